//! The commands on a store's keys: `list`, `show`, `forget`, `resolve`. They run on any
//! [`StoreAdmin`], so every store answers them alike.

use std::time::Duration;

use tower_idempotency::Receipt;
use tower_idempotency::layer::{KeyForm, StoredKeys};
use tower_idempotency::store::StoreError;
use tower_idempotency::store::admin::{AdminOutcome, Cursor, Force, Resolution, StoreAdmin};

use crate::args::Command;
use crate::output::{Exit, Output, listed, shown};

/// The stored key of a KEY given on the command line: the layer's form of it in the
/// namespace (`NS:KEY`, or `NS:h1:<digest>`) with `--namespace`, KEY as given without.
fn stored(keys: Option<&StoredKeys>, key: &str) -> Result<String, String> {
    match keys {
        None => Ok(key.to_owned()),
        Some(keys) => keys.of(key).map_err(|e| format!("{key:?}: {e}")),
    }
}

/// The stored keys of `--namespace` and `--hashed`; `None` without a namespace.
pub(crate) fn stored_keys(
    namespace: Option<&str>,
    hashed: bool,
) -> Result<Option<StoredKeys>, String> {
    let Some(namespace) = namespace else {
        return Ok(None);
    };
    let form = if hashed {
        KeyForm::Hashed
    } else {
        KeyForm::Raw
    };
    StoredKeys::new(namespace, form)
        .map(Some)
        .map_err(|e| format!("--namespace: {e}"))
}

/// Runs a command on the keys of `store`; answers the exit code.
pub(crate) async fn run(
    store: &dyn StoreAdmin,
    keys: Option<&StoredKeys>,
    command: &Command,
    output: &mut Output<'_>,
) -> Exit {
    if let Command::List { limit, after, all } = command {
        return list(store, *limit, after.as_deref(), *all, output).await;
    }
    let (Command::Show { key }
    | Command::Forget { key, .. }
    | Command::Delivered { key, .. }
    | Command::NotSent { key, .. }) = command
    else {
        return output.problem(Exit::Usage, "not a command on the store's keys");
    };
    let key = match stored(keys, key) {
        Ok(key) => key,
        Err(problem) => return output.problem(Exit::Usage, problem),
    };
    match command {
        Command::Show { .. } => match store.inspect(&key).await {
            Ok(Some(record)) => {
                output.line(shown(&record));
                Exit::Done
            }
            Ok(None) => output.problem(Exit::NotFound, format_args!("{key}: no record")),
            Err(e) => output.failed(&e),
        },
        Command::Forget { force, .. } => {
            let answer = store.forget(&key, force_of(*force)).await;
            settled(
                output,
                &key,
                answer,
                "forgotten: the next send under it goes",
            )
        }
        Command::Delivered {
            id,
            transport,
            ttl,
            force,
            ..
        } => {
            let resolution = Resolution::delivered(Receipt::new(id, transport), *ttl);
            let answer = store.resolve(&key, &resolution, force_of(*force)).await;
            let done = format!(
                "resolved as delivered ({id}, {transport}) for {}: repeats are answered \
                 with it",
                in_words(*ttl)
            );
            settled(output, &key, answer, &done)
        }
        Command::NotSent { force, .. } => {
            let answer = store
                .resolve(&key, &Resolution::not_sent(), force_of(*force))
                .await;
            settled(
                output,
                &key,
                answer,
                "resolved as not sent: the next send under it goes",
            )
        }
        _ => output.problem(Exit::Usage, "not a command on the store's keys"),
    }
}

/// `list`: a page, or every page with `all`.
async fn list(
    store: &dyn StoreAdmin,
    limit: usize,
    after: Option<&str>,
    all: bool,
    output: &mut Output<'_>,
) -> Exit {
    let mut cursor = after.map(Cursor::new);
    loop {
        let page = match store.list(cursor.as_ref(), limit).await {
            Ok(page) => page,
            Err(e) => return output.failed(&e),
        };
        for record in &page.entries {
            output.line(listed(record));
        }
        match page.next {
            Some(next) if all => cursor = Some(next),
            Some(next) => {
                output.line(format_args!("# more: --after '{next}'"));
                return Exit::Done;
            }
            None => return Exit::Done,
        }
    }
}

/// The answer of `forget` or `resolve`, told.
fn settled(
    output: &mut Output<'_>,
    key: &str,
    answer: Result<AdminOutcome, StoreError>,
    done: &str,
) -> Exit {
    match answer {
        Ok(AdminOutcome::Done) => {
            output.line(format_args!("{key}: {done}"));
            Exit::Done
        }
        Ok(AdminOutcome::NothingThere) => output.problem(
            Exit::NotFound,
            format_args!("{key}: no record under this key; nothing changed"),
        ),
        Ok(AdminOutcome::HeldByLiveSend) => output.problem(
            Exit::Refused,
            format_args!(
                "{key}: a live send or a waiting claim holds this key; nothing changed \
                 (wait for its lease to pass, or add --force)"
            ),
        ),
        Ok(other) => output.problem(
            Exit::StoreFailed,
            format_args!("{key}: the store answered {other:?}, which this tool does not know"),
        ),
        Err(e) => output.failed(&e),
    }
}

fn force_of(force: bool) -> Force {
    if force { Force::Yes } else { Force::No }
}

/// A ttl as an operator reads it.
fn in_words(ttl: Duration) -> String {
    let seconds = ttl.as_secs();
    match seconds {
        s if s % 86_400 == 0 => format!("{} d", s / 86_400),
        s if s % 3_600 == 0 => format!("{} h", s / 3_600),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Request, parse};
    use tower_idempotency::store::{Reservation, Store};
    use tower_idempotency::{Fingerprint, IdempotencyLayer, MemoryStore, Outcome, SendError};

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

    /// Runs `line` (after a store option the test does not use) on `store`: the exit code,
    /// stdout and stderr.
    async fn command(store: &MemoryStore, line: &str) -> (Exit, String, String) {
        let words = ["--sqlite", "unused"]
            .into_iter()
            .map(str::to_owned)
            .chain(line.split_whitespace().map(str::to_owned));
        let Ok(Request::Run(args)) = parse(words) else {
            panic!("{line:?} does not parse")
        };
        let args = *args;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let keys = stored_keys(args.namespace.as_deref(), args.hashed).unwrap();
        let exit = run(
            store,
            keys.as_ref(),
            &args.command,
            &mut Output {
                out: &mut out,
                err: &mut err,
            },
        )
        .await;
        (
            exit,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn a_namespace_makes_the_stored_key_like_the_layer() {
        let raw = stored_keys(Some("billing"), false).unwrap();
        assert_eq!(stored(raw.as_ref(), "inv:42").unwrap(), "billing:inv:42");
        assert_eq!(stored(None, "billing:inv:42").unwrap(), "billing:inv:42");
        let hashed = stored_keys(Some("billing"), true).unwrap();
        let hashed = stored(hashed.as_ref(), "inv:42").unwrap();
        let layer = IdempotencyLayer::builder()
            .store(MemoryStore::new())
            .namespace("billing")
            .key_form(KeyForm::Hashed)
            .build()
            .unwrap();
        assert_eq!(hashed, layer.stored_key_for("inv:42").unwrap());
        assert!(stored_keys(Some("bad:ns"), true).is_err());
        assert!(stored(raw.as_ref(), "").is_err(), "a key the layer refuses");
    }

    #[tokio::test]
    async fn the_tool_lists_shows_and_resolves_a_key_of_unknown_delivery() {
        let store = MemoryStore::new();
        unknown_key(&store, "billing:inv:42").await;

        let (exit, out, _) = command(&store, "list").await;
        assert_eq!(exit, Exit::Done);
        assert!(
            out.starts_with("billing:inv:42\tdone\tunknown delivery: provider.timeout"),
            "{out}"
        );

        let (exit, out, _) = command(&store, "--namespace billing show inv:42").await;
        assert_eq!(exit, Exit::Done);
        assert!(out.contains("state:       done"), "{out}");

        let (exit, out, _) = command(
            &store,
            "resolve billing:inv:42 delivered msg_81 --transport resend",
        )
        .await;
        assert_eq!(exit, Exit::Done, "{out}");
        let (_, out, _) = command(&store, "show billing:inv:42").await;
        assert!(out.contains("delivered: msg_81 (resend)"), "{out}");
        let (_, out, _) = command(&store, "list").await;
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
        let (exit, _, err) = command(&store, "forget ns:live").await;
        assert_eq!(exit, Exit::Refused, "{err}");
        assert!(err.contains("--force"), "{err}");
        let (exit, _, _) = command(&store, "resolve ns:live not-sent").await;
        assert_eq!(exit, Exit::Refused);
        let (exit, _, _) = command(&store, "forget ns:live --force").await;
        assert_eq!(exit, Exit::Done);
        let (exit, _, err) = command(&store, "show ns:live").await;
        assert_eq!(exit, Exit::NotFound, "{err}");
        let (exit, _, _) = command(&store, "resolve ns:live delivered m").await;
        assert_eq!(exit, Exit::NotFound);
    }

    #[tokio::test]
    async fn list_pages_with_a_cursor_the_next_call_takes() {
        let store = MemoryStore::new();
        for i in 0..3 {
            unknown_key(&store, &format!("ns:k{i}")).await;
        }
        let (_, first, _) = command(&store, "list --limit 2").await;
        let cursor = first
            .lines()
            .find_map(|l| l.strip_prefix("# more: --after '"))
            .and_then(|c| c.strip_suffix('\''))
            .unwrap_or_else(|| panic!("no cursor in {first}"));
        assert_eq!(first.lines().count(), 3, "{first}");
        let (_, rest, _) = command(&store, &format!("list --after {cursor}")).await;
        assert_eq!(rest.lines().count(), 1, "{rest}");
        let (_, all, _) = command(&store, "list --limit 1 --all").await;
        assert_eq!(all.lines().count(), 3, "{all}");
    }

    #[test]
    fn ttls_read_in_the_largest_whole_unit() {
        assert_eq!(in_words(Duration::from_secs(86_400)), "1 d");
        assert_eq!(in_words(Duration::from_secs(7_200)), "2 h");
        assert_eq!(in_words(Duration::from_secs(90)), "90 s");
    }
}
