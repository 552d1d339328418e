//! What every codec writes the same way: the endpoint under a base URL, the `Authorization`
//! header, RFC 3339 times, form bodies, and the validation error of a message a provider's
//! documented limits refuse.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::uri::{PathAndQuery, Uri};
use http::{HeaderValue, Method};

use crate::outcome::SendError;
use crate::outcome::codes;

/// The `User-Agent` of every codec's requests.
const AGENT: &str = concat!("tower-idempotency/", env!("CARGO_PKG_VERSION"));

/// A validation error, code [`provider.invalid_request`](codes::INVALID_REQUEST): `message`
/// breaks one of `provider`'s documented limits, and was not sent.
pub(crate) fn refused(provider: &str, why: impl std::fmt::Display) -> SendError {
    SendError::validation(
        codes::INVALID_REQUEST,
        format!("{provider} would refuse this message: {why}; not sent"),
    )
}

/// `path` under `base`: the base's path with its trailing `/` trimmed, then `path`, and the
/// base's query (if any) after both, so `https://proxy.example/resend?tenant=7` and `/emails`
/// give `https://proxy.example/resend/emails?tenant=7`.
pub(crate) fn endpoint(base: &Uri, path: &str, provider: &str) -> Result<Uri, SendError> {
    let not_absolute = || {
        SendError::validation(
            codes::INVALID_REQUEST,
            format!("the {provider} base URL is not an absolute http(s) URL"),
        )
    };
    let (Some(scheme), Some(authority)) = (base.scheme(), base.authority()) else {
        return Err(not_absolute());
    };
    let joined = match base.query() {
        Some(query) => format!("{}{path}?{query}", base.path().trim_end_matches('/')),
        None => format!("{}{path}", base.path().trim_end_matches('/')),
    };
    let path_and_query = joined.parse::<PathAndQuery>().map_err(|_| not_absolute())?;
    Uri::builder()
        .scheme(scheme.clone())
        .authority(authority.clone())
        .path_and_query(path_and_query)
        .build()
        .map_err(|_| not_absolute())
}

/// A `POST` of `body` to `uri`, with `authorization` (kept out of logs) under `auth_header`.
pub(crate) fn post(
    uri: Uri,
    auth_header: http::HeaderName,
    authorization: &str,
    content_type: &'static str,
    body: Vec<u8>,
    provider: &str,
) -> Result<http::Request<Bytes>, SendError> {
    let mut credential = HeaderValue::from_str(authorization).map_err(|e| {
        SendError::validation(
            codes::INVALID_REQUEST,
            format!("the {provider} credential cannot be sent as an HTTP header"),
        )
        .with_source(e)
    })?;
    credential.set_sensitive(true);
    http::Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(auth_header, credential)
        .header(CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, "application/json")
        .header(USER_AGENT, AGENT)
        .body(Bytes::from(body))
        .map_err(|e| {
            SendError::validation(
                codes::INVALID_REQUEST,
                format!("the {provider} request cannot be built"),
            )
            .with_source(e)
        })
}

/// A JSON `POST` with `Authorization: <authorization>`.
pub(crate) fn post_json(
    uri: Uri,
    authorization: &str,
    body: &impl serde::Serialize,
    provider: &str,
) -> Result<http::Request<Bytes>, SendError> {
    let body = serde_json::to_vec(body).map_err(|e| {
        SendError::validation(
            codes::INVALID_REQUEST,
            "the message cannot be encoded as JSON",
        )
        .with_source(e)
    })?;
    post(
        uri,
        AUTHORIZATION,
        authorization,
        "application/json",
        body,
        provider,
    )
}

/// `pairs` as `application/x-www-form-urlencoded`: bytes other than ASCII letters, digits and
/// `*-._` percent-encoded, spaces as `+`.
pub(crate) fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        form_escape(name, &mut out);
        out.push(b'=');
        form_escape(value, &mut out);
    }
    out
}

fn form_escape(text: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => out.push(b),
            b' ' => out.push(b'+'),
            _ => out.extend([b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]),
        }
    }
}

/// At most 300 characters of a provider's text.
pub(crate) fn truncate(text: &str) -> String {
    text.chars().take(300).collect()
}

/// `at` as RFC 3339 in UTC with whole seconds (`2025-03-01T09:30:00Z`); `None` before 1970
/// (no provider schedules into the past) or past year 9999, which RFC 3339 cannot write.
pub(crate) fn rfc3339(at: SystemTime) -> Option<String> {
    let secs = at.duration_since(UNIX_EPOCH).ok()?.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    if year > 9999 {
        return None;
    }
    let time = secs % 86_400;
    Some(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        time / 3600,
        time % 3600 / 60,
        time % 60
    ))
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`,
/// for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rfc3339_formats_utc_dates_with_leap_days() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(rfc3339(at(0)).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(784_111_777)).unwrap(), "1994-11-06T08:49:37Z");
        assert_eq!(rfc3339(at(951_782_400)).unwrap(), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(1_709_210_096)).unwrap(), "2024-02-29T12:34:56Z");
        assert_eq!(rfc3339(at(4_102_444_800)).unwrap(), "2100-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH - Duration::from_secs(1)), None);
        assert_eq!(
            rfc3339(at(253_402_300_799)).unwrap(),
            "9999-12-31T23:59:59Z"
        );
        assert_eq!(rfc3339(at(253_402_300_800)), None);
        // Cross-check a day a week for 200 years against httpdate's IMF-fixdate.
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        for day in (0..73_000).step_by(7) {
            let t = at(day * 86_400 + 3_723);
            let imf = httpdate::fmt_http_date(t); // "Sun, 06 Nov 1994 01:02:03 GMT"
            let parts: Vec<&str> = imf.split_whitespace().collect();
            let month = MONTHS.iter().position(|m| *m == parts[2]).unwrap() + 1;
            let expected = format!("{}-{month:02}-{}T{}Z", parts[3], parts[1], parts[4]);
            assert_eq!(rfc3339(t).unwrap(), expected);
        }
    }

    #[test]
    fn endpoints_keep_the_base_path_and_query() {
        let join =
            |base: &str, path| endpoint(&base.parse().unwrap(), path, "p").map(|u| u.to_string());
        assert_eq!(
            join("https://api.resend.com", "/emails").unwrap(),
            "https://api.resend.com/emails"
        );
        assert_eq!(
            join("http://127.0.0.1:8080/", "/emails/batch").unwrap(),
            "http://127.0.0.1:8080/emails/batch"
        );
        assert_eq!(
            join("https://proxy.example/resend/?tenant=7&x=a%20b", "/emails").unwrap(),
            "https://proxy.example/resend/emails?tenant=7&x=a%20b"
        );
        assert!(join("/relative", "/emails").is_err());
    }

    #[test]
    fn forms_escape_everything_but_unreserved_bytes() {
        let body = form(&[("To", "+15558675310"), ("Body", "Héllo & bye=1")]);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "To=%2B15558675310&Body=H%C3%A9llo+%26+bye%3D1"
        );
    }
}
