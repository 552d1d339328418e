//! The providers' timestamps, read into `SystemTime`: Resend's `2023-04-03 22:13:42.674981+00`,
//! Postmark's `2014-02-14T11:12:42.6327538-05:00`, Twilio's `Thu, 30 Jul 2015 20:12:31 +0000`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An ISO 8601 / RFC 3339 time, with `T` or a space between date and time, an optional
/// fraction, and `Z`, `±HH`, `±HHMM` or `±HH:MM`; `None` when it is not one.
pub(crate) fn iso8601(text: &str) -> Option<SystemTime> {
    let b = text.trim().as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(r)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &b[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let n = fraction.iter().take_while(|c| c.is_ascii_digit()).count();
        for (i, digit) in fraction[..n].iter().take(9).enumerate() {
            nanos += u32::from(digit - b'0') * 10u32.pow(8 - i as u32);
        }
        rest = &fraction[n..];
    }
    let offset = match rest {
        b"" | b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), tail @ ..] => {
            let digits: Vec<u8> = tail.iter().copied().filter(|c| *c != b':').collect();
            if digits.len() != 2 && digits.len() != 4 || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let hours = i64::from(digits[0] - b'0') * 10 + i64::from(digits[1] - b'0');
            let minutes = if digits.len() == 4 {
                i64::from(digits[2] - b'0') * 10 + i64::from(digits[3] - b'0')
            } else {
                0
            };
            let seconds = hours * 3600 + minutes * 60;
            if *sign == b'+' { seconds } else { -seconds }
        }
        _ => return None,
    };
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// An RFC 2822 date as Twilio writes it (`Thu, 30 Jul 2015 20:12:31 +0000`), or an HTTP date.
pub(crate) fn rfc2822(text: &str) -> Option<SystemTime> {
    let text = text.trim();
    let text = text
        .strip_suffix("+0000")
        .map_or_else(|| text.to_owned(), |t| format!("{t}GMT"));
    httpdate::parse_http_date(&text).ok()
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn reads_each_providers_timestamps() {
        // 2023-04-03 22:13:42 UTC = 1680560022
        let resend = iso8601("2023-04-03 22:13:42.674981+00").unwrap();
        assert_eq!(resend, at(1_680_560_022) + Duration::from_micros(674_981));
        assert_eq!(iso8601("2023-04-03T22:13:42Z"), Some(at(1_680_560_022)));
        assert_eq!(
            iso8601("2023-04-03T17:13:42-05:00"),
            Some(at(1_680_560_022))
        );
        assert_eq!(
            iso8601("2023-04-04T00:13:42.0+0200"),
            Some(at(1_680_560_022))
        );
        for bad in [
            "",
            "yesterday",
            "2023-13-03T22:13:42Z",
            "2023-04-03T22:13:42+5",
            "1969-12-31T00:00:00Z",
        ] {
            assert_eq!(iso8601(bad), None, "{bad:?}");
        }
    }
}
