//! The outbox table's name, checked, and the SQL text of every statement on it.

use sha2::{Digest, Sha256};

use crate::store::postgres::InvalidTableName;
use crate::store::postgres::sql::split_table_name;

/// The statements on one outbox table, written once when the table is named.
pub(super) struct OutboxSql {
    pub(super) name: String,
    /// The `LISTEN`/`pg_notify` channel: derived from the name, at most 63 bytes.
    pub(super) channel: String,
    pub(super) migrate: String,
    pub(super) enqueue: String,
    pub(super) claim: String,
    pub(super) mark: String,
    pub(super) release: String,
    pub(super) lag: String,
    pub(super) counts: String,
    pub(super) dead_letters: String,
    pub(super) requeue: String,
    pub(super) purge: String,
}

impl OutboxSql {
    pub(super) fn new(name: &str) -> Result<Self, InvalidTableName> {
        let (schema, table) = split_table_name(name)?;
        // Checked names need no escaping; quoting keeps keywords usable.
        let quoted = match schema {
            Some(schema) => format!("\"{schema}\".\"{table}\""),
            None => format!("\"{table}\""),
        };
        let digest = Sha256::digest(name.as_bytes());
        let channel: String = std::iter::once("tower_idempotency_outbox_".to_owned())
            .chain(digest[..4].iter().map(|b| format!("{b:02x}")))
            .collect();
        let waiting_index = format!("\"{table}_waiting_idx\"");
        let done_index = format!("\"{table}_done_idx\"");
        let release_claim = "claim_token = NULL, claimed_until = NULL";
        Ok(Self {
            name: name.to_owned(),
            migrate: format!(
                "SELECT pg_advisory_xact_lock(hashtext('tower_idempotency.outbox.migrate'));
                 CREATE TABLE IF NOT EXISTS {quoted} (
                     id            bigserial   PRIMARY KEY,
                     key           text        NOT NULL UNIQUE,
                     message       jsonb       NOT NULL,
                     state         text        NOT NULL DEFAULT 'waiting',
                     attempts      integer     NOT NULL DEFAULT 0,
                     available_at  timestamptz NOT NULL DEFAULT now(),
                     claim_token   uuid,
                     claimed_until timestamptz,
                     enqueued_at   timestamptz NOT NULL DEFAULT now(),
                     finished_at   timestamptz,
                     provider_id   text,
                     transport     text,
                     last_error    text
                 );
                 CREATE INDEX IF NOT EXISTS {waiting_index} ON {quoted} (available_at, id)
                     WHERE state = 'waiting';
                 CREATE INDEX IF NOT EXISTS {done_index} ON {quoted} (finished_at)
                     WHERE state = 'done';"
            ),
            // The notification is sent when the caller's transaction commits, and only if a
            // row was inserted: a repeated key changes nothing and wakes nobody.
            enqueue: format!(
                "WITH inserted AS (
                     INSERT INTO {quoted} (key, message) VALUES ($1, $2::text::jsonb)
                     ON CONFLICT (key) DO NOTHING
                     RETURNING id
                 )
                 SELECT inserted.id, pg_notify($3, '')::text FROM inserted"
            ),
            // SKIP LOCKED: concurrent workers each take rows nobody else is taking. The claim
            // is a lease (`claimed_until`), not a held transaction, so a worker that dies
            // frees its rows when the lease passes, and the send runs with no open
            // transaction. `waited_ms` is how long each row had been ready: the lag.
            claim: format!(
                "UPDATE {quoted} AS o
                 SET claim_token = $1,
                     claimed_until = now() + $2::bigint * interval '1 millisecond',
                     attempts = o.attempts + 1
                 WHERE o.id IN (
                     SELECT id FROM {quoted}
                     WHERE state = 'waiting' AND available_at <= now()
                       AND (claimed_until IS NULL OR claimed_until <= now())
                     ORDER BY available_at, id
                     LIMIT $3
                     FOR UPDATE SKIP LOCKED
                 )
                 RETURNING o.id, o.message::text, o.attempts,
                     (extract(epoch FROM now() - o.available_at) * 1000)::bigint"
            ),
            // The answers of many sends in one statement, one array element per row. Every
            // row is fenced by its claim's token: a worker whose lease passed, and whose row
            // another claim took, changes nothing, and RETURNING names the claims it recorded.
            // A row put back (`waiting`) waits `after_ms`; a finished one (`done`, `dead`)
            // keeps the time it finished.
            mark: format!(
                "UPDATE {quoted} AS o
                 SET state = m.state,
                     available_at = CASE WHEN m.state = 'waiting'
                         THEN now() + m.after_ms * interval '1 millisecond'
                         ELSE o.available_at END,
                     finished_at = CASE WHEN m.state = 'waiting' THEN NULL ELSE now() END,
                     provider_id = m.provider_id, transport = m.transport,
                     last_error = m.last_error, {release_claim}
                 FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::text[],
                             $6::text[], $7::bigint[])
                     AS m(id, token, state, provider_id, transport, last_error, after_ms)
                 WHERE o.id = m.id AND o.claim_token = m.token
                 RETURNING m.id, m.token"
            ),
            // Rows claimed but not sent go back as they were, attempt uncounted.
            release: format!(
                "UPDATE {quoted} AS o
                 SET attempts = greatest(o.attempts - 1, 0), {release_claim}
                 FROM unnest($1::bigint[], $2::uuid[]) AS r(id, token)
                 WHERE o.id = r.id AND o.claim_token = r.token"
            ),
            lag: format!(
                "SELECT (extract(epoch FROM now() - min(available_at)) * 1000)::bigint
                 FROM {quoted} WHERE state = 'waiting' AND available_at <= now()"
            ),
            counts: format!("SELECT state, count(*) FROM {quoted} GROUP BY state"),
            dead_letters: format!(
                "SELECT id, key, attempts, last_error FROM {quoted}
                 WHERE state = 'dead' ORDER BY id LIMIT $1"
            ),
            requeue: format!(
                "WITH requeued AS (
                     UPDATE {quoted} SET state = 'waiting', attempts = 0, available_at = now(),
                         finished_at = NULL, {release_claim}
                     WHERE key = $1 AND state = 'dead'
                     RETURNING id
                 )
                 SELECT requeued.id, pg_notify($2, '')::text FROM requeued"
            ),
            purge: format!(
                "DELETE FROM {quoted} WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM {quoted}
                     WHERE state = 'done'
                       AND finished_at <= now() - $1::bigint * interval '1 millisecond'
                     LIMIT $2 FOR UPDATE SKIP LOCKED))"
            ),
            channel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_short_stable_and_per_table() {
        let a = OutboxSql::new("outbox").unwrap();
        let b = OutboxSql::new("app.outbox").unwrap();
        assert_eq!(a.channel, OutboxSql::new("outbox").unwrap().channel);
        assert_ne!(a.channel, b.channel);
        assert!(a.channel.len() <= 63);
        assert!(OutboxSql::new("Out-box").is_err());
    }
}
