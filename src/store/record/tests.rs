//! Unit tests of the stored form: the golden bytes of each version-1 form and the record
//! rules.

use super::*;
use crate::store::StoreErrorKind;

const TOKEN: &str = "6f1c2a4e-8b3d-4f5a-9c7e-1d2b3c4d5e6f";
const FINGERPRINT: &str = "0303030303030303030303030303030303030303030303030303030303030303";

fn token() -> Token {
    TOKEN.parse().unwrap()
}

fn fingerprint() -> Fingerprint {
    Fingerprint::from_bytes([3; 32])
}

fn kept_sent() -> Outcome {
    let receipt = Receipt::new("msg_1", "resend").with_accepted(["b@x", "a@x"]);
    Outcome::kept(&Ok(receipt), &["a@x", "b@x", "c@x"])
}

fn kept_error() -> SendError {
    SendError::unknown_delivery("provider.timeout", "timed out")
        .with_retry_after(Duration::from_millis(1500))
        .with_source(std::io::Error::other("socket closed"))
}

// Golden: the exact bytes of each version-1 form. A change here breaks every record a
// running release wrote: add a version instead.

#[test]
fn a_kept_receipt_is_written_with_positions_not_addresses() {
    assert_eq!(
        outcome_json(&kept_sent()).unwrap(),
        r#"{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false,"accepted_at":[1,0]}}"#
    );
}

#[test]
fn a_kept_error_is_written_with_retry_after_and_source_text() {
    assert_eq!(
        outcome_json(&Outcome::kept(&Err(kept_error()), &[])).unwrap(),
        r#"{"failed":{"code":"provider.timeout","category":"unknown","retryable":false,"message":"timed out","retry_after_ms":1500,"source":"socket closed"}}"#
    );
}

#[test]
fn a_pending_record_is_written_as_state_token_fingerprint() {
    assert_eq!(
        pending_json(token(), fingerprint()).unwrap(),
        format!(r#"{{"state":"pending","token":"{TOKEN}","fingerprint":"{FINGERPRINT}"}}"#)
    );
    assert_eq!(
        encode_record(token(), &Record::pending(fingerprint())).unwrap(),
        pending_json(token(), fingerprint()).unwrap().into_bytes()
    );
}

#[test]
fn a_done_record_is_written_with_its_outcome() {
    let expected = format!(
        r#"{{"state":"done","token":"{TOKEN}","fingerprint":"{FINGERPRINT}","outcome":{{"sent":{{"id":"msg_1","transport":"resend","accepted":[],"replayed":false,"accepted_at":[1,0]}}}}}}"#
    );
    assert_eq!(
        done_json(token(), fingerprint(), &kept_sent()).unwrap(),
        expected
    );
    assert_eq!(
        encode_record(token(), &Record::done(fingerprint(), kept_sent())).unwrap(),
        expected.into_bytes()
    );
}

#[test]
fn a_kept_receipt_replays_its_positions_as_the_messages_addresses() {
    let stored = br#"{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false,"accepted_at":[1,0]}}"#;
    let receipt = decode_outcome(stored)
        .unwrap()
        .into_replay_for(&["a@x", "b@x", "c@x"])
        .unwrap();
    assert_eq!(receipt.id, "msg_1");
    assert_eq!(receipt.transport, "resend");
    assert_eq!(receipt.accepted, ["b@x", "a@x"]);
    assert!(receipt.replayed);
}

#[test]
fn a_kept_error_reads_back_with_every_part() {
    let stored = br#"{"failed":{"code":"provider.timeout","category":"unknown","retryable":false,"message":"timed out","retry_after_ms":1500,"source":"socket closed"}}"#;
    let error = decode_outcome(stored).unwrap().replay().unwrap_err();
    assert_eq!(error.code(), "provider.timeout");
    assert_eq!(error.category(), Category::Unknown);
    assert!(!error.is_retryable());
    assert_eq!(error.message(), "timed out");
    assert_eq!(error.retry_after(), Some(Duration::from_millis(1500)));
    assert_eq!(Error::source(&error).unwrap().to_string(), "socket closed");
    assert!(error.is_replayed());
}

#[test]
fn every_category_keeps_its_stored_name() {
    let names = [
        (Category::Delivered, "delivered"),
        (Category::Retryable, "retryable"),
        (Category::Permanent, "permanent"),
        (Category::Validation, "validation"),
        (Category::Unknown, "unknown"),
    ];
    for (category, name) in names {
        let json = serde_json::to_string(&CategoryV1::from(category)).unwrap();
        assert_eq!(json, format!("\"{name}\""));
        let back: CategoryV1 = serde_json::from_str(&json).unwrap();
        assert_eq!(Category::from(back), category);
    }
}

#[test]
fn encoding_then_decoding_gives_the_same_bytes() {
    for outcome in [
        kept_sent(),
        Outcome::sent(Receipt::new("m1", "fake").with_accepted(["a@x"])),
        Outcome::failed(kept_error()),
        Outcome::failed(SendError::aborted()),
    ] {
        let bytes = encode_outcome(&outcome).unwrap();
        let again = encode_outcome(&decode_outcome(&bytes).unwrap()).unwrap();
        assert_eq!(bytes, again);
    }
    let done = done_json(token(), fingerprint(), &kept_sent()).unwrap();
    let (t, record) = decode_record(done.as_bytes()).unwrap();
    assert_eq!(t, token());
    assert_eq!(record.state, RecordState::Done);
    assert_eq!(record.fingerprint, fingerprint());
    assert_eq!(encode_record(t, &record).unwrap(), done.into_bytes());
}

#[test]
fn undecodable_records_are_corrupt() {
    let done_without_outcome =
        format!(r#"{{"state":"done","token":"{TOKEN}","fingerprint":"{FINGERPRINT}"}}"#);
    let without_token = format!(r#"{{"state":"pending","fingerprint":"{FINGERPRINT}"}}"#);
    for value in [
        &b"garbage"[..],
        b"",
        b"null",
        b"{}",
        b"\xff\xfe",
        done_without_outcome.as_bytes(),
        without_token.as_bytes(),
    ] {
        let err = decode_record(value).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    }
    for value in [
        &b"42"[..],
        br#"{"nope":1}"#,
        b"[]",
        b"",
        br#"{"sent":{"id":"m","transport":"t"}}"#,
        br#"{"sent":{"id":"m","transport":"t","accepted":[]}}"#,
    ] {
        let err = decode_outcome(value).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    }
}

fn failure_of(category: &str) -> String {
    format!(
        r#"{{"failed":{{"code":"provider.x","category":"{category}","retryable":false,"message":"m"}}}}"#
    )
}

#[test]
fn a_pending_record_that_carries_an_outcome_is_corrupt() {
    let sent = r#"{"sent":{"id":"m","transport":"t","accepted":[],"replayed":false}}"#;
    for outcome in [sent.to_owned(), failure_of("unknown")] {
        let value = format!(
            r#"{{"state":"pending","token":"{TOKEN}","fingerprint":"{FINGERPRINT}","outcome":{outcome}}}"#
        );
        let err = decode_record(value.as_bytes()).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        assert!(
            err.to_string()
                .contains("pending record carries an outcome"),
            "{err}"
        );
    }
}

#[test]
fn a_kept_failure_of_category_delivered_is_corrupt_alone_or_in_a_record() {
    let failure = failure_of("delivered");
    let err = decode_outcome(failure.as_bytes()).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    assert!(err.to_string().contains("category delivered"), "{err}");
    let done = format!(
        r#"{{"state":"done","token":"{TOKEN}","fingerprint":"{FINGERPRINT}","outcome":{failure}}}"#
    );
    let err = decode_record(done.as_bytes()).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    assert!(err.to_string().contains("category delivered"), "{err}");
}

#[test]
fn a_kept_failure_of_any_other_category_reads_back() {
    for (name, category) in [
        ("retryable", Category::Retryable),
        ("permanent", Category::Permanent),
        ("validation", Category::Validation),
        ("unknown", Category::Unknown),
    ] {
        let kept = decode_outcome(failure_of(name).as_bytes()).unwrap();
        assert_eq!(kept.category(), category, "{name}");
    }
}

#[test]
fn a_record_that_breaks_the_rules_is_not_written() {
    let mut pending = Record::pending(fingerprint());
    pending.outcome = Some(kept_sent());
    let err = encode_record(token(), &pending).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    let mut done = Record::done(fingerprint(), kept_sent());
    done.outcome = None;
    let err = encode_record(token(), &done).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
}

#[test]
fn records_with_times_are_written_after_every_other_field_and_read_back() {
    let times = Times {
        first_attempt_at_ms: Some(1_764_500_000_000),
        lease_until_ms: Some(1_764_500_120_000),
    };
    let pending =
        record_json_at(RecordState::Pending, token(), fingerprint(), None, times).unwrap();
    assert_eq!(
        pending,
        format!(
            r#"{{"state":"pending","token":"{TOKEN}","fingerprint":"{FINGERPRINT}","first_attempt_at_ms":1764500000000,"lease_until_ms":1764500120000}}"#
        )
    );
    let (_, record, read) = decode_record_times(pending.as_bytes()).unwrap();
    assert_eq!(record.state, RecordState::Pending);
    assert_eq!(read, times);
    assert_eq!(
        read.first_attempt_age(1_764_500_003_000),
        Some(Duration::from_secs(3))
    );
    let done_times = Times {
        lease_until_ms: None,
        ..times
    };
    let failed = Outcome::failed(kept_error());
    let done = record_json_at(
        RecordState::Done,
        token(),
        fingerprint(),
        Some(&failed),
        done_times,
    )
    .unwrap();
    // What `RedisStore`'s complete script makes of the record written without times.
    let appended = format!(
        "{},\"first_attempt_at_ms\":1764500000000}}",
        done_json(token(), fingerprint(), &failed)
            .unwrap()
            .strip_suffix('}')
            .unwrap()
    );
    assert_eq!(done, appended);
}

#[test]
fn a_pending_record_without_both_times_is_corrupt_where_records_carry_them() {
    let at = 1_764_500_000_000;
    for times in [
        Times::default(),
        Times {
            first_attempt_at_ms: Some(at),
            lease_until_ms: None,
        },
        Times {
            first_attempt_at_ms: None,
            lease_until_ms: Some(at),
        },
    ] {
        let pending =
            record_json_at(RecordState::Pending, token(), fingerprint(), None, times).unwrap();
        let err = decode_record_times(pending.as_bytes()).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{pending}");
        // The public decoder reads what `encode_record`, which has no clock, writes.
        assert!(decode_record(pending.as_bytes()).is_ok(), "{pending}");
    }
}

#[test]
fn a_done_record_without_its_first_attempt_reads_with_an_unknown_age() {
    let done = done_json(token(), fingerprint(), &Outcome::failed(kept_error())).unwrap();
    let (_, record, times) = decode_record_times(done.as_bytes()).unwrap();
    assert!(record.is_unknown_delivery());
    assert_eq!(times, Times::default());
    assert_eq!(times.first_attempt_age(1_764_500_000_000), None);
}

#[test]
fn a_later_version_byte_is_refused_by_name() {
    assert_eq!(Form::of(b"{}"), Form::JsonV1);
    assert_eq!(Form::of(b" \n\t{}"), Form::JsonV1);
    assert_eq!(Form::of(b"\x02rest"), Form::Later(2));
    let err = decode_outcome(b"\x02\x00\x01").unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    assert!(err.to_string().contains("version 2"), "{err}");
    let err = decode_record(b"\x07").unwrap_err();
    assert!(err.to_string().contains("version 7"), "{err}");
}
