//! Unit tests of the stored form: the golden bytes of each form (outcomes in version 1,
//! records in version 2) and the record rules.

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

/// A version-2 record, spelled out: version, state, token, fingerprint, times, outcome.
fn v2(state: char, times: &str, outcome: &str) -> Vec<u8> {
    format!("\x02{state}{TOKEN}{FINGERPRINT}{times}\n{outcome}").into_bytes()
}

const SENT_JSON: &str = r#"{"sent":{"id":"msg_1","transport":"resend","accepted":[],"replayed":false,"accepted_at":[1,0]}}"#;

// Golden: the exact bytes of each form. A change here breaks every record a running release
// wrote: add a version instead.

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
        encode_record(token(), &Record::pending(fingerprint())).unwrap(),
        v2('P', ",", "")
    );
    let times = Times {
        first_attempt_before_expiry_ms: Some(86_520_000),
        kept_after_lease_ms: Some(86_400_000),
    };
    assert_eq!(
        pending_value(token(), fingerprint(), times).unwrap(),
        v2('P', "86520000,86400000", "")
    );
}

#[test]
fn a_done_record_is_written_with_its_outcome() {
    assert_eq!(
        done_value(token(), fingerprint(), &kept_sent()).unwrap(),
        v2('D', ",", SENT_JSON)
    );
    assert_eq!(
        encode_record(token(), &Record::done(fingerprint(), kept_sent())).unwrap(),
        v2('D', ",", SENT_JSON)
    );
}

#[test]
fn the_token_and_state_sit_where_the_scripts_compare_them() {
    let value = done_value(token(), fingerprint(), &kept_sent()).unwrap();
    assert_eq!(value[0], 2);
    assert_eq!(&value[1..2], b"D");
    assert_eq!(&value[2..38], TOKEN.as_bytes());
    assert_eq!(&value[38..102], FINGERPRINT.as_bytes());
    assert_eq!(value::TIMES_AT, 102);
}

#[test]
fn accepted_positions_outside_the_recipients_are_corrupt() {
    let recipients = ["a@x", "b@x"];
    assert_eq!(
        accepted_recipients(&[1, 0], &recipients).unwrap(),
        ["b@x", "a@x"]
    );
    for positions in [&[2][..], &[0, 5], &[u32::MAX]] {
        let err = accepted_recipients(positions, &recipients).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{positions:?}");
    }
    let replay = decode_outcome(SENT_JSON.as_bytes())
        .unwrap()
        .into_replay_for(&["only@x"]);
    let err = replay.expect_err("a position beyond the message replayed");
    assert_eq!(err.code(), crate::outcome::codes::STORE_FAILED);
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
    let done = done_value(token(), fingerprint(), &kept_sent()).unwrap();
    let (t, record) = decode_record(&done).unwrap();
    assert_eq!(t, token());
    assert_eq!(record.state, RecordState::Done);
    assert_eq!(record.fingerprint, fingerprint());
    assert_eq!(encode_record(t, &record).unwrap(), done);
}

#[test]
fn undecodable_records_are_corrupt() {
    let done_without_outcome = v2('D', ",", "");
    let without_token = format!("\x02P{FINGERPRINT},\n");
    let unclosed = format!("\x02P{TOKEN}{FINGERPRINT}1,2");
    let odd_time = v2('P', "1x,2", "");
    let odd_state = v2('X', ",", "");
    let json = format!(r#"{{"state":"pending","token":"{TOKEN}","fingerprint":"{FINGERPRINT}"}}"#);
    for value in [
        &b"garbage"[..],
        b"",
        b"null",
        b"{}",
        b"\x02",
        b"\xff\xfe",
        &done_without_outcome,
        without_token.as_bytes(),
        unclosed.as_bytes(),
        &odd_time,
        &odd_state,
        json.as_bytes(),
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
        let value = v2('P', "1,1", &outcome);
        let err = decode_record(&value).unwrap_err();
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
    let done = v2('D', ",", &failure);
    let err = decode_record(&done).unwrap_err();
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
fn records_with_times_read_back_relative_to_their_expiry() {
    let times = Times {
        first_attempt_before_expiry_ms: Some(120_000),
        kept_after_lease_ms: Some(60_000),
    };
    let pending = pending_value(token(), fingerprint(), times).unwrap();
    let (_, record, read) = decode_record_times(&pending).unwrap();
    assert_eq!(record.state, RecordState::Pending);
    assert_eq!(read, times);
    // With 117 s left on the key, the first attempt began 3 s ago and the lease has 57 s.
    assert_eq!(
        read.first_attempt_age(117_000),
        Some(Duration::from_secs(3))
    );
    assert_eq!(read.lease_left(117_000), Duration::from_secs(57));
    assert_eq!(read.lease_left(60_000), Duration::ZERO);
    // What `RedisStore`'s complete script makes of the record written without times.
    let done = done_value(token(), fingerprint(), &Outcome::failed(kept_error())).unwrap();
    let mut completed = done[..102].to_vec();
    completed.extend_from_slice(b"86403000");
    completed.extend_from_slice(&done[102..]);
    let (_, record, read) = decode_record_times(&completed).unwrap();
    assert!(record.is_unknown_delivery());
    assert_eq!(read.first_attempt_before_expiry_ms, Some(86_403_000));
    assert_eq!(read.kept_after_lease_ms, None);
}

#[test]
fn a_pending_record_without_both_times_is_corrupt_where_records_carry_them() {
    for times in [",", "5,", ",5"] {
        let pending = v2('P', times, "");
        let err = decode_record_times(&pending).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{times}");
        // The public decoder reads what `encode_record`, which has no clock, writes.
        assert!(decode_record(&pending).is_ok(), "{times}");
    }
}

#[test]
fn a_done_record_without_its_first_attempt_reads_with_an_unknown_age() {
    let done = done_value(token(), fingerprint(), &Outcome::failed(kept_error())).unwrap();
    let (_, record, times) = decode_record_times(&done).unwrap();
    assert!(record.is_unknown_delivery());
    assert_eq!(times, Times::default());
    assert_eq!(times.first_attempt_age(1_000), None);
}

#[test]
fn a_later_version_byte_is_refused_by_name() {
    assert_eq!(Form::of(b"{}"), Form::JsonV1);
    assert_eq!(Form::of(b" \n\t{}"), Form::JsonV1);
    assert_eq!(Form::of(b"\x02rest"), Form::RecordV2);
    assert_eq!(Form::of(b"\x03rest"), Form::Later(3));
    let err = decode_outcome(b"\x03\x00\x01").unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    assert!(err.to_string().contains("version 3"), "{err}");
    let err = decode_outcome(&v2('D', ",", SENT_JSON)).unwrap_err();
    assert!(err.to_string().contains("whole record"), "{err}");
    let err = decode_record(b"\x07").unwrap_err();
    assert!(err.to_string().contains("version 7"), "{err}");
}
