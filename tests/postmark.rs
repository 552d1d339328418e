//! Email through Postmark: `PostmarkCodec` against a fake Postmark that enforces Postmark's
//! published request rules (tests/support/http/postmark.rs). Per-message `ErrorCode`s of a
//! batch become per-message outcomes: one inactive recipient frees its own key and no other.
#![cfg(feature = "http")]

mod support;

use std::time::{Duration, SystemTime};

use support::http::postmark::{self, batch, error, result, sent};
use support::http::{FakeProvider, hyper_client, send_with};
use support::send_batch;
use tower::ServiceBuilder;
use tower_idempotency::http::HttpTransport;
use tower_idempotency::http::postmark::{POSTMARK_MAX_BATCH, PostmarkCodec};
use tower_idempotency::message::Tracking;
use tower_idempotency::outcome::{Category, codes};
use tower_idempotency::{IdempotencyLayer, Message, MessageBuilder};

const TOKEN: &str = "server-token-123";

fn codec(provider: &FakeProvider) -> PostmarkCodec {
    PostmarkCodec::new(TOKEN).base_url(provider.base_url())
}

fn email(to: &str) -> MessageBuilder {
    Message::builder()
        .from("Shop <hello@shop.example>")
        .to(to)
        .subject("Your receipt")
        .text("Thanks for your order.")
}

#[tokio::test]
async fn an_email_goes_to_postmark_as_its_documented_json() {
    let provider = postmark::provider(vec![sent(1)]).await;
    let message = email("\"Lee, Ann\" <ann@example.com>")
        .to("bob@example.com")
        .cc("ops@example.com")
        .reply_to("help@shop.example")
        .html("<p>Thanks</p>")
        .header("X-Order", "ord_1")
        .message_id("<m1@shop.example>")
        .tracking(Tracking {
            opens: true,
            clicks: true,
        })
        .metadata("order_id", "ord_1")
        .idempotency_key("receipt:ord_1")
        .build()
        .unwrap();

    let receipt = send_with(codec(&provider), message).await.unwrap();

    assert_eq!(receipt.id, "pm-1");
    assert_eq!(receipt.transport, "postmark");
    let request = &provider.requests()[0];
    assert_eq!(request.uri.path(), "/email");
    assert_eq!(request.header("x-postmark-server-token"), Some(TOKEN));
    assert_eq!(request.key, None, "Postmark takes no idempotency key");
    let body = request.json();
    assert_eq!(
        body["To"],
        "\"Lee, Ann\" <ann@example.com>, bob@example.com"
    );
    assert_eq!(body["Cc"], "ops@example.com");
    assert_eq!(body["ReplyTo"], "help@shop.example");
    assert_eq!(body["TextBody"], "Thanks for your order.");
    assert_eq!(body["HtmlBody"], "<p>Thanks</p>");
    assert_eq!(
        body["Headers"],
        serde_json::json!([
            { "Name": "X-Order", "Value": "ord_1" },
            { "Name": "Message-ID", "Value": "<m1@shop.example>" },
        ])
    );
    assert_eq!(body["TrackOpens"], true);
    assert_eq!(body["TrackLinks"], "HtmlAndText");
    assert_eq!(body["Metadata"]["order_id"], "ord_1");
    assert_eq!(body["MessageStream"], "outbound");
    provider.assert_no_violations();
}

#[tokio::test]
async fn a_batch_with_one_inactive_recipient_keeps_the_other_keys_done_and_frees_that_one() {
    let provider = postmark::provider(vec![
        batch(&[result(0, 1), result(406, 0), result(0, 3)]),
        batch(&[result(0, 4)]),
    ])
    .await;
    let mut service = ServiceBuilder::new()
        .layer(IdempotencyLayer::in_memory())
        .service(HttpTransport::new(hyper_client(), codec(&provider)));
    let messages = || {
        vec![
            email("a@example.com")
                .idempotency_key("receipt:a")
                .build()
                .unwrap(),
            email("bounced@example.com")
                .idempotency_key("receipt:b")
                .build()
                .unwrap(),
            email("c@example.com")
                .idempotency_key("receipt:c")
                .build()
                .unwrap(),
        ]
    };

    let first = send_batch(&mut service, messages()).await;
    assert_eq!(first[0].as_ref().unwrap().id, "pm-1");
    let inactive = first[1].as_ref().unwrap_err();
    assert_eq!(inactive.code(), codes::INACTIVE_RECIPIENT);
    assert_eq!(inactive.category(), Category::Permanent);
    assert_eq!(first[2].as_ref().unwrap().id, "pm-3");
    assert_eq!(provider.requests().len(), 1);

    // The same batch again: a and c are answered from the store; b's key was freed, so b
    // alone goes to Postmark (now answered OK).
    let again = send_batch(&mut service, messages()).await;
    assert!(again[0].as_ref().unwrap().replayed);
    assert_eq!(again[1].as_ref().unwrap().id, "pm-4");
    assert!(!again[1].as_ref().unwrap().replayed);
    assert!(again[2].as_ref().unwrap().replayed);
    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].uri.path(), "/email/batch");
    let resent = requests[1].json();
    assert_eq!(resent.as_array().unwrap().len(), 1);
    assert_eq!(resent[0]["To"], "bounced@example.com");
    provider.assert_no_violations();
}

#[tokio::test]
async fn what_postmark_would_refuse_never_leaves_the_codec_and_batch_neighbours_go() {
    let provider = postmark::provider(vec![batch(&[result(0, 1), result(0, 2)])]).await;
    let cc_only = Message::builder()
        .from("hello@shop.example")
        .cc("ops@example.com")
        .subject("s")
        .text("t")
        .build()
        .unwrap();
    let fifty_one = (0..51)
        .fold(Message::builder(), |b, i| b.to(format!("r{i}@example.com")))
        .from("hello@shop.example")
        .text("t")
        .build()
        .unwrap();
    let scheduled = email("a@example.com")
        .send_at(SystemTime::now() + Duration::from_secs(60))
        .build()
        .unwrap();
    let sms = support::sms("hi");
    // 30 + 30 addresses: each list is under 50, the message is over.
    let thirty_and_thirty = (0..30)
        .fold(Message::builder(), |b, i| {
            b.to(format!("t{i}@example.com"))
                .bcc(format!("b{i}@example.com"))
        })
        .from("hello@shop.example")
        .text("t")
        .build()
        .unwrap();
    let empty_bodies = email("a@example.com").text("").html("").build().unwrap();
    let case_twins = email("a@example.com")
        .metadata("order_id", "1")
        .metadata("Order_ID", "1")
        .build()
        .unwrap();
    for (message, what) in [
        (cc_only.clone(), "`To` is required"),
        (fifty_one.clone(), "51"),
        (thirty_and_thirty.clone(), "60 addresses together"),
        (empty_bodies.clone(), "bodies are empty"),
        (case_twins.clone(), "differ only by case"),
        (scheduled.clone(), "schedule"),
        (sms.clone(), "SMS"),
    ] {
        let err = send_with(codec(&provider), message).await.unwrap_err();
        assert_eq!(err.code(), codes::INVALID_REQUEST, "{what}");
        assert!(err.message().contains(what), "{what}: {err}");
    }
    assert!(provider.requests().is_empty());

    let mut transport = HttpTransport::new(hyper_client(), codec(&provider));
    let outcomes = send_batch(
        &mut transport,
        vec![
            email("a@example.com").build().unwrap(),
            cc_only,
            fifty_one,
            thirty_and_thirty,
            empty_bodies,
            case_twins,
            email("b@example.com").build().unwrap(),
        ],
    )
    .await;
    assert_eq!(outcomes[0].as_ref().unwrap().id, "pm-1");
    for refused in &outcomes[1..6] {
        assert_eq!(refused.as_ref().unwrap_err().code(), codes::INVALID_REQUEST);
    }
    assert_eq!(outcomes[6].as_ref().unwrap().id, "pm-2");
    assert_eq!(provider.requests().len(), 1);
    provider.assert_no_violations();
}

#[tokio::test]
async fn fifty_recipients_together_an_html_body_alone_and_distinct_keys_go() {
    let provider = postmark::provider(vec![sent(1)]).await;
    // 25 + 15 + 10: fifty across To, Cc and Bcc.
    let message = (0..25)
        .fold(Message::builder(), |b, i| {
            let b = b.to(format!("t{i}@example.com"));
            match i {
                0..15 => b.cc(format!("c{i}@example.com")),
                15..25 => b.bcc(format!("b{i}@example.com")),
                _ => b,
            }
        })
        .from("hello@shop.example")
        .subject("Your receipt")
        .html("<p>Thanks</p>")
        .metadata("order_id", "1")
        .metadata("order_ref", "1")
        .build()
        .unwrap();

    let receipt = send_with(codec(&provider), message).await.unwrap();

    assert_eq!(receipt.id, "pm-1");
    assert_eq!(receipt.accepted.len(), 50);
    provider.assert_no_violations();
}

#[tokio::test]
async fn a_batch_of_500_goes_and_501_is_refused_whole() {
    let results: Vec<_> = (1..=POSTMARK_MAX_BATCH).map(|n| result(0, n)).collect();
    let provider = postmark::provider(vec![batch(&results)]).await;
    let mut transport = HttpTransport::new(hyper_client(), codec(&provider));
    let messages = |n: usize| -> Vec<Message> {
        (0..n)
            .map(|i| email(&format!("r{i}@example.com")).build().unwrap())
            .collect()
    };

    let refused = send_batch(&mut transport, messages(POSTMARK_MAX_BATCH + 1)).await;
    assert!(
        refused
            .iter()
            .all(|o| o.as_ref().unwrap_err().code() == codes::BATCH_TOO_LARGE)
    );
    assert!(provider.requests().is_empty());

    let outcomes = send_batch(&mut transport, messages(POSTMARK_MAX_BATCH)).await;
    assert_eq!(outcomes[499].as_ref().unwrap().id, "pm-500");
    assert_eq!(provider.requests().len(), 1);
    provider.assert_no_violations();
}

#[tokio::test]
async fn postmark_answers_map_to_outcomes() {
    let cases = [
        (
            error(422, 406),
            codes::INACTIVE_RECIPIENT,
            Category::Permanent,
        ),
        (
            error(422, 300),
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (
            error(422, 411),
            codes::VALIDATION_ERROR,
            Category::Validation,
        ),
        (error(422, 401), codes::REJECTED, Category::Permanent),
        (error(422, 412), codes::REJECTED, Category::Permanent),
        (error(401, 10), codes::REJECTED, Category::Permanent),
        (error(429, 429), codes::RATE_LIMITED, Category::Retryable),
        (error(500, 0), codes::SERVER_ERROR, Category::Unknown),
    ];
    for (reply, code, category) in cases {
        let provider = postmark::provider(vec![reply.clone()]).await;
        let err = send_with(codec(&provider), email("a@example.com").build().unwrap())
            .await
            .unwrap_err();
        assert_eq!((err.code(), err.category()), (code, category), "{reply:?}");
        provider.assert_no_violations();
    }
    // Per-message rate limits and maintenance in a batch are retryable for that message.
    let provider = postmark::provider(vec![batch(&[result(429, 0), result(100, 0)])]).await;
    let mut transport = HttpTransport::new(hyper_client(), codec(&provider));
    let outcomes = send_batch(
        &mut transport,
        vec![
            email("a@example.com").build().unwrap(),
            email("b@example.com").build().unwrap(),
        ],
    )
    .await;
    assert_eq!(
        outcomes[0].as_ref().unwrap_err().code(),
        codes::RATE_LIMITED
    );
    assert_eq!(outcomes[1].as_ref().unwrap_err().code(), codes::UNAVAILABLE);
    assert!(
        outcomes
            .iter()
            .all(|o| o.as_ref().unwrap_err().is_retryable())
    );
}

#[tokio::test]
async fn a_refusal_of_the_fake_is_postmarks_own_error() {
    // The schema is real: what Postmark refuses, the fake refuses with ErrorCode 300.
    let provider = postmark::provider(vec![sent(1)]).await;
    let list = |prefix: &str| {
        (0..30)
            .map(|i| format!("{prefix}{i}@example.com"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let base = || serde_json::json!({ "From": "hello@shop.example", "To": "a@example.com", "TextBody": "t" });
    let mut sixty = base();
    sixty["To"] = list("t").into();
    sixty["Bcc"] = list("b").into();
    let mut empty = base();
    empty["TextBody"] = "".into();
    empty["HtmlBody"] = "".into();
    let mut twins = base();
    twins["Metadata"] = serde_json::json!({ "order_id": "1", "Order_ID": "1" });
    for body in [sixty, empty, twins] {
        let request = http::Request::post(format!("{}email", provider.base_url()))
            .header("x-postmark-server-token", TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(bytes::Bytes::from(body.to_string()))
            .unwrap();
        let response = tower::ServiceExt::oneshot(hyper_client(), request)
            .await
            .unwrap();
        assert_eq!(response.status(), 422);
    }
    let violations = provider.violations();
    assert!(violations[0].contains("60 recipients"), "{violations:?}");
    assert!(violations[1].contains("not empty"), "{violations:?}");
    assert!(violations[2].contains("case differences"), "{violations:?}");
}
