//! The fingerprint encoding: pinned by golden vectors, checked by properties.

use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use tower_idempotency::message::{Attachment, Tracking};
use tower_idempotency::{Envelope, Fingerprint, Message, MessageBuilder, RawMessage};

fn base() -> MessageBuilder {
    Message::builder()
        .from("shop@example.com")
        .to("user@example.com")
        .text("Welcome aboard.")
}

fn golden_messages() -> Vec<(&'static str, Message)> {
    vec![
        ("minimal", base().build().unwrap()),
        (
            "sms",
            // An SMS is built as one since SMS exist; the email builder that held this one
            // before refuses phone numbers, so no record can be looked up by the old value.
            Message::sms()
                .from_number("+15550100")
                .to("+15550199")
                .text("Your code is 123456")
                .idempotency_key("otp:42")
                .build()
                .unwrap(),
        ),
        (
            "full",
            Message::builder()
                .from("Shop <shop@example.com>")
                .to("a@example.com")
                .to("b@example.com")
                .cc("c@example.com")
                .bcc("d@example.com")
                .reply_to("support@example.com")
                .subject("Order ord_20481")
                .text("Vintage Nikon FM2 just sold.")
                .html("<p>Vintage Nikon FM2 just sold.</p>")
                .header("X-Campaign", "orders")
                .header("List-Unsubscribe", "<mailto:u@example.com>")
                .attachment(Attachment::new(
                    "invoice.pdf",
                    "application/pdf",
                    &b"%PDF"[..],
                ))
                .message_id("<m1@example.com>")
                .in_reply_to("<m0@example.com>")
                .reference("<m-1@example.com>")
                .reference("<m0@example.com>")
                // Kept as 1_800_000_000 s: the builder drops the 500 ns.
                .send_at(UNIX_EPOCH + Duration::new(1_800_000_000, 500))
                .tracking(Tracking {
                    opens: true,
                    clicks: false,
                })
                .metadata("order_id", "ord_20481")
                .metadata("tenant", "t1")
                .build()
                .unwrap(),
        ),
        (
            "html-only-unicode",
            Message::builder()
                .from("boutique@exemple.fr")
                .to("élodie@exemple.fr")
                .subject("Bienvenue à bord ✉")
                .html("<p>Merci !</p>")
                .build()
                .unwrap(),
        ),
        (
            "scheduled-before-epoch",
            base()
                .send_at(UNIX_EPOCH - Duration::from_secs(86_400))
                .build()
                .unwrap(),
        ),
        (
            // Kept, and hashed, as 1_800_000_000.123 s: the builder rounds down to the
            // millisecond, the precision of the outbox's row.
            "scheduled-sub-millisecond",
            base()
                .send_at(UNIX_EPOCH + Duration::new(1_800_000_000, 123_456_789))
                .build()
                .unwrap(),
        ),
    ]
}

/// Pinned fingerprints. "minimal", "scheduled-sub-millisecond" and the raw vector were also
/// computed by an independent implementation of the encoding documented in `fingerprint`
/// (Python's hashlib and struct), so the docs and the code agree. If this test fails, the encoding changed: every live key in every
/// store would answer `key_reused` after a deploy. Do not update these values; add a new
/// encoding version instead.
const GOLDEN: &[(&str, &str)] = &[
    (
        "minimal",
        "028f60ddf07ae2788540747c79a9139e5f19fc5cae3d9de150379b35da76b3ad",
    ),
    (
        "sms",
        "8a4fd25b15e385197474ec42666df813d95c0bc6a1027c6020fa2d94d083cc50",
    ),
    (
        "full",
        "1b01d1e754e96ed05c8af6221e3c34aa43ba84b52601da106561e2f5bc3386fc",
    ),
    (
        "html-only-unicode",
        "555f7ca5e9dc84ae31cb3c5a1f11c127342eaa3b76b8308c17830cec879512a4",
    ),
    (
        "scheduled-before-epoch",
        "c46f0f9d6019d82cc794525afcdfed90dca48aa7eeba2abe46e769f2942fd94a",
    ),
    (
        "scheduled-sub-millisecond",
        "c363355013a0f92fe7c80272cbf8b94f0a1c14582e35e38060cc0fdc59a93e7a",
    ),
];

const GOLDEN_RAW: &str = "bda066b7edd43b2212e3b83e78feeed6c7d9356b0b496d4a795b8b451c9dd75b";

#[test]
fn golden_vectors_pin_the_encoding() {
    let messages = golden_messages();
    let mut actual = Vec::new();
    for (name, message) in &messages {
        actual.push((*name, Fingerprint::of(message).to_string()));
    }
    for ((name, expected), (actual_name, actual)) in GOLDEN.iter().zip(&actual) {
        assert_eq!(name, actual_name);
        assert_eq!(expected, actual, "fingerprint of {name} changed");
    }
    assert_eq!(GOLDEN.len(), actual.len());
}

#[test]
fn golden_vector_pins_the_raw_encoding() {
    let raw = RawMessage::new(
        Envelope::new("shop@example.com", ["a@example.com", "b@example.com"]).unwrap(),
        &b"Subject: hi\r\n\r\nbody"[..],
    );
    assert_eq!(Fingerprint::of(&raw).to_string(), GOLDEN_RAW);
}

#[test]
fn a_schedule_is_fingerprinted_to_the_millisecond() {
    let at = |nanos| {
        Fingerprint::of(
            &base()
                .send_at(UNIX_EPOCH + Duration::new(1_800_000_000, nanos))
                .build()
                .unwrap(),
        )
    };
    assert_eq!(
        at(123_456_789),
        at(123_000_000),
        "sub-millisecond digits are not kept"
    );
    assert_ne!(at(123_000_000), at(124_000_000), "milliseconds are");
}

#[test]
fn raw_messages_are_fingerprinted_by_their_envelope_only() {
    let envelope = Envelope::new("a@x", ["b@x"]).unwrap();
    let one = RawMessage::new(envelope.clone(), &b"one"[..]);
    let two = RawMessage::new(envelope, &b"two"[..]);
    assert_eq!(Fingerprint::of(&one), Fingerprint::of(&two));
    let other = RawMessage::new(Envelope::new("a@x", ["c@x"]).unwrap(), &b"one"[..]);
    assert_ne!(Fingerprint::of(&one), Fingerprint::of(&other));
}

#[test]
fn the_key_is_not_fingerprinted() {
    let a = base().idempotency_key("k1").build().unwrap();
    let b = base().idempotency_key("k2").build().unwrap();
    assert_eq!(Fingerprint::of(&a), Fingerprint::of(&b));
}

#[test]
fn text_moved_across_a_field_boundary_changes_the_fingerprint() {
    let a = base().subject("ab").text("c").build().unwrap();
    let b = base().subject("a").text("bc").build().unwrap();
    assert_ne!(Fingerprint::of(&a), Fingerprint::of(&b));
    // The same across list elements and between lists.
    let a = base().to("x@ab").to("c@d").build().unwrap();
    let b = base().to("x@a").to("bc@d").build().unwrap();
    assert_ne!(Fingerprint::of(&a), Fingerprint::of(&b));
    let a = base().cc("x@y").build().unwrap();
    let b = base().bcc("x@y").build().unwrap();
    assert_ne!(Fingerprint::of(&a), Fingerprint::of(&b));
    // An empty subject is not an absent one.
    let a = base().subject("").build().unwrap();
    assert_ne!(
        Fingerprint::of(&a),
        Fingerprint::of(&base().build().unwrap())
    );
}

/// One fingerprinted field each; `edit` applies a change to it.
#[derive(Debug, Clone, Copy)]
enum Field {
    From,
    To,
    Cc,
    Bcc,
    ReplyTo,
    Subject,
    Text,
    Html,
    HeaderName,
    HeaderValue,
    AttachmentName,
    AttachmentType,
    MessageId,
    InReplyTo,
    References,
    SendAt,
    TrackOpens,
    TrackClicks,
    MetadataName,
    MetadataValue,
}

const FIELDS: &[Field] = &[
    Field::From,
    Field::To,
    Field::Cc,
    Field::Bcc,
    Field::ReplyTo,
    Field::Subject,
    Field::Text,
    Field::Html,
    Field::HeaderName,
    Field::HeaderValue,
    Field::AttachmentName,
    Field::AttachmentType,
    Field::MessageId,
    Field::InReplyTo,
    Field::References,
    Field::SendAt,
    Field::TrackOpens,
    Field::TrackClicks,
    Field::MetadataName,
    Field::MetadataValue,
];

#[derive(Debug, Clone)]
struct Parts {
    strings: Vec<String>,
    secs: u64,
    opens: bool,
    clicks: bool,
    content: Vec<u8>,
}

fn build(p: &Parts, changed: Option<(Field, &str)>) -> Message {
    let s = |i: usize, f: Field| -> String {
        match changed {
            Some((c, v)) if std::mem::discriminant(&c) == std::mem::discriminant(&f) => {
                format!("{}{v}", p.strings[i])
            }
            _ => p.strings[i].clone(),
        }
    };
    let is = |f: Field| matches!(changed, Some((c, _)) if std::mem::discriminant(&c) == std::mem::discriminant(&f));
    // Addresses must be mailboxes: the drawn text becomes the local part.
    let address = |i: usize, f: Field| format!("{}@example.com", s(i, f).replace(['@', '.'], "_"));
    Message::builder()
        .from(address(0, Field::From))
        .to(address(1, Field::To))
        .cc(address(2, Field::Cc))
        .bcc(address(3, Field::Bcc))
        .reply_to(address(4, Field::ReplyTo))
        .subject(s(5, Field::Subject))
        .text(s(6, Field::Text))
        .html(s(7, Field::Html))
        .header(s(8, Field::HeaderName), s(9, Field::HeaderValue))
        .attachment(Attachment::new(
            s(10, Field::AttachmentName),
            s(11, Field::AttachmentType),
            p.content.clone(),
        ))
        .message_id(s(12, Field::MessageId))
        .in_reply_to(s(13, Field::InReplyTo))
        .reference(s(14, Field::References))
        .send_at(UNIX_EPOCH + Duration::from_secs(p.secs + u64::from(is(Field::SendAt))))
        .tracking(Tracking {
            opens: p.opens ^ is(Field::TrackOpens),
            clicks: p.clicks ^ is(Field::TrackClicks),
        })
        .metadata(s(15, Field::MetadataName), s(16, Field::MetadataValue))
        .build()
        .unwrap()
}

fn parts() -> impl Strategy<Value = Parts> {
    (
        proptest::collection::vec("[a-z0-9@.]{1,12}", 17),
        0u64..4_000_000_000,
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(strings, secs, opens, clicks, content)| Parts {
            strings,
            secs,
            opens,
            clicks,
            content,
        })
}

proptest! {
    #[test]
    fn changing_any_one_field_changes_the_fingerprint(p in parts(), field in 0..FIELDS.len(), suffix in "[a-z]{1,4}") {
        let field = FIELDS[field];
        let before = Fingerprint::of(&build(&p, None));
        let after = Fingerprint::of(&build(&p, Some((field, &suffix))));
        prop_assert_ne!(before, after, "changing {:?} kept the fingerprint", field);
    }

    #[test]
    fn attachment_bytes_do_not_change_the_fingerprint(p in parts(), other in proptest::collection::vec(any::<u8>(), 0..64)) {
        let a = build(&p, None);
        let b = build(&Parts { content: other, ..p }, None);
        prop_assert_eq!(Fingerprint::of(&a), Fingerprint::of(&b));
    }

    #[test]
    fn metadata_and_header_order_do_not_change_the_fingerprint(
        entries in proptest::collection::btree_map("[a-z]{1,6}", "[a-z]{0,6}", 1..6)
    ) {
        let forward = entries.iter().fold(base(), |b, (k, v)| b.metadata(k, v).header(k, v));
        let backward = entries.iter().rev().fold(base(), |b, (k, v)| b.metadata(k, v).header(k, v));
        prop_assert_eq!(
            Fingerprint::of(&forward.build().unwrap()),
            Fingerprint::of(&backward.build().unwrap())
        );
    }

    #[test]
    fn splitting_text_between_subject_and_body_differently_changes_it(s in "[a-z]{2,12}", cut in 1usize..11) {
        let cut = cut.min(s.len() - 1);
        let a = base().subject(&s[..cut]).text(&s[cut..]).build().unwrap();
        let b = base().subject(&s[..cut - 1]).text(&s[cut - 1..]).build();
        if let Ok(b) = b {
            prop_assert_ne!(Fingerprint::of(&a), Fingerprint::of(&b));
        }
    }
}
