//! Where keys are reserved: the [`Store`] trait, its records and errors, and the stores.
//!
//! A store has four operations, each one atomic step in its backend:
//!
//! | operation | does |
//! |---|---|
//! | [`reserve`](Store::reserve) | when no live record holds the key, holds it pending for `lease` under a new token and answers [`Reservation::Reserved`]; otherwise answers [`Reservation::Held`] with the record |
//! | [`complete`](Store::complete) | keeps the key done with the outcome for `ttl`, when the token holds it or nothing does |
//! | [`release`](Store::release) | frees the key, when the token holds it pending |
//! | [`extend`](Store::extend) | makes the lease end `lease` from now, when the token holds the key pending and its lease has not passed |
//! | [`retake`](Store::retake) | holds a done key of unknown delivery pending again under a new token, for a re-send of the same message while its first attempt is younger than a window |
//!
//! A store that needs no waiting (an in-process one, as [`MemoryStore`]) may also answer
//! [`reserve_now`](Store::reserve_now) and [`complete_now`](Store::complete_now): the same
//! steps, answered at once, which the layer asks first so that a send on such a store makes
//! no future for them. Both default to `None` (ask the future), which every store may keep.
//!
//! Records carry the time of the first attempt under their key, by the store's clock, and
//! report it as an age ([`Record::first_attempt_age`]), so no skew between the caller's and
//! the store's clock enters it. A store that keeps a pending record past its lease reports a
//! reserve that takes it over ([`Reservation::TakenOver`]): its holder began a send and never
//! settled it, so the layer can check with the provider before it sends again.
//!
//! The token fences a reservation: once the lease of a pending key has passed, another reserve
//! may take it under a new token, and the first owner's late `complete`, `release` or `extend`
//! must leave the new owner's record alone. Expiry is decided by the store's own clock, never
//! the caller's.
//!
//! A reserve whose answer is lost (a dropped connection, the store's or the layer's timeout)
//! is reported as a store failure: the message is not sent. The networked stores then release
//! that reserve's token in the background, asking a few times over about seven seconds, so the
//! key it may have taken does not stay held for the whole lease with nobody sending; the
//! SQLite store never runs a reserve whose caller stopped waiting. A key none of these
//! releases reached frees itself when its lease ends.
//!
//! Stores:
//!
//! | store | feature | for |
//! |---|---|---|
//! | [`MemoryStore`] | default | one process: bounded, sharded, forgets on restart |
//! | `redis::RedisStore` | `redis` (`redis-cluster` for Redis Cluster) | several processes; `SET NX GET PX` reserves, Lua scripts fence complete and release |
//! | `postgres::PostgresStore` | `postgres` | several processes; one statement per operation, expiry by the server's `now()` |
//! | `sqlite::SqliteStore` | `sqlite` | the processes of one host, no server: one database file, one statement per operation, expiry by SQLite's clock |
//! | `mysql::MySqlStore` | `mysql` | several processes on MySQL 8 or MariaDB 10.6+; fenced autocommit statements, expiry by the server's `UTC_TIMESTAMP(6)` |
//!
//! Each store is in its backend's module, and at the crate root (`tower_idempotency::MemoryStore`,
//! `tower_idempotency::RedisStore`, …).
//!
//! Operators settle keys by hand (read a record, forget a key, resolve it as delivered or as
//! not sent, list the keys of unknown delivery) through [`admin::StoreAdmin`], a trait of its
//! own that every store of this crate implements.
//!
//! Every store passes the conformance suite in `store::conformance` (feature `test-util`),
//! which third-party stores can run as well. Networked stores write records and outcomes in
//! the versioned stored form of [`record`], open to third-party stores too.
//!
//! [`MemoryStore`]: memory::MemoryStore

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::fingerprint::Fingerprint;
use crate::outcome::Outcome;

pub mod admin;
mod error;
pub mod memory;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) mod millis;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod record;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod statement;
mod token;
#[cfg(any(feature = "postgres", feature = "redis", feature = "mysql"))]
mod unanswered;

#[cfg(any(test, feature = "test-util"))]
pub mod conformance;

pub use error::{StoreError, StoreErrorKind};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use statement::{ClaimParam, ClaimStatement};
pub use token::Token;

/// The state of a live record.
///
/// Later releases may add states; a `match` outside this crate needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordState {
    /// A send holds the key and has not finished.
    Pending,
    /// A send finished and its outcome is kept.
    Done,
}

/// A live record that holds a key, as [`Store::reserve`] reports it.
///
/// Later releases may add fields: a store builds one with [`pending`](Self::pending) or
/// [`done`](Self::done).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Record {
    /// Pending or done.
    pub state: RecordState,
    /// The fingerprint of the message that holds the key.
    pub fingerprint: Fingerprint,
    /// The kept outcome: present when done, absent when pending. A record that breaks this
    /// is corrupt (see [the record rules](record#the-record-rules)).
    pub outcome: Option<Outcome>,
    /// How long ago the first attempt under this key began (the reserve that first took it,
    /// kept through retakes and takeovers of the same message), measured by the store's own
    /// clock, so no skew between the caller's and the store's clocks enters it. `None` when
    /// the store cannot tell: a store that does not keep the time, a record completed after
    /// its own pending record was gone, or one resolved by hand on `RedisStore`; and on a done
    /// record of known delivery, where a store may leave it out (`RedisStore` does, to answer
    /// a replay in one command): only a re-send of an outcome of unknown delivery is decided
    /// by it. A layer never
    /// re-sends a message whose first attempt's age is unknown (see [`IdempotencyLayerBuilder::provider_window`](crate::IdempotencyLayerBuilder::provider_window)).
    pub first_attempt_age: Option<Duration>,
}

impl Record {
    /// A send of the message with `fingerprint` holds the key and has not finished.
    pub fn pending(fingerprint: Fingerprint) -> Self {
        Self {
            state: RecordState::Pending,
            fingerprint,
            outcome: None,
            first_attempt_age: None,
        }
    }

    /// A send of the message with `fingerprint` finished with `outcome`.
    pub fn done(fingerprint: Fingerprint, outcome: Outcome) -> Self {
        Self {
            state: RecordState::Done,
            fingerprint,
            outcome: Some(outcome),
            first_attempt_age: None,
        }
    }

    /// Sets how long ago, by the store's clock, the first attempt under the key began (see
    /// [`first_attempt_age`](Self::first_attempt_age)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::{Fingerprint, store::Record};
    ///
    /// let record = Record::pending(Fingerprint::from_bytes([0; 32]))
    ///     .with_first_attempt_age(Duration::from_secs(3));
    /// assert_eq!(record.first_attempt_age, Some(Duration::from_secs(3)));
    /// ```
    #[must_use]
    pub fn with_first_attempt_age(mut self, age: Duration) -> Self {
        self.first_attempt_age = Some(age);
        self
    }

    /// Whether this record is a kept outcome of unknown delivery: done with a failure of
    /// category [`Unknown`](crate::Category::Unknown) (a timeout after the request left, an
    /// unclear 5xx, a send dropped mid-call), so the message may or may not have gone.
    pub fn is_unknown_delivery(&self) -> bool {
        self.state == RecordState::Done
            && self
                .outcome
                .as_ref()
                .and_then(Outcome::error)
                .is_some_and(crate::outcome::SendError::delivery_unknown)
    }
}

/// What [`Store::reserve`] found.
///
/// **Whether the reserve holds the key is [`token`](Self::token)**: `Some` for
/// [`Reserved`](Self::Reserved) and for [`TakenOver`](Self::TakenOver) alike, as a takeover
/// holds the key as surely as a fresh reservation (and must be completed or released the same
/// way), `None` when another record holds it. Ask `token()` rather than matching `Reserved`
/// alone, which would leave a taken-over key held, unsent, until its lease ends.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::{Reservation, Store};
/// use tower_idempotency::{Fingerprint, MemoryStore, Outcome, Receipt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let fingerprint = Fingerprint::from_bytes([7; 32]);
/// let reservation = store.reserve("welcome:42", fingerprint, Duration::from_secs(60)).await?;
/// if let Some(token) = reservation.token() {
///     // Ours, fresh or taken over: send, then keep the outcome (or release on failure).
///     let sent = Outcome::sent(Receipt::new("msg_1", "resend"));
///     store.complete("welcome:42", token, fingerprint, &sent, Duration::from_secs(3600)).await?;
/// } else if let Reservation::Held { record } = reservation {
///     // Another send's: in flight, or done with `record.outcome` to replay.
///     println!("held: {:?}", record.state);
/// }
/// # Ok(()) }
/// ```
///
/// Later releases may add answers; a `match` outside this crate needs a wildcard arm.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Reservation {
    /// The key is now held pending under `token`.
    Reserved {
        /// The token that fences this reservation.
        token: Token,
    },
    /// A live record holds the key.
    Held {
        /// That record.
        record: Record,
    },
    /// The key is now held pending under `token`, taken over from a pending record whose
    /// lease had passed: its holder began a send and never settled it (a crashed process),
    /// so the provider may or may not have taken that message.
    ///
    /// A store reports it only while it still has the stale record (see each store's docs);
    /// otherwise such a reserve answers [`Reserved`](Self::Reserved). When `previous` is of
    /// the same message, the new record keeps its first attempt's time.
    TakenOver {
        /// The token that fences this reservation.
        token: Token,
        /// The pending record whose lease had passed.
        previous: Record,
    },
}

impl Reservation {
    /// The token the key is now held under, when this reservation holds it
    /// ([`Reserved`](Self::Reserved) or [`TakenOver`](Self::TakenOver)); `None` when another
    /// record holds it ([`Held`](Self::Held)).
    ///
    /// The test for "this reserve holds the key": a reservation it answers `Some` for must be
    /// settled (completed or released) under that token.
    pub fn token(&self) -> Option<Token> {
        match self {
            Self::Reserved { token } | Self::TakenOver { token, .. } => Some(*token),
            Self::Held { .. } => None,
        }
    }
}

/// A store of idempotency keys; see the [module docs](self) for the contract.
///
/// Object safe: the layer holds it as `Arc<dyn Store>`. Implementations must make each
/// operation a single atomic step in their backend and decide expiry by their own clock.
///
/// For re-sends inside the provider's window and takeovers that check first, a store
/// implements [`retake`](Self::retake), keeps the first attempt's time in its records
/// (written by `reserve` on a free key, kept by a takeover of the same message, by
/// `complete` by the same token and by `retake`) and reports it as
/// [`Record::first_attempt_age`] in what `reserve` answers (on pending records and on done
/// ones of unknown delivery; on a done record of known delivery it may leave it out), and,
/// when it keeps pending records past their lease, answers [`Reservation::TakenOver`]. A
/// store that does none of
/// this still works: the layer then never re-sends a key and sends a taken-over key as a
/// fresh one.
/// [`complete`](Self::complete) and [`release`](Self::release) answer whether they changed the
/// record; `false` means another token holds the key (or, for release, nothing pending does).
pub trait Store: Send + Sync + 'static {
    /// Holds `key` pending for `lease` under a new token, unless a live record holds it.
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>>;

    /// [`reserve`](Self::reserve), answered at once by a store that needs no waiting for it
    /// (an in-process one); `None`, the default, when the store must wait, and the caller
    /// then calls `reserve`. When it answers, it answers what `reserve` would at that moment,
    /// and does what `reserve` would.
    ///
    /// The layer asks this first, as an answer here costs no future and no timer: for an
    /// in-process store those are a visible share of a send (BENCHMARKS.md). A store that
    /// wraps another forwards it, or keeps the default and is still correct.
    ///
    /// The key comes as the layer holds it, shared: a store that keeps keys in memory may
    /// keep a clone of this `Arc` rather than a copy of the text (`MemoryStore` does).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower_idempotency::store::{Reservation, Store};
    /// use tower_idempotency::{Fingerprint, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key: Arc<str> = Arc::from("order-1");
    /// let fingerprint = Fingerprint::from_bytes([7; 32]);
    /// let lease = Duration::from_secs(30);
    /// let first = store.reserve_now(&key, fingerprint, lease);
    /// assert!(matches!(first, Some(Ok(Reservation::Reserved { .. }))));
    /// let again = store.reserve_now(&key, fingerprint, lease);
    /// assert!(matches!(again, Some(Ok(Reservation::Held { .. }))));
    /// ```
    fn reserve_now(
        &self,
        key: &Arc<str>,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Option<Result<Reservation, StoreError>> {
        let _ = (key, fingerprint, lease);
        None
    }

    /// The bound the store keeps on each of its calls, when it bounds them itself: a call
    /// still unanswered after it fails with [`StoreErrorKind::Timeout`] (and, for a reserve,
    /// frees what it reserved). `None`, the default, when the store sets no bound.
    ///
    /// The layer bounds each store call by its
    /// [`reserve_timeout`](crate::IdempotencyLayerBuilder::reserve_timeout); where the
    /// store's own bound is no longer, the layer's timer could never fire first, and the
    /// layer sets none (a timer is a visible share of a call on a fast store, BENCHMARKS.md).
    /// A store answering `Some` must keep its word: the layer then waits for it that long.
    /// A store that wraps another forwards it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::store::Store;
    ///
    /// // An in-process store answers at once and needs no bound.
    /// assert_eq!(MemoryStore::new().call_timeout(), None);
    /// ```
    fn call_timeout(&self) -> Option<Duration> {
        None
    }

    /// Keeps `key` done with `outcome` for `ttl`, when `token` holds it or nothing does.
    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// [`complete`](Self::complete), answered at once by a store that needs no waiting for
    /// it, as [`reserve_now`](Self::reserve_now) is for `reserve`; `None`, the default, when
    /// the store must wait. The layer asks it first when it keeps a single send's outcome,
    /// and settles through `complete` (with its retries) when this answers `None` or an
    /// error.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower_idempotency::outcome::{Outcome, Receipt};
    /// use tower_idempotency::store::{Reservation, Store};
    /// use tower_idempotency::{Fingerprint, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key: Arc<str> = Arc::from("order-1");
    /// let fingerprint = Fingerprint::from_bytes([7; 32]);
    /// let minute = Duration::from_secs(60);
    /// let reserved = store.reserve_now(&key, fingerprint, minute);
    /// let Some(Ok(Reservation::Reserved { token })) = reserved else {
    ///     unreachable!("a free key is reserved");
    /// };
    /// let sent = Outcome::sent(Receipt::new("msg_1", "resend"));
    /// let kept = store.complete_now(&key, token, fingerprint, &sent, minute);
    /// assert!(matches!(kept, Some(Ok(true))));
    /// ```
    fn complete_now(
        &self,
        key: &Arc<str>,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Option<Result<bool, StoreError>> {
        let _ = (key, token, fingerprint, outcome, ttl);
        None
    }

    /// Deletes `key` when `token` holds it pending.
    fn release<'a>(&'a self, key: &'a str, token: Token)
    -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Makes the lease of `key` end `lease` from now, by the store's clock, when `token` holds
    /// it pending and its lease has not passed; answers whether it did. `false` means the key
    /// is lost to this token: another token holds it, it was completed or released, or its
    /// lease passed (a record whose lease passed may already be gone, so a store never
    /// revives one).
    ///
    /// The layer calls it while a send runs, so that a send slower than its lease keeps its
    /// key. Like `complete` and `release`, it is one atomic step in the backend, fenced by the
    /// token.
    ///
    /// The default answers an error of kind [`StoreErrorKind::Unsupported`], so a store
    /// that does not implement it still works; the layer then holds keys for
    /// the lease given at reserve time only, and says so in a warning. Every store of this
    /// crate implements it.
    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = (key, token, lease);
        Box::pin(std::future::ready(Err(StoreError::new(
            StoreErrorKind::Unsupported,
            "this store cannot extend a lease",
        ))))
    }

    /// Takes back `key` for a re-send of the same message: when a live done record of
    /// `fingerprint` holds it, with an outcome of unknown delivery
    /// ([`Record::is_unknown_delivery`]), and its first attempt began less than `within` ago
    /// by the store's clock, holds it pending for `lease` under a new token, keeping the
    /// first attempt's time, and answers that token. Otherwise it changes nothing and
    /// answers `None` (the record changed meanwhile, its window passed, its first attempt's
    /// time is unknown, or it is another message's).
    ///
    /// One atomic step in the backend, like `reserve`: of concurrent retakes of a key exactly
    /// one gets it, and the others then find it pending.
    ///
    /// The default answers an error of kind [`StoreErrorKind::Unsupported`], so a store
    /// that does not implement it still works; the layer then replays the stored outcome and says so in a warning. A store that
    /// implements it must also keep the first attempt's time in its records and report it as
    /// [`Record::first_attempt_age`]. Every store of this crate implements it.
    fn retake<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        let _ = (key, fingerprint, lease, within);
        Box::pin(std::future::ready(Err(StoreError::new(
            StoreErrorKind::Unsupported,
            "this store cannot retake a key",
        ))))
    }

    /// [`reserve`](Self::reserve) for many keys, in as few round trips as the backend allows.
    ///
    /// The keys must be distinct (the layer guarantees it); a store may refuse a repeated key.
    /// The answer has one entry per request, in order: an entry's error concerns that key
    /// alone (a corrupt record), while an outer error means the whole call failed and no key
    /// may be assumed reserved. The default calls `reserve` once per key.
    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(requests.len());
            for (key, fingerprint) in requests {
                answers.push(self.reserve(key, *fingerprint, lease).await);
            }
            Ok(answers)
        })
    }

    /// [`complete`](Self::complete) for many keys, in as few round trips as the backend
    /// allows; one answer per completion, in order. The default calls `complete` once per key.
    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(completions.len());
            for c in completions {
                answers.push(
                    self.complete(c.key, c.token, c.fingerprint, c.outcome, ttl)
                        .await?,
                );
            }
            Ok(answers)
        })
    }

    /// [`release`](Self::release) for many keys, in as few round trips as the backend allows;
    /// one answer per key, in order. The default calls `release` once per key.
    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(releases.len());
            for (key, token) in releases {
                answers.push(self.release(key, *token).await?);
            }
            Ok(answers)
        })
    }
}

/// A key to hold as *claimed* in a transaction of the caller's own, made by
/// [`IdempotencyLayer::claim`](crate::IdempotencyLayer::claim): the claim-then-send shape,
/// where the key commits with the business rows and the layer's send then takes it.
///
/// A claim is held for `ttl`, waiting for its send. A reserve with the same fingerprint takes
/// it (pending, under a new token) and sends; one with another fingerprint finds the key
/// held and is answered `idempotency.key_reused`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The key as the layer stores it (`namespace:key`, or `namespace:h1:<digest>` with
    /// hashed keys).
    pub key: String,
    /// The fingerprint of the message claimed.
    pub fingerprint: Fingerprint,
    /// How long the claim waits for its send.
    pub ttl: Duration,
}

impl Claim {
    /// A claim of `key` for the message of `fingerprint`, held for `ttl`.
    pub fn new(key: impl Into<String>, fingerprint: Fingerprint, ttl: Duration) -> Self {
        Self {
            key: key.into(),
            fingerprint,
            ttl,
        }
    }
}

/// A claim still waiting for its send, as `PostgresStore::claims` (feature `postgres`),
/// `SqliteStore::claims` (feature `sqlite`) and `MySqlStore::claims` (feature `mysql`) list it
/// after a crash: the messages the next run must send.
///
/// It holds the key as stored, which with [`KeyForm::Hashed`](crate::layer::KeyForm::Hashed)
/// is a digest: it cannot be read back into the business event. Map it the other way: rebuild
/// the messages of your recent events from your rows, ask the layer for each one's claim
/// ([`IdempotencyLayer::claim`](crate::IdempotencyLayer::claim), in the layer's key form), and
/// send those of which [`is_claim_of`](Self::is_claim_of) holds. The same code works with raw
/// keys.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use rusqlite::Connection;
/// use tower_idempotency::layer::KeyForm;
/// use tower_idempotency::{IdempotencyLayer, Message, SqliteStore};
///
/// # let dir = std::env::temp_dir().join(format!("waiting-claim-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("app.sqlite3");
/// let store = SqliteStore::open(&path).await?;
/// let layer = IdempotencyLayer::builder()
///     .store(store.clone())
///     .namespace("alerts")
///     .key_form(KeyForm::Hashed)
///     .build()?;
/// let alert = |order: &str| {
///     Message::builder().from("shop@x.example").to("seller@y.example")
///         .text(format!("{order} paid")).idempotency_key(format!("order.paid:{order}")).build()
/// };
///
/// // The order's transaction claimed its alert, then the process died before the send.
/// let connection = Connection::open(&path)?;
/// connection.busy_timeout(std::time::Duration::from_secs(5))?;
/// if let Some(claim) = layer.claim(&alert("ord_2")?)? {
///     store.claim_in(&connection, &claim)?;
/// }
///
/// // The next run: which of the recent orders' alerts wait for their send?
/// let waiting = store.claims(100).await?;
/// assert!(waiting[0].key.starts_with("alerts:h1:"), "a digest, not the order");
/// let mut to_send = Vec::new();
/// for order in ["ord_1", "ord_2", "ord_3"] {
///     let message = alert(order)?;
///     if let Some(claim) = layer.claim(&message)? {
///         if waiting.iter().any(|w| w.is_claim_of(&claim)) {
///             to_send.push(message); // send it through the layer: it takes the claim
///         }
///     }
/// }
/// assert_eq!(to_send.len(), 1);
/// assert_eq!(to_send[0].text(), Some("ord_2 paid"));
/// # drop(store); drop(connection);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitingClaim {
    /// The key as stored (`namespace:key`, or `namespace:h1:<digest>` with hashed keys).
    pub key: String,
    /// The fingerprint of the message claimed.
    pub fingerprint: Fingerprint,
}

impl WaitingClaim {
    /// A waiting claim of `key` for the message of `fingerprint`.
    pub fn new(key: impl Into<String>, fingerprint: Fingerprint) -> Self {
        Self {
            key: key.into(),
            fingerprint,
        }
    }

    /// Whether this is the claim the layer makes for a message (`claim`, from
    /// [`IdempotencyLayer::claim`](crate::IdempotencyLayer::claim)): the same stored key and
    /// the same fingerprint, so the send of that message takes it. A claim of the same key
    /// with another fingerprint is not: that message differs from the one claimed, and its
    /// send would be refused as `idempotency.key_reused`; compare [`key`](Self::key) alone
    /// to find such a claim.
    pub fn is_claim_of(&self, claim: &Claim) -> bool {
        self.key == claim.key && self.fingerprint == claim.fingerprint
    }
}

/// One completion of [`Store::complete_many`].
#[derive(Clone, Copy, Debug)]
pub struct Completion<'a> {
    /// The key.
    pub key: &'a str,
    /// The token that reserved it.
    pub token: Token,
    /// The fingerprint of the message sent under it.
    pub fingerprint: Fingerprint,
    /// The outcome to keep.
    pub outcome: &'a Outcome,
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        (**self).reserve(key, fingerprint, lease)
    }

    fn reserve_now(
        &self,
        key: &Arc<str>,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Option<Result<Reservation, StoreError>> {
        (**self).reserve_now(key, fingerprint, lease)
    }

    fn call_timeout(&self) -> Option<Duration> {
        (**self).call_timeout()
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &'a Outcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).complete(key, token, fingerprint, outcome, ttl)
    }

    fn complete_now(
        &self,
        key: &Arc<str>,
        token: Token,
        fingerprint: Fingerprint,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Option<Result<bool, StoreError>> {
        (**self).complete_now(key, token, fingerprint, outcome, ttl)
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).release(key, token)
    }

    fn extend<'a>(
        &'a self,
        key: &'a str,
        token: Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).extend(key, token, lease)
    }

    fn retake<'a>(
        &'a self,
        key: &'a str,
        fingerprint: Fingerprint,
        lease: Duration,
        within: Duration,
    ) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        (**self).retake(key, fingerprint, lease, within)
    }

    fn reserve_many<'a>(
        &'a self,
        requests: &'a [(&'a str, Fingerprint)],
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Result<Reservation, StoreError>>, StoreError>> {
        (**self).reserve_many(requests, lease)
    }

    fn complete_many<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        (**self).complete_many(completions, ttl)
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, Token)],
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        (**self).release_many(releases)
    }
}
