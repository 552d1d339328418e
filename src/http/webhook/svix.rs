//! Svix's webhook signatures, as Resend sends its events: `svix-id`, `svix-timestamp` (Unix
//! seconds) and `svix-signature`, a space-separated list of `v1,<base64>` signatures, each an
//! HMAC-SHA256 of `{svix-id}.{svix-timestamp}.{body}` keyed by the base64 secret after
//! `whsec_`.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::Refused;

/// How far a signed timestamp may be from the receiver's clock, either way: 5 minutes, as
/// Svix's own libraries allow.
pub const SVIX_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// A Svix endpoint secret (`whsec_…`).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::http::webhook::svix::SvixSecret;
///
/// // Svix's published example.
/// let secret = SvixSecret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let now = UNIX_EPOCH + Duration::from_secs(1_614_265_330);
/// let verified = secret.verify(
///     "msg_p5jXN8AQM9LWM0D4loKWxJek",
///     "1614265330",
///     br#"{"test": 2432232314}"#,
///     "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
///     now,
/// );
/// assert!(verified.is_ok());
/// # Ok::<(), tower_idempotency::BoxError>(())
/// ```
#[derive(Clone)]
pub struct SvixSecret {
    key: Vec<u8>,
    tolerance: Duration,
}

impl SvixSecret {
    /// The secret as the dashboard shows it, `whsec_` and base64 (the prefix may be left off).
    ///
    /// # Errors
    /// When what follows `whsec_` is not base64, or is empty.
    pub fn new(secret: &str) -> Result<Self, crate::BoxError> {
        let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
        let key = crate::base64::decode(encoded)
            .filter(|key| !key.is_empty())
            .ok_or("a Svix secret is `whsec_` and base64")?;
        Ok(Self {
            key,
            tolerance: SVIX_TOLERANCE,
        })
    }

    /// Accepts timestamps within `tolerance` of the clock (default [`SVIX_TOLERANCE`]).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Checks `signatures` (the `svix-signature` header) over `id`, `timestamp` and `body`,
    /// as of `now`. Every `v1` signature in the list is tried; one match is enough (Svix lists
    /// several while a secret is rotated).
    ///
    /// # Errors
    /// [`Refused::StaleTimestamp`] for a timestamp outside the tolerance (checked first, and
    /// so also for a good signature: a replayed request), [`Refused::BadSignature`] when no
    /// signature matches.
    pub fn verify(
        &self,
        id: &str,
        timestamp: &str,
        body: &[u8],
        signatures: &str,
        now: SystemTime,
    ) -> Result<(), Refused> {
        let seconds: u64 = timestamp
            .trim()
            .parse()
            .map_err(|_| Refused::BadSignature)?;
        let signed_at = UNIX_EPOCH + Duration::from_secs(seconds);
        let skew = match now.duration_since(signed_at) {
            Ok(behind) => behind,
            Err(ahead) => ahead.duration(),
        };
        if skew > self.tolerance {
            return Err(Refused::StaleTimestamp);
        }
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).map_err(|_| Refused::BadSignature)?;
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        for signature in signatures.split_whitespace() {
            let Some(encoded) = signature.strip_prefix("v1,") else {
                continue;
            };
            let Some(bytes) = crate::base64::decode(encoded) else {
                continue;
            };
            // `verify_slice` compares in constant time.
            if mac.clone().verify_slice(&bytes).is_ok() {
                return Ok(());
            }
        }
        Err(Refused::BadSignature)
    }
}

impl fmt::Debug for SvixSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SvixSecret")
            .field("key", &"<redacted>")
            .field("tolerance", &self.tolerance)
            .finish()
    }
}
