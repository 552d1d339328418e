//! The schema and the SQL text of every statement a [`SqliteStore`](super::SqliteStore) runs.
//!
//! Every expiry is compared with `now!()`, the database's own clock in milliseconds, so every
//! process on the host decides alike whatever its own timers say.

/// The current time in whole milliseconds since the UNIX epoch, by SQLite's clock (the
/// host's). `unixepoch('subsec')` needs SQLite 3.42; the bundled one is newer. Every
/// statement below spells the time with this one macro.
macro_rules! now {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// A done row of unknown delivery: the partial index's predicate, repeated word for word by
/// the listing so the planner uses the index. `json_valid` first, so a damaged outcome is
/// simply not listed instead of failing every write of the index.
macro_rules! unknown {
    () => {
        "state = 'done' AND json_valid(outcome) AND outcome ->> '$.failed.category' = 'unknown'"
    };
}

/// A reserve takes the row when it expired, or when it is a claim of the same message
/// (claim-then-send: the claim was written in the caller's transaction).
macro_rules! takes {
    () => {
        concat!(
            "(r.expires_at <= ",
            now!(),
            " OR (r.state = 'claimed' AND r.fingerprint = excluded.fingerprint))"
        )
    };
}

/// What the admin operations read of a row: key, state, fingerprint, outcome, ms left
/// (zero or less once passed), and `expires_at`, the position in the listing's order.
macro_rules! admin_columns {
    () => {
        concat!(
            "key, state, fingerprint, outcome, expires_at - ",
            now!(),
            ", expires_at"
        )
    };
}

/// Creates the table and its indexes when they are absent; run by every `open` inside a
/// write transaction, so processes opening the file at once do not race.
pub(super) const SCHEMA: &str = concat!(
    "CREATE TABLE IF NOT EXISTS idempotency_keys (
        key         TEXT    PRIMARY KEY NOT NULL,
        state       TEXT    NOT NULL,
        token       BLOB    NOT NULL,
        fingerprint BLOB    NOT NULL,
        outcome     TEXT,
        expires_at  INTEGER NOT NULL,
        first_attempt_at INTEGER
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx
        ON idempotency_keys (expires_at);
    CREATE INDEX IF NOT EXISTS idempotency_keys_unknown_idx
        ON idempotency_keys (expires_at, key) WHERE ",
    unknown!(),
    ";"
);

/// `?1` key: the row as it is before a reserve (state, fingerprint, outcome, whether its
/// time passed, its first attempt's age in ms). Run in the reserve's write transaction, so
/// nothing changes between it and the reserve: a reserve that took the key from a pending
/// row whose lease passed reports the takeover with it.
pub(super) const BEFORE_RESERVE: &str = concat!(
    "SELECT state, fingerprint, outcome, expires_at <= ",
    now!(),
    ", ",
    now!(),
    " - first_attempt_at FROM idempotency_keys WHERE key = ?1"
);

/// `?1` key, `?2` token, `?3` fingerprint, `?4` lease in ms. The upsert always updates, so it
/// always returns the row: a live one written back unchanged (every SET expression reads the
/// row as it was), an expired one replaced by the new reservation. Whose token comes back
/// says who holds the key. The first attempt's time is kept by a takeover of the same
/// message's pending row, and starts again otherwise.
pub(super) const RESERVE: &str = concat!(
    "INSERT INTO idempotency_keys AS r
         (key, state, token, fingerprint, outcome, expires_at, first_attempt_at)
     VALUES (?1, 'pending', ?2, ?3, NULL, ",
    now!(),
    " + ?4, ",
    now!(),
    ")
     ON CONFLICT (key) DO UPDATE SET
         state = CASE WHEN ",
    takes!(),
    " THEN excluded.state ELSE r.state END,
         token = CASE WHEN ",
    takes!(),
    " THEN excluded.token ELSE r.token END,
         fingerprint = CASE WHEN ",
    takes!(),
    " THEN excluded.fingerprint ELSE r.fingerprint END,
         outcome = CASE WHEN ",
    takes!(),
    " THEN NULL ELSE r.outcome END,
         expires_at = CASE WHEN ",
    takes!(),
    " THEN excluded.expires_at ELSE r.expires_at END,
         first_attempt_at = CASE WHEN NOT ",
    takes!(),
    " THEN r.first_attempt_at
             WHEN r.state = 'pending' AND r.fingerprint = excluded.fingerprint
             THEN r.first_attempt_at ELSE excluded.first_attempt_at END
     RETURNING state, token, fingerprint, outcome, ",
    now!(),
    " - first_attempt_at"
);

/// `?1` key, `?2` token, `?3` fingerprint, `?4` lease in ms, `?5` window in ms: holds a live
/// done row of the same message, of unknown delivery, whose first attempt is younger than
/// the window, pending again under the new token, keeping the first attempt's time; a row
/// comes back when it did.
pub(super) const RETAKE: &str = concat!(
    "UPDATE idempotency_keys SET state = 'pending', token = ?2, outcome = NULL, expires_at = ",
    now!(),
    " + ?4 WHERE key = ?1 AND ",
    unknown!(),
    " AND expires_at > ",
    now!(),
    " AND fingerprint = ?3 AND first_attempt_at > ",
    now!(),
    " - ?5 RETURNING key"
);

/// `?1` key, `?2` token, `?3` fingerprint, `?4` outcome, `?5` ttl in ms: writes done when
/// the token holds the key or nothing live does; a row comes back when it wrote.
pub(super) const COMPLETE: &str = concat!(
    "INSERT INTO idempotency_keys AS r (key, state, token, fingerprint, outcome, expires_at)
     VALUES (?1, 'done', ?2, ?3, ?4, ",
    now!(),
    " + ?5)
     ON CONFLICT (key) DO UPDATE SET
         state = excluded.state, token = excluded.token, fingerprint = excluded.fingerprint,
         outcome = excluded.outcome, expires_at = excluded.expires_at,
         first_attempt_at = CASE WHEN r.token = excluded.token THEN r.first_attempt_at END
     WHERE r.token = excluded.token OR r.expires_at <= ",
    now!(),
    " RETURNING key"
);

/// `?1` key, `?2` token.
pub(super) const RELEASE: &str =
    "DELETE FROM idempotency_keys WHERE key = ?1 AND token = ?2 AND state = 'pending'";

/// `?1` key, `?2` token, `?3` lease in ms. A row whose lease passed is dead even while it
/// lingers on disk, and is never revived.
pub(super) const EXTEND: &str = concat!(
    "UPDATE idempotency_keys SET expires_at = ",
    now!(),
    " + ?3 WHERE key = ?1 AND token = ?2 AND state = 'pending' AND expires_at > ",
    now!()
);

/// `?1` how many rows at most: deletes expired rows, oldest first; a pending row only an
/// hour after its lease passed, so that the next reserve of a key whose holder crashed still
/// reports the takeover (the range scan on `expires_at` stays the index's).
pub(super) const PURGE: &str = concat!(
    "DELETE FROM idempotency_keys WHERE key IN (
         SELECT key FROM idempotency_keys WHERE expires_at <= ",
    now!(),
    " AND (state <> 'pending' OR expires_at <= ",
    now!(),
    " - 3600000) ORDER BY expires_at LIMIT ?1)"
);

/// `?1` key, `?2` token, `?3` fingerprint, `?4` ttl in ms: written in the caller's
/// transaction; replaces only an expired row, so a live record is left alone (no row
/// written: one row written means claimed, a count every driver reports).
pub(super) const CLAIM: &str = concat!(
    "INSERT INTO idempotency_keys AS r (key, state, token, fingerprint, outcome, expires_at)
     VALUES (?1, 'claimed', ?2, ?3, NULL, ",
    now!(),
    " + ?4)
     ON CONFLICT (key) DO UPDATE SET
         state = excluded.state, token = excluded.token, fingerprint = excluded.fingerprint,
         outcome = NULL, expires_at = excluded.expires_at, first_attempt_at = NULL
     WHERE r.expires_at <= ",
    now!()
);

/// `?1` how many: the claims still waiting for their send, oldest first.
pub(super) const CLAIMS: &str = concat!(
    "SELECT key, fingerprint FROM idempotency_keys WHERE state = 'claimed' AND expires_at > ",
    now!(),
    " ORDER BY expires_at, key LIMIT ?1"
);

/// `?1` key.
pub(super) const INSPECT: &str = concat!(
    "SELECT ",
    admin_columns!(),
    " FROM idempotency_keys WHERE key = ?1"
);

/// `?1` key: whether a live send holds it (pending or claimed, within its lease); no row
/// when there is no record.
pub(super) const LIVE: &str = concat!(
    "SELECT state IN ('pending', 'claimed') AND expires_at > ",
    now!(),
    " FROM idempotency_keys WHERE key = ?1"
);

/// `?1` key.
pub(super) const FORGET: &str = "DELETE FROM idempotency_keys WHERE key = ?1";

/// `?1` key, `?2` new token, `?3` outcome, `?4` ttl in ms.
pub(super) const RESOLVE: &str = concat!(
    "UPDATE idempotency_keys SET state = 'done', token = ?2, outcome = ?3, expires_at = ",
    now!(),
    " + ?4 WHERE key = ?1"
);

/// `?1` the cursor's `expires_at`, `?2` its key, `?3` how many. Two ordered, limited scans
/// (the partial index on unknown outcomes, the index on `expires_at` for pending rows whose
/// lease passed) merged: never the whole table.
pub(super) const LIST: &str = concat!(
    "SELECT ",
    admin_columns!(),
    " FROM (
         SELECT * FROM (SELECT * FROM idempotency_keys WHERE ",
    unknown!(),
    " AND expires_at > ",
    now!(),
    " AND (expires_at, key) > (?1, ?2) ORDER BY expires_at, key LIMIT ?3)
         UNION ALL
         SELECT * FROM (SELECT * FROM idempotency_keys WHERE state = 'pending' AND expires_at <= ",
    now!(),
    " AND (expires_at, key) > (?1, ?2) ORDER BY expires_at, key LIMIT ?3)
     ) ORDER BY expires_at, key LIMIT ?3"
);
