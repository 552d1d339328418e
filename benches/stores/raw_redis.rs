//! The Redis baseline of the benches: what a user would write instead of `RedisStore`,
//! through the same client. A reserve, and a replay, is one `SET key pending NX GET PX lease`;
//! a fresh send then writes its done record with the smallest fenced write, a script that
//! sets it only while the key still holds this send's pending value (a plain `SET` could
//! overwrite a record another send took over). No code of ours runs here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;

const RECEIPT_JSON: &str =
    r#"{"sent":{"id":"msg-1","transport":"bench","accepted":[],"replayed":false}}"#;

/// Sets the done record only while the key holds this send's pending value.
const FENCED_WRITE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

/// The minimal commands, with the fenced write's script loaded on the server.
pub(crate) struct MinimalRedis {
    fenced_write: Script,
    /// A run's own tag, so tokens of two runs never meet.
    run: String,
    next: AtomicU64,
}

impl MinimalRedis {
    /// Loads the fenced write once, as a user's code would at start.
    pub(crate) async fn load(connection: &mut ConnectionManager) -> Self {
        let fenced_write = Script::new(FENCED_WRITE);
        fenced_write
            .prepare_invoke()
            .load_async(connection)
            .await
            .expect("SCRIPT LOAD");
        let run = format!("{:x}", std::process::id() as u64 ^ now_nanos());
        Self {
            fenced_write,
            run,
            next: AtomicU64::new(0),
        }
    }

    /// Reserves `key` with `SET NX GET` and, when it was free, writes its done record:
    /// answers whether it was free.
    pub(crate) async fn send(
        &self,
        connection: &mut ConnectionManager,
        key: &str,
        lease: Duration,
        ttl: Duration,
    ) -> bool {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let pending = format!("pending:{}:{token}", self.run);
        let held: Option<Vec<u8>> = redis::cmd("SET")
            .arg(key)
            .arg(&pending)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(lease.as_millis() as u64)
            .query_async(connection)
            .await
            .expect("SET NX GET");
        if held.is_some() {
            return false;
        }
        let wrote: i64 = self
            .fenced_write
            .key(key)
            .arg(&pending)
            .arg(format!("done:{RECEIPT_JSON}"))
            .arg(ttl.as_millis() as u64)
            .invoke_async(connection)
            .await
            .expect("EVALSHA fenced write");
        assert_eq!(wrote, 1);
        true
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
