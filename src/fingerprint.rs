//! Fingerprints: a SHA-256 digest that tells one message from another under the same key.
//!
//! # Encoding (version 1)
//!
//! The digest runs over a canonical encoding, never over a concatenation, so no two different
//! messages share it:
//!
//! - a domain prefix naming the kind of message and the encoding version
//!   (`tower-idempotency/message/v1\0`, `tower-idempotency/raw/v1\0`);
//! - then every field, always, in a fixed order, each introduced by a one-byte tag;
//! - a string is its length as a little-endian `u64`, then its UTF-8 bytes;
//! - a list is its element count as a `u64`, then each element;
//! - an optional value is a presence byte (`0` or `1`), then the value;
//! - headers and metadata are maps sorted by name, so insertion order does not matter;
//! - attachments contribute their file name and content type, not their bytes;
//! - the schedule is seconds and nanoseconds relative to the Unix epoch, with a sign byte; a
//!   message keeps its schedule in whole milliseconds
//!   ([`MessageBuilder::send_at`](crate::MessageBuilder::send_at) rounds down), so the
//!   nanoseconds are always a multiple of 1,000,000, as in every stored form of the message.
//!
//! Fields of a [`Message`]: from, to, cc, bcc, reply-to, subject, text, html, headers,
//! attachments, message id, in-reply-to, references, send-at, tracking (opens, clicks),
//! metadata. The idempotency key is not part of it: the fingerprint is what the key protects.
//! A [`RawMessage`] is fingerprinted by its envelope (sender, recipients).
//!
//! Your own request types are fingerprinted through the same [`Encoder`], under a domain of
//! their own.
//!
//! The encoding is pinned by golden vectors in the tests: a fingerprint that changes between
//! releases would turn every live key into `idempotency.key_reused` after a deploy. A change of
//! encoding must come with a new version prefix and a migration note.

use std::fmt;
use std::str::FromStr;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::message::{Channel, Message, RawMessage, SmsSender};

// Written with a trailing NUL by `Encoder::new`.
const MESSAGE_DOMAIN: &str = "tower-idempotency/message/v1";
const RAW_DOMAIN: &str = "tower-idempotency/raw/v1";

/// A 32-byte SHA-256 fingerprint of a message's content; hex in `Display` and serde.
///
/// ```
/// use tower_idempotency::{Fingerprint, Message};
///
/// let message = Message::builder().from("a@example.com").to("b@example.com").text("hi").build()?;
/// let fingerprint = Fingerprint::of(&message);
/// assert_eq!(fingerprint.to_string().len(), 64);
/// assert_eq!(fingerprint.to_string().parse::<Fingerprint>()?, fingerprint);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of anything [`Fingerprinted`].
    pub fn of<M: Fingerprinted + ?Sized>(message: &M) -> Self {
        message.fingerprint()
    }

    /// Wraps 32 digest bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits, as `Display` writes them: from a table into one buffer,
    /// since every record a networked store writes carries a fingerprint.
    pub(crate) fn hex(&self) -> [u8; 64] {
        let mut hex = [0; 64];
        for (pair, byte) in hex.chunks_exact_mut(2).zip(&self.0) {
            pair.copy_from_slice(&crate::hex::pair(*byte));
        }
        hex
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.hex()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// A string that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseFingerprintError;

impl fmt::Display for ParseFingerprintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a fingerprint is 64 hexadecimal digits")
    }
}

impl std::error::Error for ParseFingerprintError {}

impl FromStr for Fingerprint {
    type Err = ParseFingerprintError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_hex(s.as_bytes()).ok_or(ParseFingerprintError)
    }
}

impl Fingerprint {
    /// The fingerprint in 64 hex digits of either case, as [`FromStr`] reads it; `None` for
    /// anything else. Each digit's value comes from a table, as a networked store reads a
    /// fingerprint in every record it answers.
    pub(crate) fn from_hex(hex: &[u8]) -> Option<Self> {
        let hex: &[u8; 64] = hex.try_into().ok()?;
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = crate::hex::byte(pair[0], pair[1])?;
        }
        Some(Self(out))
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // One string, not `collect_str`: that goes through `Display` and the serializer's
        // escaping writer, for text that never needs an escape.
        let hex = self.hex();
        let hex = std::str::from_utf8(&hex).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(hex)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Something the layer can fingerprint: [`Message`], [`RawMessage`], and your own request
/// types through the [`Encoder`] (see
/// [`IdempotentRequest`](crate::layer::IdempotentRequest) for a whole example).
pub trait Fingerprinted {
    /// Its fingerprint under the current encoding version.
    fn fingerprint(&self) -> Fingerprint;
}

impl Fingerprinted for Message {
    fn fingerprint(&self) -> Fingerprint {
        let m = &*self.parts;
        let mut e = Encoder::new(MESSAGE_DOMAIN);
        e.tag(0x01).str(&m.from);
        e.tag(0x02).list(&m.to);
        e.tag(0x03).list(&m.cc);
        e.tag(0x04).list(&m.bcc);
        e.tag(0x05).list(&m.reply_to);
        e.tag(0x06).opt(m.subject.as_deref());
        e.tag(0x07).opt(m.text.as_deref());
        e.tag(0x08).opt(m.html.as_deref());
        e.tag(0x09).len(m.headers.len());
        for (name, value) in &m.headers {
            e.str(name).str(value);
        }
        e.tag(0x0a).len(m.attachments.len());
        for a in &m.attachments {
            e.str(&a.filename).str(&a.content_type);
        }
        e.tag(0x0b).opt(m.threading.message_id.as_deref());
        e.tag(0x0c).opt(m.threading.in_reply_to.as_deref());
        e.tag(0x0d).list(&m.threading.references);
        e.tag(0x0e);
        match m.send_at {
            None => e.byte(0),
            Some(at) => {
                e.byte(1);
                let (sign, d) = match at.duration_since(UNIX_EPOCH) {
                    Ok(d) => (0u8, d),
                    Err(before) => (1u8, before.duration()),
                };
                e.byte(sign)
                    .u64(d.as_secs())
                    .u64(u64::from(d.subsec_nanos()))
            }
        };
        e.tag(0x0f).bool(m.tracking.opens).bool(m.tracking.clicks);
        e.tag(0x10).len(m.metadata.len());
        for (name, value) in &m.metadata {
            e.str(name).str(value);
        }
        // Only an SMS says its channel, so every email keeps the fingerprint it always had.
        if let Channel::Sms(sender) = m.channel {
            e.tag(0x11).byte(match sender {
                SmsSender::Number => 1,
                SmsSender::AlphanumericId => 2,
                SmsSender::MessagingService => 3,
            });
        }
        e.finish()
    }
}

impl Fingerprinted for RawMessage {
    fn fingerprint(&self) -> Fingerprint {
        let envelope = self.envelope();
        let mut e = Encoder::new(RAW_DOMAIN);
        e.tag(0x01).str(envelope.from());
        e.tag(0x02).list(envelope.to());
        e.finish()
    }
}

impl<T: Fingerprinted + ?Sized> Fingerprinted for &T {
    fn fingerprint(&self) -> Fingerprint {
        (**self).fingerprint()
    }
}

/// The crate's canonical encoder: fingerprint your own request types through it.
///
/// It streams a prefix-free encoding into SHA-256, so two different sequences of fields never
/// share a fingerprint (see the [module docs](self)):
///
/// - [`new`](Self::new) starts with a domain, followed by a NUL byte: name your type and the
///   version of its encoding (`"my-app/push/v1"`), so it never collides with another type's;
///   it must hold no NUL itself;
/// - a string or byte string is its length as a little-endian `u64`, then its bytes;
/// - a list is its element count, then each element;
/// - an optional string is a presence byte (`0` or `1`), then the string;
/// - a `u64` is its 8 little-endian bytes, a `bool` one byte.
///
/// Write every field, always, in a fixed order; leave out what does not make it another
/// request (the idempotency key, a timestamp of the call). For a map, write its length with
/// [`u64`](Self::u64), then each entry in sorted order. Changing what you write changes every
/// fingerprint: bump the version in the domain when you do, and expect live keys to answer
/// `idempotency.key_reused` for the messages they protect.
///
/// Nothing is buffered, so a large body costs what SHA-256 over it costs.
///
/// ```
/// use tower_idempotency::fingerprint::{Encoder, Fingerprint};
///
/// fn push_fingerprint(device: &str, title: Option<&str>, text: &str, badge: u64) -> Fingerprint {
///     let mut e = Encoder::new("my-app/push/v1");
///     e.str(device).opt(title).str(text).u64(badge);
///     e.finish()
/// }
/// assert_eq!(push_fingerprint("d1", None, "hi", 1), push_fingerprint("d1", None, "hi", 1));
/// // Lengths are written, so moving a character from one field to the next is another request.
/// assert_ne!(push_fingerprint("d1", None, "hi", 1), push_fingerprint("d", None, "1hi", 1));
/// ```
pub struct Encoder(Sha256);

impl Encoder {
    /// Starts an encoding under `domain` (written with a trailing NUL byte).
    pub fn new(domain: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(domain.as_bytes());
        hasher.update([0]);
        Self(hasher)
    }

    fn byte(&mut self, b: u8) -> &mut Self {
        self.0.update([b]);
        self
    }

    fn tag(&mut self, tag: u8) -> &mut Self {
        self.byte(tag)
    }

    fn len(&mut self, n: usize) -> &mut Self {
        self.u64(n as u64)
    }

    /// Writes a number: 8 bytes, little-endian.
    pub fn u64(&mut self, n: u64) -> &mut Self {
        self.0.update(n.to_le_bytes());
        self
    }

    /// Writes a flag: one byte, `0` or `1`.
    pub fn bool(&mut self, b: bool) -> &mut Self {
        self.byte(u8::from(b))
    }

    /// Writes a string: its length in bytes, then its UTF-8 bytes.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    /// Writes a byte string: its length, then its bytes.
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.len(bytes.len());
        self.0.update(bytes);
        self
    }

    /// Writes an optional string: `0`, or `1` then the string.
    pub fn opt(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            None => self.byte(0),
            Some(s) => self.byte(1).str(s),
        }
    }

    /// Writes a list of strings: the count, then each string.
    pub fn list<S: AsRef<str>>(&mut self, items: &[S]) -> &mut Self {
        self.len(items.len());
        for item in items {
            self.str(item.as_ref());
        }
        self
    }

    /// The fingerprint of everything written.
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

impl fmt::Debug for Encoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_refuses_wrong_length_and_non_hex() {
        assert!("ab".parse::<Fingerprint>().is_err());
        assert!("zz".repeat(32).parse::<Fingerprint>().is_err());
        assert!("Ab".repeat(32).parse::<Fingerprint>().is_ok());
    }

    #[test]
    fn every_byte_reads_as_the_hex_digit_it_is_or_not_at_all() {
        for b in 0..=255u8 {
            for at in [0, 1, 62, 63] {
                let mut hex = [b'0'; 64];
                hex[at] = b;
                let read = Fingerprint::from_hex(&hex);
                let digit = char::from(b).to_digit(16).filter(|_| b.is_ascii_hexdigit());
                match digit {
                    None => assert_eq!(read, None, "byte {b} at {at}"),
                    Some(d) => {
                        let byte = read.expect("a hex digit").0[at / 2];
                        let want = if at % 2 == 0 { d << 4 } else { d };
                        assert_eq!(u32::from(byte), want, "byte {b} at {at}");
                    }
                }
            }
        }
        assert_eq!(Fingerprint::from_hex(&[b'0'; 63]), None);
        assert_eq!(Fingerprint::from_hex(&[b'0'; 65]), None);
    }

    #[test]
    fn serde_is_the_hex_string() {
        let f = Fingerprint::from_bytes([0xab; 32]);
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(json, format!("\"{}\"", "ab".repeat(32)));
        assert_eq!(serde_json::from_str::<Fingerprint>(&json).unwrap(), f);
        assert!(serde_json::from_str::<Fingerprint>("\"nothex\"").is_err());
    }

    #[test]
    fn display_hex_and_serde_write_the_same_digits() {
        for bytes in [[0; 32], [0xff; 32], std::array::from_fn(|i| (i * 37) as u8)] {
            let f = Fingerprint::from_bytes(bytes);
            let shown = f.to_string();
            assert_eq!(std::str::from_utf8(&f.hex()).unwrap(), shown);
            assert_eq!(serde_json::to_string(&f).unwrap(), format!("\"{shown}\""));
            let pairs: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(shown, pairs);
        }
    }
}
