//! The command line: the usage text, and its parsing into [`Args`]. Hand-parsed: a dozen
//! options and seven commands do not need a parser crate in every user's build.

use std::path::PathBuf;
use std::time::Duration;

use tower_idempotency::layer::DEFAULT_TTL;

/// The whole `--help`.
pub(crate) const USAGE: &str = "\
idempotency-admin: settle the keys of a tower-idempotency store by hand, and requeue the
outbox's dead letters.

usage: idempotency-admin STORE [OPTIONS] COMMAND

STORE, exactly one:
  --redis URL           a RedisStore (redis://[user:password@]host:port[/db])
  --redis-cluster URLS  a RedisStore on Redis Cluster: node URLs separated by commas
  --redis-sentinel URLS --primary-name NAME
                        a RedisStore on the primary that Redis Sentinel names NAME (the
                        name in the sentinels' `sentinel monitor` lines): the sentinels'
                        URLs, redis://[user:password@]host:port, separated by commas.
                        The primary is reached without credentials; for one that needs
                        them, give its own URL to --redis
  --postgres URL        a PostgresStore, and its outbox (postgres://user@host:port/db)
  --mysql URL           a MySqlStore on MySQL or MariaDB, and its outbox
                        (mysql://user:password@host:port/db)
  --sqlite FILE         a SqliteStore's database file; the tool opens an existing store
                        only, and refuses a file that is not one (it creates nothing)

A store's value written `env:NAME` is read from the environment variable NAME
(`--postgres env:DATABASE_URL`): a URL's password then stays out of the process list.

commands on keys (every store):
  list [--limit N] [--after CURSOR] [--all]
                        the keys of unknown delivery and the stale keys (pending, their
                        lease passed: a crashed or lost send), oldest first, a page of N
                        at a time (default 100); every store lists both. One line per
                        key: KEY, STATE (done, or stale), OUTCOME, EXPIRY, tab-separated
  show KEY              the record: state, fingerprint, outcome, time left
  forget KEY [--force]  delete the record: the next send under the key goes
  resolve KEY delivered ID [--transport NAME] [--ttl SECONDS] [--force]
                        keep the key done with the provider's message id ID: a repeat
                        is answered with it, never sent (transport default `manual`,
                        ttl default 86400, a day)
  resolve KEY not-sent [--force]
                        free the key: the next send under it goes

commands on the outbox (--postgres or --mysql):
  dead-letters list [--limit N]
                        the dead messages, oldest first (default 100): KEY, ATTEMPTS,
                        LAST ERROR, tab-separated; never their content
  dead-letters requeue KEY
                        put the dead message of idempotency key KEY back to waiting, its
                        attempts reset: a worker sends it again through its stack

options:
  --namespace NS        KEY is a message's key in the layer's namespace NS: the stored key
                        is `NS:KEY`. Without it, KEY is the stored key, as `list` prints
                        it. Not for dead letters, whose KEY is the message's own key
  --hashed              with --namespace: the layer stores hashed keys (KeyForm::Hashed),
                        so the stored key is `NS:h1:<SHA-256 of NS:KEY>`
  --prefix PREFIX       the RedisStore's key prefix (default `idem:`)
  --table TABLE         the PostgresStore's or MySqlStore's table (default
                        `idempotency_keys`)
  --outbox-table TABLE  the outbox's table (default `idempotency_outbox`)
  --                    what follows is a word, even when it begins with `-`
  -h, --help            this text
  -V, --version         the version

forget and resolve leave alone a key that a live send holds (within its lease) or that a
claim waits on, and exit 4: wait for the lease to pass, or add --force, which takes the
key anyway (that send may still reach the provider).

exit codes:
  0  done
  1  usage error: the command line cannot be read, or an option does not apply
  2  not found: no record under the key, or no dead letter under the key
  3  store error: the store cannot be reached, failed, or is not a store (a SQLite file
     without the table, a PostgreSQL or MySQL table or outbox that does not exist, a
     URL that is not the store's)
  4  refused: a live send or a waiting claim holds the key (add --force)
";

/// Refused when dead letters are asked of a store that has no outbox.
pub(crate) const OUTBOX_STORES: &str =
    "the outbox is on PostgreSQL or MySQL: dead letters need --postgres or --mysql";

/// Which store, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreArg {
    Redis(String),
    RedisCluster(Vec<String>),
    /// The sentinels' URLs, and the name they know the primary by.
    RedisSentinel {
        sentinels: Vec<String>,
        primary_name: String,
    },
    Postgres(String),
    MySql(String),
    Sqlite(PathBuf),
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Command {
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
    DeadLetters {
        limit: u32,
    },
    Requeue {
        key: String,
    },
}

impl Command {
    /// Whether it works on the outbox rather than on the store's keys.
    pub(crate) fn is_outbox(&self) -> bool {
        matches!(self, Self::DeadLetters { .. } | Self::Requeue { .. })
    }
}

/// A command to run on a store.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Args {
    pub(crate) store: StoreArg,
    pub(crate) prefix: Option<String>,
    pub(crate) table: Option<String>,
    pub(crate) outbox_table: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) hashed: bool,
    pub(crate) command: Command,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Request {
    Help,
    Version,
    Run(Box<Args>),
}

/// The options as given, before they are matched to the command.
#[derive(Default)]
struct Options {
    stores: Vec<StoreArg>,
    primary_name: Option<String>,
    prefix: Option<String>,
    table: Option<String>,
    outbox_table: Option<String>,
    namespace: Option<String>,
    hashed: bool,
    limit: Option<String>,
    after: Option<String>,
    all: bool,
    force: bool,
    transport: Option<String>,
    ttl: Option<String>,
}

impl Options {
    /// The command options given, by name: each command refuses those it does not take.
    fn command_options(&self) -> Vec<&'static str> {
        [
            ("--limit", self.limit.is_some()),
            ("--after", self.after.is_some()),
            ("--all", self.all),
            ("--force", self.force),
            ("--transport", self.transport.is_some()),
            ("--ttl", self.ttl.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// Reads the arguments after the program's name.
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Request, String> {
    let mut options = Options::default();
    let mut words = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(Request::Help),
            "-V" | "--version" => return Ok(Request::Version),
            "--redis" => options
                .stores
                .push(StoreArg::Redis(location("--redis", value("--redis")?)?)),
            "--redis-cluster" => {
                let urls = url_list("--redis-cluster", value("--redis-cluster")?, "node")?;
                options.stores.push(StoreArg::RedisCluster(urls));
            }
            "--redis-sentinel" => {
                let urls = url_list("--redis-sentinel", value("--redis-sentinel")?, "sentinel")?;
                // The name comes from --primary-name, wherever it stands: set once all is read.
                options.stores.push(StoreArg::RedisSentinel {
                    sentinels: urls,
                    primary_name: String::new(),
                });
            }
            "--primary-name" => options.primary_name = Some(value("--primary-name")?),
            "--postgres" => options.stores.push(StoreArg::Postgres(location(
                "--postgres",
                value("--postgres")?,
            )?)),
            "--mysql" => options
                .stores
                .push(StoreArg::MySql(location("--mysql", value("--mysql")?)?)),
            "--sqlite" => options.stores.push(StoreArg::Sqlite(PathBuf::from(location(
                "--sqlite",
                value("--sqlite")?,
            )?))),
            "--prefix" => options.prefix = Some(value("--prefix")?),
            "--table" => options.table = Some(value("--table")?),
            "--outbox-table" => options.outbox_table = Some(value("--outbox-table")?),
            "--namespace" => options.namespace = Some(value("--namespace")?),
            "--hashed" => options.hashed = true,
            "--limit" => options.limit = Some(value("--limit")?),
            "--after" => options.after = Some(value("--after")?),
            "--all" => options.all = true,
            "--force" => options.force = true,
            "--transport" => options.transport = Some(value("--transport")?),
            "--ttl" => options.ttl = Some(value("--ttl")?),
            "--" => words.extend(args.by_ref()),
            flag if flag.starts_with('-') && flag.len() > 1 => {
                return Err(format!("unknown option {flag}"));
            }
            word => words.push(word.to_owned()),
        }
    }
    let command = command(&words, &options)?;
    let store = match options.stores.len() {
        0 => {
            return Err(
                "no store: give one of --redis, --redis-cluster, --redis-sentinel, --postgres, \
                 --mysql, --sqlite"
                    .to_owned(),
            );
        }
        1 => options.stores.remove(0),
        _ => return Err("more than one store: give exactly one".to_owned()),
    };
    let store = with_primary_name(store, options.primary_name.take())?;
    check_store_options(&store, &options, &command)?;
    Ok(Request::Run(Box::new(Args {
        store,
        prefix: options.prefix,
        table: options.table,
        outbox_table: options.outbox_table,
        namespace: options.namespace,
        hashed: options.hashed,
        command,
    })))
}

/// A store option's value: as given, or, written `env:NAME`, the environment variable NAME's,
/// which keeps a password out of the process list.
fn location(option: &str, value: String) -> Result<String, String> {
    let Some(name) = value.strip_prefix("env:") else {
        return Ok(value);
    };
    match std::env::var(name) {
        Ok(found) if !found.is_empty() => Ok(found),
        _ => Err(format!("{option} {value}: the variable {name} is not set")),
    }
}

/// The URLs of a store option that takes several, separated by commas (`what` URLs: node,
/// sentinel).
fn url_list(option: &str, value: String, what: &str) -> Result<Vec<String>, String> {
    let urls: Vec<String> = location(option, value)?
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(format!("{option} needs at least one {what} URL"));
    }
    Ok(urls)
}

/// `store` with the primary's name from `--primary-name`, which Sentinel alone needs and
/// takes.
fn with_primary_name(store: StoreArg, name: Option<String>) -> Result<StoreArg, String> {
    match (store, name) {
        (StoreArg::RedisSentinel { sentinels, .. }, Some(name)) if !name.trim().is_empty() => {
            Ok(StoreArg::RedisSentinel {
                sentinels,
                primary_name: name,
            })
        }
        (StoreArg::RedisSentinel { .. }, _) => Err(
            "--redis-sentinel needs --primary-name NAME: the name the sentinels know the \
             primary by (their `sentinel monitor` lines)"
                .to_owned(),
        ),
        (_, Some(_)) => Err("--primary-name names a Sentinel's primary: it needs \
                             --redis-sentinel"
            .to_owned()),
        (store, None) => Ok(store),
    }
}

/// The command the words name, with the command options it takes.
fn command(words: &[String], options: &Options) -> Result<Command, String> {
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let (command, takes): (Command, &[&str]) = match words.as_slice() {
        ["list"] => (
            Command::List {
                limit: positive(options.limit.as_deref(), 100)?,
                after: options.after.clone(),
                all: options.all,
            },
            &["--limit", "--after", "--all"],
        ),
        ["show", key] => (
            Command::Show {
                key: key.to_string(),
            },
            &[],
        ),
        ["forget", key] => (
            Command::Forget {
                key: key.to_string(),
                force: options.force,
            },
            &["--force"],
        ),
        ["resolve", key, "delivered", id] => (
            Command::Delivered {
                key: key.to_string(),
                id: id.to_string(),
                transport: options
                    .transport
                    .clone()
                    .unwrap_or_else(|| "manual".to_owned()),
                ttl: match options.ttl.as_deref() {
                    None => DEFAULT_TTL,
                    Some(seconds) => Duration::from_secs(
                        seconds
                            .parse::<u64>()
                            .ok()
                            .filter(|s| *s > 0)
                            .ok_or("--ttl needs a positive number of seconds")?,
                    ),
                },
                force: options.force,
            },
            &["--transport", "--ttl", "--force"],
        ),
        ["resolve", key, "not-sent"] => (
            Command::NotSent {
                key: key.to_string(),
                force: options.force,
            },
            &["--force"],
        ),
        ["resolve", _, other, ..] if !matches!(*other, "delivered" | "not-sent") => {
            return Err(format!(
                "resolve takes `delivered ID` or `not-sent`, not {other:?}"
            ));
        }
        ["dead-letters", "list"] => (
            Command::DeadLetters {
                limit: positive(options.limit.as_deref(), 100)?,
            },
            &["--limit"],
        ),
        ["dead-letters", "requeue", key] => (
            Command::Requeue {
                key: key.to_string(),
            },
            &[],
        ),
        [] => return Err("no command".to_owned()),
        _ => return Err(format!("cannot read the command {:?}", words.join(" "))),
    };
    if let Some(extra) = options
        .command_options()
        .into_iter()
        .find(|o| !takes.contains(o))
    {
        return Err(format!("{extra} does not apply to this command"));
    }
    Ok(command)
}

/// The options that name a store's settings, against the store and the command.
fn check_store_options(
    store: &StoreArg,
    options: &Options,
    command: &Command,
) -> Result<(), String> {
    let redis = matches!(
        store,
        StoreArg::Redis(_) | StoreArg::RedisCluster(_) | StoreArg::RedisSentinel { .. }
    );
    let sql = matches!(store, StoreArg::Postgres(_) | StoreArg::MySql(_));
    if options.prefix.is_some() && !redis {
        return Err(
            "--prefix is the RedisStore's: it needs --redis, --redis-cluster or --redis-sentinel"
                .into(),
        );
    }
    if options.table.is_some() && !sql {
        return Err(
            "--table is the PostgresStore's or MySqlStore's: it needs --postgres or --mysql".into(),
        );
    }
    if (options.outbox_table.is_some() || command.is_outbox()) && !sql {
        return Err(OUTBOX_STORES.into());
    }
    if command.is_outbox() {
        if options.namespace.is_some() || options.hashed {
            return Err(
                "a dead letter's KEY is the message's own key: --namespace and --hashed do \
                 not apply"
                    .into(),
            );
        }
        if options.table.is_some() || options.prefix.is_some() {
            return Err("dead letters are in the outbox's table: use --outbox-table".into());
        }
    } else if options.outbox_table.is_some() {
        return Err("--outbox-table applies to the dead-letters commands only".into());
    }
    if options.hashed && options.namespace.is_none() {
        return Err("--hashed needs --namespace".into());
    }
    Ok(())
}

/// A positive count from `--limit`, `default` when not given.
fn positive<T: std::str::FromStr + Default + PartialOrd>(
    given: Option<&str>,
    default: T,
) -> Result<T, String> {
    match given {
        None => Ok(default),
        Some(text) => text
            .parse::<T>()
            .ok()
            .filter(|n| *n > T::default())
            .ok_or_else(|| format!("--limit needs a positive number, not {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, String> {
        match parse(line.split_whitespace().map(str::to_owned))? {
            Request::Run(args) => Ok(*args),
            other => panic!("{line:?} is {other:?}"),
        }
    }

    #[test]
    fn every_command_parses_with_its_options() {
        let parsed =
            args("--postgres postgres://db --table keys --namespace billing forget inv:42 --force")
                .unwrap();
        assert_eq!(parsed.store, StoreArg::Postgres("postgres://db".into()));
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
            args("--redis redis://r resolve k delivered msg_1 --transport resend --ttl 60")
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
            args("--sqlite a.db resolve k not-sent").unwrap().command,
            Command::NotSent {
                key: "k".into(),
                force: false
            }
        );
        assert_eq!(
            args("--sqlite a.db list --limit 5 --after 12:k --all")
                .unwrap()
                .command,
            Command::List {
                limit: 5,
                after: Some("12:k".into()),
                all: true
            }
        );
        assert_eq!(
            args("--redis-cluster redis://a,redis://b show k")
                .unwrap()
                .store,
            StoreArg::RedisCluster(vec!["redis://a".into(), "redis://b".into()])
        );
        assert_eq!(
            args(
                "--primary-name mymaster --redis-sentinel redis://s1:26379,redis://s2:26379 show k"
            )
            .unwrap()
            .store,
            StoreArg::RedisSentinel {
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
                primary_name: "mymaster".into()
            }
        );
        assert_eq!(
            args("--redis-sentinel redis://s1 --primary-name m --prefix p list")
                .unwrap()
                .prefix
                .as_deref(),
            Some("p")
        );
        assert_eq!(
            args("--postgres p --outbox-table jobs dead-letters list --limit 7")
                .unwrap()
                .command,
            Command::DeadLetters { limit: 7 }
        );
        let parsed = args("--mysql mysql://db --table keys --outbox-table jobs dead-letters list");
        assert!(
            parsed.is_err(),
            "--table is not for dead letters: {parsed:?}"
        );
        let parsed = args("--mysql mysql://db --table keys show k").unwrap();
        assert_eq!(parsed.store, StoreArg::MySql("mysql://db".into()));
        assert_eq!(parsed.table.as_deref(), Some("keys"));
        assert_eq!(
            args("--mysql mysql://db --outbox-table jobs dead-letters requeue order:1")
                .unwrap()
                .outbox_table
                .as_deref(),
            Some("jobs")
        );
        assert_eq!(
            args("--postgres p dead-letters requeue order:1")
                .unwrap()
                .command,
            Command::Requeue {
                key: "order:1".into()
            }
        );
        assert_eq!(
            args("--redis r show -- -odd-key").unwrap().command,
            Command::Show {
                key: "-odd-key".into()
            }
        );
        assert_eq!(
            parse(["list".to_owned(), "--help".to_owned()]),
            Ok(Request::Help)
        );
        assert_eq!(parse(["-V".to_owned()]), Ok(Request::Version));
        let blank_name = [
            "--redis-sentinel",
            "redis://s1",
            "--primary-name",
            " ",
            "list",
        ];
        let parsed = parse(blank_name.map(str::to_owned));
        assert!(parsed.is_err(), "a blank primary name: {parsed:?}");
    }

    #[test]
    fn malformed_command_lines_are_usage_errors() {
        for line in [
            "",
            "list",
            "--redis r",
            "--redis r --postgres p list",
            "--redis r list --limit 0",
            "--redis r list --limit x",
            "--redis r show",
            "--redis r show a b",
            "--redis r show a --force",
            "--redis r resolve k",
            "--redis r resolve k delivered",
            "--redis r resolve k maybe",
            "--redis r resolve k not-sent --ttl 5",
            "--redis r resolve k delivered m --ttl 0",
            "--redis r forget k --colour",
            "--redis r --namespace",
            "--redis r --hashed show k",
            "--redis r --table t list",
            "--sqlite f --prefix p list",
            "--redis r dead-letters list",
            "--redis r --mysql m list",
            "--mysql m --prefix p list",
            "--mysql m --namespace ns dead-letters list",
            "--mysql m --outbox-table o list",
            "--mysql",
            "--sqlite f dead-letters requeue k",
            "--postgres p --namespace ns dead-letters requeue k",
            "--postgres p --outbox-table o list",
            "--postgres p dead-letters requeue",
            "--postgres p dead-letters drop k",
            "--redis-cluster , list",
            "--redis-sentinel redis://s1 list",
            "--redis-sentinel , --primary-name m list",
            "--redis r --primary-name m list",
            "--redis-sentinel redis://s1 --primary-name m --redis r list",
            "--redis-sentinel redis://s1 --primary-name m --table t list",
            "--redis-sentinel redis://s1 --primary-name m dead-letters list",
            "--postgres env:TOWER_IDEMPOTENCY_ADMIN_SURELY_UNSET list",
        ] {
            assert!(args(line).is_err(), "{line:?} was accepted");
        }
    }

    #[test]
    fn the_usage_names_every_command_and_exit_code() {
        for word in [
            "list",
            "show",
            "forget",
            "resolve",
            "delivered",
            "not-sent",
            "dead-letters",
            "requeue",
            "--redis",
            "--redis-cluster",
            "--redis-sentinel",
            "--primary-name",
            "--postgres",
            "--mysql",
            "--sqlite",
            "0  done",
            "1  usage",
            "2  not found",
            "3  store error",
            "4  refused",
        ] {
            assert!(USAGE.contains(word), "{word:?} is not in the usage");
        }
        assert!(
            USAGE.contains("every store lists both"),
            "the usage says every store lists stale keys"
        );
    }
}
