//! Lookups that ship: a [`Service<Verify>`](crate::verify::Verify) per provider, over the same
//! HTTP client as [`HttpTransport`](super::HttpTransport), for the
//! [`Reconciler`](crate::reconcile::Reconciler) and
//! [`verify_takeovers`](crate::IdempotencyLayerBuilder::verify_takeovers) as they are.
//!
//! A [`ListingLookup`] lists what the provider took (newest first, page after page, back to
//! its [`lookback`](ListingLookup::lookback)), keeps that listing for
//! [`refresh`](ListingLookup::refresh), and answers every question from it: a reconciler pass
//! over a thousand keys costs the pages of one listing, not a request per key. Each message is
//! found by the [mark](super::mark) its codec put on it, a digest of the stored key.
//!
//! | the listing | the answer |
//! |---|---|
//! | holds a message marked with the key's digest | [`Delivered`](crate::verify::Verified::Delivered), with the provider's id |
//! | reached back past the lookback, holds no such message, and was taken at least [`listing_delay`](ListingLookup::listing_delay) after the lookup first saw the key unsettled | [`NotSent`](crate::verify::Verified::NotSent) |
//! | anything else (a listing too young to show the message, one cut off by [`max_pages`](ListingLookup::max_pages), a provider error) | [`Unknown`](crate::verify::Verified::Unknown), or an error (the reconciler leaves the key) |
//!
//! "First saw the key unsettled" stands for "the message, if it went, went before then": the
//! reconciler asks only about keys of unknown delivery and pending keys whose lease passed, so
//! their send is over when the lookup first hears of them. The provider's listing delay is how
//! long it may take to list a message it took; until that has passed since the first
//! question, a message missing from the listing may still appear, and the answer is unknown.
//!
//! | provider | listing | found by | listing delay (default) |
//! |---|---|---|---|
//! | Resend ([`resend::ResendListing`]) | `GET /emails?limit=100&after=…` | `message_id`, the `Message-ID` the codec set | [`DEFAULT_LISTING_DELAY`] (5 min): Resend documents none |
//! | Twilio ([`twilio::TwilioLookup`], one listing per key: no mark to list by) | `GET …/Messages.json?To=…&From=…` | `To`, `From` and `Body` of the message you rebuild | [`DEFAULT_LISTING_DELAY`] (5 min): Twilio documents none |
//! | Postmark ([`postmark::PostmarkListing`]) | `GET /messages/outbound?count=500&offset=…` (at most 10,000 back) | `Metadata.idempotency_digest` | [`DEFAULT_LISTING_DELAY`] (5 min): Postmark documents none |
//!
//! The listing delays are assumptions: no provider documents how long it takes to list a
//! message it took. Set [`listing_delay`](ListingLookup::listing_delay) longer if yours lists
//! later.
//!
//! A message that sets a `Message-ID` of its own is not marked at Resend (its header is
//! kept), and a question carries nothing that tells whether it did: the Resend lookup answers
//! unknown for a key it does not find, never not sent, unless you declare
//! [`every_message_marked`](resend::ResendListing::every_message_marked).

mod listing;
pub mod postmark;
pub mod resend;
pub(crate) mod time;
pub mod twilio;

pub use listing::{
    DEFAULT_LISTING_DELAY, DEFAULT_LOOKBACK, DEFAULT_MAX_PAGES, DEFAULT_REFRESH, Listed,
    ListedPage, Listing, ListingLookup,
};

/// `<base_url><path>?<query>`, the base's own path kept (a proxy's prefix).
fn endpoint(base: &http::Uri, path: &str, query: &str) -> Result<http::Uri, crate::BoxError> {
    let base = base.to_string();
    let base = base.trim_end_matches('/');
    Ok(format!("{base}{path}?{query}").parse()?)
}

/// `text` escaped for a URL query value: every byte but the unreserved ones percent-encoded.
fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let [high, low] = crate::hex::pair(byte);
            out.push('%');
            out.push(char::from(high).to_ascii_uppercase());
            out.push(char::from(low).to_ascii_uppercase());
        }
    }
    out
}
