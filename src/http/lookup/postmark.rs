//! [`PostmarkListing`]: Postmark's outbound message search, `GET /messages/outbound`, newest
//! first, 500 a page (`count`), paged by `offset` (Postmark answers at most 10,000 back:
//! `count + offset` ≤ 10,000). A message is found by its `Metadata` entry
//! [`idempotency_digest`](crate::http::mark::KEY_DIGEST), which the
//! [codec](crate::http::postmark::PostmarkCodec) set.

use std::collections::HashMap;
use std::fmt;

use bytes::Bytes;
use http::Uri;
use serde::Deserialize;

use super::time::iso8601;
use super::{Listed, ListedPage, Listing};
use crate::http::codec::postmark::{POSTMARK, POSTMARK_API};
use crate::http::mark::KEY_DIGEST;
use crate::outcome::BoxError;

/// The most messages one page of the outbound search holds (`count`'s maximum).
pub const POSTMARK_PAGE: usize = 500;

/// How far back the outbound search pages: `count + offset` at most 10,000.
pub const POSTMARK_MAX_OFFSET: usize = 10_000;

/// Postmark's outbound message search, for a [`ListingLookup`](super::ListingLookup).
#[derive(Clone)]
pub struct PostmarkListing {
    server_token: String,
    base_url: Uri,
}

impl PostmarkListing {
    /// Lists at [`POSTMARK_API`] with the server's `server_token`.
    pub fn new(server_token: impl Into<String>) -> Self {
        Self {
            server_token: server_token.into(),
            base_url: Uri::from_static(POSTMARK_API),
        }
    }

    /// Lists at `base_url` instead (a test server, a proxy).
    #[must_use]
    pub fn base_url(mut self, base_url: Uri) -> Self {
        self.base_url = base_url;
        self
    }
}

impl fmt::Debug for PostmarkListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostmarkListing")
            .field("server_token", &"<redacted>")
            .field("base_url", &self.base_url)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Page {
    total_count: usize,
    messages: Vec<Message>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Message {
    #[serde(rename = "MessageID")]
    message_id: String,
    #[serde(default)]
    received_at: Option<String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

impl Listing for PostmarkListing {
    fn transport(&self) -> &'static str {
        POSTMARK
    }

    fn max_pages(&self) -> usize {
        POSTMARK_MAX_OFFSET / POSTMARK_PAGE
    }

    fn page(
        &self,
        _previous: Option<&ListedPage>,
        pages_read: usize,
    ) -> Result<http::Request<Bytes>, BoxError> {
        let offset = pages_read * POSTMARK_PAGE;
        let query = format!("count={POSTMARK_PAGE}&offset={offset}");
        let uri = super::endpoint(&self.base_url, "/messages/outbound", &query)?;
        Ok(http::Request::get(uri)
            .header("accept", "application/json")
            .header("x-postmark-server-token", &self.server_token)
            .body(Bytes::new())?)
    }

    fn read(&self, response: &http::Response<Bytes>) -> Result<ListedPage, BoxError> {
        let page: Page = serde_json::from_slice(response.body())?;
        // A full page may have older ones after it; `TotalCount` counts from the newest.
        let more = page.messages.len() >= POSTMARK_PAGE && page.total_count > POSTMARK_PAGE;
        let messages = page
            .messages
            .into_iter()
            .map(|m| {
                let digest = m.metadata.get(KEY_DIGEST).cloned();
                let created = m.received_at.as_deref().and_then(iso8601);
                Listed::new(digest, m.message_id, created)
            })
            .collect();
        Ok(ListedPage::new(messages, more))
    }
}
