//! `idempotency-admin`: settle the keys of a tower-idempotency store by hand (list the keys of
//! unknown delivery and the stale ones, show, forget, resolve as delivered or not sent), and
//! list and requeue the outbox's dead letters, on Redis (a server, Cluster or Sentinel),
//! PostgreSQL, MySQL (or MariaDB) and SQLite stores; the outbox on PostgreSQL or MySQL.
//!
//! ```sh
//! cargo install tower-idempotency --features cli
//! idempotency-admin --redis redis://127.0.0.1:6379 list
//! idempotency-admin --postgres postgres://app@db/app --namespace billing show invoice:42
//! idempotency-admin --redis-sentinel redis://s1:26379,redis://s2:26379 --primary-name mymaster list
//! idempotency-admin --sqlite /var/lib/app/keys.sqlite3 resolve billing:invoice:42 delivered msg_81
//! idempotency-admin --postgres postgres://app@db/app dead-letters requeue order.created:ord_1
//! idempotency-admin --mysql mysql://app@db/app --table keys forget billing:invoice:42
//! idempotency-admin --mysql mysql://app@db/app dead-letters list
//! ```
//!
//! `--help` prints the whole usage and the exit codes (args.rs).
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod args;
mod connect;
mod dead_letters;
mod keys;
mod output;

use std::process::ExitCode;

use args::{Args, Request, USAGE, parse};
use output::{Exit, Output};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
    let mut output = Output {
        out: &mut stdout,
        err: &mut stderr,
    };
    let args = match parse(std::env::args().skip(1)) {
        Ok(Request::Run(args)) => args,
        Ok(Request::Help) => {
            output.line(USAGE.trim_end());
            return Exit::Done.into();
        }
        Ok(Request::Version) => {
            output.line(concat!("idempotency-admin ", env!("CARGO_PKG_VERSION")));
            return Exit::Done.into();
        }
        Err(problem) => {
            output.problem(Exit::Usage, problem);
            let _ = writeln!(output.err, "run `idempotency-admin --help` for the usage");
            return Exit::Usage.into();
        }
    };
    run(&args, &mut output).await.into()
}

/// Opens the store the arguments name and runs their command on it.
async fn run(args: &Args, output: &mut Output<'_>) -> Exit {
    if args.command.is_outbox() {
        match connect::outbox(args).await {
            Ok(outbox) => dead_letters::run(&outbox, &args.command, output).await,
            Err(not) => output.problem(not.exit, not.reason),
        }
    } else {
        // A namespace no layer accepts is refused before the store is opened.
        let stored_keys = match keys::stored_keys(args.namespace.as_deref(), args.hashed) {
            Ok(keys) => keys,
            Err(problem) => return output.problem(Exit::Usage, problem),
        };
        let stored_keys = stored_keys.as_ref();
        match connect::store(args).await {
            Ok(store) => keys::run(store.as_ref(), stored_keys, &args.command, output).await,
            Err(not) => output.problem(not.exit, not.reason),
        }
    }
}
