//! [`ListingLookup`]: answers [`Verify`] questions from a provider's listing of what it took,
//! listed once per [`refresh`](ListingLookup::refresh) and shared by every question.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_service::Service;

use crate::http::mark::key_digest;
use crate::outcome::{BoxError, Receipt};
use crate::verify::{Verified, Verify};

/// How long a provider may take to list a message it took, unless told otherwise: 5 minutes.
pub const DEFAULT_LISTING_DELAY: Duration = Duration::from_secs(5 * 60);
/// How far back a listing reaches unless told otherwise: 25 hours, the layer's default ttl
/// (24 h) and an hour to spare. Keep it longer than the layer's ttl plus its lease.
pub const DEFAULT_LOOKBACK: Duration = Duration::from_secs(25 * 60 * 60);
/// The most pages one listing reads unless told otherwise; a listing cut off by it answers
/// unknown for what it did not find.
pub const DEFAULT_MAX_PAGES: usize = 100;
/// How long a listing answers questions before the next one is taken, unless told otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
/// The longest page body read: 8 MiB.
const MAX_PAGE_BODY: usize = 8 * 1024 * 1024;
/// The shortest time between two listings taken because a key's listing delay has passed.
const MIN_GAP: Duration = Duration::from_secs(1);

/// One message a provider listed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listed {
    /// The [`key_digest`] the message was marked with, if it carries one.
    pub digest: Option<String>,
    /// The provider's id of the message.
    pub id: String,
    /// When the provider took it, when it says.
    pub created: Option<SystemTime>,
}

impl Listed {
    /// A listed message.
    pub fn new(digest: Option<String>, id: impl Into<String>, created: Option<SystemTime>) -> Self {
        Self {
            digest,
            id: id.into(),
            created,
        }
    }
}

/// One page of a listing, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedPage {
    /// The page's messages, newest first.
    pub messages: Vec<Listed>,
    /// Whether the provider has more, older ones.
    pub more: bool,
}

impl ListedPage {
    /// A page of `messages`, with older ones after it when `more`.
    pub fn new(messages: Vec<Listed>, more: bool) -> Self {
        Self { messages, more }
    }
}

/// How a provider lists the messages it took, newest first:
/// [`ResendListing`](super::resend::ResendListing),
/// [`PostmarkListing`](super::postmark::PostmarkListing), or one of yours.
pub trait Listing {
    /// The transport name of the receipts found (`resend`, `postmark`).
    fn transport(&self) -> &'static str;

    /// The most pages the provider lets a listing read (default: no bound of its own); a
    /// listing stops at the smaller of this and [`ListingLookup::max_pages`].
    fn max_pages(&self) -> usize {
        usize::MAX
    }

    /// The request for the next page: the first when `previous` is `None`, else the one after
    /// `previous`, the `pages_read`-th page read so far.
    ///
    /// # Errors
    /// When no request can be made (a base URL that does not take the path).
    fn page(
        &self,
        previous: Option<&ListedPage>,
        pages_read: usize,
    ) -> Result<http::Request<Bytes>, BoxError>;

    /// The page in a 2xx answer.
    ///
    /// # Errors
    /// When the body is not what the provider documents.
    fn read(&self, response: &http::Response<Bytes>) -> Result<ListedPage, BoxError>;

    /// Whether a message missing from a complete listing proves it was not sent (default:
    /// yes). A listing that cannot find every message the codec sent (one whose mark may be
    /// missing) answers no, and the lookup then answers
    /// [`Unknown`](crate::verify::Verified::Unknown), never
    /// [`NotSent`](crate::verify::Verified::NotSent), for what it did not find.
    fn absence_proves_not_sent(&self) -> bool {
        true
    }
}

#[derive(Default)]
struct Snapshot {
    /// When the listing began: it shows what the provider had taken by then.
    taken_at: Option<Instant>,
    /// Whether it reached back past the lookback (or the provider's end).
    complete: bool,
    /// Digest to provider id.
    found: HashMap<String, String>,
    /// Requests made for listings, in all.
    requests: u64,
}

struct Shared {
    snapshot: tokio::sync::Mutex<Snapshot>,
    first_seen: Mutex<HashMap<String, Instant>>,
}

/// A [`Service<Verify>`](Verify) that answers from a provider's listing; see the
/// [module docs](super) for what it answers when.
///
/// Clones share one listing. Questions wait for a listing under way rather than take their
/// own.
///
/// ```
/// use tower_idempotency::http::lookup::ListingLookup;
/// use tower_idempotency::http::lookup::resend::ResendListing;
/// use tower_idempotency::reconcile::Reconciler;
/// use tower_idempotency::MemoryStore;
/// # let client = tower::service_fn(|_: http::Request<bytes::Bytes>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::from(r#"{"data":[],"has_more":false}"#)))
/// # });
///
/// let lookup = ListingLookup::new(client, ResendListing::new("re_123"));
/// let reconciler = Reconciler::new(MemoryStore::new(), lookup);
/// # let _ = reconciler;
/// ```
pub struct ListingLookup<S, L> {
    client: S,
    listing: Arc<L>,
    listing_delay: Duration,
    lookback: Duration,
    max_pages: usize,
    refresh: Duration,
    shared: Arc<Shared>,
}

impl<S, L> ListingLookup<S, L> {
    /// A lookup that lists through `client` as `listing` describes.
    pub fn new(client: S, listing: L) -> Self {
        Self {
            client,
            listing: Arc::new(listing),
            listing_delay: DEFAULT_LISTING_DELAY,
            lookback: DEFAULT_LOOKBACK,
            max_pages: DEFAULT_MAX_PAGES,
            refresh: DEFAULT_REFRESH,
            shared: Arc::new(Shared {
                snapshot: tokio::sync::Mutex::new(Snapshot::default()),
                first_seen: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// How long the provider may take to list a message it took (default
    /// [`DEFAULT_LISTING_DELAY`]): "not sent" is answered only by a listing taken that long
    /// after the key was first asked about.
    #[must_use]
    pub fn listing_delay(mut self, delay: Duration) -> Self {
        self.listing_delay = delay;
        self
    }

    /// How far back a listing reaches (default [`DEFAULT_LOOKBACK`]); keep it longer than the
    /// layer's ttl plus its lease, so every key the store still keeps is covered.
    #[must_use]
    pub fn lookback(mut self, lookback: Duration) -> Self {
        self.lookback = lookback;
        self
    }

    /// The most pages one listing reads (default [`DEFAULT_MAX_PAGES`]; at least 1).
    #[must_use]
    pub fn max_pages(mut self, pages: usize) -> Self {
        self.max_pages = pages.max(1);
        self
    }

    /// How long one listing answers questions (default [`DEFAULT_REFRESH`]).
    #[must_use]
    pub fn refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// The requests made for listings so far, by this lookup and its clones.
    pub async fn requests(&self) -> u64 {
        self.shared.snapshot.lock().await.requests
    }

    /// The listing.
    pub fn listing(&self) -> &L {
        &self.listing
    }

    /// The client.
    pub fn get_ref(&self) -> &S {
        &self.client
    }

    /// The client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.client
    }

    /// Unwraps the client.
    pub fn into_inner(self) -> S {
        self.client
    }
}

impl<S: Clone, L> Clone for ListingLookup<S, L> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            listing: Arc::clone(&self.listing),
            listing_delay: self.listing_delay,
            lookback: self.lookback,
            max_pages: self.max_pages,
            refresh: self.refresh,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, L: fmt::Debug> fmt::Debug for ListingLookup<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListingLookup")
            .field("listing", &self.listing)
            .field("listing_delay", &self.listing_delay)
            .field("lookback", &self.lookback)
            .field("max_pages", &self.max_pages)
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl<S, L, B> Service<Verify> for ListingLookup<S, L>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    L: Listing + Send + Sync + 'static,
{
    type Response = Verified;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Verified, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The client is made ready for each page, inside the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, question: Verify) -> Self::Future {
        let this = self.clone();
        Box::pin(this.answer(question))
    }
}

impl<S, L, B> ListingLookup<S, L>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    L: Listing + Send + Sync + 'static,
{
    async fn answer(mut self, question: Verify) -> Result<Verified, BoxError> {
        let now = Instant::now();
        let first_seen = self.first_seen(&question.stored_key, now);
        let digest = key_digest(&question.stored_key);
        let conclusive_after = first_seen + self.listing_delay;
        let mut snapshot = self.shared.snapshot.lock().await;
        let stale = snapshot
            .taken_at
            .is_none_or(|taken| now.saturating_duration_since(taken) >= self.refresh);
        // A listing too young to prove a message missing, once a younger one could.
        let too_young = !snapshot.found.contains_key(&digest)
            && snapshot.taken_at.is_some_and(|taken| {
                taken < conclusive_after
                    && conclusive_after <= now
                    && now.saturating_duration_since(taken) >= MIN_GAP
            });
        if stale || too_young {
            let (lookback, max_pages) = (self.lookback, self.max_pages);
            list(
                &mut self.client,
                &*self.listing,
                lookback,
                max_pages,
                &mut snapshot,
            )
            .await?;
        }
        if let Some(id) = snapshot.found.get(&digest) {
            return Ok(Verified::Delivered(Receipt::new(
                id.clone(),
                self.listing.transport(),
            )));
        }
        let taken = snapshot.taken_at.unwrap_or(now);
        Ok(
            if snapshot.complete
                && taken >= conclusive_after
                && self.listing.absence_proves_not_sent()
            {
                Verified::NotSent
            } else {
                Verified::Unknown
            },
        )
    }

    /// When the lookup first heard of `key`, remembering it now if never.
    fn first_seen(&self, key: &str, now: Instant) -> Instant {
        let mut seen = self
            .shared
            .first_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() >= 100_000 {
            // A key unsettled for longer than the lookback is gone from the store.
            let lookback = self.lookback;
            seen.retain(|_, at| now.saturating_duration_since(*at) < lookback);
        }
        *seen.entry(key.to_owned()).or_insert(now)
    }
}

/// Takes a new listing into `snapshot`; on an error the old one stays.
async fn list<S, L, B>(
    client: &mut S,
    listing: &L,
    lookback: Duration,
    max_pages: usize,
    snapshot: &mut Snapshot,
) -> Result<(), BoxError>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
    L: Listing,
{
    let taken_at = Instant::now();
    let oldest_wanted = SystemTime::now().checked_sub(lookback);
    let mut found = HashMap::new();
    let mut previous: Option<ListedPage> = None;
    let mut complete = false;
    for pages_read in 0..max_pages.min(listing.max_pages()) {
        let request = listing.page(previous.as_ref(), pages_read)?;
        snapshot.requests += 1;
        let page = fetch(client, listing, request).await?;
        let mut reached_back = false;
        for message in &page.messages {
            if let (Some(created), Some(oldest)) = (message.created, oldest_wanted)
                && created < oldest
            {
                reached_back = true;
            }
            if let Some(digest) = &message.digest {
                found
                    .entry(digest.clone())
                    .or_insert_with(|| message.id.clone());
            }
        }
        if !page.more || reached_back {
            complete = true;
            break;
        }
        previous = Some(page);
    }
    snapshot.taken_at = Some(taken_at);
    snapshot.complete = complete;
    snapshot.found = found;
    Ok(())
}

async fn fetch<S, L, B>(
    client: &mut S,
    listing: &L,
    request: http::Request<Bytes>,
) -> Result<ListedPage, BoxError>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
    L: Listing,
{
    let response = client
        .ready()
        .await
        .map_err(Into::into)?
        .call(request)
        .await
        .map_err(Into::into)?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_PAGE_BODY)
        .collect()
        .await?
        .to_bytes();
    if !parts.status.is_success() {
        return Err(format!(
            "the provider answered HTTP {} to a listing",
            parts.status.as_u16()
        )
        .into());
    }
    listing.read(&http::Response::from_parts(parts, body))
}
