//! What the tool prints, and its exit codes.

use std::fmt::Write as _;
use std::io::Write;
use std::process::ExitCode;

use tower_idempotency::Category;
use tower_idempotency::store::StoreError;
use tower_idempotency::store::admin::{Expiry, Inspected};

/// The exit codes, as the usage lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Done.
    Done = 0,
    /// The command line cannot be read, or an option does not apply.
    Usage = 1,
    /// No record, or no dead letter, under the key.
    NotFound = 2,
    /// The store cannot be reached, failed, or is not a store.
    StoreFailed = 3,
    /// A live send or a waiting claim holds the key.
    Refused = 4,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// Where the tool writes: results to `out`, problems to `err`.
pub(crate) struct Output<'w> {
    pub(crate) out: &'w mut dyn Write,
    pub(crate) err: &'w mut dyn Write,
}

impl Output<'_> {
    /// A line of result.
    pub(crate) fn line(&mut self, text: impl std::fmt::Display) {
        // A closed stdout (a pager quit early) leaves nothing to tell.
        let _ = writeln!(self.out, "{text}");
    }

    /// A problem, prefixed `error: `; answers `exit`.
    pub(crate) fn problem(&mut self, exit: Exit, text: impl std::fmt::Display) -> Exit {
        let _ = writeln!(self.err, "error: {text}");
        exit
    }

    /// A store's failure; answers [`Exit::StoreFailed`].
    pub(crate) fn failed(&mut self, error: &StoreError) -> Exit {
        self.problem(
            Exit::StoreFailed,
            format_args!("the store failed ({:?}): {}", error.kind(), chain(error)),
        )
    }
}

/// An error and its sources, `: `-separated: the cause an operator acts on is often inside.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// When a record's lease or ttl ends.
pub(crate) fn expiry(expires: Expiry) -> String {
    match expires {
        Expiry::In(left) => format!("expires in {}s", left.as_secs()),
        Expiry::Passed => "expired (lease or ttl passed)".to_owned(),
        _ => "expiry unknown".to_owned(),
    }
}

/// A record's kept outcome, on one line.
pub(crate) fn outcome(record: &Inspected) -> String {
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

/// A record as `list` prints it: key, state (`stale` for a pending record whose lease
/// passed), outcome, expiry, tab-separated.
pub(crate) fn listed(record: &Inspected) -> String {
    let state = if record.is_stale() {
        "stale"
    } else {
        record.state.as_str()
    };
    format!(
        "{}\t{state}\t{}\t{}",
        record.key,
        outcome(record),
        expiry(record.expires)
    )
}

/// A record as `show` prints it, one field a line.
pub(crate) fn shown(record: &Inspected) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "key:         {}", record.key);
    let _ = writeln!(text, "state:       {}", record.state);
    let _ = writeln!(
        text,
        "stale:       {}",
        if record.is_stale() { "yes" } else { "no" }
    );
    let _ = writeln!(text, "fingerprint: {}", record.fingerprint);
    let _ = writeln!(text, "outcome:     {}", outcome(record));
    let _ = write!(text, "expiry:      {}", expiry(record.expires));
    text
}
