//! The table name a [`MySqlStore`](super::MySqlStore) uses, checked, and the SQL text of every
//! statement on it, written once when the table is named.
//!
//! Every statement runs unchanged on MySQL 8 and MariaDB 10.6+: no `RETURNING` (MariaDB
//! only), no `VALUES()` in `ON DUPLICATE KEY UPDATE` (deprecated by MySQL 8.0.20) nor the row
//! alias that replaces it (MySQL only), no `CREATE INDEX IF NOT EXISTS` (MariaDB only). Time
//! is `UTC_TIMESTAMP(6)`, the server's clock in UTC, so neither a session's `time_zone` nor a
//! daylight-saving change moves an expiry.

use std::fmt;

/// MySQL's and MariaDB's limit on identifier length, in characters (here bytes: ASCII).
const MAX_IDENTIFIER_LEN: usize = 64;

/// The longest key the table holds, in bytes (its `VARBINARY` primary key). Longer keys are
/// refused before any statement is sent, so that no server setting can truncate one.
pub(crate) const MAX_KEY_LEN: usize = 1024;

/// The server's clock, in UTC, to the microsecond.
pub(super) const NOW: &str = "UTC_TIMESTAMP(6)";

/// A validated table name and the statements that use it.
pub(super) struct Table {
    pub(super) name: String,
    pub(super) quoted: String,
    pub(super) sql: Sql,
}

/// The statements on one table whose text does not depend on a batch's size.
pub(super) struct Sql {
    pub(super) migrate: String,
    pub(super) insert: String,
    pub(super) peek: String,
    pub(super) take: String,
    pub(super) complete: String,
    pub(super) complete_insert: String,
    pub(super) release: String,
    pub(super) extend: String,
    pub(super) retake: String,
    pub(super) purge: String,
    pub(super) claim_insert: String,
    pub(super) claim_take: String,
    pub(super) claim_upsert: String,
    pub(super) claims: String,
    pub(super) inspect: String,
    pub(super) lock_one: String,
    pub(super) delete_one: String,
    pub(super) resolve: String,
    pub(super) list: String,
}

/// What a reserve reads of a row: state, token, fingerprint, outcome, the first attempt's
/// age in ms (NULL when unknown), and whether it expired (1 or 0).
pub(super) const RECORD_COLUMNS: &str = "state, token, fingerprint, outcome,
    TIMESTAMPDIFF(MICROSECOND, first_attempt_at, UTC_TIMESTAMP(6)) DIV 1000,
    expires_at <= UTC_TIMESTAMP(6)";

/// What the admin operations read of a row: key, state, fingerprint, outcome, the time left
/// in ms (negative once passed), and the position in the listing's order (`expires_at` in
/// microseconds since the UNIX epoch: the column holds UTC).
const ADMIN_COLUMNS: &str = "`key` AS k, state, fingerprint, outcome,
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000 AS left_ms,
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) AS pos";

/// After the listing's cursor: its position (twice) and its key.
const AFTER: &str = "(expires_at > '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND
     OR (expires_at = '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND AND `key` > ?))";

/// `?` placeholders for `n` values, separated by commas.
pub(super) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl Table {
    pub(super) fn new(name: &str) -> Result<Self, InvalidTableName> {
        let (schema, table) = split_table_name(name)?;
        Ok(Self::checked(name, schema, table))
    }

    /// The statements for a name whose parts passed [`check_identifier`].
    pub(super) fn checked(name: &str, schema: Option<&str>, table: &str) -> Self {
        // Names are checked to need no escaping; quoting still keeps keywords usable.
        let q = match schema {
            Some(schema) => format!("`{schema}`.`{table}`"),
            None => format!("`{table}`"),
        };
        let sql = Sql {
            // Indexes are declared in the table: `CREATE INDEX IF NOT EXISTS` is MariaDB's
            // only. `unknown_delivery` is the listing's filter, kept by the server (a
            // generated column), so the listing reads an index of those rows only: neither
            // server has partial indexes. The key is bytes (`VARBINARY`), compared exactly:
            // a text column's collation would make `A` and `a` one key.
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {q} (
                     `key` VARBINARY({MAX_KEY_LEN}) NOT NULL,
                     state VARCHAR(7) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                     token BINARY(16) NOT NULL,
                     fingerprint VARBINARY(64) NOT NULL,
                     outcome JSON NULL,
                     expires_at DATETIME(6) NOT NULL,
                     first_attempt_at DATETIME(6) NULL,
                     unknown_delivery TINYINT AS (IFNULL(state = 'done' AND
                         JSON_UNQUOTE(JSON_EXTRACT(outcome, '$.failed.category')) = 'unknown',
                         0)) STORED,
                     PRIMARY KEY (`key`),
                     INDEX expires_at_idx (expires_at),
                     INDEX unknown_idx (unknown_delivery, expires_at, `key`)
                 ) ENGINE = InnoDB"
            ),
            // A reserve's first statement: a key with no row gets one (what most sends find).
            // `IGNORE` turns only the duplicate key into "no row written": the store refuses
            // keys too long for the column, and the other values have fixed sizes, so no
            // other error it would hide can arise.
            insert: format!(
                "INSERT IGNORE INTO {q}
                     (`key`, state, token, fingerprint, outcome, expires_at, first_attempt_at)
                 VALUES (?, 'pending', ?, ?, NULL, {NOW} + INTERVAL ? MICROSECOND, {NOW})"
            ),
            peek: format!("SELECT {RECORD_COLUMNS} FROM {q} WHERE `key` = ?"),
            // A reserve's third statement, for a row `peek` found takeable: a compare-and-set
            // on the token peek saw, so of racing reserves exactly one takes the row (the
            // update re-reads the latest version under its lock), and what peek read is the
            // row it took. `first_attempt_at` is assigned first, as MySQL assigns left to
            // right and later expressions see earlier assignments: it reads the old state
            // and fingerprint (as it does under MariaDB's `SIMULTANEOUS_ASSIGNMENT` mode,
            // where every expression reads the old row). Parameters: fingerprint, fingerprint, token, lease (µs), key,
            // peeked token, fingerprint.
            take: format!(
                "UPDATE {q} SET
                     first_attempt_at = IF(state = 'pending' AND fingerprint = ?,
                                           first_attempt_at, {NOW}),
                     state = 'pending', fingerprint = ?, token = ?, outcome = NULL,
                     expires_at = {NOW} + INTERVAL ? MICROSECOND
                 WHERE `key` = ? AND token = ?
                     AND (expires_at <= {NOW} OR (state = 'claimed' AND fingerprint = ?))"
            ),
            // Fenced by the token: the holder's own row, or an expired one. The token's own
            // row keeps its first attempt's time (read before `token` is assigned). Params:
            // fingerprint, outcome, ttl (µs), token, token, key, token.
            complete: format!(
                "UPDATE {q} SET state = 'done', fingerprint = ?, outcome = ?,
                     expires_at = {NOW} + INTERVAL ? MICROSECOND,
                     first_attempt_at = IF(token = ?, first_attempt_at, NULL),
                     token = ?
                 WHERE `key` = ? AND (token = ? OR expires_at <= {NOW})"
            ),
            // When the update found no row to write: a key with no row gets the done row.
            complete_insert: format!(
                "INSERT IGNORE INTO {q} (`key`, state, token, fingerprint, outcome, expires_at)
                 VALUES (?, 'done', ?, ?, ?, {NOW} + INTERVAL ? MICROSECOND)"
            ),
            release: format!("DELETE FROM {q} WHERE `key` = ? AND token = ? AND state = 'pending'"),
            // `expires_at > now`: a row whose lease passed is dead even while it lingers on
            // disk, and is never revived.
            extend: format!(
                "UPDATE {q} SET expires_at = {NOW} + INTERVAL ? MICROSECOND
                 WHERE `key` = ? AND token = ? AND state = 'pending' AND expires_at > {NOW}"
            ),
            retake: format!(
                "UPDATE {q} SET state = 'pending', token = ?, outcome = NULL,
                     expires_at = {NOW} + INTERVAL ? MICROSECOND
                 WHERE `key` = ? AND unknown_delivery = 1 AND expires_at > {NOW}
                     AND fingerprint = ?
                     AND first_attempt_at > {NOW} - INTERVAL ? MICROSECOND"
            ),
            // The condition is checked on each row as it is when deleted, so a key taken again
            // meanwhile is never purged.
            purge: format!("DELETE FROM {q} WHERE expires_at <= {NOW} ORDER BY expires_at LIMIT ?"),
            claim_insert: format!(
                "INSERT IGNORE INTO {q} (`key`, state, token, fingerprint, outcome, expires_at)
                 VALUES (?, 'claimed', ?, ?, NULL, {NOW} + INTERVAL ? MICROSECOND)"
            ),
            // Replaces only an expired row: a live record (a send under way or done, another
            // claim) is left alone.
            claim_take: format!(
                "UPDATE {q} SET state = 'claimed', token = ?, fingerprint = ?, outcome = NULL,
                     expires_at = {NOW} + INTERVAL ? MICROSECOND, first_attempt_at = NULL
                 WHERE `key` = ? AND expires_at <= {NOW}"
            ),
            // `claim_insert` and `claim_take` as one statement, for drivers that run one
            // (`MySqlStore::claim_statement`). Each assignment keeps a live row as it is, and
            // `expires_at`, which the others read, is assigned last (MySQL assigns left to
            // right). The ttl is in milliseconds. Parameters: key, token, fingerprint, ttl,
            // then token, fingerprint, ttl again.
            claim_upsert: format!(
                "INSERT INTO {q}
                     (`key`, state, token, fingerprint, outcome, expires_at, first_attempt_at)
                 VALUES (?, 'claimed', ?, ?, NULL, {NOW} + INTERVAL (? * 1000) MICROSECOND, NULL)
                 ON DUPLICATE KEY UPDATE
                     state = IF(expires_at <= {NOW}, 'claimed', state),
                     token = IF(expires_at <= {NOW}, ?, token),
                     fingerprint = IF(expires_at <= {NOW}, ?, fingerprint),
                     outcome = IF(expires_at <= {NOW}, NULL, outcome),
                     first_attempt_at = IF(expires_at <= {NOW}, NULL, first_attempt_at),
                     expires_at = IF(expires_at <= {NOW},
                                     {NOW} + INTERVAL (? * 1000) MICROSECOND, expires_at)"
            ),
            claims: format!(
                "SELECT `key`, fingerprint FROM {q} WHERE state = 'claimed' AND expires_at > {NOW}
                 ORDER BY expires_at, `key` LIMIT ?"
            ),
            inspect: format!("SELECT {ADMIN_COLUMNS} FROM {q} WHERE `key` = ?"),
            // The admin changes lock the row first, in a transaction, and decide on the
            // locked version whether a live send holds it.
            lock_one: format!(
                "SELECT state IN ('pending', 'claimed') AND expires_at > {NOW}
                 FROM {q} WHERE `key` = ? FOR UPDATE"
            ),
            delete_one: format!("DELETE FROM {q} WHERE `key` = ?"),
            resolve: format!(
                "UPDATE {q} SET state = 'done', token = ?, outcome = ?,
                     expires_at = {NOW} + INTERVAL ? MICROSECOND
                 WHERE `key` = ?"
            ),
            // Two ordered, limited scans (the index on unknown outcomes, the index on
            // expires_at for pending rows whose lease passed) merged: never the whole table.
            // Parameters: the cursor (position, position, key) and the limit, per scan, then
            // the limit.
            list: format!(
                "(SELECT {ADMIN_COLUMNS} FROM {q}
                  WHERE unknown_delivery = 1 AND expires_at > {NOW} AND {AFTER}
                  ORDER BY expires_at, `key` LIMIT ?)
                 UNION ALL
                 (SELECT {ADMIN_COLUMNS} FROM {q}
                  WHERE state = 'pending' AND expires_at <= {NOW} AND {AFTER}
                  ORDER BY expires_at, `key` LIMIT ?)
                 ORDER BY pos, k LIMIT ?"
            ),
        };
        Self {
            name: name.to_owned(),
            quoted: q,
            sql,
        }
    }

    /// The batch reserve's insert of `n` rows (in key order, so overlapping batches take
    /// their locks in one order): key, token, fingerprint per row, then the lease (µs).
    pub(super) fn insert_many(&self, n: usize) -> String {
        let q = &self.quoted;
        let row = format!("(?, 'pending', ?, ?, NULL, {NOW} + INTERVAL ? MICROSECOND, {NOW})");
        format!(
            "INSERT IGNORE INTO {q}
                 (`key`, state, token, fingerprint, outcome, expires_at, first_attempt_at)
             VALUES {}",
            vec![row; n].join(", ")
        )
    }

    /// What the batch reserve reads back of `n` keys: the key, then [`RECORD_COLUMNS`].
    pub(super) fn peek_many(&self, n: usize) -> String {
        format!(
            "SELECT `key`, {RECORD_COLUMNS} FROM {} WHERE `key` IN ({})",
            self.quoted,
            marks(n)
        )
    }

    /// Locks the rows of `n` keys in key order, for the batch complete and release: key,
    /// state, token, whether expired.
    pub(super) fn lock_many(&self, n: usize) -> String {
        format!(
            "SELECT `key`, state, token, expires_at <= {NOW} FROM {} WHERE `key` IN ({})
             ORDER BY `key` FOR UPDATE",
            self.quoted,
            marks(n)
        )
    }

    /// The batch complete's update of `n` rows it holds locked and may write: per row key
    /// and value in the `CASE` of fingerprints, then of outcomes, the ttl (µs), then key and
    /// token in each of the two `CASE`s of tokens, then the keys.
    pub(super) fn complete_many(&self, n: usize) -> String {
        let case = format!("CASE `key` {} END", vec!["WHEN ? THEN ?"; n].join(" "));
        format!(
            "UPDATE {} SET state = 'done', fingerprint = {case}, outcome = {case},
                 expires_at = {NOW} + INTERVAL ? MICROSECOND,
                 first_attempt_at = IF(token = {case}, first_attempt_at, NULL),
                 token = {case}
             WHERE `key` IN ({})",
            self.quoted,
            marks(n)
        )
    }

    /// The batch complete's insert of `n` done rows for keys with no row: key, token,
    /// fingerprint, outcome per row, then the ttl (µs).
    pub(super) fn complete_insert_many(&self, n: usize) -> String {
        let row = format!("(?, 'done', ?, ?, ?, {NOW} + INTERVAL ? MICROSECOND)");
        format!(
            "INSERT IGNORE INTO {} (`key`, state, token, fingerprint, outcome, expires_at)
             VALUES {}",
            self.quoted,
            vec![row; n].join(", ")
        )
    }

    /// The tokens of `n` keys, to see which rows the batch complete's insert wrote.
    pub(super) fn tokens_many(&self, n: usize) -> String {
        format!(
            "SELECT `key`, token FROM {} WHERE `key` IN ({})",
            self.quoted,
            marks(n)
        )
    }

    /// Deletes `n` rows the batch release holds locked.
    pub(super) fn delete_many(&self, n: usize) -> String {
        format!("DELETE FROM {} WHERE `key` IN ({})", self.quoted, marks(n))
    }
}

/// Splits `table` or `schema.table` into its parts, each checked by [`check_identifier`]:
/// names that need no escaping and cannot carry SQL.
fn split_table_name(name: &str) -> Result<(Option<&str>, &str), InvalidTableName> {
    let invalid = |reason| InvalidTableName {
        name: name.to_owned(),
        reason,
    };
    let mut parts = name.split('.');
    let (schema, table) = match (parts.next(), parts.next(), parts.next()) {
        (Some(table), None, _) => (None, table),
        (Some(schema), Some(table), None) => (Some(schema), table),
        _ => return Err(invalid("at most one dot, between database and table")),
    };
    for part in schema.iter().chain([&table]) {
        check_identifier(part).map_err(invalid)?;
    }
    Ok((schema, table))
}

fn check_identifier(part: &str) -> Result<(), &'static str> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("empty name"),
        Some(c) if !(c.is_ascii_lowercase() || c == '_') => {
            return Err("a name starts with a lowercase ASCII letter or an underscore");
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err("a name holds lowercase ASCII letters, digits and underscores only");
    }
    if part.len() > MAX_IDENTIFIER_LEN {
        return Err("a name is at most 64 bytes long");
    }
    Ok(())
}

/// A table name [`MySqlStore::table`](super::MySqlStore::table) refused.
///
/// A name is `table` or `database.table`, each part of lowercase ASCII letters, digits and
/// underscores, starting with a letter or underscore, at most 64 bytes: a name that means the
/// same on a server with case-sensitive table names (Linux) as on one without, and one that
/// cannot carry SQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTableName {
    name: String,
    reason: &'static str,
}

impl InvalidTableName {
    /// The name that was refused.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why it was refused.
    pub fn reason(&self) -> &str {
        self.reason
    }
}

impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid table name {:?}: {}", self.name, self.reason)
    }
}

impl std::error::Error for InvalidTableName {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mysql::DEFAULT_TABLE;

    #[test]
    fn the_default_table_name_is_valid() {
        assert!(Table::new(DEFAULT_TABLE).is_ok());
    }

    #[test]
    fn table_names_are_plain_or_database_qualified_identifiers() {
        for good in [
            "keys",
            "_keys",
            "app.idempotency_keys",
            "k1",
            &"a".repeat(64),
        ] {
            assert!(Table::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "a.",
            "a.b.c",
            "Keys",
            "1keys",
            "keys; DROP TABLE users",
            "keys`",
            "kéys",
            &"a".repeat(65),
        ] {
            let error = Table::new(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(error.name(), bad);
        }
    }

    #[test]
    fn batch_statements_have_one_placeholder_per_value() {
        let table = Table::new("t").unwrap();
        let count = |sql: &str| sql.matches('?').count();
        assert_eq!(count(&table.insert_many(3)), 3 * 4);
        assert_eq!(count(&table.peek_many(3)), 3);
        assert_eq!(count(&table.complete_many(2)), 4 * 2 * 2 + 1 + 2);
        assert_eq!(count(&table.complete_insert_many(2)), 2 * 5);
    }
}
