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
    for value in [&b"42"[..], br#"{"nope":1}"#, b"[]", b""] {
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
    // A record of the previous release carries none.
    let old = done_json(token(), fingerprint(), &failed).unwrap();
    assert_eq!(
        decode_record_times(old.as_bytes()).unwrap().2,
        Times::default()
    );
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

/// No outcome, a kept receipt, a kept error, and a receipt whose strings need escapes.
fn sample_outcomes() -> [Option<Outcome>; 4] {
    [
        None,
        Some(kept_sent()),
        Some(Outcome::failed(kept_error())),
        Some(Outcome::sent(
            Receipt::new("id \"quoted\" \\ \u{1}", "tränsport").with_accepted(["a@x"]),
        )),
    ]
}

#[test]
fn records_are_written_as_serde_json_writes_the_stored_form() {
    let outcomes = sample_outcomes();
    let times = [
        Times::default(),
        Times {
            first_attempt_at_ms: Some(0),
            lease_until_ms: None,
        },
        Times {
            first_attempt_at_ms: Some(u64::MAX),
            lease_until_ms: Some(1),
        },
    ];
    for outcome in &outcomes {
        for state in [RecordState::Pending, RecordState::Done] {
            for times in times {
                let ours =
                    record_json_at(state, token(), fingerprint(), outcome.as_ref(), times).unwrap();
                let serde = serde_json::to_string(&RecordOut {
                    state: state.into(),
                    token: token(),
                    fingerprint: fingerprint(),
                    outcome: outcome.as_ref().map(OutcomeOut::from),
                    first_attempt_at_ms: times.first_attempt_at_ms,
                    lease_until_ms: times.lease_until_ms,
                })
                .unwrap();
                assert_eq!(ours, serde);
            }
        }
    }
}

/// What the general decoder makes of `bytes`, and what the reader of the written form
/// makes of them when it reads them at all; as text, to compare.
fn both_readings(bytes: &[u8]) -> (String, Option<String>) {
    let general = format!("{:?}", read_general(bytes).and_then(checked_stored));
    let written = written::read(bytes).map(|stored| format!("{:?}", checked_stored(stored)));
    (general, written)
}

#[test]
fn the_written_form_reads_as_the_general_decoder_reads_it() {
    let outcomes = sample_outcomes();
    let times = [
        Times::default(),
        Times {
            first_attempt_at_ms: Some(7),
            lease_until_ms: Some(u64::MAX),
        },
    ];
    let mut written_forms = Vec::new();
    for outcome in &outcomes {
        for state in [RecordState::Pending, RecordState::Done] {
            for times in times {
                let json =
                    record_json_at(state, token(), fingerprint(), outcome.as_ref(), times).unwrap();
                let (general, written) = both_readings(json.as_bytes());
                // Every record this release writes takes the fast way (a pending record with
                // an outcome too: the rules, applied after either reading, refuse it alike).
                assert_eq!(written.as_ref(), Some(&general), "{json}");
                written_forms.push(json);
            }
        }
    }
    // Anything else is read by the general decoder alone, or read alike by both.
    let done = &written_forms[written_forms.len() - 2];
    let mut others = vec![
        done.replacen("{\"state\"", "{ \"state\"", 1),
        done.replacen(
            "\"fingerprint\":\"03",
            "\"fingerprint\":\"\\u0030\\u0033",
            1,
        ),
        done.replacen("\"done\"", "\"pending\"", 1),
        done.replacen("\"done\"", "\"weird\"", 1),
        format!("{}}}", done.strip_suffix('}').unwrap()),
        format!("{} ", done),
        format!("{},\"state\":\"done\"}}", done.strip_suffix('}').unwrap()),
        format!("{},\"token\":null}}", done.strip_suffix('}').unwrap()),
        format!("{},\"unknown\":[1,2]}}", done.strip_suffix('}').unwrap()),
        format!(
            "{},\"repeats_a_fixed_field\":1}}",
            done.strip_suffix('}').unwrap()
        ),
        done.replacen(TOKEN, &TOKEN.to_uppercase(), 1),
        done.replacen(TOKEN, &TOKEN.replace('-', ""), 1),
        done.replacen(FINGERPRINT, &FINGERPRINT.to_uppercase(), 1),
        done.replacen(FINGERPRINT, &FINGERPRINT[..62], 1),
        done[..done.len() - 1].to_owned(),
        done.replacen(",\"outcome\":", ",\"outcome\":null,\"x\":", 1),
    ];
    for cut in [10, 40, 100, 140, 160] {
        others.push(done[..cut.min(done.len())].to_owned());
    }
    let mut read_by_position = Vec::new();
    for bytes in &others {
        let (general, written) = both_readings(bytes.as_bytes());
        if let Some(written) = written {
            assert_eq!(written, general, "{bytes}");
            read_by_position.push(bytes.as_str());
        }
    }
    // Not vacuous: seven of these were read both ways and compared (a pending state with an
    // outcome, refused alike; trailing space; an unknown field; an upper-case token; a null
    // outcome; the fingerprint, whose digits have no case, unchanged), and none of those the
    // fast reader must leave alone (escapes in a fixed field, a space before one) was taken.
    assert_eq!(read_by_position.len(), 7, "{read_by_position:#?}");
    assert!(
        read_by_position
            .iter()
            .all(|b| !b.contains("\\u0030") && !b.starts_with("{ ")),
        "{read_by_position:#?}"
    );
}

/// A receipt as given, naming its accepted addresses.
fn as_given() -> Outcome {
    Outcome::sent(Receipt::new("msg_2", "fake").with_accepted(["a@x", "b@y"]))
}

/// A done record of `outcome` with `times`, as this release writes it.
fn done_at(outcome: &Outcome, times: Times) -> String {
    record_json_at(
        RecordState::Done,
        token(),
        fingerprint(),
        Some(outcome),
        times,
    )
    .unwrap()
}

/// The bytes after the fingerprint's closing quote in a record.
fn tail_of(record: &str) -> &[u8] {
    let at = record.find(FINGERPRINT).expect("the fingerprint") + FINGERPRINT.len() + 1;
    &record.as_bytes()[at..]
}

#[test]
fn kept_receipts_and_times_are_read_by_position_when_no_string_needs_an_escape() {
    let times = Times {
        first_attempt_at_ms: Some(1_764_500_000_000),
        lease_until_ms: Some(u64::MAX),
    };
    let mut by_position = 0;
    for outcome in sample_outcomes().into_iter().chain([Some(as_given())]) {
        for times in [Times::default(), times] {
            let json = record_json_at(
                RecordState::Done,
                token(),
                fingerprint(),
                outcome.as_ref(),
                times,
            )
            .unwrap();
            let tail = written::tail_by_position(tail_of(&json));
            // A kept error, and a receipt whose strings carry escapes, go to serde_json.
            let expected = match &outcome {
                None => true,
                Some(o) => o.receipt().is_some_and(|r| !r.id.contains('"')),
            };
            assert_eq!(tail.is_some(), expected, "{json}");
            if let Some(tail) = tail {
                by_position += 1;
                assert_eq!(tail.first_attempt_at_ms, times.first_attempt_at_ms);
                assert_eq!(tail.lease_until_ms, times.lease_until_ms);
            }
        }
    }
    assert_eq!(by_position, 6);
}

/// Every one-byte change of a written record (a byte dropped, or replaced or preceded by
/// one that matters to JSON) is read alike by the reader of the written form and by the
/// general decoder, whichever of the two the reader then takes for the tail.
#[test]
fn every_one_byte_change_of_a_written_record_reads_as_the_general_decoder_reads_it() {
    let times = Times {
        first_attempt_at_ms: Some(1_764_500_000_000),
        lease_until_ms: Some(42),
    };
    const BYTES: &[u8] = b" \"\\,:[]{}0159.e-tfnx\x01\x7f\xc3\xff";
    let (mut compared, mut tails_by_position) = (0, 0);
    for outcome in [kept_sent(), as_given()] {
        let json = done_at(&outcome, times);
        let bytes = json.as_bytes();
        let tail_at = bytes.len() - tail_of(&json).len();
        for at in 0..bytes.len() {
            let mut changed = vec![[&bytes[..at], &bytes[at + 1..]].concat()];
            for &b in BYTES {
                let mut replaced = bytes.to_vec();
                replaced[at] = b;
                changed.push(replaced);
                changed.push([&bytes[..at], &[b], &bytes[at..]].concat());
            }
            for changed in changed {
                let general = format!("{:?}", read_general(&changed).and_then(checked_stored));
                let Some(stored) = written::read(&changed) else {
                    continue;
                };
                let written = format!("{:?}", checked_stored(stored));
                let text = String::from_utf8_lossy(&changed);
                assert_eq!(written, general, "{text}");
                compared += 1;
                if changed.starts_with(&bytes[..tail_at])
                    && written::tail_by_position(&changed[tail_at..]).is_some()
                {
                    tails_by_position += 1;
                }
            }
        }
    }
    // Not vacuous: many changes (a digit in a string or a number, a letter in a string)
    // leave a record both read, and the tail of many of those was read by position.
    assert!(compared > 500, "{compared}");
    assert!(tails_by_position > 300, "{tails_by_position}");
}

/// Receipts of every shape the writer by position takes, and some it must leave to
/// serde_json (strings that need escapes), with whether it takes them.
fn receipts_to_write() -> Vec<(Outcome, bool)> {
    let sent = |id: &str, transport: &str, accepted: &[&str], replayed, accepted_at: &[u32]| {
        let mut receipt = Receipt::new(id, transport).with_accepted(accepted.iter().copied());
        receipt.replayed = replayed;
        Outcome(Kept::Sent {
            receipt,
            accepted_at: accepted_at.to_vec(),
        })
    };
    let mut receipts = vec![
        (kept_sent(), true),
        (sent("msg_2", "fake", &["a@x", "b@y"], false, &[]), true),
        (sent("", "", &[], true, &[]), true),
        (
            sent(
                "i",
                "tränsport 日本 \u{7f}",
                &["é@x"],
                false,
                &[0, u32::MAX],
            ),
            true,
        ),
        (sent("m", "t", &[], false, &[7]), true),
        (Outcome::failed(kept_error()), false),
    ];
    for needs_escape in ["\"", "\\", "\u{0}", "\u{1f}", "\n", "a\"b"] {
        receipts.push((sent(needs_escape, "t", &[], false, &[]), false));
        receipts.push((sent("i", needs_escape, &[], false, &[]), false));
        receipts.push((sent("i", "t", &["a@x", needs_escape], false, &[1]), false));
    }
    receipts
}

#[test]
fn outcomes_and_records_are_written_as_serde_json_writes_them_by_position_or_not() {
    for (outcome, by_position) in receipts_to_write() {
        let serde = serde_json::to_string(&OutcomeOut::from(&outcome)).unwrap();
        assert_eq!(outcome_json(&outcome).unwrap(), serde);
        let mut json = Vec::new();
        assert_eq!(
            written::write_receipt(&mut json, &outcome),
            by_position,
            "{serde}"
        );
        if !by_position {
            assert!(json.is_empty(), "{serde}");
        }
        let times = Times {
            first_attempt_at_ms: Some(u64::MAX),
            lease_until_ms: Some(0),
        };
        let record = done_at(&outcome, times);
        let serde_record = serde_json::to_string(&RecordOut {
            state: StateV1::Done,
            token: token(),
            fingerprint: fingerprint(),
            outcome: Some(OutcomeOut::from(&outcome)),
            first_attempt_at_ms: times.first_attempt_at_ms,
            lease_until_ms: times.lease_until_ms,
        })
        .unwrap();
        assert_eq!(record, serde_record);
        // And it reads back as the general decoder reads it.
        let (general, written) = both_readings(record.as_bytes());
        assert_eq!(written.as_ref(), Some(&general), "{record}");
    }
}

#[test]
fn numbers_are_written_as_serde_json_writes_them() {
    for n in [
        0,
        1,
        9,
        10,
        99,
        100,
        1_764_500_000_000,
        u64::from(u32::MAX),
        u64::MAX,
    ] {
        let mut json = Vec::new();
        written::write_number(&mut json, n);
        assert_eq!(json, serde_json::to_vec(&n).unwrap(), "{n}");
    }
}
