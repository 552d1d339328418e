//! [`ResendListing`]: Resend's `GET /emails`, newest first, 100 a page, paged with `after`
//! (the last id of the page before), as Resend's OpenAPI description (`emails/list`,
//! `ListEmailsResponse`) documents it. A message is found by its `message_id`, the
//! `Message-ID` the [codec](crate::http::resend::ResendCodec) set from the stored key's
//! [digest](crate::http::mark::key_digest).
//!
//! A keyed message that sets a `Message-ID` of its own keeps it (its threading is the
//! sender's), so it carries no mark Resend lists, and a question about a key carries neither
//! the message nor whether it set one. A listing that misses a message therefore proves
//! nothing by default: the lookup answers [`Delivered`](crate::verify::Verified::Delivered)
//! for what it finds and [`Unknown`](crate::verify::Verified::Unknown) for the rest, and the
//! reconciler leaves those keys (to a webhook, or to you). Declare
//! [`every_message_marked`](ResendListing::every_message_marked) when no keyed message of
//! yours sets a `Message-ID`: a message still missing once the listing delay has passed is
//! then [`NotSent`](crate::verify::Verified::NotSent).

use std::fmt;

use bytes::Bytes;
use http::Uri;
use serde::Deserialize;

use super::time::iso8601;
use super::{Listed, ListedPage, Listing};
use crate::http::codec::resend::{RESEND, RESEND_API};
use crate::http::mark::digest_of_message_id;
use crate::outcome::BoxError;

/// The most emails one page of `GET /emails` holds (`limit`'s maximum).
pub const RESEND_PAGE: usize = 100;

/// Resend's listing of sent emails, for a [`ListingLookup`](super::ListingLookup).
///
/// ```
/// use tower_idempotency::http::lookup::resend::ResendListing;
///
/// let listing = ResendListing::new("re_123").base_url("http://127.0.0.1:8080".parse()?);
/// assert!(!format!("{listing:?}").contains("re_123"));
/// # Ok::<(), http::uri::InvalidUri>(())
/// ```
#[derive(Clone)]
pub struct ResendListing {
    authorization: String,
    base_url: Uri,
    every_message_marked: bool,
}

impl ResendListing {
    /// Lists at [`RESEND_API`] with `api_key` (a key allowed to read emails: Resend's
    /// "sending access" keys cannot).
    pub fn new(api_key: impl AsRef<str>) -> Self {
        Self {
            authorization: format!("Bearer {}", api_key.as_ref()),
            base_url: Uri::from_static(RESEND_API),
            every_message_marked: false,
        }
    }

    /// Declares that no keyed message sent through the codec sets a `Message-ID` of its own,
    /// so every one carries the mark: a message missing from a complete listing, once the
    /// listing delay has passed, was not sent. Without it, the lookup never answers not sent.
    ///
    /// Declare it only if it holds for every message of every process sending under these
    /// keys: a message that set its own `Message-ID` would be answered not sent, and its key
    /// freed to send again.
    #[must_use]
    pub fn every_message_marked(mut self) -> Self {
        self.every_message_marked = true;
        self
    }

    /// Lists at `base_url` instead (a test server, a proxy).
    #[must_use]
    pub fn base_url(mut self, base_url: Uri) -> Self {
        self.base_url = base_url;
        self
    }
}

impl fmt::Debug for ResendListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResendListing")
            .field("api_key", &"<redacted>")
            .field("base_url", &self.base_url)
            .field("every_message_marked", &self.every_message_marked)
            .finish()
    }
}

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    has_more: bool,
    data: Vec<Email>,
}

#[derive(Deserialize)]
struct Email {
    id: String,
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    created_at: Option<String>,
}

impl Listing for ResendListing {
    fn transport(&self) -> &'static str {
        RESEND
    }

    fn page(
        &self,
        previous: Option<&ListedPage>,
        _pages_read: usize,
    ) -> Result<http::Request<Bytes>, BoxError> {
        let mut query = format!("limit={RESEND_PAGE}");
        if let Some(last) = previous.and_then(|p| p.messages.last()) {
            query.push_str("&after=");
            query.push_str(&super::query_escape(&last.id));
        }
        let uri = super::endpoint(&self.base_url, "/emails", &query)?;
        Ok(http::Request::get(uri)
            .header(http::header::AUTHORIZATION, &self.authorization)
            .body(Bytes::new())?)
    }

    fn read(&self, response: &http::Response<Bytes>) -> Result<ListedPage, BoxError> {
        let page: Page = serde_json::from_slice(response.body())?;
        let messages = page
            .data
            .into_iter()
            .map(|email| {
                let digest = email
                    .message_id
                    .as_deref()
                    .and_then(digest_of_message_id)
                    .map(str::to_owned);
                let created = email.created_at.as_deref().and_then(iso8601);
                Listed::new(digest, email.id, created)
            })
            .collect();
        Ok(ListedPage::new(messages, page.has_more))
    }

    fn absence_proves_not_sent(&self) -> bool {
        self.every_message_marked
    }
}
