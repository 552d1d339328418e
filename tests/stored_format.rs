//! The stored form of records and outcomes (`store::record`), pinned byte for byte.
//!
//! During a rolling deploy processes of two releases read each other's records, so what is
//! written must not change by accident: each literal below is what this release writes
//! (outcomes in version 1, whole records in version 2), and what every later release must
//! still decode. When a test here fails, do
//! not update the literal: add a version to the stored form instead.

use std::error::Error;
use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::layer::DEFAULT_NAMESPACE;
use tower_idempotency::outcome::{Category, Outcome, Receipt, SendError};
use tower_idempotency::store::record::{
    decode_outcome, decode_record, encode_outcome, encode_record,
};
use tower_idempotency::store::{Record, RecordState, Reservation, Store, StoreErrorKind, Token};
use tower_idempotency::{Fingerprint, IdempotencyLayer, MemoryStore, Message};

const TOKEN: &str = "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3c4d5e6f";
const FINGERPRINT: &str = "0909090909090909090909090909090909090909090909090909090909090909";

/// A receipt the layer kept: its accepted recipients as positions, no address.
const SENT_WITH_POSITIONS: &str = r#"{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false,"accepted_at":[0,1]}}"#;
/// A receipt kept as given, naming its accepted recipients.
const SENT_AS_GIVEN: &str =
    r#"{"sent":{"id":"msg_2","transport":"fake","accepted":["a@example.com"],"replayed":false}}"#;
/// An error of unknown delivery with every optional part.
const FAILED: &str = r#"{"failed":{"code":"provider.timeout","category":"unknown","retryable":false,"message":"timed out","retry_after_ms":1500,"source":"socket closed"}}"#;
/// An error with none of the optional parts.
const FAILED_BARE: &str = r#"{"failed":{"code":"idempotency.aborted","category":"unknown","retryable":false,"message":"the send was dropped after the provider was called; it may have gone"}}"#;

fn token() -> Token {
    TOKEN.parse().expect("a UUID")
}

fn fingerprint() -> Fingerprint {
    Fingerprint::from_bytes([9; 32])
}

/// A record in version 2: the version byte, the state (`P` or `D`), the token and the
/// fingerprint at fixed places, the two times (`first_attempt_before_expiry_ms`,
/// `kept_after_lease_ms`) and a line end, then the outcome of a done record.
fn pending_record() -> String {
    format!("\x02P{TOKEN}{FINGERPRINT},\n")
}

fn done_record() -> String {
    format!("\x02D{TOKEN}{FINGERPRINT},\n{SENT_WITH_POSITIONS}")
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).expect("the stored forms are UTF-8")
}

#[test]
fn a_receipt_is_written_as_given() {
    let outcome = Outcome::sent(Receipt::new("msg_2", "fake").with_accepted(["a@example.com"]));
    assert_eq!(text(encode_outcome(&outcome).unwrap()), SENT_AS_GIVEN);
}

#[test]
fn an_error_is_written_with_retry_after_and_source_text() {
    let error = SendError::unknown_delivery("provider.timeout", "timed out")
        .with_retry_after(Duration::from_millis(1500))
        .with_source(std::io::Error::other("socket closed"));
    assert_eq!(
        text(encode_outcome(&Outcome::failed(error)).unwrap()),
        FAILED
    );
    assert_eq!(
        text(encode_outcome(&Outcome::failed(SendError::aborted())).unwrap()),
        FAILED_BARE
    );
}

#[test]
fn a_pending_record_is_written_as_state_token_and_fingerprint() {
    let bytes = encode_record(token(), &Record::pending(fingerprint())).unwrap();
    assert_eq!(text(bytes), pending_record());
}

#[test]
fn a_done_record_is_written_with_its_outcome() {
    // The outcome with positions is the layer's own (addresses become positions when it
    // keeps a receipt); it is read back from its literal to write it again.
    let outcome = decode_outcome(SENT_WITH_POSITIONS.as_bytes()).unwrap();
    let bytes = encode_record(token(), &Record::done(fingerprint(), outcome)).unwrap();
    assert_eq!(text(bytes), done_record());
}

#[test]
fn the_pinned_forms_decode_to_what_was_written() {
    let kept = decode_outcome(SENT_WITH_POSITIONS.as_bytes()).unwrap();
    let receipt = kept.receipt().expect("a receipt");
    assert_eq!(receipt.id, "msg_1");
    assert_eq!(receipt.transport, "resend");
    assert!(receipt.accepted.is_empty(), "no address was stored");
    assert_eq!(kept.category(), Category::Delivered);

    let given = decode_outcome(SENT_AS_GIVEN.as_bytes()).unwrap();
    assert_eq!(given.replay().unwrap().accepted, ["a@example.com"]);

    let failed = decode_outcome(FAILED.as_bytes()).unwrap();
    let error = failed.error().expect("an error");
    assert_eq!(error.code(), "provider.timeout");
    assert_eq!(error.category(), Category::Unknown);
    assert!(!error.is_retryable());
    assert_eq!(error.message(), "timed out");
    assert_eq!(error.retry_after(), Some(Duration::from_millis(1500)));
    assert_eq!(error.source().unwrap().to_string(), "socket closed");

    let bare = decode_outcome(FAILED_BARE.as_bytes()).unwrap();
    let error = bare.replay().unwrap_err();
    assert_eq!(error.code(), "idempotency.aborted");
    assert_eq!(error.retry_after(), None);
    assert!(error.source().is_none());
    assert!(error.is_replayed());

    let (t, pending) = decode_record(pending_record().as_bytes()).unwrap();
    assert_eq!(t, token());
    assert_eq!(pending.state, RecordState::Pending);
    assert_eq!(pending.fingerprint, fingerprint());
    assert!(pending.outcome.is_none());

    let (t, done) = decode_record(done_record().as_bytes()).unwrap();
    assert_eq!(t, token());
    assert_eq!(done.state, RecordState::Done);
    assert_eq!(done.fingerprint, fingerprint());
    assert_eq!(done.outcome.unwrap().replay().unwrap().id, "msg_1");
}

#[test]
fn decoding_and_encoding_again_gives_the_same_bytes() {
    for literal in [SENT_WITH_POSITIONS, SENT_AS_GIVEN, FAILED, FAILED_BARE] {
        let again = encode_outcome(&decode_outcome(literal.as_bytes()).unwrap()).unwrap();
        assert_eq!(text(again), literal);
    }
    for literal in [pending_record(), done_record()] {
        let (t, record) = decode_record(literal.as_bytes()).unwrap();
        assert_eq!(text(encode_record(t, &record).unwrap()), literal);
    }
}

#[test]
fn values_that_are_not_of_a_known_version_are_corrupt() {
    for value in [
        &b"garbage"[..],
        b"",
        b"null",
        b"42",
        b"{}",
        br#"{"nope":1}"#,
    ] {
        let error = decode_outcome(value).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{value:?}");
    }
    let done_without_outcome = format!("\x02D{TOKEN}{FINGERPRINT},\n");
    let json_record = format!(
        r#"{{"state":"done","token":"{TOKEN}","fingerprint":"{FINGERPRINT}","outcome":{FAILED}}}"#
    );
    for value in [
        &b"garbage"[..],
        b"{}",
        done_without_outcome.as_bytes(),
        json_record.as_bytes(),
    ] {
        let error = decode_record(value).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{value:?}");
    }
    // A later release's form starts with its version byte.
    let error = decode_outcome(b"\x03\x00").unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Corrupt);
    assert!(error.to_string().contains("version 3"), "{error}");
    let error = decode_record(b"\x03\x00").unwrap_err();
    assert!(error.to_string().contains("version 3"), "{error}");
}

/// What the layer hands a store for a sent message is the first literal above: the
/// accepted recipients as positions in the message's list, no address.
#[tokio::test]
async fn the_layer_keeps_a_receipt_in_the_pinned_form() {
    let store = MemoryStore::new();
    let mut svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service(tower::service_fn(|m: Message| async move {
            let accepted: Vec<String> = m.recipients().map(str::to_owned).collect();
            Ok::<_, SendError>(Receipt::new("msg_1", "resend").with_accepted(accepted))
        }));
    let m = Message::builder()
        .from("shop@example.com")
        .to("seller@example.com")
        .cc("accounts@example.com")
        .text("hi")
        .idempotency_key("k")
        .build()
        .unwrap();
    svc.ready().await.unwrap().call(m.clone()).await.unwrap();

    let key = format!("{DEFAULT_NAMESPACE}:k");
    let held = store
        .reserve(&key, Fingerprint::of(&m), Duration::from_secs(1))
        .await
        .unwrap();
    let Reservation::Held { record } = held else {
        panic!("the key is done: {held:?}")
    };
    let kept = record.outcome.expect("a done record has an outcome");
    assert_eq!(text(encode_outcome(&kept).unwrap()), SENT_WITH_POSITIONS);
}

/// The form `RedisStore` writes, with the record's times relative to its key's expiry: how
/// long before it the first attempt began and, for a pending record, how long it is kept
/// after its lease. The public decoder reads it, as it reads the form without them that
/// `encode_record` writes.
#[test]
fn a_record_with_its_times_decodes() {
    let pending = format!("\x02P{TOKEN}{FINGERPRINT}86520000,86400000\n");
    let (t, record) = decode_record(pending.as_bytes()).unwrap();
    assert_eq!(t, token());
    assert_eq!(record.state, RecordState::Pending);
    assert_eq!(record.fingerprint, fingerprint());
    let done = format!("\x02D{TOKEN}{FINGERPRINT}86403000,\n{FAILED}");
    let (_, record) = decode_record(done.as_bytes()).unwrap();
    assert!(record.is_unknown_delivery());
    // The decoder alone has no clock: the age is the store's to tell.
    assert_eq!(record.first_attempt_age, None);
    // `encode_record` has no expiry to be relative to: it writes the record without times.
    assert_eq!(
        text(encode_record(token(), &record).unwrap()),
        format!("\x02D{TOKEN}{FINGERPRINT},\n{FAILED}")
    );
}
