//! The shipped lookups settle the keys a send left unknown, from the provider's listing: a
//! message the provider took is never sent again and its repeat replays the provider's id;
//! one it never took goes once, but only after the listing delay; inside it the key is left.
//! A reconciler pass over a thousand keys costs the pages of one listing, not a request per
//! key. Against a fake Resend that keeps and lists what it took (tests/support/http/listing.rs).
#![cfg(feature = "http")]

mod support;

use std::time::Duration;

use support::http::listing::{ListingResend, OnSend};
use support::http::{HyperClient, hyper_client};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::lookup::ListingLookup;
use tower_idempotency::http::lookup::resend::ResendListing;
use tower_idempotency::http::mark::{KEY_DIGEST, key_digest};
use tower_idempotency::http::resend::ResendCodec;
use tower_idempotency::outcome::codes;
use tower_idempotency::reconcile::Reconciler;
use tower_idempotency::store::Store;
use tower_idempotency::store::admin::StoreAdmin;
use tower_idempotency::{Fingerprint, IdempotencyLayer, MemoryStore, Message, Receipt, SendError};

const NAMESPACE: &str = "orders";
const DELAY: Duration = Duration::from_secs(10 * 60);

fn email(key: &str) -> Message {
    Message::builder()
        .from("Shop <hello@shop.example>")
        .to("seller@example.com")
        .subject("New order")
        .text("Sold.")
        .idempotency_key(key)
        .build()
        .unwrap()
}

struct Stack {
    store: MemoryStore,
    layer: IdempotencyLayer,
    resend: ListingResend,
}

impl Stack {
    async fn new() -> Self {
        let store = MemoryStore::new();
        let layer = IdempotencyLayer::builder()
            .store(store.clone())
            .namespace(NAMESPACE)
            .build()
            .unwrap();
        Self {
            store,
            layer,
            resend: ListingResend::start().await,
        }
    }

    async fn send(&self, key: &str) -> Result<Receipt, SendError> {
        let transport = HttpTransport::new(
            hyper_client(),
            ResendCodec::new("re_test").base_url(self.resend.base_url()),
        );
        ServiceBuilder::new()
            .layer(self.layer.clone())
            .service(transport)
            .oneshot(email(key))
            .await
    }

    fn lookup(&self) -> ListingLookup<HyperClient, ResendListing> {
        ListingLookup::new(
            hyper_client(),
            ResendListing::new("re_test")
                .base_url(self.resend.base_url())
                .every_message_marked(),
        )
        .listing_delay(DELAY)
    }

    fn reconciler(
        &self,
        lookup: ListingLookup<HyperClient, ResendListing>,
    ) -> Reconciler<MemoryStore, ListingLookup<HyperClient, ResendListing>> {
        Reconciler::new(self.store.clone(), lookup)
            .stored_keys(self.layer.stored_keys())
            .max_keys_per_pass(2_000)
    }
}

#[tokio::test]
async fn the_codec_marks_each_send_with_the_digest_of_its_stored_key() {
    let stack = Stack::new().await;
    stack.send("order:1").await.unwrap();
    let taken = stack.resend.taken();
    let digest = key_digest(&format!("{NAMESPACE}:order:1"));
    assert_eq!(taken[0].tags, vec![(KEY_DIGEST.to_owned(), digest.clone())]);
    assert_eq!(
        taken[0].message_id.as_deref(),
        Some(format!("<ti-{digest}@shop.example>").as_str())
    );
}

#[tokio::test]
async fn a_key_the_provider_took_is_settled_delivered_and_never_sent_again() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::TakeThen500]);
    let unknown = stack.send("order:took").await.unwrap_err();
    assert!(unknown.delivery_unknown());
    stack.resend.take_unmarked(3);

    let mut reconciler = stack.reconciler(stack.lookup());
    let report = reconciler.run_once().await;
    assert_eq!(
        (report.delivered, report.not_sent, report.unknown),
        (1, 0, 0)
    );

    let again = stack.send("order:took").await.unwrap();
    assert_eq!(again.id, "re-0", "the provider's id, replayed");
    assert!(again.replayed);
    assert_eq!(stack.resend.sends(), 1, "never sent twice");
}

#[tokio::test]
async fn a_key_the_provider_never_took_is_left_inside_the_listing_delay_and_freed_after() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::Only500]);
    let unknown = stack.send("order:lost").await.unwrap_err();
    assert!(unknown.delivery_unknown());

    let lookup = stack.lookup();
    let mut reconciler = stack.reconciler(lookup.clone());
    let inside = reconciler.run_once().await;
    assert_eq!(
        (inside.delivered, inside.not_sent, inside.unknown),
        (0, 0, 1)
    );
    let still = stack.send("order:lost").await.unwrap_err();
    assert!(still.delivery_unknown(), "left as it was: {still:?}");
    assert_eq!(stack.resend.sends(), 1);

    // Past the listing delay, a new listing proves the message missing.
    tokio::time::pause();
    tokio::time::advance(DELAY + Duration::from_secs(1)).await;
    tokio::time::resume();
    let after = reconciler.run_once().await;
    assert_eq!((after.delivered, after.not_sent, after.unknown), (0, 1, 0));

    let sent = stack.send("order:lost").await.unwrap();
    assert!(!sent.replayed);
    let repeat = stack.send("order:lost").await.unwrap();
    assert_eq!(repeat.id, sent.id);
    assert!(repeat.replayed);
    assert_eq!(stack.resend.sends(), 2, "sent once more, and only once");
}

#[tokio::test]
async fn a_message_with_its_own_message_id_is_never_answered_not_sent_by_default() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::TakeThen500]);
    let threaded = Message::builder()
        .from("Shop <hello@shop.example>")
        .to("seller@example.com")
        .subject("Re: New order")
        .text("Sold.")
        .message_id("<thread-7@shop.example>")
        .idempotency_key("order:threaded")
        .build()
        .unwrap();
    let send = || {
        let transport = HttpTransport::new(
            hyper_client(),
            ResendCodec::new("re_test").base_url(stack.resend.base_url()),
        );
        ServiceBuilder::new()
            .layer(stack.layer.clone())
            .service(transport)
            .oneshot(threaded.clone())
    };
    let unknown = send().await.unwrap_err();
    assert!(unknown.delivery_unknown());
    let taken = stack.resend.taken();
    assert_eq!(
        taken[0].message_id.as_deref(),
        Some("<thread-7@shop.example>"),
        "the sender's own Message-ID is kept, so Resend lists no mark"
    );

    // The listing cannot find it; long past the listing delay, that still proves nothing.
    let lookup = ListingLookup::new(
        hyper_client(),
        ResendListing::new("re_test").base_url(stack.resend.base_url()),
    )
    .listing_delay(DELAY);
    let mut reconciler = stack.reconciler(lookup);
    reconciler.run_once().await;
    tokio::time::pause();
    tokio::time::advance(DELAY * 3).await;
    tokio::time::resume();
    let after = reconciler.run_once().await;
    assert_eq!((after.delivered, after.not_sent, after.unknown), (0, 0, 1));

    let still = send().await.unwrap_err();
    assert!(still.delivery_unknown(), "not freed: {still:?}");
    assert_eq!(stack.resend.sends(), 1, "never sent a second time");
}

#[tokio::test]
async fn a_pass_over_a_thousand_unknown_keys_reads_one_paged_listing() {
    let stack = Stack::new().await;
    const KEYS: usize = 1_000;
    stack
        .resend
        .script(std::iter::repeat_n(OnSend::TakeThen500, KEYS));
    for i in 0..KEYS {
        let error = stack.send(&format!("order:{i}")).await.unwrap_err();
        assert!(error.delivery_unknown());
    }
    let lookup = stack.lookup();
    let mut reconciler = stack.reconciler(lookup.clone());
    let report = reconciler.run_once().await;
    assert_eq!(report.delivered, KEYS as u64);
    assert_eq!(report.unknown + report.not_sent + report.errors, 0);
    // 1,000 emails at 100 a page: ten requests, not a thousand.
    assert_eq!(stack.resend.listings(), KEYS / 100);
    assert_eq!(lookup.requests().await, (KEYS / 100) as u64);

    for i in [0, 499, 999] {
        let again = stack.send(&format!("order:{i}")).await.unwrap();
        assert!(again.replayed);
        assert_eq!(again.id, format!("re-{i}"));
    }
    assert_eq!(stack.resend.sends(), KEYS);
}

#[tokio::test]
async fn a_listing_cut_off_by_max_pages_never_answers_not_sent() {
    let stack = Stack::new().await;
    stack.resend.script([OnSend::Only500]);
    stack.send("order:lost").await.unwrap_err();
    stack.resend.take_unmarked(250);
    let lookup = stack.lookup().max_pages(2).listing_delay(Duration::ZERO);
    let mut reconciler = stack.reconciler(lookup);
    let report = reconciler.run_once().await;
    assert_eq!((report.not_sent, report.unknown), (0, 1));
    assert_eq!(stack.resend.listings(), 2);
}

/// What a process that crashed mid-send leaves: the key pending under its lease.
async fn crash_mid_send(store: &MemoryStore, key: &str) {
    let stored = format!("{NAMESPACE}:{key}");
    store
        .reserve(&stored, Fingerprint::of(&email(key)), LEASE)
        .await
        .unwrap();
}

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn keys_a_crash_left_are_settled_by_the_lookup_before_any_takeover_sends() {
    let resend = ListingResend::start().await;
    let store = MemoryStore::new();
    let lookup = ListingLookup::new(
        hyper_client(),
        ResendListing::new("re_test")
            .base_url(resend.base_url())
            .every_message_marked(),
    )
    .listing_delay(DELAY);
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace(NAMESPACE)
        .lease(LEASE)
        .verify_takeovers(lookup.clone())
        .build()
        .unwrap();
    let send = |key: &'static str| {
        let transport = HttpTransport::new(
            hyper_client(),
            ResendCodec::new("re_test").base_url(resend.base_url()),
        );
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(transport)
            .oneshot(email(key))
    };

    // Two processes crashed mid-send: one after Resend took its message, one before.
    tokio::time::pause();
    crash_mid_send(&store, "order:went").await;
    let went_id = resend.take_marked(&format!("{NAMESPACE}:order:went"));
    crash_mid_send(&store, "order:lost").await;
    tokio::time::advance(LEASE + Duration::from_secs(1)).await;
    tokio::time::resume();

    // The message that went is found and never sent again.
    let went = send("order:went").await.unwrap();
    assert_eq!(went.id, went_id);
    assert!(went.replayed);
    // Inside the listing delay, the one that did not go is left: not sent, not freed.
    let held = send("order:lost").await.unwrap_err();
    assert_eq!(held.code(), codes::UNVERIFIED, "{held:?}");
    assert_eq!(resend.sends(), 0);

    // Past the listing delay, the reconciler frees it, and it goes once.
    tokio::time::pause();
    tokio::time::advance(DELAY).await;
    tokio::time::resume();
    let mut reconciler = Reconciler::new(store.clone(), lookup).stored_keys(layer.stored_keys());
    let report = reconciler.run_once().await;
    assert_eq!(
        (report.delivered, report.not_sent, report.unknown),
        (0, 1, 0)
    );
    assert!(
        store
            .inspect(&format!("{NAMESPACE}:order:lost"))
            .await
            .unwrap()
            .is_none()
    );
    let sent = send("order:lost").await.unwrap();
    assert!(!sent.replayed);
    let repeat = send("order:lost").await.unwrap();
    assert_eq!(repeat.id, sent.id);
    assert_eq!(resend.sends(), 1, "sent once");
}

const ACCOUNT: &str = "AC0123456789abcdef0123456789abcdef";

fn sms(key: &str, text: &str) -> Message {
    Message::sms()
        .from_number("+15005550006")
        .to("+15005550010")
        .text(text)
        .idempotency_key(key)
        .build()
        .unwrap()
}

/// The texts the app sent, by key: what `recall` rebuilds a key's message from.
fn text_of(key: &str) -> Option<String> {
    Some(format!("Your code for {}", key.strip_prefix("otp:")?))
}

#[tokio::test]
async fn the_twilio_lookup_matches_the_rebuilt_message_and_guesses_nothing() {
    let twilio = support::http::twilio_list::TwilioList::start().await;
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("sms")
        .build()
        .unwrap();
    // Four SMS whose sends left their keys unknown.
    let provider = tower::service_fn(|_: Message| async {
        Err::<Receipt, _>(SendError::unknown_delivery("provider.timeout", "timed out"))
    });
    for key in ["otp:went", "otp:lost", "otp:twice", "otp:other"] {
        let text = text_of(key).unwrap();
        let error = ServiceBuilder::new()
            .layer(layer.clone())
            .service(provider)
            .oneshot(sms(key, &text))
            .await
            .unwrap_err();
        assert!(error.delivery_unknown());
    }
    // What Twilio took: "went" once, "twice" twice (ambiguous), and 150 others on two pages.
    for i in 0..150 {
        twilio.push(
            "+15005550010",
            "+15005550006",
            &format!("noise {i}"),
            "delivered",
        );
    }
    let went = twilio.push(
        "+15005550010",
        "+15005550006",
        "Your code for went",
        "delivered",
    );
    twilio.push(
        "+15005550010",
        "+15005550006",
        "Your code for twice",
        "sent",
    );
    twilio.push(
        "+15005550010",
        "+15005550006",
        "Your code for twice",
        "sent",
    );
    twilio.push(
        "+15005550010",
        "+15005550006",
        "Your code for lost",
        "failed",
    );

    let recall = |question: &tower_idempotency::verify::Verify| {
        let key = question.raw_key.as_deref()?;
        // "other" is rebuilt wrong: not the message that holds its key.
        let text = if key == "otp:other" {
            "changed".to_owned()
        } else {
            text_of(key)?
        };
        Some(sms(key, &text))
    };
    let lookup = tower_idempotency::http::lookup::twilio::TwilioLookup::new(
        hyper_client(),
        ACCOUNT,
        "auth-token",
        recall,
    )
    .base_url(twilio.base_url())
    .listing_delay(DELAY);
    let mut reconciler = Reconciler::new(store.clone(), lookup).stored_keys(layer.stored_keys());

    let first = reconciler.run_once().await;
    assert_eq!((first.delivered, first.not_sent, first.unknown), (1, 0, 3));
    let record = store.inspect("sms:otp:went").await.unwrap().unwrap();
    assert_eq!(record.outcome.unwrap().receipt().unwrap().id, went);

    tokio::time::pause();
    tokio::time::advance(DELAY).await;
    tokio::time::resume();
    let second = reconciler.run_once().await;
    // "lost" failed at Twilio: not sent, freed; "twice" and "other" stay unknown.
    assert_eq!(
        (second.delivered, second.not_sent, second.unknown),
        (0, 1, 2)
    );
    assert!(store.inspect("sms:otp:lost").await.unwrap().is_none());
    assert!(
        store
            .inspect("sms:otp:twice")
            .await
            .unwrap()
            .unwrap()
            .is_unknown_delivery()
    );
    // Two pages per key that reached the listing ("other" never does).
    assert_eq!(twilio.requests(), 2 * 3 + 2 * 2);
}

#[test]
fn postmark_and_twilio_codecs_mark_what_they_send() {
    use tower_idempotency::http::Codec;
    use tower_idempotency::http::postmark::PostmarkCodec;
    use tower_idempotency::http::twilio::TwilioCodec;

    let request = PostmarkCodec::new("token")
        .encode(&email("welcome:1"))
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(request.body()).unwrap();
    assert_eq!(body["Metadata"][KEY_DIGEST], key_digest("welcome:1"));

    let codec = TwilioCodec::new(ACCOUNT, "auth-token")
        .status_callback("https://hooks.shop.example/twilio?app=1".parse().unwrap());
    let request = codec.encode(&sms("otp:1", "hi")).unwrap();
    let form = std::str::from_utf8(request.body()).unwrap();
    let expected = format!(
        "StatusCallback=https%3A%2F%2Fhooks.shop.example%2Ftwilio%3Fapp%3D1%26idempotency_digest%3D{}",
        key_digest("otp:1")
    );
    assert!(form.contains(&expected), "{form}");
}

#[tokio::test]
async fn the_postmark_lookup_pages_the_outbound_search_by_offset() {
    use tower_idempotency::http::lookup::postmark::PostmarkListing;

    let postmark = support::http::postmark_list::PostmarkList::start().await;
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder()
        .store(store.clone())
        .namespace("mail")
        .build()
        .unwrap();
    let provider = tower::service_fn(|_: Message| async {
        Err::<Receipt, _>(SendError::unknown_delivery("provider.timeout", "timed out"))
    });
    for key in ["welcome:went", "welcome:lost"] {
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(provider)
            .oneshot(email(key))
            .await
            .unwrap_err();
    }
    let went = postmark.push(Some(key_digest("mail:welcome:went")));
    for _ in 0..600 {
        postmark.push(None);
    }
    let lookup = ListingLookup::new(
        hyper_client(),
        PostmarkListing::new("server-token").base_url(postmark.base_url()),
    )
    .listing_delay(DELAY);
    let mut reconciler = Reconciler::new(store.clone(), lookup).stored_keys(layer.stored_keys());
    let report = reconciler.run_once().await;
    assert_eq!(
        (report.delivered, report.not_sent, report.unknown),
        (1, 0, 1)
    );
    let record = store.inspect("mail:welcome:went").await.unwrap().unwrap();
    assert_eq!(record.outcome.unwrap().receipt().unwrap().id, went);
    // 601 messages at 500 a page: two requests for the whole pass.
    assert_eq!(postmark.requests(), 2);

    // Past the listing delay, a new listing proves the other missing.
    tokio::time::pause();
    tokio::time::advance(DELAY).await;
    tokio::time::resume();
    let report = reconciler.run_once().await;
    assert_eq!(
        (report.delivered, report.not_sent, report.unknown),
        (0, 1, 0)
    );
    assert_eq!(postmark.requests(), 4);
}
