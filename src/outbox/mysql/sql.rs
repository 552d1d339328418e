//! The SQL text of every statement on a MySQL outbox table, written once when the table is
//! named, and the statements whose text depends on a batch's size.
//!
//! Every statement runs unchanged on MySQL 8 and MariaDB 10.6+, with what both servers run
//! the same way, as [`MySqlStore`](crate::MySqlStore)'s statements do: no `RETURNING`
//! (MariaDB only), no `CREATE INDEX IF NOT EXISTS` (MariaDB only), no `unnest`-like table of
//! parameters (a batch is a `CASE` per column), and no `UPDATE … WHERE id IN (SELECT … LIMIT)`
//! (MySQL refuses a `LIMIT` there): the claim is a short transaction of two statements.
//! Time is `UTC_TIMESTAMP(6)`, the server's clock in UTC, as the store's.

/// The server's clock, in UTC, to the microsecond.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// The longest key the table holds, in bytes: a `VARBINARY` as wide as
/// [`MySqlStore`](crate::MySqlStore)'s key column, far above the 256 bytes a message's
/// idempotency key may have, and within InnoDB's index limit.
const MAX_KEY_LEN: usize = 1024;

/// The statements on one outbox table whose text does not depend on a batch's size.
pub(super) struct OutboxSql {
    pub(super) name: String,
    quoted: String,
    pub(super) migrate: String,
    pub(super) enqueue: String,
    pub(super) claim_lock: String,
    pub(super) lag: String,
    pub(super) counts: String,
    pub(super) dead_letters: String,
    pub(super) requeue: String,
    pub(super) purge: String,
}

/// `?` placeholders for `n` values, separated by commas.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// `CASE id WHEN ? THEN <then> … END` for `n` rows: each row's id, then `then`'s values.
fn case_by_id(n: usize, then: &str) -> String {
    format!(
        "CASE id {} END",
        vec![format!("WHEN ? THEN {then}"); n].join(" ")
    )
}

impl OutboxSql {
    /// The statements for `name`, already checked by the store's rules (`table` or
    /// `database.table`, identifiers that need no escaping).
    pub(super) fn new(name: &str) -> Self {
        // Checked names need no escaping; quoting keeps keywords usable.
        let q = name
            .split('.')
            .map(|part| format!("`{part}`"))
            .collect::<Vec<_>>()
            .join(".");
        Self {
            name: name.to_owned(),
            // Indexes are declared in the table (`CREATE INDEX IF NOT EXISTS` is MariaDB's
            // only); neither server has partial indexes, so they lead with `state`. The
            // table's utf8mb4 is for MariaDB, whose `JSON` is a `LONGTEXT` in the table's
            // character set: message text in any script must round-trip.
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {q} (
                     id            BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                     `key`         VARBINARY({MAX_KEY_LEN}) NOT NULL,
                     message       JSON NOT NULL,
                     state         VARCHAR(7) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                                       DEFAULT 'waiting',
                     attempts      INT NOT NULL DEFAULT 0,
                     available_at  DATETIME(6) NOT NULL,
                     claim_token   BINARY(16) NULL,
                     claimed_until DATETIME(6) NULL,
                     enqueued_at   DATETIME(6) NOT NULL,
                     finished_at   DATETIME(6) NULL,
                     provider_id   TEXT NULL,
                     transport     TEXT NULL,
                     last_error    TEXT NULL,
                     UNIQUE INDEX key_idx (`key`),
                     INDEX waiting_idx (state, available_at, id),
                     INDEX done_idx (state, finished_at)
                 ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
            ),
            // `IGNORE` turns only the duplicate key into "no row written": the key fits the
            // column (a message's key is at most 256 bytes) and the message is JSON the crate
            // wrote, so no other error it would hide can arise. A key another open
            // transaction inserted waits for that transaction, as a unique index does.
            enqueue: format!(
                "INSERT IGNORE INTO {q} (`key`, message, available_at, enqueued_at)
                 VALUES (?, ?, {NOW}, {NOW})"
            ),
            // The claim's first statement, in its own short transaction: SKIP LOCKED, so
            // concurrent workers each lock rows nobody else is taking; the second statement
            // (`claim`) writes the lease on the rows locked here. `waited_ms` is how long
            // each row had been ready: the lag.
            claim_lock: format!(
                "SELECT id, message, attempts + 1,
                     TIMESTAMPDIFF(MICROSECOND, available_at, {NOW}) DIV 1000
                 FROM {q}
                 WHERE state = 'waiting' AND available_at <= {NOW}
                   AND (claimed_until IS NULL OR claimed_until <= {NOW})
                 ORDER BY available_at, id
                 LIMIT ?
                 FOR UPDATE SKIP LOCKED"
            ),
            lag: format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(available_at), {NOW}) DIV 1000
                 FROM {q} WHERE state = 'waiting' AND available_at <= {NOW}"
            ),
            counts: format!("SELECT state, COUNT(*) FROM {q} GROUP BY state"),
            dead_letters: format!(
                "SELECT id, `key`, attempts, last_error FROM {q}
                 WHERE state = 'dead' ORDER BY id LIMIT ?"
            ),
            requeue: format!(
                "UPDATE {q} SET state = 'waiting', attempts = 0, available_at = {NOW},
                     finished_at = NULL, claim_token = NULL, claimed_until = NULL
                 WHERE `key` = ? AND state = 'dead'"
            ),
            // The condition is checked on each row as it is deleted.
            purge: format!(
                "DELETE FROM {q}
                 WHERE state = 'done' AND finished_at <= {NOW} - INTERVAL ? MICROSECOND
                 ORDER BY finished_at LIMIT ?"
            ),
            quoted: q,
        }
    }

    /// The claim's second statement: the lease on the `n` rows the first one locked.
    /// Parameters: token, lease (µs), the ids.
    pub(super) fn claim(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET claim_token = ?, claimed_until = {NOW} + INTERVAL ? MICROSECOND,
                 attempts = attempts + 1
             WHERE id IN ({})",
            self.quoted,
            placeholders(n)
        )
    }

    /// Locks `n` rows in id order, so overlapping marks wait for each other rather than
    /// deadlock, and reads their claims: id, token.
    pub(super) fn lock_claims(&self, n: usize) -> String {
        format!(
            "SELECT id, claim_token FROM {} WHERE id IN ({}) ORDER BY id FOR UPDATE",
            self.quoted,
            placeholders(n)
        )
    }

    /// The answers of `n` rows the mark holds locked, one `CASE` per column. A row put back
    /// (`waiting`) waits its `after` (µs); a finished one (`after` NULL) keeps its
    /// `available_at` and gets its `finished_at`. Each column reads parameters only, never
    /// another column, so MariaDB's `SIMULTANEOUS_ASSIGNMENT` mode changes nothing.
    /// Parameters: per row id and after (µs or NULL); id and finished (0 or 1); id and
    /// state; id and provider id; id and transport; id and last error; then the ids.
    pub(super) fn mark(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET
                 available_at = {},
                 finished_at = {},
                 state = {},
                 provider_id = {},
                 transport = {},
                 last_error = {},
                 claim_token = NULL, claimed_until = NULL
             WHERE id IN ({})",
            self.quoted,
            case_by_id(
                n,
                &format!("IFNULL({NOW} + INTERVAL ? MICROSECOND, available_at)")
            ),
            case_by_id(n, &format!("IF(?, {NOW}, NULL)")),
            case_by_id(n, "?"),
            case_by_id(n, "?"),
            case_by_id(n, "?"),
            case_by_id(n, "?"),
            placeholders(n)
        )
    }

    /// Puts back `n` rows, each fenced by its claim's token, attempt uncounted. Parameters:
    /// the ids, then per row id and token.
    pub(super) fn release(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET attempts = GREATEST(attempts - 1, 0),
                 claim_token = NULL, claimed_until = NULL
             WHERE id IN ({}) AND claim_token = {}",
            self.quoted,
            placeholders(n),
            case_by_id(n, "?")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_statements_have_one_placeholder_per_value() {
        let sql = OutboxSql::new("app.outbox");
        let count = |sql: &str| sql.matches('?').count();
        assert!(sql.migrate.contains("`app`.`outbox`"));
        assert_eq!(count(&sql.claim(3)), 2 + 3);
        assert_eq!(count(&sql.lock_claims(3)), 3);
        assert_eq!(count(&sql.mark(3)), 6 * 2 * 3 + 3);
        assert_eq!(count(&sql.release(3)), 3 + 2 * 3);
    }
}
