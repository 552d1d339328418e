//! The listing of stale pending keys: pending records whose lease passed (a crashed or lost
//! send), found by `SCAN` over the store's prefix, on every primary of a cluster. See
//! [Settling a key by hand](super#settling-a-key-by-hand).
//!
//! A pending record is written by one `SET NX`, so indexing it would add a write to every
//! reserve; a listing, which an operator or a reconciler runs now and then, reads the
//! keyspace instead.

use redis::{Cmd, Script};

use super::inspect::{inspected, raw_value};
use super::{Connection, RedisStore, server_error};
use crate::store::admin::{Cursor, Inspected, Page};
use crate::store::{StoreError, StoreErrorKind};

/// What starts a cursor of the stale listing: `stale:<scan cursor>:<keys done>:<node>`.
const STALE: &str = "stale:";

/// How many slots one `SCAN` call looks at.
const SCAN_COUNT: usize = 1000;

/// How many `SCAN` calls one page makes at most before it answers with what it found: a page
/// may hold fewer entries than asked, even none, with a cursor to go on.
const SCANS_PER_PAGE: usize = 16;

/// The Lua script that reads a key when it holds a pending record: `{1, value, pttl}`, else
/// `{0}`. Done records, the bulk of a keyspace, are not sent back.
const PENDING_SCRIPT: &str = r"
local current = redis.pcall('GET', KEYS[1])
if type(current) ~= 'string' or string.byte(current, 1) ~= 2
    or string.sub(current, 2, 2) ~= 'P' then
  return {0}
end
return {1, current, redis.call('PTTL', KEYS[1])}
";

/// The script of the stale listing.
pub(super) fn pending_script() -> Script {
    Script::new(PENDING_SCRIPT)
}

/// Where a stale listing stands: the `SCAN` cursor on a node, and how many keys of the batch
/// that cursor answers were already read.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Position {
    scan: u64,
    done: usize,
    /// The node's address on a cluster; empty on one node.
    node: String,
}

impl Position {
    fn start(node: String) -> Self {
        Self {
            scan: 0,
            done: 0,
            node,
        }
    }

    /// The position `cursor` names, `None` when it is not a cursor of the stale listing.
    pub(super) fn of(cursor: &Cursor) -> Option<Result<Self, StoreError>> {
        let rest = cursor.as_str().strip_prefix(STALE)?;
        let mut parts = rest.splitn(3, ':');
        let position = (|| {
            let scan = parts.next()?.parse().ok()?;
            let done = parts.next()?.parse().ok()?;
            let node = parts.next()?.to_owned();
            Some(Self { scan, done, node })
        })();
        Some(position.ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::InvalidInput,
                format!("{cursor:?} is not a cursor of this store"),
            )
        }))
    }

    fn cursor(&self) -> Cursor {
        Cursor::new(format!("{STALE}{}:{}:{}", self.scan, self.done, self.node))
    }
}

/// `pattern` with the characters `SCAN MATCH` reads as a glob escaped.
fn glob_escaped(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

impl RedisStore {
    /// The nodes a listing scans, in a fixed order: the one server (named by an empty
    /// address; under Sentinel, the primary), or every primary of a cluster.
    async fn scanned_nodes(&self) -> Result<Vec<String>, StoreError> {
        match &self.connection {
            Connection::Single(_) => Ok(vec![String::new()]),
            #[cfg(feature = "redis-sentinel")]
            Connection::Sentinel(_) => Ok(vec![String::new()]),
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let reply = connection
                    .route_command(
                        redis::cmd("PING"),
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await
                    .map_err(server_error)?;
                let redis::Value::Map(nodes) = reply else {
                    return Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "the cluster did not name its primaries",
                    ));
                };
                let mut nodes: Vec<String> = nodes
                    .into_iter()
                    .filter_map(|(address, _)| redis::from_redis_value(address).ok())
                    .collect();
                nodes.sort();
                Ok(nodes)
            }
        }
    }

    /// One `SCAN` on `node` (ignored on one server): the next cursor and the keys of this
    /// batch.
    #[cfg_attr(not(feature = "redis-cluster"), allow(unused_variables))]
    async fn scan(&self, node: &str, at: u64) -> Result<(u64, Vec<String>), StoreError> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(at)
            .arg("MATCH")
            .arg(glob_escaped(&self.prefix))
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg("string");
        let reply = match &self.connection {
            Connection::Single(_) => self.run(&cmd).await?,
            #[cfg(feature = "redis-sentinel")]
            Connection::Sentinel(_) => self.run(&cmd).await?,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let (host, port) = node
                    .rsplit_once(':')
                    .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
                    .ok_or_else(|| {
                        StoreError::new(
                            StoreErrorKind::InvalidInput,
                            format!("{node:?} is not a node of this cluster"),
                        )
                    })?;
                connection
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port }),
                    )
                    .await
                    .map_err(server_error)?
            }
        };
        let reply = reply.extract_error().map_err(server_error)?;
        let (next, keys): (String, Vec<Vec<u8>>) =
            redis::from_redis_value(reply).map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the server answered a SCAN with something unexpected",
                )
            })?;
        let next = next.parse().map_err(|_| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                "the server answered a SCAN with a cursor that is not a number",
            )
        })?;
        // A key that is not UTF-8 is none of this store's.
        let keys = keys
            .into_iter()
            .map(|key| String::from_utf8(key).unwrap_or_default())
            .collect();
        Ok((next, keys))
    }

    /// A page of stale pending keys from `from` (the start when `None`). The page's cursor
    /// goes on with the stale listing, or, once every node was scanned, with `then`.
    pub(super) async fn list_stale(
        &self,
        from: Option<Position>,
        limit: usize,
        then: Cursor,
    ) -> Result<Page, StoreError> {
        let nodes = self.scanned_nodes().await?;
        let mut at = match from {
            Some(position) => position,
            None => match nodes.first() {
                Some(node) => Position::start(node.clone()),
                None => return Ok(Page::new(Vec::new(), Some(then))),
            },
        };
        let mut entries = Vec::new();
        for _ in 0..SCANS_PER_PAGE {
            let (next, keys) = self.scan(&at.node, at.scan).await?;
            // In the batch's order, so that a place in it names the same key next time.
            let batch: Vec<Option<&str>> = keys
                .iter()
                .skip(at.done)
                .map(|key| key.strip_prefix(&*self.prefix))
                .collect();
            let stale = self.stale_of(&batch).await?;
            let room = limit - entries.len();
            if stale.len() > room {
                // The page is full inside this batch: the next page reads this batch again
                // from the first key not listed yet.
                let (listed, last) = stale[..room]
                    .last()
                    .map_or((0, 0), |(_, at_key)| (room, *at_key));
                entries.extend(stale.into_iter().take(listed).map(|(entry, _)| entry));
                at.done += last + 1;
                return Ok(Page::new(entries, Some(at.cursor())));
            }
            entries.extend(stale.into_iter().map(|(entry, _)| entry));
            at.done = 0;
            at.scan = next;
            if next == 0 {
                // This node is scanned through; the next one, or the rest of the listing.
                let following = nodes
                    .iter()
                    .position(|node| *node == at.node)
                    .and_then(|i| nodes.get(i + 1));
                match following {
                    Some(node) => at = Position::start(node.clone()),
                    None => return Ok(Page::new(entries, Some(then))),
                }
            }
            if entries.len() == limit {
                break;
            }
        }
        Ok(Page::new(entries, Some(at.cursor())))
    }

    /// The stale pending records among `keys` (without the prefix; `None` for a key that is
    /// none of this store's), each with its place in `keys`.
    async fn stale_of(&self, keys: &[Option<&str>]) -> Result<Vec<(Inspected, usize)>, StoreError> {
        let ours: Vec<(usize, &str)> = keys
            .iter()
            .enumerate()
            .filter_map(|(i, key)| Some((i, (*key)?)))
            .collect();
        let reads: Vec<(String, Cmd)> = ours
            .iter()
            .map(|(_, key)| {
                let redis_key = self.redis_key(key);
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.admin.pending.get_hash())
                    .arg(1)
                    .arg(&redis_key);
                (redis_key, cmd)
            })
            .collect();
        let replies = self.send_scripts(&self.admin.pending, &reads).await?;
        let mut stale = Vec::new();
        for ((i, key), reply) in ours.into_iter().zip(replies) {
            // A value that cannot be read is no stale send: `inspect` reports it.
            if let Some((bytes, pttl)) = raw_value(reply?)?
                && let Ok(Some(entry)) = inspected(key, &bytes, pttl)
                && entry.is_stale()
            {
                stale.push((entry, i));
            }
        }
        Ok(stale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_from_its_cursor() {
        for position in [
            Position::start(String::new()),
            Position {
                scan: 1234,
                done: 7,
                node: "127.0.0.1:7001".to_owned(),
            },
        ] {
            assert_eq!(Position::of(&position.cursor()).unwrap().unwrap(), position);
        }
        assert!(Position::of(&Cursor::new("12:key")).is_none());
        let error = Position::of(&Cursor::new("stale:x:0:"))
            .unwrap()
            .unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    }

    #[test]
    fn a_prefix_is_matched_literally() {
        assert_eq!(glob_escaped("idem:"), "idem:*");
        assert_eq!(glob_escaped("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\*");
    }
}
