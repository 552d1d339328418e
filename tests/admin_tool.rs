//! The operator tool `idempotency-admin`, run as a process (the binary cargo builds for the
//! tests, as `cargo install --features cli` builds it) against each store: `list` shows a
//! key of unknown delivery and a stale key, `show`, `forget` and `resolve` change what the
//! store holds, the outbox's dead letters are listed and requeued by key, and the exit codes
//! are those the usage documents (usage error, not found, unreachable store, refused).
//!
//! The SQLite cases and the cases without a store run everywhere; the Redis, PostgreSQL and
//! MySQL ones are reported as ignored when their server did not answer as the suite was built
//! (see `support::stores`), the Sentinel one, on a group of its own, when `redis-server` is
//! missing.
#![cfg(feature = "cli")]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::stores::{SqliteDir, fp, until_expired};
use tower_idempotency::layer::{KeyForm, StoredKeys};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use tower_idempotency::outbox::Outbox;
use tower_idempotency::store::Reservation;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{Outcome, SendError, SqliteStore};

/// The binary under test.
const TOOL: &str = env!("CARGO_BIN_EXE_idempotency-admin");

/// Every run of the tool is bounded by this.
const RUN_BOUND: Duration = Duration::from_secs(60);

/// The exit codes the usage documents.
const DONE: i32 = 0;
const USAGE: i32 = 1;
const NOT_FOUND: i32 = 2;
const STORE_FAILED: i32 = 3;
const REFUSED: i32 = 4;

/// What a run of the tool answered.
#[derive(Debug)]
struct Ran {
    code: i32,
    out: String,
    err: String,
}

/// Runs the tool with `store` (the store's options) and then `line`, split at whitespace.
async fn tool(store: &[String], line: &str) -> Ran {
    tool_with_env(store, line, &[]).await
}

/// [`tool`] with the environment variables `env` set.
async fn tool_with_env(store: &[String], line: &str, env: &[(&str, &str)]) -> Ran {
    let args: Vec<String> = store
        .iter()
        .cloned()
        .chain(line.split_whitespace().map(str::to_owned))
        .collect();
    let child = Command::new(TOOL)
        .args(&args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the tool starts");
    let pid = child.id();
    let waited = tokio::time::timeout(
        RUN_BOUND,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    let Ok(output) = waited else {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        panic!(
            "`idempotency-admin {}` ran longer than {RUN_BOUND:?}",
            args.join(" ")
        );
    };
    let output = output
        .expect("the waiting thread")
        .expect("the tool's output");
    Ran {
        code: output
            .status
            .code()
            .unwrap_or_else(|| panic!("the tool was killed: {:?}", output.status)),
        out: String::from_utf8(output.stdout).expect("UTF-8 output"),
        err: String::from_utf8(output.stderr).expect("UTF-8 errors"),
    }
}

/// A key of unknown delivery: a send that timed out after the request left.
async fn unknown_key(store: &dyn StoreAdmin, key: &str) {
    let Reservation::Reserved { token } = store
        .reserve(key, fp(1), Duration::from_secs(60))
        .await
        .expect("reserve")
    else {
        panic!("{key} was not free")
    };
    let timeout = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
    assert!(
        store
            .complete(key, token, fp(1), &timeout, Duration::from_secs(3600))
            .await
            .expect("complete")
    );
}

/// A stale key: a send that reserved and crashed, its lease then passed on the store's clock.
async fn stale_key(store: &dyn StoreAdmin, key: &str) {
    store
        .reserve(key, fp(2), Duration::from_millis(200))
        .await
        .expect("reserve");
    until_expired(store, &[key]).await;
}

/// The keys `list` printed, with their state column.
fn listed(out: &str) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = out
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| {
            let mut fields = line.split('\t');
            let key = fields.next().unwrap_or_default().to_owned();
            let state = fields.next().unwrap_or_default().to_owned();
            (key, state)
        })
        .collect();
    keys.sort();
    keys
}

/// The same story on every store: `list` shows the unknown and the stale key (not the live
/// one), and each command's answer and exit code, checked against what the store then holds.
async fn settles_keys_by_hand(store: &dyn StoreAdmin, options: &[String]) {
    unknown_key(store, "ns:unknown").await;
    stale_key(store, "ns:stale").await;
    store
        .reserve("ns:live", fp(3), Duration::from_secs(600))
        .await
        .expect("reserve");

    let ran = tool(options, "list --all").await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert_eq!(
        listed(&ran.out),
        [
            ("ns:stale".to_owned(), "stale".to_owned()),
            ("ns:unknown".to_owned(), "done".to_owned())
        ],
        "{ran:?}"
    );
    assert!(
        ran.out.contains("unknown delivery: provider.timeout"),
        "{ran:?}"
    );

    let ran = tool(options, "--namespace ns show unknown").await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert!(ran.out.contains("key:         ns:unknown"), "{ran:?}");
    assert!(ran.out.contains("state:       done"), "{ran:?}");
    assert!(ran.out.contains(&fp(1).to_string()), "{ran:?}");
    let ran = tool(options, "show ns:stale").await;
    assert!(ran.out.contains("stale:       yes"), "{ran:?}");
    let ran = tool(options, "show ns:nothing").await;
    assert_eq!(ran.code, NOT_FOUND, "{ran:?}");
    assert!(ran.err.contains("no record"), "{ran:?}");

    // A live send's key is refused without --force, and left as it was.
    let ran = tool(options, "forget ns:live").await;
    assert_eq!(ran.code, REFUSED, "{ran:?}");
    assert!(ran.err.contains("--force"), "{ran:?}");
    assert!(store.inspect("ns:live").await.unwrap().is_some());
    let ran = tool(options, "resolve ns:live not-sent").await;
    assert_eq!(ran.code, REFUSED, "{ran:?}");
    let ran = tool(options, "forget ns:live --force").await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert!(store.inspect("ns:live").await.unwrap().is_none());
    let ran = tool(options, "forget ns:live").await;
    assert_eq!(ran.code, NOT_FOUND, "{ran:?}");

    let ran = tool(
        options,
        "resolve ns:unknown delivered msg_81 --transport resend --ttl 3600",
    )
    .await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    let record = store.inspect("ns:unknown").await.unwrap().expect("kept");
    let receipt = record.outcome.as_ref().and_then(|o| o.receipt()).cloned();
    assert_eq!(
        receipt.map(|r| (r.id, r.transport)),
        Some(("msg_81".to_owned(), "resend".to_owned()))
    );
    assert_eq!(
        record.fingerprint,
        fp(1),
        "the record's fingerprint is kept"
    );

    let ran = tool(options, "resolve ns:stale not-sent").await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert!(store.inspect("ns:stale").await.unwrap().is_none());
    let ran = tool(options, "resolve ns:stale delivered m").await;
    assert_eq!(ran.code, NOT_FOUND, "{ran:?}");

    // Every page: on Redis one page scans a bounded part of the keyspace, so on a server
    // holding many other keys the first page may be empty with a cursor to go on.
    let ran = tool(options, "list --all").await;
    assert_eq!((ran.code, ran.out.as_str()), (DONE, ""), "{ran:?}");
}

/// The dead message the outbox stories plant, as a refused send leaves it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const DEAD_KEY: &str = "order:1";
/// Its last error.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const DEAD_ERROR: &str = "provider.rejected (permanent): refused";
/// The message beside it, waiting.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const WAITING_KEY: &str = "order:2";

/// The same story on each database's outbox, which holds [`DEAD_KEY`], given up after three
/// attempts with [`DEAD_ERROR`], and [`WAITING_KEY`]: `dead-letters list` shows the dead one
/// only, `requeue` puts it back to waiting, and a key without a dead letter is not found.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn requeues_dead_letters_by_key(outbox: &Outbox, options: &[String]) {
    let ran = tool(options, "dead-letters list").await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert_eq!(ran.out, format!("{DEAD_KEY}\t3\t{DEAD_ERROR}\n"), "{ran:?}");

    let ran = tool(options, &format!("dead-letters requeue {DEAD_KEY}")).await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    let counts = outbox.counts().await.unwrap();
    assert_eq!((counts.waiting, counts.dead), (2, 0), "{counts:?}");
    let ran = tool(options, "dead-letters list").await;
    assert_eq!((ran.code, ran.out.as_str()), (DONE, ""), "{ran:?}");

    // A key whose row is waiting, and a key with no row: nothing to requeue.
    for key in [DEAD_KEY, WAITING_KEY, "order:3"] {
        let ran = tool(options, &format!("dead-letters requeue {key}")).await;
        assert_eq!(ran.code, NOT_FOUND, "{key}: {ran:?}");
    }
}

fn sqlite_options(path: &Path) -> Vec<String> {
    vec!["--sqlite".to_owned(), path.display().to_string()]
}

#[tokio::test]
async fn the_tool_settles_keys_on_a_sqlite_store() {
    let dir = SqliteDir::new("admin_tool");
    let store = SqliteStore::open(dir.file()).await.expect("open");
    settles_keys_by_hand(&store, &sqlite_options(&dir.file())).await;
}

#[tokio::test]
async fn the_tool_finds_a_hashed_key_from_the_message_key() {
    let dir = SqliteDir::new("admin_tool_hashed");
    let store = SqliteStore::open(dir.file()).await.expect("open");
    let stored = StoredKeys::new("alerts", KeyForm::Hashed)
        .unwrap()
        .of("order.created:ord_1:email")
        .unwrap();
    unknown_key(&store, &stored).await;
    let options = sqlite_options(&dir.file());
    let ran = tool(
        &options,
        "--namespace alerts --hashed show order.created:ord_1:email",
    )
    .await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert!(
        ran.out.contains(&format!("key:         {stored}")),
        "{ran:?}"
    );
    let ran = tool(
        &options,
        "--namespace alerts show order.created:ord_1:email",
    )
    .await;
    assert_eq!(ran.code, NOT_FOUND, "the raw form is another key: {ran:?}");
}

#[tokio::test]
async fn a_store_location_can_come_from_the_environment() {
    let dir = SqliteDir::new("admin_tool_env");
    let store = SqliteStore::open(dir.file()).await.expect("open");
    unknown_key(&store, "ns:from-env").await;
    let file = dir.file().display().to_string();
    let ran = tool_with_env(
        &[],
        "--sqlite env:ADMIN_TOOL_STORE show ns:from-env",
        &[("ADMIN_TOOL_STORE", file.as_str())],
    )
    .await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert!(ran.out.contains("key:         ns:from-env"), "{ran:?}");
    let ran = tool(&[], "--sqlite env:ADMIN_TOOL_STORE_UNSET show ns:from-env").await;
    assert_eq!(ran.code, USAGE, "{ran:?}");
    assert!(
        ran.err.contains("ADMIN_TOOL_STORE_UNSET is not set"),
        "{ran:?}"
    );
}

#[tokio::test]
async fn the_tool_creates_nothing_in_a_file_that_is_not_a_store() {
    let dir = SqliteDir::new("admin_tool_not_a_store");

    let missing = dir.0.join("missing.sqlite3");
    let ran = tool(&sqlite_options(&missing), "list").await;
    assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
    assert!(ran.err.contains("existing SQLite store only"), "{ran:?}");
    assert!(!missing.exists(), "the tool created {}", missing.display());

    let text = dir.0.join("notes.txt");
    std::fs::write(&text, "not a database, and longer than a SQLite header is").unwrap();
    let ran = tool(&sqlite_options(&text), "list").await;
    assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
    assert!(ran.err.contains("is not a SQLite store"), "{ran:?}");
    assert_eq!(
        std::fs::read_to_string(&text).unwrap(),
        "not a database, and longer than a SQLite header is"
    );

    // Another application's database: refused, and left without the store's table.
    let other = dir.0.join("app.sqlite3");
    let app = rusqlite::Connection::open(&other).unwrap();
    app.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .unwrap();
    let ran = tool(&sqlite_options(&other), "forget ns:key --force").await;
    assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
    assert!(ran.err.contains("has no idempotency_keys table"), "{ran:?}");
    let tables: Vec<String> = app
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(tables, ["orders"]);

    let ran = tool(&sqlite_options(&dir.0), "list").await;
    assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
    assert!(ran.err.contains("is a directory"), "{ran:?}");
}

#[tokio::test]
async fn usage_errors_and_help_have_their_exit_codes() {
    let ran = tool(&[], "").await;
    assert_eq!(ran.code, USAGE, "{ran:?}");
    assert!(ran.err.contains("error: no command"), "{ran:?}");
    assert!(ran.err.contains("--help"), "{ran:?}");

    for line in [
        "list",
        "--sqlite f show",
        "--sqlite f resolve k maybe",
        "--sqlite f dead-letters list",
        "--redis redis://127.0.0.1:6379 --table t list",
        "--postgres postgres://x --namespace ns dead-letters requeue k",
        "--sqlite f list --colour",
        "--mysql mysql://127.0.0.1 --prefix p list",
        "--mysql mysql://127.0.0.1 --namespace ns dead-letters list",
        "--redis-sentinel redis://127.0.0.1:26379 list",
        "--redis redis://127.0.0.1:6379 --primary-name mymaster list",
    ] {
        let ran = tool(&[], line).await;
        assert_eq!(ran.code, USAGE, "{line}: {ran:?}");
        assert!(ran.out.is_empty(), "{line}: {ran:?}");
    }

    let ran = tool(&[], "--help").await;
    assert_eq!(ran.code, DONE, "{ran:?}");
    assert!(ran.out.starts_with("idempotency-admin:"), "{ran:?}");
    assert!(ran.out.contains("exit codes:"), "{ran:?}");
    let ran = tool(&[], "--version").await;
    assert_eq!(
        ran.out.trim(),
        format!("idempotency-admin {}", env!("CARGO_PKG_VERSION"))
    );
}

/// A loopback port nobody listens on: bound, then closed.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn an_unreachable_store_is_a_store_error() {
    let port = closed_port();
    for (options, what) in [
        (format!("--redis redis://127.0.0.1:{port}"), "Redis"),
        (
            format!("--postgres postgres://postgres@127.0.0.1:{port}/test"),
            "PostgreSQL",
        ),
        (
            format!("--mysql mysql://root@127.0.0.1:{port}/test"),
            "MySQL",
        ),
    ] {
        let ran = tool(&[], &format!("{options} list")).await;
        assert_eq!(ran.code, STORE_FAILED, "{options}: {ran:?}");
        assert!(
            ran.err.contains(&format!("could not open {what}")),
            "{options}: {ran:?}"
        );
    }
    for options in [
        format!("--postgres postgres://postgres@127.0.0.1:{port}/test"),
        format!("--mysql mysql://root@127.0.0.1:{port}/test"),
    ] {
        let ran = tool(&[], &format!("{options} dead-letters list")).await;
        assert_eq!(ran.code, STORE_FAILED, "{options}: {ran:?}");
    }
    // A sentinel address that is no URL is named by its place, not its text (it may hold a
    // password); one that is closed is a store error too.
    let line = format!("--redis-sentinel redis://127.0.0.1:{port},s3cret@x --primary-name m list");
    let ran = tool(&[], &line).await;
    assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
    assert!(ran.err.contains("address 2 of 2"), "{ran:?}");
    assert!(!ran.err.contains("s3cret"), "{ran:?}");
    let line = format!("--redis-sentinel redis://127.0.0.1:{port} --primary-name m list");
    let ran = tool(&[], &line).await;
    assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
    assert!(
        ran.err.contains("could not open the Redis primary \"m\""),
        "{ran:?}"
    );
}

/// Whatever the URL, the option picks the database: a mistyped scheme, or another database's
/// URL, is refused before anything connects (the port is closed: a connection attempt would
/// say so instead), and the password stays out of the message.
#[tokio::test]
async fn a_url_not_of_the_options_database_is_a_store_error() {
    let port = closed_port();
    for (options, option) in [
        (
            format!("--mysql mysq://root:s3cret@127.0.0.1:{port}/test"),
            "--mysql",
        ),
        (
            format!("--mysql postgres://root:s3cret@127.0.0.1:{port}/test"),
            "--mysql",
        ),
        (
            format!("--postgres mysql://root:s3cret@127.0.0.1:{port}/test"),
            "--postgres",
        ),
        (
            format!("--postgres postgress://root:s3cret@127.0.0.1:{port}/test"),
            "--postgres",
        ),
    ] {
        for command in ["list", "dead-letters list"] {
            let ran = tool(&[], &format!("{options} {command}")).await;
            assert_eq!(ran.code, STORE_FAILED, "{options} {command}: {ran:?}");
            assert!(
                ran.err.contains(&format!("{option} takes a URL such as")),
                "{options} {command}: {ran:?}"
            );
            assert!(!ran.err.contains("s3cret"), "{options} {command}: {ran:?}");
        }
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use support::stores::{backend_url, unique_prefix};
    use tower_idempotency::RedisStore;

    #[tokio::test]
    #[cfg_attr(
        not(backend_redis),
        ignore = "no Redis at REDIS_URL or redis://127.0.0.1:6379"
    )]
    async fn the_tool_settles_keys_on_a_redis_store() {
        let Some(url) = backend_url("REDIS_URL") else {
            return;
        };
        let prefix = unique_prefix("admin_tool");
        let store = RedisStore::connect(&url)
            .await
            .expect("connect")
            .key_prefix(prefix.clone());
        let options = vec!["--redis".to_owned(), url, "--prefix".to_owned(), prefix];
        settles_keys_by_hand(&store, &options).await;
    }

    #[cfg(feature = "redis-cluster")]
    #[tokio::test]
    #[cfg_attr(
        not(backend_redis_cluster),
        ignore = "no Redis Cluster at REDIS_CLUSTER_URLS or 127.0.0.1:7001-7003"
    )]
    async fn the_tool_settles_keys_on_a_redis_cluster_store() {
        let Some(urls) = backend_url("REDIS_CLUSTER_URLS") else {
            return;
        };
        let prefix = unique_prefix("admin_tool_cluster");
        let store = RedisStore::connect_cluster(urls.split(','))
            .await
            .expect("connect")
            .key_prefix(prefix.clone());
        let options = vec![
            "--redis-cluster".to_owned(),
            urls,
            "--prefix".to_owned(),
            prefix,
        ];
        settles_keys_by_hand(&store, &options).await;
    }

    /// Through the sentinels of a group of the test's own: the story on the primary they
    /// name, and a name they do not know is a store error that names it.
    #[cfg(feature = "redis-sentinel")]
    #[tokio::test]
    #[cfg_attr(
        not(backend_redis_binaries),
        ignore = "no redis-server and redis-cli on PATH"
    )]
    async fn the_tool_settles_keys_through_redis_sentinel() {
        use support::servers::sentinel::{PRIMARY_NAME, SentinelGroup};

        let Some(group) = SentinelGroup::start(0).await else {
            return;
        };
        let prefix = unique_prefix("admin_tool_sentinel");
        let store = group.store(prefix.clone(), Duration::from_secs(2)).await;
        let sentinels = group.sentinel_urls().join(",");
        let options = [
            "--redis-sentinel",
            &sentinels,
            "--primary-name",
            PRIMARY_NAME,
            "--prefix",
            &prefix,
        ]
        .map(str::to_owned);
        settles_keys_by_hand(&store, &options).await;

        let line = format!("--redis-sentinel {sentinels} --primary-name no-such-primary list");
        let ran = tool(&[], &line).await;
        assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
        assert!(ran.err.contains("\"no-such-primary\""), "{ran:?}");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use support::message;
    use support::stores::postgres_admin::{admin, drop_table};
    use support::stores::{backend_url, unique};
    use tower_idempotency::PostgresStore;

    #[tokio::test]
    #[cfg_attr(
        not(backend_postgres),
        ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
    )]
    async fn the_tool_settles_keys_on_a_postgres_store() {
        let Some(url) = backend_url("DATABASE_URL") else {
            return;
        };
        let table = unique("admin_tool");
        let store = PostgresStore::connect(&url)
            .await
            .expect("connect")
            .table(&table)
            .expect("valid table name");
        store.migrate().await.expect("migrate");
        let options = vec![
            "--postgres".to_owned(),
            url.clone(),
            "--table".to_owned(),
            table.clone(),
        ];
        settles_keys_by_hand(&store, &options).await;
        drop_table(&url, &table).await;

        // A table that is not there is a store error, and stays absent.
        let ran = tool(&options, "list").await;
        assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
        let exists: bool = admin(&url)
            .await
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .await
            .unwrap()
            .get(0);
        assert!(!exists, "the tool created the table");
    }

    #[tokio::test]
    #[cfg_attr(
        not(backend_postgres),
        ignore = "no PostgreSQL at DATABASE_URL or postgres://postgres@127.0.0.1:5432/test"
    )]
    async fn the_tool_lists_and_requeues_dead_letters_by_key() {
        let Some(url) = backend_url("DATABASE_URL") else {
            return;
        };
        let table = unique("admin_tool_outbox");
        let outbox = Outbox::connect(&url)
            .await
            .expect("connect")
            .table(&table)
            .expect("valid table name");
        outbox.migrate().await.expect("migrate");
        let mut client = admin(&url).await;
        let tx = client.transaction().await.unwrap();
        for key in [DEAD_KEY, WAITING_KEY] {
            outbox
                .enqueue(&tx, &message(Some(key), "New order"))
                .await
                .expect("enqueue");
        }
        tx.commit().await.unwrap();
        // A worker gave the message up: the state a refused send leaves, written around the
        // outbox as the worker writes it.
        client
            .execute(
                &format!(
                    "UPDATE \"{table}\" SET state = 'dead', attempts = 3, finished_at = now(), \
                     last_error = $2 WHERE key = $1"
                ),
                &[&DEAD_KEY, &DEAD_ERROR],
            )
            .await
            .unwrap();
        let options = vec![
            "--postgres".to_owned(),
            url.clone(),
            "--outbox-table".to_owned(),
            table.clone(),
        ];
        requeues_dead_letters_by_key(&outbox, &options).await;
        drop_table(&url, &table).await;

        let ran = tool(&options, "dead-letters list").await;
        assert_eq!(ran.code, STORE_FAILED, "a missing outbox table: {ran:?}");
        assert!(ran.err.contains("does not exist"), "{ran:?}");
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use mysql_async::TxOpts;
    use mysql_async::prelude::Queryable;
    use support::message;
    use support::stores::mysql_admin::{admin, drop_table};
    use support::stores::{backend_url, unique};
    use tower_idempotency::MySqlStore;

    /// Whether `table` exists on the server at `url`.
    async fn table_exists(url: &str, table: &str) -> bool {
        let pool = admin(url);
        let mut conn = pool.get_conn().await.expect("admin connection");
        let found: Option<u64> = conn
            .exec_first(
                "SELECT count(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = ?",
                (table,),
            )
            .await
            .expect("information_schema");
        drop(conn);
        pool.disconnect().await.expect("disconnect");
        found.unwrap_or(0) > 0
    }

    #[tokio::test]
    #[cfg_attr(
        not(backend_mysql),
        ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
    )]
    async fn the_tool_settles_keys_on_a_mysql_store() {
        let Some(url) = backend_url("MYSQL_URL") else {
            return;
        };
        let table = unique("admin_tool");
        let store = MySqlStore::connect(&url)
            .await
            .expect("connect")
            .table(&table)
            .expect("valid table name");
        store.migrate().await.expect("migrate");
        let options = vec![
            "--mysql".to_owned(),
            url.clone(),
            "--table".to_owned(),
            table.clone(),
        ];
        settles_keys_by_hand(&store, &options).await;
        drop_table(&url, &table).await;

        // A table that is not there is a store error, and stays absent.
        let ran = tool(&options, "list").await;
        assert_eq!(ran.code, STORE_FAILED, "{ran:?}");
        assert!(
            !table_exists(&url, &table).await,
            "the tool created the table"
        );
    }

    #[tokio::test]
    #[cfg_attr(
        not(backend_mysql),
        ignore = "no MySQL or MariaDB at MYSQL_URL or mysql://root@127.0.0.1:3306/test"
    )]
    async fn the_tool_lists_and_requeues_dead_letters_by_key_on_mysql() {
        let Some(url) = backend_url("MYSQL_URL") else {
            return;
        };
        let table = unique("admin_tool_outbox");
        let outbox = Outbox::connect(&url)
            .await
            .expect("connect")
            .table(&table)
            .expect("valid table name");
        outbox.migrate().await.expect("migrate");
        let pool = admin(&url);
        let mut tx = pool
            .start_transaction(TxOpts::default())
            .await
            .expect("begin");
        for key in [DEAD_KEY, WAITING_KEY] {
            outbox
                .enqueue_mysql(&mut tx, &message(Some(key), "New order"))
                .await
                .expect("enqueue");
        }
        tx.commit().await.expect("commit");
        // A worker gave the message up: the state a refused send leaves, written around the
        // outbox as the worker writes it.
        let mut conn = pool.get_conn().await.expect("admin connection");
        conn.exec_drop(
            format!(
                "UPDATE `{table}` SET state = 'dead', attempts = 3, \
                 finished_at = UTC_TIMESTAMP(6), last_error = ? WHERE `key` = ?"
            ),
            (DEAD_ERROR, DEAD_KEY),
        )
        .await
        .expect("plant the dead letter");
        drop(conn);
        pool.disconnect().await.expect("disconnect");
        let options = vec![
            "--mysql".to_owned(),
            url.clone(),
            "--outbox-table".to_owned(),
            table.clone(),
        ];
        requeues_dead_letters_by_key(&outbox, &options).await;
        drop_table(&url, &table).await;

        let ran = tool(&options, "dead-letters list").await;
        assert_eq!(ran.code, STORE_FAILED, "a missing outbox table: {ran:?}");
        assert!(ran.err.contains("does not exist"), "{ran:?}");
        assert!(
            !table_exists(&url, &table).await,
            "the tool created the table"
        );
    }
}
