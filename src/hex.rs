//! Lowercase hex digits, written from a table and read through one: a fingerprint and a
//! hashed key are written on every record a store keeps, and read on every one it gives back.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two lowercase hex digits of `byte`.
pub(crate) fn pair(byte: u8) -> [u8; 2] {
    [
        DIGITS[usize::from(byte >> 4)],
        DIGITS[usize::from(byte & 15)],
    ]
}

/// The value of the hex digit `digit`, either case; `None` when it is none.
pub(crate) fn value(digit: u8) -> Option<u8> {
    match VALUE[usize::from(digit)] {
        255 => None,
        value => Some(value),
    }
}

/// The byte the two hex digits `high` and `low` stand for.
pub(crate) fn byte(high: u8, low: u8) -> Option<u8> {
    Some(value(high)? << 4 | value(low)?)
}

/// Each byte's value as a hex digit, or 255 when it is none.
const VALUE: [u8; 256] = {
    let mut table = [255u8; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_written_and_read_back_and_only_hex_digits_are_read() {
        for b in 0..=255u8 {
            let [high, low] = pair(b);
            assert_eq!(byte(high, low), Some(b));
            assert_eq!(
                String::from_utf8(pair(b).to_vec()).unwrap(),
                format!("{b:02x}")
            );
            let digit = char::from(b).to_digit(16).filter(|_| b.is_ascii_hexdigit());
            assert_eq!(value(b).map(u32::from), digit, "byte {b}");
        }
    }
}
