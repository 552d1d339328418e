//! The providers' webhook requests, signed as each documents it, written here from the
//! documentation (not from the receivers' code): Svix's for Resend (HMAC-SHA256 over
//! `{id}.{timestamp}.{body}`, keyed by the base64 secret after `whsec_`, sent as `v1,<base64>`),
//! Twilio's (HMAC-SHA1 over the URL and the sorted form parameters, keyed by the auth token),
//! Postmark's Basic credentials.

use std::time::{SystemTime, UNIX_EPOCH};

use base64_engine::{decode, encode};
use hmac::{Hmac, Mac};

/// Svix's published example secret.
pub const SVIX_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A Resend event as Svix delivers it, signed at `at` (Unix seconds) under `id`.
pub fn svix_request(id: &str, at: u64, body: &str, secret: &str) -> http::Request<String> {
    let key = decode(secret.strip_prefix("whsec_").unwrap());
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{at}.{body}").as_bytes());
    let signature = encode(&mac.finalize().into_bytes());
    http::Request::post("/webhooks/resend")
        .header("content-type", "application/json")
        .header("svix-id", id)
        .header("svix-timestamp", at.to_string())
        .header("svix-signature", format!("v1,{signature}"))
        .body(body.to_owned())
        .unwrap()
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A Twilio status callback to `origin` + `path_and_query`, signed with `auth_token`.
pub fn twilio_request(
    origin: &str,
    path_and_query: &str,
    params: &[(&str, &str)],
    auth_token: &str,
) -> http::Request<String> {
    let mut sorted = params.to_vec();
    sorted.sort();
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(auth_token.as_bytes()).unwrap();
    mac.update(format!("{origin}{path_and_query}").as_bytes());
    for (name, value) in &sorted {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
    let signature = encode(&mac.finalize().into_bytes());
    let body: Vec<String> = params
        .iter()
        .map(|(n, v)| format!("{n}={}", v.replace('+', "%2B")))
        .collect();
    http::Request::post(path_and_query)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-twilio-signature", signature)
        .body(body.join("&"))
        .unwrap()
}

/// A Postmark event with Basic credentials `user:password`.
pub fn postmark_request(user: &str, password: &str, body: &str) -> http::Request<String> {
    http::Request::post("/webhooks/postmark")
        .header("content-type", "application/json")
        .header(
            "authorization",
            format!("Basic {}", encode(format!("{user}:{password}").as_bytes())),
        )
        .body(body.to_owned())
        .unwrap()
}

/// Standard base64 with padding, written out so the fakes share no code with the receivers.
pub mod base64_engine {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(text: &str) -> Vec<u8> {
        let mut bits = 0u32;
        let mut count = 0;
        let mut out = Vec::new();
        for c in text.bytes().filter(|c| *c != b'=') {
            let v = ALPHABET.iter().position(|a| *a == c).unwrap() as u32;
            bits = bits << 6 | v;
            count += 6;
            if count >= 8 {
                count -= 8;
                out.push((bits >> count) as u8);
            }
        }
        out
    }

    #[test]
    fn round_trips() {
        assert_eq!(encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(encode(b"fo"), "Zm8=");
        assert_eq!(decode("Zm8="), b"fo");
    }
}
