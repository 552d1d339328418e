//! Settling a key by hand: read a record, forget a key, resolve it as delivered or as not
//! sent, and list the keys whose delivery is unknown.
//!
//! A message whose delivery is unknown (a timeout after the request left, an aborted send)
//! keeps its key for the whole ttl, so that it never goes twice. When an operator has learnt
//! what happened (the provider's dashboard shows the message, or shows nothing), these
//! operations settle the key:
//!
//! | operation | does |
//! |---|---|
//! | [`inspect`](StoreAdmin::inspect) | reads the record: state, fingerprint, outcome, time left |
//! | [`forget`](StoreAdmin::forget) | deletes the record: the next send under the key goes |
//! | [`resolve`](StoreAdmin::resolve) with [`Resolution::delivered`] | keeps the key done with the provider's receipt: a repeat is answered with it, never sent |
//! | [`resolve`](StoreAdmin::resolve) with [`Resolution::not_sent`] | frees the key: the next send under it goes |
//! | [`list`](StoreAdmin::list) | pages through the keys of unknown delivery, and the pending keys whose lease passed where the store keeps those, oldest first |
//!
//! `forget` and `resolve` never take a key from a live holder (a send under way, within its
//! lease, or a claim waiting for its send): they answer [`AdminOutcome::HeldByLiveSend`] and
//! change nothing, unless called with [`Force::Yes`]. Each is one atomic step in the store,
//! like the operations of [`Store`], so a send that starts meanwhile is never overwritten.
//!
//! Keys are the keys as stored: the layer stores `namespace:key` (see
//! [`IdempotencyLayer`](crate::IdempotencyLayer)).
//!
//! # Why a trait of its own
//!
//! These operations are for operators and reconciliation jobs, not for every request, so they
//! are a separate trait rather than more methods on [`Store`]: a third-party store implements
//! the four hot-path operations and nothing more, and adds [`StoreAdmin`] when it can. Every
//! store of this crate implements it, and the conformance suite (`store::conformance`,
//! feature `test-util`) checks it when built with `Conformance::with_admin`.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::store::admin::{AdminOutcome, Force, Resolution, StoreAdmin};
//! use tower_idempotency::store::{Reservation, Store};
//! use tower_idempotency::{Fingerprint, MemoryStore, Outcome, Receipt, SendError};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let fingerprint = Fingerprint::from_bytes([1; 32]);
//! let Reservation::Reserved { token } =
//!     store.reserve("welcome:42", fingerprint, Duration::from_secs(60)).await?
//! else { unreachable!() };
//! let timeout = Outcome::failed(SendError::unknown_delivery("provider.timeout", "timed out"));
//! store.complete("welcome:42", token, fingerprint, &timeout, Duration::from_secs(3600)).await?;
//!
//! // The operator finds the key in the listing, checks the provider, and settles it.
//! let page = store.list(None, 100).await?;
//! assert_eq!(page.entries[0].key, "welcome:42");
//! let delivered = Resolution::delivered(Receipt::new("msg_81", "resend"), Duration::from_secs(3600));
//! let answer = store.resolve("welcome:42", &delivered, Force::No).await?;
//! assert_eq!(answer, AdminOutcome::Done);
//! let record = store.inspect("welcome:42").await?.expect("kept");
//! assert_eq!(record.outcome.and_then(|o| o.receipt().map(|r| r.id.clone())).as_deref(), Some("msg_81"));
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Store, StoreError};
use crate::fingerprint::Fingerprint;
use crate::outcome::{Category, Outcome, Receipt};

/// The state of a record, as an operator sees it.
///
/// Later releases may add states; a `match` outside this crate needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyState {
    /// A send holds the key and has not finished (or, once its lease passed, crashed).
    Pending,
    /// Claimed in a transaction of the caller's own, waiting for its send
    /// (`PostgresStore::claim_in`).
    Claimed,
    /// A send finished and its outcome is kept.
    Done,
}

impl KeyState {
    /// The state's name: `pending`, `claimed` or `done`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Claimed => "claimed",
            Self::Done => "done",
        }
    }
}

impl fmt::Display for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a record's lease (pending, claimed) or ttl (done) ends, by the store's clock.
///
/// Later releases may add cases; a `match` outside this crate needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Expiry {
    /// It ends in this long.
    In(Duration),
    /// It has passed: the record is dead to the protocol (a reserve takes the key) and
    /// lingers until the store drops it.
    Passed,
    /// The store cannot tell.
    Unknown,
}

/// A record as [`StoreAdmin::inspect`] and [`StoreAdmin::list`] read it.
///
/// Later releases may add fields: a store builds one with [`new`](Self::new).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Inspected {
    /// The key as stored (`namespace:key` for the layer's keys).
    pub key: String,
    /// Pending, claimed or done.
    pub state: KeyState,
    /// The fingerprint of the message that holds the key.
    pub fingerprint: Fingerprint,
    /// The kept outcome, for a done record.
    pub outcome: Option<Outcome>,
    /// When the lease or ttl ends.
    pub expires: Expiry,
}

impl Inspected {
    /// A record of `key`.
    pub fn new(
        key: impl Into<String>,
        state: KeyState,
        fingerprint: Fingerprint,
        outcome: Option<Outcome>,
        expires: Expiry,
    ) -> Self {
        Self {
            key: key.into(),
            state,
            fingerprint,
            outcome,
            expires,
        }
    }

    /// Whether a live holder has the key: a send within its lease, or a claim waiting for
    /// its send. `forget` and `resolve` leave such a key alone unless forced.
    pub fn is_held_live(&self) -> bool {
        matches!(self.state, KeyState::Pending | KeyState::Claimed)
            && !matches!(self.expires, Expiry::Passed)
    }

    /// Whether the kept outcome is of unknown delivery: the message may have gone.
    pub fn is_unknown_delivery(&self) -> bool {
        self.state == KeyState::Done
            && self
                .outcome
                .as_ref()
                .is_some_and(|o| o.category() == Category::Unknown)
    }

    /// Whether it is a pending record whose lease passed: its send crashed or was lost.
    pub fn is_stale(&self) -> bool {
        self.state == KeyState::Pending && self.expires == Expiry::Passed
    }
}

/// Whether `forget` and `resolve` may take a key from a live holder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Force {
    /// Leave a key held by a live send alone (the default).
    #[default]
    No,
    /// Take it anyway. The live send is not stopped, and may still reach the provider. What
    /// its settlement does then depends on what holds the key, on every store of this crate
    /// alike (the conformance suite checks it):
    ///
    /// - after a forced [`forget`](StoreAdmin::forget), or [`resolve`](StoreAdmin::resolve)
    ///   as [`NotSent`](Resolution::NotSent), nothing holds it: the send's late `complete`
    ///   keeps its outcome (as any `complete` does on a free key), so a message that went is
    ///   kept and a repeat is answered with it rather than sent again; its late `release`
    ///   and `extend` change nothing;
    /// - after a forced `resolve` as [`Delivered`](Resolution::Delivered), or once another
    ///   send reserved the key, another token holds it: the late `complete` changes nothing
    ///   (answers `false`).
    ///
    /// So a forced `forget` frees a key for the next send only until the forced-out send
    /// settles, if no send reserved it meanwhile: to free a key for good, wait for its send
    /// to settle or its lease to pass.
    Yes,
}

impl Force {
    /// Whether this is [`Force::Yes`].
    pub fn is_forced(self) -> bool {
        self == Self::Yes
    }
}

/// What an operator learnt about a key, for [`StoreAdmin::resolve`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Resolution {
    /// The provider took the message: keep the key done with this receipt for `ttl`.
    Delivered {
        /// The provider's receipt (its message id and the transport's name).
        receipt: Receipt,
        /// How long the key stays done, from now.
        ttl: Duration,
    },
    /// The provider never took it: free the key, so the next send goes.
    NotSent,
}

impl Resolution {
    /// The provider took the message with `receipt`; the key stays done for `ttl` from now.
    pub fn delivered(receipt: Receipt, ttl: Duration) -> Self {
        Self::Delivered { receipt, ttl }
    }

    /// The provider never took the message: the key is freed.
    pub fn not_sent() -> Self {
        Self::NotSent
    }
}

/// The answer of [`StoreAdmin::forget`] and [`StoreAdmin::resolve`].
///
/// Later releases may add answers; a `match` outside this crate needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdminOutcome {
    /// Done: the key was forgotten, freed or resolved.
    Done,
    /// No record holds the key: nothing was changed.
    NothingThere,
    /// A live send (or a claim waiting for its send) holds the key: nothing was changed.
    /// Wait for its lease to pass, or call again with [`Force::Yes`].
    HeldByLiveSend,
}

/// Where a [`Page`] of [`StoreAdmin::list`] ended: give it back for the next page.
///
/// Opaque, and only meaningful to the store that made it; its text form (`Display`,
/// `FromStr`) lets a command-line tool hand it back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cursor(String);

impl Cursor {
    /// A cursor of a store's own making.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The cursor's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Cursor {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}

/// One page of [`StoreAdmin::list`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Page {
    /// The keys of this page, oldest first.
    pub entries: Vec<Inspected>,
    /// Where the next page starts; `None` when this page is the last.
    pub next: Option<Cursor>,
}

impl Page {
    /// A page of `entries`, followed by the page at `next`.
    pub fn new(entries: Vec<Inspected>, next: Option<Cursor>) -> Self {
        Self { entries, next }
    }
}

/// Operations for operators on a [`Store`]; see the [module docs](self).
///
/// Object safe, like [`Store`]. Each operation that changes a record is one atomic step in
/// the backend, decided by the store's own clock.
pub trait StoreAdmin: Store {
    /// Reads the record that holds `key`: `None` when there is none. A record whose lease or
    /// ttl passed but that the store still keeps is answered with [`Expiry::Passed`].
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Inspected>, StoreError>>;

    /// Deletes the record of `key`, whatever it holds, unless a live send holds it and
    /// `force` is [`Force::No`]. Where the store cannot tell whether a live send holds the
    /// key (a value it cannot read), it deletes only when forced, and answers a
    /// [`Corrupt`](super::StoreErrorKind::Corrupt) error otherwise.
    fn forget<'a>(
        &'a self,
        key: &'a str,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>>;

    /// Settles `key` as `resolution` says, unless a live send holds it and `force` is
    /// [`Force::No`].
    ///
    /// [`Delivered`](Resolution::Delivered) keeps the record done with the receipt (under a
    /// new token, with the record's fingerprint, for the resolution's ttl): a repeat of the
    /// message is answered with that receipt and never sent. [`NotSent`](Resolution::NotSent)
    /// deletes the record, so the next send goes; on a record that holds a receipt it lets
    /// that message go again. A key with no record answers [`AdminOutcome::NothingThere`]:
    /// without a fingerprint there is nothing to keep.
    fn resolve<'a>(
        &'a self,
        key: &'a str,
        resolution: &'a Resolution,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>>;

    /// Up to `limit` keys, oldest first, after `after` (from the start when `None`): the
    /// live records whose kept outcome is of unknown delivery, and, where the store keeps
    /// them, the pending records whose lease passed (a crashed or lost send).
    ///
    /// Oldest first means in the order their ttl or lease ends, which, for records kept with
    /// one ttl, is the order they were kept; a pending record whose lease passed comes before
    /// a live one. Paging is stable: a key listed on one page is not listed again on a later
    /// one unless its record changed meanwhile. A page may hold fewer than `limit` entries
    /// (even none) while [`Page::next`] is set; the listing ends when it is `None`.
    fn list<'a>(
        &'a self,
        after: Option<&'a Cursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, StoreError>>;
}

impl<S: StoreAdmin + ?Sized> StoreAdmin for std::sync::Arc<S> {
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Inspected>, StoreError>> {
        (**self).inspect(key)
    }

    fn forget<'a>(
        &'a self,
        key: &'a str,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        (**self).forget(key, force)
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        resolution: &'a Resolution,
        force: Force,
    ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
        (**self).resolve(key, resolution, force)
    }

    fn list<'a>(
        &'a self,
        after: Option<&'a Cursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        (**self).list(after, limit)
    }
}

/// A cursor of the form `<number>:<key>`, as the stores of this crate make them: the
/// position in their order (an expiry time) and the last key listed.
pub(crate) fn split_cursor(cursor: &Cursor) -> Result<(&str, &str), StoreError> {
    cursor
        .as_str()
        .split_once(':')
        .filter(|(at, _)| !at.is_empty())
        .ok_or_else(|| {
            StoreError::new(
                super::StoreErrorKind::InvalidInput,
                format!("{cursor:?} is not a cursor of this store"),
            )
        })
}

/// [`split_cursor`] with the position parsed as a `T`: a cursor whose position does not parse
/// is not one of this store's.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn parse_cursor<T: FromStr>(cursor: &Cursor) -> Result<(T, &str), StoreError> {
    let (at, key) = split_cursor(cursor)?;
    let at = at.parse::<T>().map_err(|_| {
        StoreError::new(
            super::StoreErrorKind::InvalidInput,
            format!("{cursor:?} is not a cursor of this store"),
        )
    })?;
    Ok((at, key))
}

/// The page a listing of at most `limit` read as `rows`, each decoded by `inspected` into its
/// record and position: a full page ends with the cursor after its last row (the cursor
/// [`parse_cursor`] reads), as more may follow.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn page<R>(
    rows: impl IntoIterator<Item = R, IntoIter: ExactSizeIterator>,
    limit: usize,
    mut inspected: impl FnMut(R) -> Result<(Inspected, i64), StoreError>,
) -> Result<Page, StoreError> {
    let rows = rows.into_iter();
    let full = rows.len() == limit;
    let mut entries = Vec::with_capacity(rows.len());
    let mut last = None;
    for row in rows {
        let (record, position) = inspected(row)?;
        last = Some(format!("{position}:{}", record.key));
        entries.push(record);
    }
    Ok(Page::new(entries, last.filter(|_| full).map(Cursor::new)))
}
