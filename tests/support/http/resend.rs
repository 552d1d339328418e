//! Resend's published request rules, as the fake provider enforces them: the OpenAPI
//! description (github.com/resend/resend-openapi, `resend.yaml`, info.version 1.5.0:
//! `SendEmailRequest`, `Tag`, `Idempotency-Key` `maxLength: 256`) and the batch page (at most
//! 100 emails, no `attachments`, no `scheduled_at`; strict validation refuses the whole batch).
//! A refusal is answered as Resend answers it: 422 with `name` and `message`.

use serde_json::Value;

use super::{FakeProvider, Recorded, Reply, Script};

/// A fake Resend that enforces [`schema`] and answers valid requests by `script`.
pub async fn provider(script: impl Into<Script>) -> FakeProvider {
    FakeProvider::enforcing(schema, script).await
}

/// A fake Resend that enforces [`schema`] and answers every valid request `reply`.
pub async fn answering(reply: Reply) -> FakeProvider {
    provider(vec![reply]).await
}

/// Resend's answer to a request its schema refuses.
fn refuse(why: String) -> Result<(), (Reply, String)> {
    let body = serde_json::json!({
        "statusCode": 422,
        "name": "validation_error",
        "message": why,
    });
    Err((Reply::json(422, body.to_string()), why))
}

/// The schema of `POST /emails` and `POST /emails/batch`.
pub fn schema(request: &Recorded) -> Result<(), (Reply, String)> {
    match check(request) {
        Ok(()) => Ok(()),
        Err(why) => refuse(why),
    }
}

fn check(request: &Recorded) -> Result<(), String> {
    if request.method != http::Method::POST {
        return Err(format!("method {} is not POST", request.method));
    }
    if !request
        .header("authorization")
        .is_some_and(|a| a.starts_with("Bearer ") && a.len() > 7)
    {
        return Err("no `Authorization: Bearer` header".into());
    }
    if request.header("content-type") != Some("application/json") {
        return Err("the body is not application/json".into());
    }
    if let Some(key) = &request.key
        && !(1..=256).contains(&key.chars().count())
    {
        return Err(format!(
            "Idempotency-Key of {} characters",
            key.chars().count()
        ));
    }
    let body: Value =
        serde_json::from_slice(&request.body).map_err(|e| format!("not JSON: {e}"))?;
    // A base URL may put the API under a prefix (a proxy): the endpoint is the path's end.
    let path = request.uri.path();
    let endpoint = if path.ends_with("/emails/batch") {
        "/emails/batch"
    } else if path.ends_with("/emails") {
        "/emails"
    } else {
        path
    };
    match endpoint {
        "/emails" => email(&body, false),
        "/emails/batch" => {
            let emails = body.as_array().ok_or("a batch is not an array")?;
            if emails.is_empty() || emails.len() > 100 {
                return Err(format!("a batch of {} emails", emails.len()));
            }
            emails.iter().try_for_each(|e| email(e, true))
        }
        other => Err(format!("no such endpoint: {other}")),
    }
}

fn email(email: &Value, in_batch: bool) -> Result<(), String> {
    let email = email.as_object().ok_or("an email is not an object")?;
    for required in ["from", "to", "subject"] {
        if !email.contains_key(required) {
            return Err(format!("`{required}` is required"));
        }
    }
    string(email.get("from"), "from")?;
    string(email.get("subject"), "subject")?;
    match &email["to"] {
        Value::String(_) => {}
        Value::Array(to) if (1..=50).contains(&to.len()) && to.iter().all(Value::is_string) => {}
        _ => return Err("`to` is not a string or 1 to 50 strings".into()),
    }
    for list in ["cc", "bcc", "reply_to"] {
        match email.get(list) {
            None | Some(Value::String(_)) => {}
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {}
            _ => return Err(format!("`{list}` is not a string or strings")),
        }
    }
    for text in ["html", "text"] {
        if email.contains_key(text) {
            string(email.get(text), text)?;
        }
    }
    if let Some(headers) = email.get("headers") {
        let headers = headers.as_object().ok_or("`headers` is not an object")?;
        if !headers.values().all(Value::is_string) {
            return Err("a header value is not a string".into());
        }
    }
    if let Some(at) = email.get("scheduled_at") {
        if in_batch {
            return Err("the batch endpoint takes no `scheduled_at`".into());
        }
        let at = at.as_str().ok_or("`scheduled_at` is not a string")?;
        if !is_iso8601(at) {
            return Err(format!("`scheduled_at` {at:?} is not ISO 8601"));
        }
    }
    if let Some(attachments) = email.get("attachments") {
        if in_batch {
            return Err("the batch endpoint takes no `attachments`".into());
        }
        let attachments = attachments
            .as_array()
            .ok_or("`attachments` is not an array")?;
        for a in attachments {
            if a.get("content").and_then(Value::as_str).is_none()
                && a.get("path").and_then(Value::as_str).is_none()
            {
                return Err("an attachment has neither `content` nor `path`".into());
            }
        }
    }
    if let Some(tags) = email.get("tags") {
        for tag in tags.as_array().ok_or("`tags` is not an array")? {
            for part in ["name", "value"] {
                let text = tag.get(part).and_then(Value::as_str).unwrap_or_default();
                let ok = text.len() <= 256
                    && text
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !ok || (part == "name" && text.is_empty()) {
                    return Err(format!("tag {part} {text:?} breaks Resend's charset"));
                }
            }
        }
    }
    Ok(())
}

fn string(value: Option<&Value>, field: &str) -> Result<(), String> {
    match value {
        Some(Value::String(_)) => Ok(()),
        _ => Err(format!("`{field}` is not a string")),
    }
}

/// `YYYY-MM-DDTHH:MM:SS`, optional fraction, then `Z` or `±HH:MM`.
fn is_iso8601(at: &str) -> bool {
    let b = at.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    if b.len() < 20
        || !digits(0..4)
        || b[4] != b'-'
        || !digits(5..7)
        || b[7] != b'-'
        || !digits(8..10)
        || b[10] != b'T'
        || !digits(11..13)
        || b[13] != b':'
        || !digits(14..16)
        || b[16] != b':'
        || !digits(17..19)
    {
        return false;
    }
    let mut rest = &at[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let n = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &fraction[n..];
    }
    rest == "Z"
        || (rest.len() == 6
            && matches!(rest.as_bytes()[0], b'+' | b'-')
            && rest.as_bytes()[3] == b':')
}
