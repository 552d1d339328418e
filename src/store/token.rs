//! [`Token`]: who holds a reservation, 128 bits from the OS's random source.

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
/// ```
/// use tower_idempotency::store::Token;
///
/// let (a, b) = (Token::new(), Token::new());
/// assert_ne!(a, b);
/// assert_eq!(a.as_uuid().get_version_num(), 4);
/// assert_eq!(a.to_string().parse::<Token>().unwrap(), a);
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
        let bytes = RANDOM.with(|block| block.borrow_mut().next());
        Self(uuid::Builder::from_random_bytes(bytes).into_uuid())
    }

    /// The token as a UUID.
    pub fn as_uuid(&self) -> &Uuid {
        &self.0
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

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
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
                assert_eq!(token.as_uuid().get_version_num(), 4);
                assert_eq!(token.as_uuid().get_variant(), uuid::Variant::RFC4122);
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
        assert_ne!(*token.as_uuid(), Uuid::nil());
    }
}
