//! The "raw" Redis baseline of the benches: the commands `RedisStore` sends for a reserve and
//! a complete (`EVALSHA` of each script), through the same client, built with `format!`, with
//! none of our code.

use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::Token;

// TODO(baseline): the raw side ran `RedisStore`'s own Lua scripts, which are private now; it
// needs scripts of its own. Until then each answers an error, so a raw run fails at once
// rather than measuring a script that does nothing.
pub(crate) const RESERVE_SCRIPT: &str = "return redis.error_reply('no raw reserve script yet')";
pub(crate) const COMPLETE_SCRIPT: &str = "return redis.error_reply('no raw complete script yet')";

const RECEIPT_JSON: &str =
    r#"{"sent":{"id":"msg-1","transport":"bench","accepted":[],"replayed":false}}"#;

/// The two scripts, loaded on the server by their first use.
pub(crate) struct RawRedis {
    pub(crate) reserve: Script,
    pub(crate) complete: Script,
}

impl RawRedis {
    /// Reserves `key` and, when it was free, completes it: answers whether it was free.
    pub(crate) async fn send(
        &self,
        connection: &mut ConnectionManager,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
        ttl: Duration,
    ) -> bool {
        let token = Token::new().to_string();
        let pending =
            format!(r#"{{"state":"pending","token":"{token}","fingerprint":"{fingerprint}"}}"#);
        let reserved: Vec<redis::Value> = self
            .reserve
            .key(key)
            .arg(pending)
            .arg(fingerprint.to_string())
            .arg(lease.as_millis() as u64)
            .arg(lease.as_millis() as u64)
            .invoke_async(connection)
            .await
            .expect("EVALSHA reserve");
        if reserved.first() != Some(&redis::Value::Int(0)) {
            return false;
        }
        let done = format!(
            r#"{{"state":"done","token":"{token}","fingerprint":"{fingerprint}","outcome":{RECEIPT_JSON}}}"#
        );
        let wrote: i64 = self
            .complete
            .key(key)
            .arg(&token)
            .arg(done)
            .arg(ttl.as_millis() as u64)
            .invoke_async(connection)
            .await
            .expect("EVALSHA complete");
        assert_eq!(wrote, 1);
        true
    }
}
