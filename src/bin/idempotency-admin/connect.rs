//! Opening the store the command line names, without creating anything: a SQLite file that
//! is not already a store is refused, and no table is ever migrated.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use tower_idempotency::outbox::Outbox;
use tower_idempotency::store::StoreError;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{MySqlStore, PostgresStore, RedisStore, SqliteStore};

use crate::args::{Args, OUTBOX_STORES, StoreArg};
use crate::output::{Exit, chain};

/// Why the store could not be opened: the exit code and what to tell.
#[derive(Debug)]
pub(crate) struct NotOpened {
    pub(crate) exit: Exit,
    pub(crate) reason: String,
}

impl NotOpened {
    fn usage(reason: impl Into<String>) -> Self {
        Self {
            exit: Exit::Usage,
            reason: reason.into(),
        }
    }

    fn store(reason: impl Into<String>) -> Self {
        Self {
            exit: Exit::StoreFailed,
            reason: reason.into(),
        }
    }

    fn connect(what: &str, error: &StoreError) -> Self {
        Self::store(format!("could not open {what}: {}", chain(error)))
    }
}

/// The SQLite store's table, the one [`SqliteStore`] creates.
const SQLITE_TABLE: &str = "idempotency_keys";

/// The store of the keys, connected.
pub(crate) async fn store(args: &Args) -> Result<Box<dyn StoreAdmin>, NotOpened> {
    Ok(match &args.store {
        StoreArg::Redis(url) => {
            let store = RedisStore::connect(url).await.map_err(|e| {
                NotOpened::connect(&format!("Redis at {}", without_password(url)), &e)
            })?;
            match &args.prefix {
                Some(prefix) => Box::new(store.key_prefix(prefix.clone())),
                None => Box::new(store),
            }
        }
        StoreArg::RedisCluster(urls) => {
            let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
                .await
                .map_err(|e| {
                    let urls: Vec<String> = urls.iter().map(|u| without_password(u)).collect();
                    NotOpened::connect(&format!("Redis Cluster at {}", urls.join(",")), &e)
                })?;
            match &args.prefix {
                Some(prefix) => Box::new(store.key_prefix(prefix.clone())),
                None => Box::new(store),
            }
        }
        StoreArg::RedisSentinel {
            sentinels,
            primary_name,
        } => {
            sentinel_urls(sentinels)?;
            let shown: Vec<String> = sentinels.iter().map(|u| without_password(u)).collect();
            let store =
                RedisStore::connect_sentinel(sentinels.iter().map(String::as_str), primary_name)
                    .await
                    .map_err(|e| {
                        let what = format!(
                            "the Redis primary {primary_name:?} through the sentinels at {}",
                            shown.join(",")
                        );
                        NotOpened::connect(&what, &e)
                    })?;
            match &args.prefix {
                Some(prefix) => Box::new(store.key_prefix(prefix.clone())),
                None => Box::new(store),
            }
        }
        StoreArg::Postgres(url) => {
            of_database(url, &POSTGRES)?;
            let store = PostgresStore::connect(url)
                .await
                .map_err(|e| NotOpened::connect("PostgreSQL", &e))?;
            match &args.table {
                Some(table) => Box::new(
                    store
                        .table(table)
                        .map_err(|e| NotOpened::usage(format!("--table: {e}")))?,
                ),
                None => Box::new(store),
            }
        }
        StoreArg::MySql(url) => {
            of_database(url, &MYSQL)?;
            let store = MySqlStore::connect(url)
                .await
                .map_err(|e| NotOpened::connect("MySQL", &e))?;
            match &args.table {
                Some(table) => Box::new(
                    store
                        .table(table)
                        .map_err(|e| NotOpened::usage(format!("--table: {e}")))?,
                ),
                None => Box::new(store),
            }
        }
        StoreArg::Sqlite(path) => {
            is_sqlite_store(path).map_err(NotOpened::store)?;
            let store = SqliteStore::builder(path)
                // A short-lived tool: it purges nothing of its own accord.
                .purge_every(None)
                .open()
                .await
                .map_err(|e| NotOpened::connect(&path.display().to_string(), &e))?;
            Box::new(store)
        }
    })
}

/// The outbox, connected.
pub(crate) async fn outbox(args: &Args) -> Result<Outbox, NotOpened> {
    let (url, database) = match &args.store {
        StoreArg::Postgres(url) => (url, &POSTGRES),
        StoreArg::MySql(url) => (url, &MYSQL),
        _ => return Err(NotOpened::usage(OUTBOX_STORES)),
    };
    // `Outbox::connect` picks the database by the URL's scheme: checked first, the option
    // decides, as it does for the keys.
    of_database(url, database)?;
    let outbox = Outbox::connect(url)
        .await
        .map_err(|e| NotOpened::connect(database.name, &e))?;
    match &args.outbox_table {
        Some(table) => outbox
            .table(table)
            .map_err(|e| NotOpened::usage(format!("--outbox-table: {e}"))),
        None => Ok(outbox),
    }
}

/// A database a store option names, and the URL schemes it takes.
#[derive(Debug)]
struct Database {
    option: &'static str,
    name: &'static str,
    schemes: &'static [&'static str],
    /// Whether a value without a scheme is the database's too (tokio-postgres's `key=value`
    /// settings).
    without_scheme: bool,
    example: &'static str,
}

const POSTGRES: Database = Database {
    option: "--postgres",
    name: "PostgreSQL",
    schemes: &["postgres", "postgresql"],
    without_scheme: true,
    example: "postgres://user@host:port/db",
};

const MYSQL: Database = Database {
    option: "--mysql",
    name: "MySQL",
    schemes: &["mysql"],
    without_scheme: false,
    example: "mysql://user:password@host:port/db",
};

/// Refuses a URL of another scheme than the option's database: a typo names no database,
/// and another database's URL must not open that database under this option.
fn of_database(url: &str, database: &Database) -> Result<(), NotOpened> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    let fits = match scheme {
        // Exactly, as `Outbox::connect` reads it.
        Some(scheme) => database.schemes.contains(&scheme),
        None => database.without_scheme,
    };
    if fits {
        return Ok(());
    }
    let Database {
        option,
        name,
        example,
        ..
    } = database;
    // The scheme only: the rest may hold a password, and a value without a scheme may be
    // nothing but one.
    let given = match scheme {
        Some(scheme) => format!("a {scheme}:// URL"),
        None => "a value without a scheme".to_owned(),
    };
    Err(NotOpened::store(format!(
        "could not open {name}: {option} takes a URL such as {example}, not {given}"
    )))
}

/// Refuses a sentinel address that is not a Redis URL, naming it by its place in the list:
/// the text itself may hold a password.
fn sentinel_urls(sentinels: &[String]) -> Result<(), NotOpened> {
    for (place, url) in sentinels.iter().enumerate() {
        if redis::IntoConnectionInfo::into_connection_info(url.as_str()).is_err() {
            return Err(NotOpened::store(format!(
                "could not open Redis Sentinel: address {} of {} given to --redis-sentinel is \
                 not a Redis URL such as redis://host:26379",
                place + 1,
                sentinels.len()
            )));
        }
    }
    Ok(())
}

/// `url` with its user information, which may hold a password, replaced by `***`: errors
/// end up in terminals and logs.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Whether the file at `path` is a SQLite store already: a database holding the store's
/// table. Opened without `SQLITE_OPEN_CREATE` and only read, so neither a missing file nor
/// a table is created, and a file that is something else is left as it was.
fn is_sqlite_store(path: &Path) -> Result<(), String> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(e) => {
            return Err(format!(
                "cannot open {shown}: {e}; the tool opens an existing SQLite store only \
                 (the application's SqliteStore::open creates one)"
            ));
        }
        Ok(meta) if meta.is_dir() => {
            return Err(format!(
                "{shown} is a directory, not a SQLite database file"
            ));
        }
        Ok(_) => {}
    }
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open {shown}: {e}"))?;
    let tables: i64 = connection
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [SQLITE_TABLE],
            |row| row.get(0),
        )
        .map_err(|e| format!("{shown} is not a SQLite store: {e}"))?;
    if tables == 0 {
        return Err(format!(
            "{shown} is not a tower-idempotency store: it has no {SQLITE_TABLE} table \
             (nothing was created; check the path)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_server_without_its_password() {
        assert_eq!(
            without_password("redis://user:s3cret@cache:6379/2"),
            "redis://***@cache:6379/2"
        );
        assert_eq!(without_password("redis://:p@ss@cache"), "redis://***@cache");
        assert_eq!(without_password("redis://cache:6379"), "redis://cache:6379");
        assert_eq!(without_password("not a url"), "not a url");
    }

    #[test]
    fn a_sentinel_address_that_is_no_url_is_named_by_its_place() {
        let sentinels = ["redis://s1:26379".to_owned(), "s3cret@s2".to_owned()];
        let not = sentinel_urls(&sentinels).unwrap_err();
        assert_eq!(not.exit, Exit::StoreFailed);
        assert!(not.reason.contains("address 2 of 2"), "{}", not.reason);
        assert!(!not.reason.contains("s3cret"), "{}", not.reason);
        assert!(sentinel_urls(&sentinels[..1]).is_ok());
    }

    #[test]
    fn each_database_option_takes_its_own_urls_only() {
        assert!(of_database("mysql://root@db:3306/app", &MYSQL).is_ok());
        assert!(of_database("postgres://app@db/app", &POSTGRES).is_ok());
        assert!(of_database("postgresql://app@db/app", &POSTGRES).is_ok());
        assert!(of_database("host=db user=app", &POSTGRES).is_ok());
        for (url, database) in [
            ("mysq://root:s3cret@db/app", &MYSQL),
            ("MySQL://root:s3cret@db/app", &MYSQL),
            ("postgres://root:s3cret@db/app", &MYSQL),
            ("root:s3cret@db/app", &MYSQL),
            ("mysql://root:s3cret@db/app", &POSTGRES),
            ("postgress://root:s3cret@db/app", &POSTGRES),
        ] {
            let not = of_database(url, database).unwrap_err();
            assert_eq!(not.exit, Exit::StoreFailed, "{url}");
            assert!(
                not.reason.contains(database.option),
                "{url}: {}",
                not.reason
            );
            assert!(!not.reason.contains("s3cret"), "{url}: {}", not.reason);
        }
    }
}
