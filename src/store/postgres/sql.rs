//! The table name a [`PostgresStore`](super::PostgresStore) uses, checked, and the SQL text
//! of every statement on it, written once when the table is named.

use std::fmt;

/// PostgreSQL's limit on identifier length, in bytes.
const MAX_IDENTIFIER_LEN: usize = 63;

/// A validated table name and the statements that use it.
pub(super) struct Table {
    pub(super) name: String,
    pub(super) sql: Sql,
}

/// The statements on one table, written once when the table is named.
pub(super) struct Sql {
    pub(super) migrate: String,
    pub(super) insert: String,
    pub(super) peek: String,
    pub(super) reserve: String,
    pub(super) complete: String,
    pub(super) release: String,
    pub(super) extend: String,
    pub(super) retake: String,
    pub(super) reserve_many: String,
    pub(super) complete_many: String,
    pub(super) release_many: String,
    pub(super) purge: String,
    pub(super) claim: String,
    pub(super) claims: String,
    pub(super) inspect: String,
    pub(super) forget: String,
    pub(super) resolve: String,
    pub(super) list: String,
}

impl Table {
    pub(super) fn new(name: &str) -> Result<Self, InvalidTableName> {
        let (schema, table) = split_table_name(name)?;
        Ok(Self::checked(name, schema, table))
    }

    /// The statements for a name whose parts passed [`check_identifier`].
    pub(super) fn checked(name: &str, schema: Option<&str>, table: &str) -> Self {
        // Names are checked to need no escaping; quoting still keeps keywords such as
        // `user` or `order` usable as table names.
        let quoted = match schema {
            Some(schema) => format!("\"{schema}\".\"{table}\""),
            None => format!("\"{table}\""),
        };
        // An index lives in its table's schema, so its name is never qualified. PostgreSQL
        // truncates names over 63 bytes, the same way every time.
        let index = format!("\"{table}_expires_at_idx\"");
        let unknown_index = format!("\"{table}_unknown_idx\"");
        // A reserve takes the row when it expired, or when it is a claim of the same message
        // (claim-then-send: the claim was written in the caller's transaction).
        let takes = "(r.expires_at <= now() \
                     OR (r.state = 'claimed' AND r.fingerprint = excluded.fingerprint))";
        // What a reserve (single or batch) writes when it takes the row: pending under the new
        // token, the first attempt's time kept for a takeover of the same message.
        let take = format!(
            "ON CONFLICT (key) DO UPDATE SET
                     state = excluded.state,
                     token = excluded.token,
                     fingerprint = excluded.fingerprint,
                     outcome = NULL,
                     expires_at = excluded.expires_at,
                     first_attempt_at = CASE
                         WHEN r.state = 'pending' AND r.fingerprint = excluded.fingerprint
                             THEN r.first_attempt_at
                         ELSE excluded.first_attempt_at END
                 WHERE {takes}"
        );
        let sql = Sql {
            migrate: format!(
                "SELECT pg_advisory_xact_lock(hashtext('tower_idempotency.migrate'));
                 CREATE TABLE IF NOT EXISTS {quoted} (
                     key text PRIMARY KEY,
                     state text NOT NULL,
                     token uuid NOT NULL,
                     fingerprint bytea NOT NULL,
                     outcome jsonb,
                     expires_at timestamptz NOT NULL,
                     first_attempt_at timestamptz
                 );
                 CREATE INDEX IF NOT EXISTS {index} ON {quoted} (expires_at);
                 CREATE INDEX IF NOT EXISTS {unknown_index} ON {quoted} (expires_at, key)
                     WHERE {UNKNOWN};"
            ),
            // A reserve's first statement: a key with no row gets one, pending under the new
            // token, by the plainest statement there is (what most sends find). A key with a
            // row is left alone (`DO NOTHING` neither writes nor locks it), for `reserve`.
            insert: format!(
                "INSERT INTO {quoted}
                     (key, state, token, fingerprint, outcome, expires_at, first_attempt_at)
                 VALUES ($1, 'pending', $2, $3, NULL,
                         now() + $4::bigint * interval '1 millisecond', now())
                 ON CONFLICT (key) DO NOTHING"
            ),
            // A reserve's second statement, when the insert found a row: the row as it is, read
            // without a lock or a write (a row lock is a WAL record and a commit to disk). A
            // live row answers the reserve (a repeat, most often); an expired one, or a claim
            // of the same message, goes on to `reserve`, which takes it.
            peek: format!(
                "SELECT state, token, fingerprint, outcome::text, {FIRST_ATTEMPT_AGE},
                        expires_at <= now()
                 FROM {quoted} WHERE key = $1"
            ),
            // A reserve's third statement, for a row `peek` found takeable. The upsert writes
            // only when it takes the row (`WHERE {takes}`): a row that went live since (another
            // reserve took it first) is left as it is, with no new row version (its
            // `ON CONFLICT` locks it, though), and answered from `old`, the row as this
            // statement's snapshot saw it. No row
            // comes back when the snapshot cannot answer (the row appeared or changed after
            // it); the store then asks again. When the reserve took the key and `old` was
            // pending past its lease, it took it over from a holder that never settled it. (A
            // row changed meanwhile by another session is live, so it is not taken; one
            // deleted meanwhile was that same stale row.) The first attempt's time is kept
            // for a takeover of the same message.
            reserve: format!(
                "WITH old AS (
                     SELECT state, token, fingerprint, outcome::text AS outcome,
                            expires_at <= now() AS expired,
                            {FIRST_ATTEMPT_AGE} AS age
                     FROM {quoted} WHERE key = $1
                 ), up AS (
                 INSERT INTO {quoted} AS r
                     (key, state, token, fingerprint, outcome, expires_at, first_attempt_at)
                 VALUES ($1, 'pending', $2, $3, NULL,
                         now() + $4::bigint * interval '1 millisecond', now())
                 {take}
                 RETURNING r.state, r.token, r.fingerprint, r.outcome::text,
                     {FIRST_ATTEMPT_AGE_OF_R}
                 )
                 SELECT up.*, old.state, old.fingerprint, old.outcome, old.expired, old.age
                 FROM up LEFT JOIN old ON true
                 UNION ALL
                 SELECT old.state, old.token, old.fingerprint, old.outcome, old.age,
                        old.state, old.fingerprint, old.outcome, old.expired, old.age
                 FROM old
                 WHERE NOT EXISTS (SELECT 1 FROM up) AND NOT old.expired
                     AND NOT (old.state = 'claimed' AND old.fingerprint = $3)"
            ),
            retake: format!(
                "UPDATE {quoted} SET state = 'pending', token = $2, outcome = NULL,
                     expires_at = now() + $4::bigint * interval '1 millisecond'
                 WHERE key = $1 AND {UNKNOWN} AND expires_at > now() AND fingerprint = $3
                     AND first_attempt_at > now() - $5::bigint * interval '1 millisecond'
                 RETURNING key"
            ),
            // The token's own row keeps its first attempt's time; a row written over another
            // token's expired one does not know it.
            complete: format!(
                "INSERT INTO {quoted} AS r (key, state, token, fingerprint, outcome, expires_at)
                 VALUES ($1, 'done', $2, $3, $4::text::jsonb,
                         now() + $5::bigint * interval '1 millisecond')
                 ON CONFLICT (key) DO UPDATE SET
                     state = excluded.state, token = excluded.token,
                     fingerprint = excluded.fingerprint, outcome = excluded.outcome,
                     expires_at = excluded.expires_at,
                     first_attempt_at = CASE WHEN r.token = excluded.token
                         THEN r.first_attempt_at END
                 WHERE r.token = excluded.token OR r.expires_at <= now()"
            ),
            release: format!(
                "DELETE FROM {quoted} WHERE key = $1 AND token = $2 AND state = 'pending'"
            ),
            // `expires_at > now()`: a row whose lease passed is dead even while it lingers on
            // disk, and is never revived.
            extend: format!(
                "UPDATE {quoted} SET expires_at = now() + $3::bigint * interval '1 millisecond'
                 WHERE key = $1 AND token = $2 AND state = 'pending' AND expires_at > now()
                 RETURNING key"
            ),
            // The batch statements feed the single statements' logic from arrays, one row per
            // key. `ORDER BY key` makes every batch lock its rows in one global order, so
            // overlapping batches wait on each other instead of deadlocking.
            //
            // `reserve_many` is the single reserve per key: it writes only the rows it takes,
            // and answers a key held by a live row from `old`, that row as the statement's
            // snapshot saw it. Such a key is not even offered to the upsert (`held`), so its
            // row is neither written nor locked: a replayed batch writes no WAL. A key with no
            // row back changed under the statement (another session wrote it between the
            // snapshot and the upsert); the store asks again for those keys. Takeovers are
            // answered as reservations.
            reserve_many: format!(
                "WITH i AS (
                     SELECT * FROM unnest($1::text[], $2::uuid[], $3::bytea[])
                         AS i(key, token, fingerprint)
                 ), old AS (
                     SELECT r.key, r.state, r.token, r.fingerprint, r.outcome::text AS outcome,
                            r.expires_at <= now() AS expired, i.fingerprint AS asked
                     FROM {quoted} AS r JOIN i ON r.key = i.key
                 ), held AS (
                     SELECT * FROM old
                     WHERE NOT old.expired
                         AND NOT (old.state = 'claimed' AND old.fingerprint = old.asked)
                 ), up AS (
                 INSERT INTO {quoted} AS r
                     (key, state, token, fingerprint, outcome, expires_at, first_attempt_at)
                 SELECT i.key, 'pending', i.token, i.fingerprint, NULL,
                        now() + $4::bigint * interval '1 millisecond', now()
                 FROM i
                 WHERE NOT EXISTS (SELECT 1 FROM held WHERE held.key = i.key)
                 ORDER BY i.key
                 {take}
                 RETURNING r.state, r.token, r.fingerprint, r.outcome::text, r.key
                 )
                 SELECT * FROM up
                 UNION ALL
                 SELECT held.state, held.token, held.fingerprint, held.outcome, held.key
                 FROM held"
            ),
            // Rows the WHERE leaves alone are not returned: the keys returned were written.
            complete_many: format!(
                "INSERT INTO {quoted} AS r (key, state, token, fingerprint, outcome, expires_at)
                 SELECT i.key, 'done', i.token, i.fingerprint, i.outcome::jsonb,
                        now() + $5::bigint * interval '1 millisecond'
                 FROM unnest($1::text[], $2::uuid[], $3::bytea[], $4::text[])
                     AS i(key, token, fingerprint, outcome)
                 ORDER BY i.key
                 ON CONFLICT (key) DO UPDATE SET
                     state = excluded.state, token = excluded.token,
                     fingerprint = excluded.fingerprint, outcome = excluded.outcome,
                     expires_at = excluded.expires_at,
                     first_attempt_at = CASE WHEN r.token = excluded.token
                         THEN r.first_attempt_at END
                 WHERE r.token = excluded.token OR r.expires_at <= now()
                 RETURNING r.key"
            ),
            // A DELETE cannot be ordered, so the rows are first locked in key order (a locking
            // SELECT locks in its ORDER BY order, and under READ COMMITTED rechecks the token
            // and state on a row changed meanwhile); the DELETE then only meets rows it holds.
            release_many: format!(
                "WITH doomed AS MATERIALIZED (
                     SELECT r.key, r.token FROM {quoted} AS r
                     JOIN unnest($1::text[], $2::uuid[]) AS i(key, token)
                         ON r.key = i.key AND r.token = i.token AND r.state = 'pending'
                     ORDER BY r.key
                     FOR UPDATE OF r
                 )
                 DELETE FROM {quoted} AS r USING doomed AS d
                 WHERE r.key = d.key AND r.token = d.token AND r.state = 'pending'
                 RETURNING r.key"
            ),
            // SKIP LOCKED keeps concurrent purges (and reserves of those keys) from waiting
            // on each other; the outer condition is checked again on the row as it is when
            // deleted, so a key taken again meanwhile is never purged.
            purge: format!(
                "DELETE FROM {quoted} WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM {quoted} WHERE expires_at <= now()
                     LIMIT $1::bigint FOR UPDATE SKIP LOCKED))
                 AND expires_at <= now()"
            ),
            // Written in the caller's transaction; replaces only an expired row, so a live
            // record (a send under way or done, another claim) is left alone: no row
            // written. One row written means claimed, a count every driver reports, and
            // `$2::uuid` lets drivers that bind the token as text (sqlx without its uuid
            // feature, diesel's `sql_query`) run the same statement as `claim_in`.
            claim: format!(
                "INSERT INTO {quoted} AS r (key, state, token, fingerprint, outcome, expires_at)
                 VALUES ($1, 'claimed', $2::uuid, $3, NULL,
                         now() + $4::bigint * interval '1 millisecond')
                 ON CONFLICT (key) DO UPDATE SET
                     state = excluded.state, token = excluded.token,
                     fingerprint = excluded.fingerprint, outcome = NULL,
                     expires_at = excluded.expires_at, first_attempt_at = NULL
                 WHERE r.expires_at <= now()"
            ),
            claims: format!(
                "SELECT key, fingerprint FROM {quoted} WHERE state = 'claimed' AND expires_at > now()
                 ORDER BY expires_at, key LIMIT $1"
            ),
            inspect: format!("SELECT {ADMIN_COLUMNS} FROM {quoted} WHERE key = $1"),
            // The row is locked first, so whether a live send holds it is decided on the
            // version the change then applies to (READ COMMITTED re-reads a row changed
            // meanwhile). No row back: nothing there; `live` and `changed` otherwise.
            forget: format!(
                "WITH cur AS (
                     SELECT key, {LIVE} AS live FROM {quoted} WHERE key = $1 FOR UPDATE
                 ), gone AS (
                     DELETE FROM {quoted} AS r USING cur
                     WHERE r.key = cur.key AND ($2::boolean OR NOT cur.live)
                     RETURNING r.key
                 )
                 SELECT cur.live, EXISTS (SELECT 1 FROM gone) FROM cur"
            ),
            resolve: format!(
                "WITH cur AS (
                     SELECT key, {LIVE} AS live FROM {quoted} WHERE key = $1 FOR UPDATE
                 ), done AS (
                     UPDATE {quoted} AS r SET state = 'done', token = $3,
                         outcome = $4::text::jsonb,
                         expires_at = now() + $5::bigint * interval '1 millisecond'
                     FROM cur
                     WHERE r.key = cur.key AND ($2::boolean OR NOT cur.live)
                     RETURNING r.key
                 )
                 SELECT cur.live, EXISTS (SELECT 1 FROM done) FROM cur"
            ),
            // Two ordered, limited scans (the partial index on unknown outcomes, the index on
            // expires_at for pending rows whose lease passed) merged: never the whole table.
            list: format!(
                "SELECT {ADMIN_COLUMNS} FROM (
                     (SELECT * FROM {quoted}
                      WHERE {UNKNOWN} AND expires_at > now() AND {AFTER}
                      ORDER BY expires_at, key LIMIT $3)
                     UNION ALL
                     (SELECT * FROM {quoted}
                      WHERE state = 'pending' AND expires_at <= now() AND {AFTER}
                      ORDER BY expires_at, key LIMIT $3)
                 ) AS r
                 ORDER BY expires_at, key LIMIT $3"
            ),
        };
        Self {
            name: name.to_owned(),
            sql,
        }
    }
}

/// A done row whose kept outcome is of unknown delivery; the partial index's predicate, which
/// the listing repeats word for word so the planner uses the index.
const UNKNOWN: &str = "state = 'done' AND (outcome -> 'failed' ->> 'category') = 'unknown'";

/// How long ago a row's first attempt began, in whole milliseconds by the server's clock;
/// NULL when the row does not know it (a claim, a row completed without its pending row).
const FIRST_ATTEMPT_AGE: &str = "(extract(epoch from (now() - first_attempt_at)) * 1000)::bigint";

/// [`FIRST_ATTEMPT_AGE`] of the row a reserve answers.
const FIRST_ATTEMPT_AGE_OF_R: &str =
    "(extract(epoch from (now() - r.first_attempt_at)) * 1000)::bigint";

/// A row held by a live send: pending or claimed, within its lease.
const LIVE: &str = "(state IN ('pending', 'claimed') AND expires_at > now())";

/// After the cursor: `$1` its position (microseconds since the UNIX epoch), `$2` its key.
const AFTER: &str =
    "(expires_at, key) > (timestamptz 'epoch' + $1::bigint * interval '1 microsecond', $2)";

/// What the admin operations read of a row: key, state, fingerprint, outcome, the time left
/// in ms (negative once passed), and the position in the listing's order (`expires_at` in
/// whole microseconds since the UNIX epoch, exact on every server version).
const ADMIN_COLUMNS: &str = "key, state, fingerprint, outcome::text,
    (extract(epoch from (expires_at - now())) * 1000)::bigint,
    (extract(epoch from date_trunc('second', expires_at)))::bigint * 1000000
        + extract(microseconds from expires_at)::bigint % 1000000";

/// Splits `table` or `schema.table` into its parts, each checked by [`check_identifier`]:
/// names that need no escaping and cannot carry SQL. Also used by the outbox's table.
pub(crate) fn split_table_name(name: &str) -> Result<(Option<&str>, &str), InvalidTableName> {
    let invalid = |reason| InvalidTableName {
        name: name.to_owned(),
        reason,
    };
    let mut parts = name.split('.');
    let (schema, table) = match (parts.next(), parts.next(), parts.next()) {
        (Some(table), None, _) => (None, table),
        (Some(schema), Some(table), None) => (Some(schema), table),
        _ => return Err(invalid("at most one dot, between schema and table")),
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
        return Err("a name is at most 63 bytes long");
    }
    Ok(())
}

/// A table name [`PostgresStore::table`](super::PostgresStore::table) refused.
///
/// A name is `table` or `schema.table`, each part of lowercase ASCII letters, digits and
/// underscores, starting with a letter or underscore, at most 63 bytes: a name PostgreSQL
/// would fold to the same thing quoted or not, and one that cannot carry SQL.
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
    use crate::store::postgres::DEFAULT_TABLE;

    #[test]
    fn the_default_table_name_is_valid() {
        assert!(Table::new(DEFAULT_TABLE).is_ok());
    }

    #[test]
    fn table_names_are_plain_or_schema_qualified_identifiers() {
        for good in [
            "keys",
            "_keys",
            "app.idempotency_keys",
            "k1",
            &"a".repeat(63),
        ] {
            assert!(Table::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "Keys",
            "1keys",
            "keys; DROP TABLE users",
            "keys\"",
            "ke ys",
            "kéys",
            &"a".repeat(64),
        ] {
            let error = Table::new(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(error.name(), bad);
        }
    }
}
