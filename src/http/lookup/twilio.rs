//! [`TwilioLookup`]: Twilio's Messages list, filtered by recipient and sender, for one key
//! at a time.
//!
//! Twilio's Message resource carries no field of the sender's, so no listing can show the
//! [mark](crate::http::mark) (the codec puts it in the `StatusCallback` URL, which only the
//! callback gives back). The lookup therefore needs the message itself: you give it a
//! `recall` function that rebuilds the message a key stands for (as an outbox would), it
//! checks the rebuilt message's [`Fingerprint`] against the record's, and lists
//! `GET /2010-04-01/Accounts/{sid}/Messages.json?To=…&From=…`, newest first, page after page
//! (`next_page_uri`) back to its lookback, matching the outbound messages whose `Body` is the
//! message's text.
//!
//! | the listing | the answer |
//! |---|---|
//! | exactly one such message (not `failed` or `canceled`) | [`Delivered`](Verified::Delivered) with its `sid` |
//! | two or more: the same text to the same number from the same sender | [`Unknown`](Verified::Unknown): no guess |
//! | none, the listing reached back past the lookback, and the listing delay passed since the key was first asked about | [`NotSent`](Verified::NotSent) |
//! | anything else; no message recalled; a recalled message that is not the one that holds the key | [`Unknown`](Verified::Unknown) |
//!
//! `DateSent` is not filtered on: a message Twilio still queues or schedules has none, and a
//! listing filtered on it would miss it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::Uri;
use http_body_util::{BodyExt, Limited};
use serde::Deserialize;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_service::Service;

use super::{DEFAULT_LISTING_DELAY, DEFAULT_LOOKBACK, DEFAULT_MAX_PAGES, endpoint, query_escape};
use crate::fingerprint::Fingerprint;
use crate::http::codec::twilio::{TWILIO, TWILIO_API};
use crate::message::{Channel, Message, SmsSender};
use crate::outcome::{BoxError, Receipt};
use crate::verify::{Verified, Verify};

/// The most messages one page of the list holds, as the lookup asks (`PageSize`).
pub const TWILIO_PAGE: usize = 100;
/// The longest page body read: 4 MiB.
const MAX_PAGE_BODY: usize = 4 * 1024 * 1024;

/// A [`Service<Verify>`](Verify) over Twilio's Messages list; see the [module docs](self).
///
/// ```
/// use tower_idempotency::http::lookup::twilio::TwilioLookup;
/// use tower_idempotency::verify::Verify;
/// use tower_idempotency::Message;
/// # let client = tower::service_fn(|_: http::Request<bytes::Bytes>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::from(r#"{"messages":[]}"#)))
/// # });
///
/// // Rebuilds the SMS a key stands for, from your own records.
/// let recall = |question: &Verify| -> Option<Message> {
///     let order = question.raw_key.as_deref()?.strip_prefix("otp:")?;
///     Message::sms().from_number("+15005550006").to("+15005550010")
///         .text(format!("Your code for {order}")).build().ok()
/// };
/// let lookup = TwilioLookup::new(client, "AC0123456789abcdef0123456789abcdef", "auth-token", recall);
/// # let _ = lookup;
/// ```
pub struct TwilioLookup<S, R> {
    client: S,
    account_sid: String,
    authorization: String,
    base_url: Uri,
    recall: Arc<R>,
    listing_delay: Duration,
    lookback: Duration,
    max_pages: usize,
    first_seen: Arc<Mutex<HashMap<String, Instant>>>,
}

impl<S, R> TwilioLookup<S, R> {
    /// A lookup at [`TWILIO_API`] for `account_sid`, authenticated with its `auth_token`,
    /// that rebuilds each key's message with `recall`.
    pub fn new(
        client: S,
        account_sid: impl Into<String>,
        auth_token: impl AsRef<str>,
        recall: R,
    ) -> Self {
        let account_sid = account_sid.into();
        let basic =
            crate::base64::encode(format!("{account_sid}:{}", auth_token.as_ref()).as_bytes());
        Self {
            client,
            account_sid,
            authorization: format!("Basic {basic}"),
            base_url: Uri::from_static(TWILIO_API),
            recall: Arc::new(recall),
            listing_delay: DEFAULT_LISTING_DELAY,
            lookback: DEFAULT_LOOKBACK,
            max_pages: DEFAULT_MAX_PAGES,
            first_seen: Arc::default(),
        }
    }

    /// Lists at `base_url` instead of [`TWILIO_API`] (a test server, a proxy).
    #[must_use]
    pub fn base_url(mut self, base_url: Uri) -> Self {
        self.base_url = base_url;
        self
    }

    /// How long Twilio may take to list a message it took (default
    /// [`DEFAULT_LISTING_DELAY`]).
    #[must_use]
    pub fn listing_delay(mut self, delay: Duration) -> Self {
        self.listing_delay = delay;
        self
    }

    /// How far back a listing reaches (default [`DEFAULT_LOOKBACK`]).
    #[must_use]
    pub fn lookback(mut self, lookback: Duration) -> Self {
        self.lookback = lookback;
        self
    }

    /// The most pages one question reads (default [`DEFAULT_MAX_PAGES`]; at least 1).
    #[must_use]
    pub fn max_pages(mut self, pages: usize) -> Self {
        self.max_pages = pages.max(1);
        self
    }
}

impl<S: Clone, R> Clone for TwilioLookup<S, R> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            account_sid: self.account_sid.clone(),
            authorization: self.authorization.clone(),
            base_url: self.base_url.clone(),
            recall: Arc::clone(&self.recall),
            listing_delay: self.listing_delay,
            lookback: self.lookback,
            max_pages: self.max_pages,
            first_seen: Arc::clone(&self.first_seen),
        }
    }
}

impl<S, R> fmt::Debug for TwilioLookup<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TwilioLookup")
            .field("account_sid", &self.account_sid)
            .field("auth", &"<redacted>")
            .field("base_url", &self.base_url)
            .field("listing_delay", &self.listing_delay)
            .field("lookback", &self.lookback)
            .field("max_pages", &self.max_pages)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    messages: Vec<Listed>,
    #[serde(default)]
    next_page_uri: Option<String>,
}

#[derive(Deserialize)]
struct Listed {
    sid: String,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    direction: Option<String>,
    #[serde(default)]
    date_created: Option<String>,
}

impl<S, R, B> Service<Verify> for TwilioLookup<S, R>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    R: Fn(&Verify) -> Option<Message> + Send + Sync + 'static,
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

impl<S, R, B> TwilioLookup<S, R>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    R: Fn(&Verify) -> Option<Message> + Send + Sync + 'static,
{
    async fn answer(mut self, question: Verify) -> Result<Verified, BoxError> {
        let now = Instant::now();
        let first_seen = {
            let mut seen = self
                .first_seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.len() >= 100_000 {
                let lookback = self.lookback;
                seen.retain(|_, at| now.saturating_duration_since(*at) < lookback);
            }
            *seen.entry(question.stored_key.clone()).or_insert(now)
        };
        let Some(message) = (self.recall)(&question) else {
            return Ok(Verified::Unknown);
        };
        if Fingerprint::of(&message) != question.record.fingerprint {
            // Not the message that holds the key: nothing it finds would be about the key.
            return Ok(Verified::Unknown);
        }
        let (Channel::Sms(sender), [to]) = (message.channel(), message.to()) else {
            return Ok(Verified::Unknown);
        };
        let text = message.text().unwrap_or_default();
        let mut query = format!("To={}&PageSize={TWILIO_PAGE}", query_escape(to));
        if sender != SmsSender::MessagingService {
            query.push_str("&From=");
            query.push_str(&query_escape(message.from()));
        }
        let path = format!("/2010-04-01/Accounts/{}/Messages.json", self.account_sid);
        let mut uri = endpoint(&self.base_url, &path, &query)?;
        let oldest_wanted = SystemTime::now().checked_sub(self.lookback);
        let mut matches: Vec<String> = Vec::new();
        let mut complete = false;
        for _ in 0..self.max_pages {
            let page = self.page(uri.clone()).await?;
            let mut reached_back = false;
            for listed in &page.messages {
                let created = listed
                    .date_created
                    .as_deref()
                    .and_then(super::time::rfc2822);
                if let (Some(created), Some(oldest)) = (created, oldest_wanted)
                    && created < oldest
                {
                    reached_back = true;
                }
                let outbound = listed
                    .direction
                    .as_deref()
                    .is_none_or(|d| d.starts_with("outbound"));
                let not_sent = matches!(listed.status.as_deref(), Some("failed" | "canceled"));
                if outbound && !not_sent && listed.body.as_deref() == Some(text) {
                    matches.push(listed.sid.clone());
                }
            }
            match page.next_page_uri.filter(|next| !next.is_empty()) {
                Some(next) if !reached_back => {
                    // Twilio's next page is a path and query on the same host.
                    let base = self.base_url.to_string();
                    uri = format!("{}{next}", base.trim_end_matches('/')).parse()?;
                }
                _ => {
                    complete = true;
                    break;
                }
            }
        }
        Ok(match matches.as_slice() {
            [sid] => Verified::Delivered(Receipt::new(sid.clone(), TWILIO)),
            [] if complete && now >= first_seen + self.listing_delay => Verified::NotSent,
            _ => Verified::Unknown,
        })
    }

    async fn page(&mut self, uri: Uri) -> Result<Page, BoxError> {
        let request = http::Request::get(uri)
            .header(http::header::AUTHORIZATION, &self.authorization)
            .body(Bytes::new())?;
        let response = self
            .client
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
                "Twilio answered HTTP {} to a listing",
                parts.status.as_u16()
            )
            .into());
        }
        Ok(serde_json::from_slice(&body)?)
    }
}
