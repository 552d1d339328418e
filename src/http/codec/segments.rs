//! How long an SMS body is as the carriers and Twilio count it: in GSM-7 septets when every
//! character is in the GSM 03.38 alphabet, else in UCS-2 (UTF-16) code units, and in how many
//! segments it goes.

/// The encoding an SMS body goes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SmsEncoding {
    /// The GSM 03.38 7-bit alphabet: 160 septets in one segment, 153 in each of several.
    Gsm7,
    /// UCS-2 (UTF-16 on the wire): 70 code units in one segment, 67 in each of several.
    Ucs2,
}

/// The length of an SMS body ([`sms_length`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct SmsLength {
    /// The encoding the body needs.
    pub encoding: SmsEncoding,
    /// Its length in that encoding's units: GSM-7 septets (a character of the extension
    /// table, such as `€` or `{`, takes two), or UTF-16 code units (a character outside the
    /// Basic Multilingual Plane, such as most emoji, takes two).
    pub units: usize,
    /// The segments it goes in: one up to 160 septets or 70 code units, else segments of 153
    /// septets or 67 code units, none splitting a character's units.
    pub segments: usize,
}

/// The length of `text` as an SMS: its encoding, units and segments.
///
/// ```
/// use tower_idempotency::http::twilio::{SmsEncoding, sms_length};
///
/// let plain = sms_length("Your code is 314159");
/// assert_eq!((plain.encoding, plain.units, plain.segments), (SmsEncoding::Gsm7, 19, 1));
/// // `€` is in the GSM-7 extension table: two septets.
/// assert_eq!(sms_length("5 €").units, 4);
/// // An emoji makes the whole body UCS-2, and takes two UTF-16 code units.
/// let emoji = sms_length("Thanks 👍");
/// assert_eq!((emoji.encoding, emoji.units), (SmsEncoding::Ucs2, 9));
/// assert_eq!(sms_length(&"a".repeat(161)).segments, 2);
/// ```
pub fn sms_length(text: &str) -> SmsLength {
    let gsm7 = text.chars().all(|c| gsm7_septets(c).is_some());
    let (encoding, single, each): (_, usize, usize) = if gsm7 {
        (SmsEncoding::Gsm7, 160, 153)
    } else {
        (SmsEncoding::Ucs2, 70, 67)
    };
    let cost = |c: char| match encoding {
        SmsEncoding::Gsm7 => gsm7_septets(c).unwrap_or(2),
        SmsEncoding::Ucs2 => c.len_utf16(),
    };
    let units: usize = text.chars().map(cost).sum();
    let segments = if units <= single {
        usize::from(units > 0)
    } else {
        // A character's units never straddle two segments, so a segment may end short.
        let mut segments = 1;
        let mut used = 0;
        for c in text.chars() {
            let c = cost(c);
            if used + c > each {
                segments += 1;
                used = 0;
            }
            used += c;
        }
        segments
    };
    SmsLength {
        encoding,
        units,
        segments,
    }
}

/// The GSM 03.38 basic alphabet, apart from ASCII letters and digits.
const GSM7_BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./:;<=>?¡ÄÖÑÜ§¿äöñüà";

/// The GSM 03.38 extension table: each takes an escape and itself, two septets.
const GSM7_EXTENSION: &str = "\u{c}^{}\\[~]|€";

/// The septets of `c` in GSM-7, or `None` when the alphabet lacks it.
fn gsm7_septets(c: char) -> Option<usize> {
    if c.is_ascii_alphanumeric() || GSM7_BASIC.contains(c) {
        Some(1)
    } else if GSM7_EXTENSION.contains(c) {
        Some(2)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_basic_alphabet_and_the_extension_table_have_their_sizes() {
        // 128 characters in the basic table: 62 ASCII letters and digits, the rest listed
        // (the escape itself is not a character of text).
        assert_eq!(GSM7_BASIC.chars().count() + 62, 127);
        assert_eq!(GSM7_EXTENSION.chars().count(), 10);
    }

    #[test]
    fn segments_follow_the_encoding_limits() {
        let gsm = |n: usize| sms_length(&"a".repeat(n));
        assert_eq!((gsm(0).units, gsm(0).segments), (0, 0));
        assert_eq!(gsm(160).segments, 1);
        assert_eq!(gsm(161).segments, 2);
        assert_eq!(gsm(306).segments, 2);
        assert_eq!(gsm(307).segments, 3);
        let ucs = |n: usize| sms_length(&format!("ж{}", "a".repeat(n - 1)));
        assert_eq!(ucs(70).encoding, SmsEncoding::Ucs2);
        assert_eq!(ucs(70).segments, 1);
        assert_eq!(ucs(71).segments, 2);
        assert_eq!(ucs(134).segments, 2);
        assert_eq!(ucs(135).segments, 3);
    }

    #[test]
    fn a_two_unit_character_does_not_straddle_segments() {
        // 152 septets, then `€` (2): it does not fit in the first segment's last septet.
        let text = format!("{}€{}", "a".repeat(152), "a".repeat(10));
        let length = sms_length(&text);
        assert_eq!(length.units, 164);
        assert_eq!(length.segments, 2);
        // 66 units, then an emoji (2): it opens the second segment.
        let text = format!("{}👍{}", "ж".repeat(66), "ж".repeat(4));
        let length = sms_length(&text);
        assert_eq!((length.units, length.segments), (72, 2));
        let text = format!("{}👍{}", "ж".repeat(66), "ж".repeat(66));
        assert_eq!(sms_length(&text).segments, 3);
    }

    #[test]
    fn accented_latin_outside_the_alphabet_makes_the_body_ucs2() {
        assert_eq!(sms_length("café").encoding, SmsEncoding::Gsm7);
        assert_eq!(sms_length("naïve").encoding, SmsEncoding::Ucs2);
        assert_eq!(sms_length("“quoted”").encoding, SmsEncoding::Ucs2);
    }
}
