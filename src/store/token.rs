//! [`Token`]: who holds a reservation, a UUID v4 from the OS's random source.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An unguessable token that proves who holds a reservation: a UUID v4 whose random bits come
/// from the OS's random source.
///
/// A send makes one on every reservation, so they are read from the OS in blocks (one system
/// call per 64 tokens, per thread) instead of one call each: every bit is
/// still the OS's own, nothing is derived or predicted from earlier tokens. As with any
/// randomness kept in a process, a process that forks without `exec` shares its thread's
/// unread block with the child; tokens made in both after such a fork could repeat.
///
/// It is a [`uuid::Uuid`] and converts to and from one; it is written as a UUID is, in
/// lowercase hyphenated form (`Display`, serde in a human-readable format; its 16 bytes in
/// another), and read from any of the forms [`Uuid::parse_str`] reads.
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
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(Uuid);

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
        let random = RANDOM.with(|block| block.borrow_mut().next());
        Self(uuid::Builder::from_random_bytes(random).into_uuid())
    }

    /// The token with these 16 bytes, as a store that keeps tokens as bytes gives them back.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(Uuid::from_bytes(bytes))
    }

    /// The token's 16 bytes, in the order a UUID's are written.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl Token {
    /// The token's text, hyphenated and lowercase as `Display` writes it, on the stack: the
    /// stored records and the Redis scripts' arguments carry it on every call.
    pub(crate) fn text(&self) -> TokenText {
        let mut text = [0; 36];
        self.0.hyphenated().encode_lower(&mut text);
        TokenText(text)
    }
}

/// A [`Token`]'s text ([`Token::text`]).
pub(crate) struct TokenText([u8; 36]);

impl TokenText {
    pub(crate) fn as_str(&self) -> &str {
        // Hex digits and hyphens: always text.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl Default for Token {
    fn default() -> Self {
        Self::new()
    }
}

impl From<Uuid> for Token {
    fn from(uuid: Uuid) -> Self {
        Self(uuid)
    }
}

impl From<Token> for Uuid {
    fn from(token: Token) -> Self {
        token.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", self.0)
    }
}

impl FromStr for Token {
    type Err = uuid::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
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

    /// What stored records hold, pinned.
    #[test]
    fn a_token_is_written_as_a_hyphenated_lowercase_uuid() {
        let token = Token::from_bytes([
            0x6f, 0x1c, 0x3a, 0x9e, 0x02, 0x4b, 0x4d, 0x7f, 0x8a, 0x10, 0xbe, 0xef, 0x00, 0x01,
            0xc0, 0xde,
        ]);
        let text = "6f1c3a9e-024b-4d7f-8a10-beef0001c0de";
        assert_eq!(token.to_string(), text);
        assert_eq!(token.text().as_str(), text);
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
            assert!(bad.parse::<Token>().is_err(), "{bad}");
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
