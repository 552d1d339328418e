//! Twilio's published request rules for `CreateMessage`, as the fake provider enforces them:
//! the OpenAPI description (github.com/twilio/twilio-oai, `spec/yaml/twilio_api_v2010.yaml`):
//! `POST /2010-04-01/Accounts/{AccountSid}/Messages.json`, `AccountSid` `^AC[0-9a-fA-F]{32}$`,
//! HTTP Basic authentication, an `application/x-www-form-urlencoded` body whose `To` is
//! required, `From` (a number, a short code or an alphanumeric id) or `MessagingServiceSid`
//! (`^MG[0-9a-fA-F]{32}$`) names the sender, `Body` is at most 1,600 characters as Twilio
//! counts them (GSM-7 septets, or UTF-16 code units for a UCS-2 body: error 21617), and
//! `SendAt` goes with `ScheduleType=fixed` and a messaging service, 15 minutes to 35 days
//! after the request arrives (error 35114). A refusal is answered as Twilio answers it: 400
//! with `code`, `message`, `more_info` and `status`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use tower_idempotency::http::twilio::sms_length;

use super::{FakeProvider, Recorded, Reply, Script};

/// The parameters of `CreateMessageRequest` the fake knows; any other is refused, so the
/// codec cannot send a misspelt one unnoticed.
const KNOWN: &[&str] = &[
    "To",
    "From",
    "MessagingServiceSid",
    "Body",
    "SendAt",
    "ScheduleType",
    "StatusCallback",
    "ValidityPeriod",
    "MediaUrl",
    "ContentSid",
];

/// A fake Twilio that enforces [`schema`] and answers valid requests by `script`.
pub async fn provider(script: impl Into<Script>) -> FakeProvider {
    FakeProvider::enforcing(schema, script).await
}

/// Twilio's `201 Created` for message `n`.
pub fn created(n: usize) -> Reply {
    Reply::json(
        201,
        format!(r#"{{"sid":"SM{n:032x}","status":"queued","direction":"outbound-api"}}"#),
    )
}

/// Twilio's error answer.
pub fn error(status: u16, code: u32, message: &str) -> Reply {
    let body = serde_json::json!({
        "code": code,
        "message": message,
        "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
        "status": status,
    });
    Reply::json(status, body.to_string())
}

/// The schema of `CreateMessage`.
pub fn schema(request: &Recorded) -> Result<(), (Reply, String)> {
    check(request).map_err(|(code, why)| (error(400, code, &why), why))
}

fn check(request: &Recorded) -> Result<(), (u32, String)> {
    let bad = |why: String| Err((21_000, why));
    if request.method != http::Method::POST {
        return bad(format!("method {} is not POST", request.method));
    }
    let path = request.uri.path();
    let Some(sid) = path
        .strip_prefix("/2010-04-01/Accounts/")
        .and_then(|rest| rest.strip_suffix("/Messages.json"))
    else {
        return bad(format!("no such resource: {path}"));
    };
    if !sid_like(sid, "AC") {
        return bad(format!("AccountSid {sid:?} is not AC and 32 hex digits"));
    }
    if !request
        .header("authorization")
        .is_some_and(|a| a.starts_with("Basic ") && a.len() > 6)
    {
        return Err((20_003, "no HTTP Basic authentication".into()));
    }
    if request.header("content-type") != Some("application/x-www-form-urlencoded") {
        return bad("the body is not form-encoded".into());
    }
    let form = decode_form(&request.body).ok_or((21_000, "the body is not a form".to_string()))?;
    if let Some(name) = form.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return bad(format!("unknown parameter {name}"));
    }
    let to = form
        .get("To")
        .ok_or((21_604, "`To` is required".to_string()))?;
    if !is_e164(to) {
        return Err((21_211, format!("`To` {to:?} is not a valid phone number")));
    }
    match (form.get("From"), form.get("MessagingServiceSid")) {
        (None, None) => return Err((21_603, "`From` or `MessagingServiceSid` is required".into())),
        (_, Some(mg)) if !sid_like(mg, "MG") => {
            return bad(format!("MessagingServiceSid {mg:?} is malformed"));
        }
        (Some(from), _) if !(is_e164(from) || is_short_code(from) || is_sender_id(from)) => {
            return Err((21_212, format!("`From` {from:?} is not a valid sender")));
        }
        _ => {}
    }
    match form.get("Body") {
        None if !form.contains_key("MediaUrl") && !form.contains_key("ContentSid") => {
            return Err((21_602, "`Body` is required".into()));
        }
        Some(body) if sms_length(body).units > 1600 => {
            return Err((21_617, "`Body` exceeds 1600 characters".into()));
        }
        _ => {}
    }
    if let Some(send_at) = form.get("SendAt") {
        if form.get("ScheduleType").map(String::as_str) != Some("fixed")
            || !form.contains_key("MessagingServiceSid")
        {
            return bad("`SendAt` needs ScheduleType=fixed and a MessagingServiceSid".into());
        }
        let at = parse_rfc3339(send_at).ok_or((35_114, format!("SendAt {send_at:?}")))?;
        let now = epoch_seconds(SystemTime::now());
        if at < now + 15 * 60 || at > now + 35 * 86_400 {
            return Err((
                35_114,
                format!("SendAt {send_at} is not 15 minutes to 35 days ahead"),
            ));
        }
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ` as seconds since 1970 (Howard Hinnant's `days_from_civil`).
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let n = |range: std::ops::Range<usize>| text.get(range)?.parse::<u64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, min, s) = (n(11..13)?, n(14..16)?, n(17..19)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + h * 3600 + min * 60 + s)
}

/// Seconds since 1970 of `at`.
pub fn epoch_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn sid_like(sid: &str, prefix: &str) -> bool {
    sid.strip_prefix(prefix)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn is_e164(number: &str) -> bool {
    number.strip_prefix('+').is_some_and(|d| {
        (1..=15).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) && !d.starts_with('0')
    })
}

fn is_short_code(code: &str) -> bool {
    (5..=6).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_digit())
}

fn is_sender_id(id: &str) -> bool {
    (1..=11).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' ')
        && id.bytes().any(|b| b.is_ascii_alphabetic())
}

/// `application/x-www-form-urlencoded` back to its pairs; `None` for a malformed escape or
/// text that is not UTF-8.
pub fn decode_form(body: &[u8]) -> Option<BTreeMap<String, String>> {
    let mut pairs = BTreeMap::new();
    for pair in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let mut parts = pair.splitn(2, |&b| b == b'=');
        let name = unescape(parts.next()?)?;
        let value = unescape(parts.next().unwrap_or_default())?;
        pairs.insert(name, value);
    }
    Some(pairs)
}

fn unescape(text: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [*bytes.next()?, *bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}
