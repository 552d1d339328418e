//! A command-line tool to settle keys by hand on a Redis or PostgreSQL store: list the keys
//! whose delivery is unknown, show one, forget it, or resolve it as delivered (with the
//! provider's message id) or as not sent.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example idempotency_admin -- list
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example idempotency_admin -- --namespace billing show invoice:42
//! cargo run --example idempotency_admin -- resolve billing:invoice:42 delivered msg_81
//! ```
//!
//! Run it with `--help` for the whole usage. Exit codes: 0 done, 1 no record under the key,
//! 2 usage error, 3 refused because a live send holds the key (add `--force`), 4 the store
//! failed.
//!
//! The argument parsing and every command run against any `StoreAdmin`, so the tests at the
//! bottom (`cargo test --example idempotency_admin`) run the tool's commands on a
//! `MemoryStore`, while the conformance suite checks the stores' operations themselves.

use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use tower_idempotency::layer::{DEFAULT_TTL, KeyForm, StoredKeys};
use tower_idempotency::store::StoreError;
use tower_idempotency::store::admin::{
    AdminOutcome, Cursor, Expiry, Force, Inspected, Resolution, StoreAdmin,
};
use tower_idempotency::{Category, Receipt};
use tower_idempotency::{PostgresStore, RedisStore};

const USAGE: &str = "\
usage: idempotency_admin [OPTIONS] COMMAND

commands:
  list [--limit N] [--after CURSOR] [--all]
                       keys of unknown delivery (and, on PostgreSQL, pending keys whose
                       lease passed), oldest first, a page at a time (default 100)
  show KEY             the record: state, fingerprint, outcome, time left
  forget KEY [--force] delete the record: the next send under the key goes
  resolve KEY delivered ID [--transport NAME] [--ttl SECONDS] [--force]
                       keep the key done with the provider's message id: a repeat is
                       answered with it, never sent (transport default `manual`, ttl 24 h)
  resolve KEY not-sent [--force]
                       free the key: the next send under it goes

options:
  --store redis|redis-cluster|postgres
                       the store (default: redis when REDIS_URL is set, else postgres
                       when DATABASE_URL is set); URLs come from REDIS_URL,
                       REDIS_CLUSTER_URLS (comma separated) and DATABASE_URL
  --prefix PREFIX      the RedisStore's key prefix (default `idem:`)
  --table TABLE        the PostgresStore's table (default `idempotency_keys`)
  --namespace NS       KEY is a message's key in the layer's namespace NS: the stored key
                       is `NS:KEY`; without it, KEY is the stored key, as `list` prints it
  --hashed             with --namespace: the layer stores hashed keys (KeyForm::Hashed),
                       so the stored key is `NS:h1:<SHA-256 of NS:KEY>`

forget and resolve refuse a key that a send holds within its lease (exit 3): wait for
the lease to pass, or add --force. exit codes: 0 done, 1 no record under the key,
2 usage error, 3 held by a live send, 4 the store failed.
";

/// Which store, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StoreKind {
    Redis,
    RedisCluster,
    Postgres,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq)]
struct Args {
    store: Option<StoreKind>,
    prefix: Option<String>,
    table: Option<String>,
    namespace: Option<String>,
    hashed: bool,
    command: Command,
}

#[derive(Debug, Clone, PartialEq)]
enum Command {
    Help,
    List {
        limit: usize,
        after: Option<String>,
        all: bool,
    },
    Show {
        key: String,
    },
    Forget {
        key: String,
        force: bool,
    },
    Delivered {
        key: String,
        id: String,
        transport: String,
        ttl: Duration,
        force: bool,
    },
    NotSent {
        key: String,
        force: bool,
    },
}

/// Exit codes.
const DONE: u8 = 0;
const NOTHING_THERE: u8 = 1;
const USAGE_ERROR: u8 = 2;
const HELD: u8 = 3;
const STORE_FAILED: u8 = 4;

/// Parses the arguments after the program's name.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut store = None;
    let mut prefix = None;
    let mut table = None;
    let mut namespace = None;
    let mut hashed = false;
    let mut limit = 100;
    let mut after = None;
    let mut all = false;
    let mut force = false;
    let mut transport = "manual".to_owned();
    let mut ttl = DEFAULT_TTL;
    let mut words = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" | "help" => {
                return Ok(Args {
                    store,
                    prefix,
                    table,
                    namespace,
                    hashed,
                    command: Command::Help,
                });
            }
            "--store" => {
                store = Some(match value("--store")?.as_str() {
                    "redis" => StoreKind::Redis,
                    "redis-cluster" => StoreKind::RedisCluster,
                    "postgres" => StoreKind::Postgres,
                    other => return Err(format!("unknown store {other:?}")),
                });
            }
            "--prefix" => prefix = Some(value("--prefix")?),
            "--table" => table = Some(value("--table")?),
            "--namespace" => namespace = Some(value("--namespace")?),
            "--hashed" => hashed = true,
            "--limit" => {
                limit = value("--limit")?
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or("--limit needs a positive number")?;
            }
            "--after" => after = Some(value("--after")?),
            "--all" => all = true,
            "--force" => force = true,
            "--transport" => transport = value("--transport")?,
            "--ttl" => {
                let seconds: u64 = value("--ttl")?
                    .parse()
                    .map_err(|_| "--ttl needs a number of seconds".to_owned())?;
                ttl = Duration::from_secs(seconds);
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            word => words.push(word.to_owned()),
        }
    }
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let command = match words.as_slice() {
        ["list"] => Command::List { limit, after, all },
        ["show", key] => Command::Show {
            key: key.to_string(),
        },
        ["forget", key] => Command::Forget {
            key: key.to_string(),
            force,
        },
        ["resolve", key, "delivered", id] => Command::Delivered {
            key: key.to_string(),
            id: id.to_string(),
            transport,
            ttl,
            force,
        },
        ["resolve", key, "not-sent"] => Command::NotSent {
            key: key.to_string(),
            force,
        },
        [] => return Err("no command".to_owned()),
        _ => return Err(format!("cannot read the command {:?}", words.join(" "))),
    };
    if hashed && namespace.is_none() {
        return Err("--hashed needs --namespace".to_owned());
    }
    Ok(Args {
        store,
        prefix,
        table,
        namespace,
        hashed,
        command,
    })
}

/// The key as stored: the layer's form of `KEY` in namespace `NS` (`NS:KEY`, or
/// `NS:h1:<digest>` with `--hashed`), `KEY` as given without a namespace.
fn stored_key(namespace: Option<&str>, hashed: bool, key: &str) -> Result<String, String> {
    let Some(ns) = namespace else {
        return Ok(key.to_owned());
    };
    let form = if hashed {
        KeyForm::Hashed
    } else {
        KeyForm::Raw
    };
    let keys = StoredKeys::new(ns, form).map_err(|e| e.to_string())?;
    keys.of(key).map_err(|e| e.to_string())
}

fn describe_expiry(expires: Expiry) -> String {
    match expires {
        Expiry::In(left) => format!("expires in {}s", left.as_secs()),
        Expiry::Passed => "expired (lease or ttl passed)".to_owned(),
        _ => "expiry unknown".to_owned(),
    }
}

fn describe_outcome(record: &Inspected) -> String {
    let Some(outcome) = &record.outcome else {
        return "-".to_owned();
    };
    if let Some(receipt) = outcome.receipt() {
        return format!("delivered: {} ({})", receipt.id, receipt.transport);
    }
    match outcome.error() {
        Some(error) => {
            let category = match error.category() {
                Category::Unknown => "unknown delivery",
                Category::Retryable => "retryable",
                Category::Permanent => "permanent",
                Category::Validation => "validation",
                _ => "other",
            };
            format!("{category}: {} ({})", error.code(), error.message())
        }
        None => "-".to_owned(),
    }
}

fn describe(record: &Inspected) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "key:         {}", record.key);
    let _ = writeln!(text, "state:       {}", record.state);
    let _ = writeln!(text, "fingerprint: {}", record.fingerprint);
    let _ = writeln!(text, "outcome:     {}", describe_outcome(record));
    let _ = writeln!(text, "expiry:      {}", describe_expiry(record.expires));
    text
}

fn failed(out: &mut impl Write, error: &StoreError) -> u8 {
    let _ = writeln!(out, "error: the store failed ({:?}): {error}", error.kind());
    STORE_FAILED
}

fn settled(out: &mut impl Write, key: &str, answer: AdminOutcome, what: &str) -> u8 {
    match answer {
        AdminOutcome::Done => {
            let _ = writeln!(out, "{key}: {what}");
            DONE
        }
        AdminOutcome::NothingThere => {
            let _ = writeln!(out, "{key}: no record under this key; nothing changed");
            NOTHING_THERE
        }
        AdminOutcome::HeldByLiveSend => {
            let _ = writeln!(
                out,
                "{key}: a send holds this key within its lease; nothing changed \
                 (wait for the lease to pass, or add --force)"
            );
            HELD
        }
        _ => {
            let _ = writeln!(out, "{key}: the store answered {answer:?}");
            STORE_FAILED
        }
    }
}

/// Runs `command` on `store`, writing what it found to `out`; answers the exit code.
async fn run(
    store: &dyn StoreAdmin,
    namespace: Option<&str>,
    hashed: bool,
    command: &Command,
    out: &mut impl Write,
) -> u8 {
    let key_of = |key: &str| stored_key(namespace, hashed, key);
    match command {
        Command::Help => {
            let _ = out.write_all(USAGE.as_bytes());
            DONE
        }
        Command::List { limit, after, all } => {
            let mut cursor = after.as_deref().map(Cursor::new);
            loop {
                let page = match store.list(cursor.as_ref(), *limit).await {
                    Ok(page) => page,
                    Err(e) => return failed(out, &e),
                };
                for record in &page.entries {
                    let _ = writeln!(
                        out,
                        "{}\t{}\t{}\t{}",
                        record.key,
                        if record.is_stale() {
                            "stale"
                        } else {
                            record.state.as_str()
                        },
                        describe_outcome(record),
                        describe_expiry(record.expires)
                    );
                }
                match page.next {
                    Some(next) if *all => cursor = Some(next),
                    Some(next) => {
                        let _ = writeln!(out, "# more: --after '{next}'");
                        return DONE;
                    }
                    None => return DONE,
                }
            }
        }
        Command::Show { key } => {
            let key = match key_of(key) {
                Ok(key) => key,
                Err(problem) => {
                    let _ = writeln!(out, "error: {problem}");
                    return USAGE_ERROR;
                }
            };
            match store.inspect(&key).await {
                Ok(Some(record)) => {
                    let _ = out.write_all(describe(&record).as_bytes());
                    DONE
                }
                Ok(None) => {
                    let _ = writeln!(out, "{key}: no record under this key");
                    NOTHING_THERE
                }
                Err(e) => failed(out, &e),
            }
        }
        Command::Forget { key, force } => {
            let key = match key_of(key) {
                Ok(key) => key,
                Err(problem) => {
                    let _ = writeln!(out, "error: {problem}");
                    return USAGE_ERROR;
                }
            };
            match store.forget(&key, force_of(*force)).await {
                Ok(answer) => settled(out, &key, answer, "forgotten"),
                Err(e) => failed(out, &e),
            }
        }
        Command::Delivered {
            key,
            id,
            transport,
            ttl,
            force,
        } => {
            let key = match key_of(key) {
                Ok(key) => key,
                Err(problem) => {
                    let _ = writeln!(out, "error: {problem}");
                    return USAGE_ERROR;
                }
            };
            let resolution = Resolution::delivered(Receipt::new(id, transport), *ttl);
            match store.resolve(&key, &resolution, force_of(*force)).await {
                Ok(answer) => settled(out, &key, answer, &format!("resolved as delivered ({id})")),
                Err(e) => failed(out, &e),
            }
        }
        Command::NotSent { key, force } => {
            let key = match key_of(key) {
                Ok(key) => key,
                Err(problem) => {
                    let _ = writeln!(out, "error: {problem}");
                    return USAGE_ERROR;
                }
            };
            match store
                .resolve(&key, &Resolution::not_sent(), force_of(*force))
                .await
            {
                Ok(answer) => settled(out, &key, answer, "resolved as not sent: the key is free"),
                Err(e) => failed(out, &e),
            }
        }
    }
}

fn force_of(force: bool) -> Force {
    if force { Force::Yes } else { Force::No }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Connects to the store the arguments and the environment name.
async fn connect(args: &Args) -> Result<Box<dyn StoreAdmin>, String> {
    let kind = match &args.store {
        Some(kind) => kind.clone(),
        None => match (env("REDIS_URL"), env("DATABASE_URL")) {
            (Some(_), None) => StoreKind::Redis,
            (None, Some(_)) => StoreKind::Postgres,
            (Some(_), Some(_)) => {
                return Err("both REDIS_URL and DATABASE_URL are set: say --store".to_owned());
            }
            (None, None) => {
                return Err("set REDIS_URL, REDIS_CLUSTER_URLS or DATABASE_URL".to_owned());
            }
        },
    };
    let need = |name: &str| env(name).ok_or(format!("{name} is not set"));
    let failed = |e: StoreError| format!("could not connect: {e}");
    Ok(match kind {
        StoreKind::Redis | StoreKind::RedisCluster => {
            let store = if kind == StoreKind::Redis {
                RedisStore::connect(&need("REDIS_URL")?).await
            } else {
                RedisStore::connect_cluster(need("REDIS_CLUSTER_URLS")?.split(',')).await
            }
            .map_err(failed)?;
            match &args.prefix {
                Some(prefix) => Box::new(store.key_prefix(prefix.clone())),
                None => Box::new(store),
            }
        }
        StoreKind::Postgres => {
            let store = PostgresStore::connect(&need("DATABASE_URL")?)
                .await
                .map_err(failed)?;
            match &args.table {
                Some(table) => Box::new(store.table(table).map_err(|e| e.to_string())?),
                None => Box::new(store),
            }
        }
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(problem) => {
            eprint!("error: {problem}\n\n{USAGE}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    if args.command == Command::Help {
        print!("{USAGE}");
        return ExitCode::from(DONE);
    }
    let store = match connect(&args).await {
        Ok(store) => store,
        Err(problem) => {
            eprintln!("error: {problem}");
            return ExitCode::from(if problem.starts_with("could not connect") {
                STORE_FAILED
            } else {
                USAGE_ERROR
            });
        }
    };
    let code = run(
        store.as_ref(),
        args.namespace.as_deref(),
        args.hashed,
        &args.command,
        &mut std::io::stdout(),
    )
    .await;
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_idempotency::store::{Reservation, Store};
    use tower_idempotency::{Fingerprint, MemoryStore, Outcome, SendError};

    fn args(line: &str) -> Result<Args, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn every_command_parses_with_its_options() {
        let parsed =
            args("--store postgres --table keys --namespace billing forget inv:42 --force")
                .unwrap();
        assert_eq!(parsed.store, Some(StoreKind::Postgres));
        assert_eq!(parsed.table.as_deref(), Some("keys"));
        assert_eq!(parsed.namespace.as_deref(), Some("billing"));
        assert_eq!(
            parsed.command,
            Command::Forget {
                key: "inv:42".into(),
                force: true
            }
        );
        assert_eq!(
            args("resolve k delivered msg_1 --transport resend --ttl 60")
                .unwrap()
                .command,
            Command::Delivered {
                key: "k".into(),
                id: "msg_1".into(),
                transport: "resend".into(),
                ttl: Duration::from_secs(60),
                force: false
            }
        );
        assert_eq!(
            args("resolve k not-sent").unwrap().command,
            Command::NotSent {
                key: "k".into(),
                force: false
            }
        );
        assert_eq!(
            args("list --limit 5 --after 12:k --all").unwrap().command,
            Command::List {
                limit: 5,
                after: Some("12:k".into()),
                all: true
            }
        );
        assert_eq!(
            args("show k").unwrap().command,
            Command::Show { key: "k".into() }
        );
        assert_eq!(args("--help").unwrap().command, Command::Help);
    }

    #[test]
    fn malformed_command_lines_are_usage_errors() {
        for line in [
            "",
            "list --limit 0",
            "list --limit x",
            "show",
            "show a b",
            "resolve k",
            "resolve k delivered",
            "resolve k maybe",
            "forget k --colour",
            "--store mongo list",
            "--namespace",
        ] {
            assert!(args(line).is_err(), "{line:?} was accepted");
        }
    }

    #[test]
    fn a_namespace_makes_the_stored_key_like_the_layer() {
        assert_eq!(
            stored_key(Some("billing"), false, "inv:42").unwrap(),
            "billing:inv:42"
        );
        assert_eq!(
            stored_key(None, false, "billing:inv:42").unwrap(),
            "billing:inv:42"
        );
        let hashed = stored_key(Some("billing"), true, "inv:42").unwrap();
        let layer = tower_idempotency::IdempotencyLayer::builder()
            .store(MemoryStore::new())
            .namespace("billing")
            .key_form(KeyForm::Hashed)
            .build()
            .unwrap();
        assert_eq!(hashed, layer.stored_key_for("inv:42").unwrap());
        assert!(stored_key(Some("bad:ns"), true, "inv:42").is_err());
        assert!(
            args("--hashed show inv:42").is_err(),
            "--hashed needs a namespace"
        );
    }

    async fn unknown_key(store: &MemoryStore, key: &str) {
        let fingerprint = Fingerprint::from_bytes([1; 32]);
        let Ok(Reservation::Reserved { token }) = store
            .reserve(key, fingerprint, Duration::from_secs(60))
            .await
        else {
            panic!("{key} was not free")
        };
        let outcome = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
        store
            .complete(key, token, fingerprint, &outcome, Duration::from_secs(3600))
            .await
            .unwrap();
    }

    async fn command(store: &MemoryStore, line: &str) -> (u8, String) {
        let parsed = args(line).unwrap();
        let mut out = Vec::new();
        let code = run(
            store,
            parsed.namespace.as_deref(),
            parsed.hashed,
            &parsed.command,
            &mut out,
        )
        .await;
        (code, String::from_utf8(out).unwrap())
    }

    #[tokio::test]
    async fn the_tool_lists_shows_and_resolves_a_key_of_unknown_delivery() {
        let store = MemoryStore::new();
        unknown_key(&store, "billing:inv:42").await;

        let (code, out) = command(&store, "list").await;
        assert_eq!(code, DONE);
        assert!(
            out.starts_with("billing:inv:42\tdone\tunknown delivery: provider.timeout"),
            "{out}"
        );

        let (code, out) = command(&store, "--namespace billing show inv:42").await;
        assert_eq!(code, DONE);
        assert!(out.contains("state:       done"), "{out}");

        let (code, out) = command(
            &store,
            "resolve billing:inv:42 delivered msg_81 --transport resend",
        )
        .await;
        assert_eq!(code, DONE, "{out}");
        let (_, out) = command(&store, "show billing:inv:42").await;
        assert!(out.contains("delivered: msg_81 (resend)"), "{out}");
        let (_, out) = command(&store, "list").await;
        assert_eq!(out, "", "a delivered key is no longer listed");
    }

    #[tokio::test]
    async fn the_tool_refuses_a_live_send_without_force_and_says_when_nothing_is_there() {
        let store = MemoryStore::new();
        let fingerprint = Fingerprint::from_bytes([1; 32]);
        store
            .reserve("ns:live", fingerprint, Duration::from_secs(60))
            .await
            .unwrap();
        let (code, out) = command(&store, "forget ns:live").await;
        assert_eq!(code, HELD, "{out}");
        assert!(out.contains("--force"), "{out}");
        let (code, _) = command(&store, "resolve ns:live not-sent").await;
        assert_eq!(code, HELD);
        let (code, _) = command(&store, "forget ns:live --force").await;
        assert_eq!(code, DONE);
        let (code, out) = command(&store, "show ns:live").await;
        assert_eq!(code, NOTHING_THERE, "{out}");
        let (code, _) = command(&store, "resolve ns:live delivered m").await;
        assert_eq!(code, NOTHING_THERE);
    }

    #[tokio::test]
    async fn list_pages_with_a_cursor_the_next_call_takes() {
        let store = MemoryStore::new();
        for i in 0..3 {
            unknown_key(&store, &format!("ns:k{i}")).await;
        }
        let (_, first) = command(&store, "list --limit 2").await;
        let cursor = first
            .lines()
            .find_map(|l| l.strip_prefix("# more: --after '"))
            .and_then(|c| c.strip_suffix('\''))
            .unwrap_or_else(|| panic!("no cursor in {first}"));
        assert_eq!(first.lines().count(), 3, "{first}");
        let (_, rest) = command(&store, &format!("list --after {cursor}")).await;
        assert_eq!(rest.lines().count(), 1, "{rest}");
        let (_, all) = command(&store, "list --limit 1 --all").await;
        assert_eq!(all.lines().count(), 3, "{all}");
    }
}
