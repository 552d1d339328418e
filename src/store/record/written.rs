//! Reading a record in the exact form [`record_json_at`](super::record_json_at) writes: the
//! fixed fields (state, token, fingerprint) by position, and the rest (a kept receipt, the
//! times) by position too when its strings need no escapes; a kept error, or a string with
//! an escape, through serde_json. A replay on a networked store decodes a record per call:
//! a general JSON parse of the fixed fields (six strings scanned for escapes, UTF-8 checked,
//! matched by name) was most of its work, and serde_json on the receipt most of the rest
//! (~4k instructions a replay; `benches/sends.rs`, `redis-replay`).
//!
//! Anything not in that exact form (another field order, spaces, an earlier release's
//! writing, damage) is left to the general decoder, and so is anything this reader would
//! refuse: it answers only what the general decoder answers for the same bytes (unit tests
//! hold the two together, over written forms and every one-byte change of them).
//!
//! The writing side, [`write_receipt`] and [`write_number`], writes a kept receipt and the
//! numbers as serde_json writes them when no string needs an escape: serde_json's escaping
//! writer cost ~1k instructions a record on every complete of a networked store.

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny};

use super::{OutcomeIn, ReceiptIn, Times};
use crate::fingerprint::Fingerprint;
use crate::outcome::{Kept, Outcome};
use crate::store::{RecordState, Token};

/// What the fixed fields of a record in the written form say, and the rest to decode.
pub(super) struct Written {
    pub(super) state: RecordState,
    pub(super) token: Token,
    pub(super) fingerprint: Fingerprint,
    pub(super) outcome: Option<OutcomeIn>,
    pub(super) times: Times,
}

/// The record in `bytes`, when they are in the written form; `None` otherwise, for the
/// general decoder to read or refuse.
pub(super) fn read(bytes: &[u8]) -> Option<Written> {
    let mut at = Cursor(bytes);
    at.eat(b"{\"state\":\"")?;
    let state = match at.eat(b"pending") {
        Some(()) => RecordState::Pending,
        None => at.eat(b"done").map(|()| RecordState::Done)?,
    };
    at.eat(b"\",\"token\":\"")?;
    let token = Token::parse_ascii(at.take(36)?).ok()?;
    at.eat(b"\",\"fingerprint\":\"")?;
    let fingerprint = Fingerprint::from_hex(at.take(64)?)?;
    at.eat(b"\"")?;
    let tail = match tail_by_position(at.0) {
        Some(tail) => tail,
        None => tail_by_serde(at.0)?,
    };
    Some(Written {
        state,
        token,
        fingerprint,
        outcome: tail.outcome,
        times: Times {
            first_attempt_at_ms: tail.first_attempt_at_ms,
            lease_until_ms: tail.lease_until_ms,
        },
    })
}

/// The fields after the fingerprint (`rest`, from the comma before the next field) through
/// serde_json, when [`tail_by_position`] does not read them (a bare closing brace it does).
fn tail_by_serde(rest: &[u8]) -> Option<Tail> {
    let fields = rest.strip_prefix(b",")?;
    // The remaining fields as an object of their own: `{` in place of the comma.
    let mut object = Vec::with_capacity(fields.len() + 1);
    object.push(b'{');
    object.extend_from_slice(fields);
    let tail: Tail = serde_json::from_slice(&object).ok()?;
    (!tail.repeats_a_fixed_field).then_some(tail)
}

/// The fields after the fingerprint in the exact form the writer puts them: a kept receipt
/// whose strings need no escapes, then the times, each field where the writer puts it;
/// `None` at any other byte.
pub(super) fn tail_by_position(rest: &[u8]) -> Option<Tail> {
    let mut at = Cursor(rest);
    let outcome = match at.eat(b",\"outcome\":") {
        Some(()) => Some(at.receipt()?),
        None => None,
    };
    let mut time = |name: &[u8]| match at.eat(name) {
        Some(()) => at.number().map(Some),
        None => Some(None),
    };
    let first_attempt_at_ms = time(b",\"first_attempt_at_ms\":")?;
    let lease_until_ms = time(b",\"lease_until_ms\":")?;
    at.eat(b"}")?;
    at.0.is_empty().then_some(Tail {
        outcome,
        first_attempt_at_ms,
        lease_until_ms,
        repeats_a_fixed_field: false,
    })
}

/// Writes `outcome` as [`OutcomeOut`](super::OutcomeOut) through serde_json writes it, when
/// it is a kept receipt none of whose strings needs an escape, and answers whether it did
/// (writing nothing when not).
pub(super) fn write_receipt(json: &mut Vec<u8>, outcome: &Outcome) -> bool {
    let Kept::Sent {
        receipt,
        accepted_at,
    } = &outcome.0
    else {
        return false;
    };
    let plain = |s: &str| !s.bytes().any(escaped);
    if !(plain(&receipt.id)
        && plain(&receipt.transport)
        && receipt.accepted.iter().all(|a| plain(a)))
    {
        return false;
    }
    let string = |json: &mut Vec<u8>, s: &str| {
        json.push(b'"');
        json.extend_from_slice(s.as_bytes());
        json.push(b'"');
    };
    json.extend_from_slice(b"{\"sent\":{\"id\":");
    string(json, &receipt.id);
    json.extend_from_slice(b",\"transport\":");
    string(json, &receipt.transport);
    json.extend_from_slice(b",\"accepted\":");
    write_list(json, &receipt.accepted, |json, address| {
        string(json, address)
    });
    json.extend_from_slice(if receipt.replayed {
        b",\"replayed\":true".as_slice()
    } else {
        b",\"replayed\":false".as_slice()
    });
    if !accepted_at.is_empty() {
        json.extend_from_slice(b",\"accepted_at\":");
        write_list(json, accepted_at, |json, &at| {
            write_number(json, u64::from(at))
        });
    }
    json.extend_from_slice(b"}}");
    true
}

/// Whether JSON writes `b` escaped inside a string, as serde_json does: a quote, a
/// backslash, a control character.
fn escaped(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// Writes `[a,b,…]`, each item by `item`.
fn write_list<T>(json: &mut Vec<u8>, items: &[T], mut item: impl FnMut(&mut Vec<u8>, &T)) {
    json.push(b'[');
    for (i, value) in items.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        item(json, value);
    }
    json.push(b']');
}

/// Writes `n` in decimal, as serde_json writes a whole number.
pub(super) fn write_number(json: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    json.extend_from_slice(&digits[at..]);
}

/// The bytes left to read, each step taking exactly what the writer puts there.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn eat(&mut self, expected: &[u8]) -> Option<()> {
        self.0 = self.0.strip_prefix(expected)?;
        Some(())
    }

    /// The next `n` bytes, whatever they are.
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(taken)
    }

    /// `{"sent":{…}}` as [`ReceiptOut`](super::ReceiptOut) is written.
    fn receipt(&mut self) -> Option<OutcomeIn> {
        self.eat(b"{\"sent\":{\"id\":")?;
        let id = self.string()?.to_owned();
        self.eat(b",\"transport\":")?;
        let transport = self.string()?.to_owned();
        self.eat(b",\"accepted\":")?;
        let accepted = self.list(|at| at.string().map(str::to_owned))?;
        self.eat(b",\"replayed\":")?;
        let replayed = match self.eat(b"true") {
            Some(()) => true,
            None => self.eat(b"false").map(|()| false)?,
        };
        let accepted_at = match self.eat(b",\"accepted_at\":") {
            Some(()) => self.list(|at| u32::try_from(at.number()?).ok())?,
            None => Vec::new(),
        };
        self.eat(b"}}")?;
        Some(OutcomeIn::Sent(ReceiptIn {
            id,
            transport,
            accepted,
            replayed,
            accepted_at,
        }))
    }

    /// A string with no escape and no control character, its bytes UTF-8.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b"\"")?;
        let text = self.take(self.0.iter().position(|&b| escaped(b))?)?;
        self.eat(b"\"")?;
        std::str::from_utf8(text).ok()
    }

    /// A whole number as JSON writes one (digits, no leading zero) that fits a `u64`. What
    /// follows is the caller's to check: a `.` or an `e` there is no structural byte.
    fn number(&mut self) -> Option<u64> {
        let text = self.take(self.0.iter().take_while(|b| b.is_ascii_digit()).count())?;
        if text.is_empty() || (text.len() > 1 && text[0] == b'0') {
            return None;
        }
        text.iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
    }

    /// `[]`, or `[a,b,…]` of items `item` reads.
    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        self.eat(b"[")?;
        let mut items = Vec::new();
        if self.eat(b"]").is_some() {
            return Some(items);
        }
        loop {
            items.push(item(self)?);
            if self.eat(b"]").is_some() {
                return Some(items);
            }
            self.eat(b",")?;
        }
    }
}

/// The fields after the fingerprint, as the general decoder reads them. A fixed field seen
/// again here is a record the general decoder refuses (a duplicate field).
#[derive(Default, Deserialize)]
pub(super) struct Tail {
    #[serde(default)]
    outcome: Option<OutcomeIn>,
    #[serde(default)]
    pub(super) first_attempt_at_ms: Option<u64>,
    #[serde(default)]
    pub(super) lease_until_ms: Option<u64>,
    #[serde(
        default,
        alias = "state",
        alias = "token",
        alias = "fingerprint",
        deserialize_with = "present"
    )]
    repeats_a_fixed_field: bool,
}

/// Whether the field is there, whatever its value.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(deserializer).map(|_| true)
}
