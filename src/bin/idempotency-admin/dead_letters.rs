//! The commands on the outbox, on PostgreSQL or MySQL: `dead-letters list` and `dead-letters requeue`.

use tower_idempotency::outbox::Outbox;

use crate::args::Command;
use crate::output::{Exit, Output};

/// Runs a command on the outbox's dead letters; answers the exit code.
pub(crate) async fn run(outbox: &Outbox, command: &Command, output: &mut Output<'_>) -> Exit {
    match command {
        Command::DeadLetters { limit } => match outbox.dead_letters(*limit).await {
            Ok(dead) => {
                for letter in dead {
                    output.line(format_args!(
                        "{}\t{}\t{}",
                        letter.key,
                        letter.attempts,
                        // One line per letter, whatever the provider's text held.
                        letter
                            .last_error
                            .as_deref()
                            .unwrap_or("-")
                            .replace(['\n', '\r', '\t'], " ")
                    ));
                }
                Exit::Done
            }
            Err(e) => output.failed(&e),
        },
        Command::Requeue { key } => match outbox.requeue(key).await {
            Ok(true) => {
                output.line(format_args!(
                    "{key}: requeued, its attempts reset: a worker sends it again"
                ));
                Exit::Done
            }
            Ok(false) => output.problem(
                Exit::NotFound,
                format_args!(
                    "{key}: no dead letter under this key (it is waiting, done, or absent); \
                     nothing changed"
                ),
            ),
            Err(e) => output.failed(&e),
        },
        _ => output.problem(Exit::Usage, "not a command on the outbox"),
    }
}
