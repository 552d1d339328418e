//! Postmark's published request rules for `POST /email` and `POST /email/batch`, as the fake
//! provider enforces them: the email API reference (postmarkapp.com/developer/api/email-api:
//! `X-Postmark-Server-Token`, `From` and `To` required, `To`/`Cc`/`Bcc` comma-separated,
//! `TextBody` or `HtmlBody`, `Headers` as `[{Name, Value}]`, `TrackLinks` one of four values),
//! what error 300 covers (postmarkapp.com/support/article/1180: at most 50 recipients across
//! `To`, `Cc` and `Bcc`, a body that is not empty), the metadata FAQ (article 1125: no two
//! keys differing only by case), the batch guide (at most 500 messages, 50 MB) and the error
//! codes. A refusal is answered as Postmark answers it: 422 with `ErrorCode` and
//! `Message` (401 with `ErrorCode` 10 for a missing token).

use serde_json::Value;

use super::{FakeProvider, Recorded, Reply, Script};

/// The fields of Postmark's email object.
const KNOWN: &[&str] = &[
    "From",
    "To",
    "Cc",
    "Bcc",
    "Subject",
    "Tag",
    "HtmlBody",
    "TextBody",
    "ReplyTo",
    "Headers",
    "TrackOpens",
    "TrackLinks",
    "Metadata",
    "Attachments",
    "MessageStream",
];

/// A fake Postmark that enforces [`schema`] and answers valid requests by `script`.
pub async fn provider(script: impl Into<Script>) -> FakeProvider {
    FakeProvider::enforcing(schema, script).await
}

/// Postmark's answer to `/email`: message id `pm-<n>`.
pub fn sent(n: usize) -> Reply {
    Reply::json(200, result(0, n).to_string())
}

/// One result of a batch answer: `ErrorCode` 0 with id `pm-<n>`, or the error `code`.
pub fn result(code: i64, n: usize) -> Value {
    if code == 0 {
        serde_json::json!({
            "To": "someone@example.com",
            "SubmittedAt": "2026-11-30T10:00:00.0000000-05:00",
            "MessageID": format!("pm-{n}"),
            "ErrorCode": 0,
            "Message": "OK",
        })
    } else {
        serde_json::json!({ "ErrorCode": code, "Message": format!("documented error {code}") })
    }
}

/// Postmark's answer to `/email/batch`: one result per message.
pub fn batch(results: &[Value]) -> Reply {
    Reply::json(200, Value::Array(results.to_vec()).to_string())
}

/// Postmark's error answer.
pub fn error(status: u16, code: i64) -> Reply {
    let body =
        serde_json::json!({ "ErrorCode": code, "Message": format!("documented error {code}") });
    Reply::json(status, body.to_string())
}

/// The schema of `POST /email` and `POST /email/batch`.
pub fn schema(request: &Recorded) -> Result<(), (Reply, String)> {
    check(request).map_err(|(status, code, why)| {
        let body = serde_json::json!({ "ErrorCode": code, "Message": why });
        (Reply::json(status, body.to_string()), why)
    })
}

fn check(request: &Recorded) -> Result<(), (u16, i64, String)> {
    let invalid = |why: String| Err((422, 300, why));
    if request.method != http::Method::POST {
        return invalid(format!("method {} is not POST", request.method));
    }
    if request
        .header("x-postmark-server-token")
        .is_none_or(str::is_empty)
    {
        return Err((401, 10, "no X-Postmark-Server-Token".into()));
    }
    if request.header("content-type") != Some("application/json")
        || request.header("accept") != Some("application/json")
    {
        return Err((422, 409, "JSON required (Content-Type and Accept)".into()));
    }
    let body: Value = serde_json::from_slice(&request.body)
        .map_err(|e| (422, 402, format!("invalid JSON: {e}")))?;
    let path = request.uri.path();
    if path.ends_with("/email/batch") {
        if request.body.len() > 50_000_000 {
            return invalid("a batch over 50 MB".into());
        }
        let emails = body
            .as_array()
            .ok_or((422, 403, "a batch is not an array".to_string()))?;
        if emails.len() > 500 {
            return Err((422, 410, format!("{} messages in a batch", emails.len())));
        }
        emails
            .iter()
            .try_for_each(|e| email(e).map_err(|why| (422, 300, why)))
    } else if path.ends_with("/email") {
        if request.body.len() > 10_000_000 {
            return invalid("a message over 10 MB".into());
        }
        email(&body).map_err(|why| (422, 300, why))
    } else {
        invalid(format!("no such endpoint: {path}"))
    }
}

fn email(email: &Value) -> Result<(), String> {
    let email = email.as_object().ok_or("an email is not an object")?;
    if let Some(field) = email.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown field {field}"));
    }
    let text = |field: &str| email.get(field).and_then(Value::as_str);
    if text("From").is_none_or(str::is_empty) {
        return Err("`From` is required".into());
    }
    if text("To").is_none_or(str::is_empty) {
        return Err("`To` is required".into());
    }
    let mut recipients = 0;
    for field in ["To", "Cc", "Bcc"] {
        if let Some(list) = email.get(field) {
            let list = list.as_str().ok_or(format!("`{field}` is not a string"))?;
            recipients += addresses(list);
        }
    }
    if recipients > 50 {
        return Err(format!(
            "{recipients} recipients across To, Cc and Bcc, more than 50"
        ));
    }
    if text("TextBody").is_none_or(str::is_empty) && text("HtmlBody").is_none_or(str::is_empty) {
        return Err("`TextBody` or `HtmlBody` is required, and not empty".into());
    }
    if let Some(headers) = email.get("Headers") {
        let headers = headers.as_array().ok_or("`Headers` is not an array")?;
        for h in headers {
            if h.get("Name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
                || h.get("Value").and_then(Value::as_str).is_none()
            {
                return Err("a header is not {Name, Value}".into());
            }
        }
    }
    if let Some(links) = email.get("TrackLinks") {
        let ok = ["None", "HtmlAndText", "HtmlOnly", "TextOnly"]
            .iter()
            .any(|v| links.as_str() == Some(v));
        if !ok {
            return Err(format!("TrackLinks {links} is not a documented value"));
        }
    }
    if email.get("TrackOpens").is_some_and(|v| !v.is_boolean()) {
        return Err("TrackOpens is not a boolean".into());
    }
    if let Some(metadata) = email.get("Metadata") {
        let metadata = metadata.as_object().ok_or("`Metadata` is not an object")?;
        if !metadata.values().all(Value::is_string) {
            return Err("a metadata value is not a string".into());
        }
        let mut keys: Vec<String> = metadata.keys().map(|k| k.to_lowercase()).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() != metadata.len() {
            return Err("duplicate metadata keys, the same key with case differences".into());
        }
    }
    if let Some(attachments) = email.get("Attachments") {
        for a in attachments
            .as_array()
            .ok_or("`Attachments` is not an array")?
        {
            for field in ["Name", "Content", "ContentType"] {
                if a.get(field).and_then(Value::as_str).is_none() {
                    return Err(format!("an attachment has no {field}"));
                }
            }
        }
    }
    Ok(())
}

/// The addresses of a comma-separated list; commas inside quotes do not separate.
fn addresses(list: &str) -> usize {
    let mut quoted = false;
    let mut n = 1;
    for c in list.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => n += 1,
            _ => {}
        }
    }
    n
}
