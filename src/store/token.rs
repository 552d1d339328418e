//! [`Token`]: who holds a reservation, 128 bits from the OS's random source.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// An unguessable token that proves who holds a reservation: a UUID v4 whose random bits come
/// from the OS's random source.
///
/// A send makes one on every reservation, so they are read from the OS in blocks (one system
/// call per 64 tokens, per thread) instead of one call each: every bit is
/// still the OS's own, nothing is derived or predicted from earlier tokens. As with any
/// randomness kept in a process, a process that forks without `exec` shares its thread's
/// unread block with the child; tokens made in both after such a fork could repeat.
///
/// It is written as a UUID is, in lowercase hyphenated form (`Display`, serde in a
/// human-readable format; its 16 bytes in another), and read from any of a UUID's forms
/// (hyphenated, 32 digits, braced, `urn:uuid:`), in either case. With the `uuid` feature
/// (which `postgres` turns on) it converts to and from `uuid::Uuid`.
///
/// ```
/// use tower_idempotency::store::Token;
///
/// let (a, b) = (Token::new(), Token::new());
/// assert_ne!(a, b);
/// assert_eq!(a.as_bytes()[6] >> 4, 4, "a version 4 UUID");
/// assert_eq!(a.to_string().parse::<Token>().unwrap(), a);
/// assert_eq!(
///     Token::from_bytes([0xa1; 16]).to_string(),
///     "a1a1a1a1-a1a1-a1a1-a1a1-a1a1a1a1a1a1"
/// );
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token([u8; 16]);

/// How many tokens' worth of random bytes one read from the OS brings.
const TOKENS_PER_READ: usize = 64;

/// A block of the OS's random bytes and how much of it is used.
struct RandomBlock {
    bytes: [u8; 16 * TOKENS_PER_READ],
    used: usize,
}

thread_local! {
    static RANDOM: RefCell<RandomBlock> = const {
        RefCell::new(RandomBlock { bytes: [0; 16 * TOKENS_PER_READ], used: 16 * TOKENS_PER_READ })
    };
}

impl RandomBlock {
    /// The next 16 unused bytes, reading a new block from the OS when this one is used up.
    fn next(&mut self) -> [u8; 16] {
        if self.used == self.bytes.len() {
            fill_from_os(&mut self.bytes);
            self.used = 0;
        }
        let mut out = [0; 16];
        out.copy_from_slice(&self.bytes[self.used..self.used + 16]);
        // Used bytes are wiped, so a token cannot be read back from the block later.
        self.bytes[self.used..self.used + 16].fill(0);
        self.used += 16;
        out
    }
}

/// Fills `bytes` from the OS's random source. A machine without one cannot make tokens
/// that fence anything: that is a broken host, not an input, as with `Uuid::new_v4`.
fn fill_from_os(bytes: &mut [u8]) {
    if let Err(error) = getrandom::fill(bytes) {
        panic!("the OS random source failed ({error}): no reservation token can be made");
    }
}

impl Token {
    /// A new random token.
    pub fn new() -> Self {
        let mut bytes = RANDOM.with(|block| block.borrow_mut().next());
        // RFC 9562: version 4 (random), variant 0b10.
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Self(bytes)
    }

    /// The token with these 16 bytes, as a store that keeps tokens as bytes gives them back.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The token's 16 bytes, in the order a UUID's are written.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The 36 characters of the hyphenated lowercase form, as `Display` writes them.
    pub(crate) fn hyphenated(&self) -> [u8; 36] {
        let mut out = [b'-'; 36];
        let mut at = 0;
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                at += 1;
            }
            out[at..at + 2].copy_from_slice(&crate::hex::pair(*byte));
            at += 2;
        }
        out
    }

    /// Reads a token from any of a UUID's written forms (see the type's docs).
    pub fn parse_ascii(text: &[u8]) -> Result<Self, ParseTokenError> {
        let text = match text.len() {
            32 | 36 => text,
            38 if text[0] == b'{' && text[37] == b'}' => &text[1..37],
            45 if text[..9].eq_ignore_ascii_case(b"urn:uuid:") => &text[9..],
            _ => return Err(ParseTokenError),
        };
        // A UUID's hyphens, when it has them, and only there: then the 32 digits.
        let mut digits = [0; 32];
        let mut at = 0;
        for (i, &c) in text.iter().enumerate() {
            if text.len() == 36 && matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return Err(ParseTokenError);
                }
                continue;
            }
            *digits.get_mut(at).ok_or(ParseTokenError)? = c;
            at += 1;
        }
        let mut bytes = [0; 16];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = crate::hex::byte(pair[0], pair[1]).ok_or(ParseTokenError)?;
        }
        Ok(Self(bytes))
    }
}

/// A string that is none of a UUID's written forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseTokenError;

impl fmt::Display for ParseTokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token is a UUID: 32 hexadecimal digits, hyphenated or not")
    }
}

impl std::error::Error for ParseTokenError {}

impl Default for Token {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "uuid")]
impl From<uuid::Uuid> for Token {
    fn from(uuid: uuid::Uuid) -> Self {
        Self(uuid.into_bytes())
    }
}

#[cfg(feature = "uuid")]
impl From<Token> for uuid::Uuid {
    fn from(token: Token) -> Self {
        uuid::Uuid::from_bytes(token.0)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.hyphenated()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

impl FromStr for Token {
    type Err = ParseTokenError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_ascii(s.as_bytes())
    }
}

/// As a UUID is: its hyphenated form in a human-readable format, its 16 bytes in another.
impl Serialize for Token {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_str(
                std::str::from_utf8(&self.hyphenated())
                    .map_err(|_| serde::ser::Error::custom("a token's hyphenated form is ASCII"))?,
            )
        } else {
            serializer.serialize_bytes(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TokenVisitor;

        impl Visitor<'_> for TokenVisitor {
            type Value = Token;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a UUID, as text or 16 bytes")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Token, E> {
                Token::parse_ascii(text.as_bytes()).map_err(E::custom)
            }

            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Token, E> {
                <[u8; 16]>::try_from(bytes)
                    .map(Token)
                    .map_err(|_| E::invalid_length(bytes.len(), &self))
            }
        }

        if deserializer.is_human_readable() {
            deserializer.deserialize_str(TokenVisitor)
        } else {
            deserializer.deserialize_bytes(TokenVisitor)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn tokens_across_several_blocks_and_threads_are_distinct_v4_uuids() {
        let per_thread = 3 * TOKENS_PER_READ + 1;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..per_thread).map(|_| Token::new()).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for thread in threads {
            for token in thread.join().expect("the thread made its tokens") {
                let bytes = token.as_bytes();
                assert_eq!(bytes[6] >> 4, 4, "version 4");
                assert_eq!(bytes[8] >> 6, 0b10, "RFC 9562's variant");
                assert!(seen.insert(token), "{token} made twice");
            }
        }
        assert_eq!(seen.len(), 4 * per_thread);
    }

    #[test]
    fn a_used_part_of_the_block_is_wiped() {
        let token = Token::new();
        RANDOM.with(|block| {
            let block = block.borrow();
            let used = &block.bytes[..block.used];
            assert!(used.iter().all(|&b| b == 0), "used bytes are zero");
        });
        assert_ne!(*token.as_bytes(), [0; 16]);
    }

    /// What stored records hold: the form the `uuid` crate wrote for the releases before
    /// this one, pinned.
    #[test]
    fn a_token_is_written_as_a_hyphenated_lowercase_uuid() {
        let token = Token::from_bytes([
            0x6f, 0x1c, 0x3a, 0x9e, 0x02, 0x4b, 0x4d, 0x7f, 0x8a, 0x10, 0xbe, 0xef, 0x00, 0x01,
            0xc0, 0xde,
        ]);
        let text = "6f1c3a9e-024b-4d7f-8a10-beef0001c0de";
        assert_eq!(token.to_string(), text);
        assert_eq!(format!("{token:?}"), format!("Token({text})"));
        assert_eq!(
            serde_json::to_string(&token).unwrap(),
            format!("\"{text}\"")
        );
        assert_eq!(
            serde_json::from_str::<Token>(&format!("\"{text}\"")).unwrap(),
            token
        );
    }

    #[test]
    fn a_token_is_read_from_every_form_of_a_uuid_and_nothing_else() {
        let token: Token = "6f1c3a9e-024b-4d7f-8a10-beef0001c0de".parse().unwrap();
        for form in [
            "6F1C3A9E-024B-4D7F-8A10-BEEF0001C0DE",
            "6f1c3a9e024b4d7f8a10beef0001c0de",
            "{6f1c3a9e-024b-4d7f-8a10-beef0001c0de}",
            "urn:uuid:6f1c3a9e-024b-4d7f-8a10-beef0001c0de",
            "URN:UUID:6f1c3a9e-024b-4d7f-8a10-beef0001c0de",
        ] {
            assert_eq!(form.parse::<Token>(), Ok(token), "{form}");
        }
        for bad in [
            "",
            "6f1c3a9e-024b-4d7f-8a10-beef0001c0d",
            "6f1c3a9e-024b-4d7f-8a10-beef0001c0dee",
            "6f1c3a9e-024b-4d7f-8a10-beef0001c0dg",
            "6f1c3a9e0-24b-4d7f-8a10-beef0001c0de",
            "6f1c3a9e-024b-4d7f-8a10+beef0001c0de",
            "6f1c3a9e024b4d7f8a10beef0001c0d-",
            "{6f1c3a9e-024b-4d7f-8a10-beef0001c0de]",
            "urn:uuid:6f1c3a9e024b4d7f8a10beef0001c0de",
            "6f1c3a9e-024b-4d7f-8a10-beef0001c0dé",
        ] {
            assert_eq!(bad.parse::<Token>(), Err(ParseTokenError), "{bad}");
        }
        assert!(serde_json::from_str::<Token>("\"not a token\"").is_err());
        assert!(serde_json::from_str::<Token>("42").is_err());
    }

    #[test]
    fn a_new_token_reads_back_as_itself() {
        for _ in 0..1000 {
            let token = Token::new();
            assert_eq!(token.to_string().parse::<Token>(), Ok(token));
            assert_eq!(Token::from_bytes(*token.as_bytes()), token);
        }
    }

    #[cfg(feature = "uuid")]
    #[test]
    fn a_token_and_its_uuid_are_written_alike_and_convert_both_ways() {
        for _ in 0..100 {
            let token = Token::new();
            let uuid = uuid::Uuid::from(token);
            assert_eq!(uuid.get_version_num(), 4);
            assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(uuid.to_string(), token.to_string());
            assert_eq!(
                serde_json::to_string(&uuid).unwrap(),
                serde_json::to_string(&token).unwrap()
            );
            assert_eq!(Token::from(uuid), token);
        }
    }
}
