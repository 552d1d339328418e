//! AWS Signature Version 4 over an `http::Request<Bytes>`: the signing of AWS's own SDKs
//! (`aws-sigv4`), applied by a codec before [`HttpTransport`](super::HttpTransport) sends the
//! request. Enabled by the `ses` feature.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use bytes::Bytes;

use crate::outcome::{SendError, codes};

/// The AWS credentials a codec signs with, shared by its clones and replaceable while it runs.
///
/// Temporary credentials (an assumed role, a container's or an instance's) expire: read new
/// ones where your AWS SDK's credentials provider gives them, and hand them over with
/// [`replace`](Self::replace); every request signed after it uses them.
///
/// ```
/// use aws_credential_types::Credentials;
/// use tower_idempotency::http::ses::{SesCodec, SesCredentials};
///
/// let credentials = SesCredentials::new(Credentials::new("AKIDEXAMPLE", "secret", None, None, "static"));
/// let codec = SesCodec::new("eu-west-1", credentials.clone());
/// // Later, from the task that refreshes them:
/// credentials.replace(Credentials::new("AKIDNEW", "new-secret", Some("token".into()), None, "static"));
/// assert!(!format!("{codec:?}").contains("secret"));
/// ```
#[derive(Clone)]
pub struct SesCredentials(Arc<RwLock<Credentials>>);

impl SesCredentials {
    /// Credentials to sign with until [`replace`](Self::replace)d.
    pub fn new(credentials: Credentials) -> Self {
        Self(Arc::new(RwLock::new(credentials)))
    }

    /// Signs every later request with `credentials`.
    pub fn replace(&self, credentials: Credentials) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = credentials;
    }

    fn current(&self) -> Credentials {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl From<Credentials> for SesCredentials {
    fn from(credentials: Credentials) -> Self {
        Self::new(credentials)
    }
}

impl std::fmt::Debug for SesCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `Credentials`' own Debug redacts the secret; the access key id is no secret.
        f.debug_tuple("SesCredentials")
            .field(&self.current().access_key_id())
            .finish()
    }
}

/// Signs `request` in place for `service` in `region` at `time`: adds `x-amz-date`,
/// `x-amz-security-token` (temporary credentials) and `authorization`. Every header already on
/// the request is signed; a header added afterwards is sent unsigned.
pub(crate) fn sign_request(
    request: &mut http::Request<Bytes>,
    credentials: &SesCredentials,
    region: &str,
    service: &str,
    time: SystemTime,
) -> Result<(), SendError> {
    let refused = |why: &str, e: Option<Box<dyn std::error::Error + Send + Sync>>| {
        let error = SendError::validation(
            codes::INVALID_REQUEST,
            format!("the request cannot be signed ({why}); not sent"),
        );
        match e {
            Some(e) => error.with_source(e),
            None => error,
        }
    };
    let identity = credentials.current().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| refused("signing parameters", Some(e.into())))?
        .into();
    let uri = request.uri().to_string();
    let mut headers = Vec::with_capacity(request.headers().len());
    for (name, value) in request.headers() {
        let value = value
            .to_str()
            .map_err(|e| refused("a header that is not visible ASCII", Some(e.into())))?;
        headers.push((name.as_str(), value));
    }
    let signable = SignableRequest::new(
        request.method().as_str(),
        &uri,
        headers.into_iter(),
        SignableBody::Bytes(request.body()),
    )
    .map_err(|e| refused("the URI or a header", Some(e.into())))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| refused("aws-sigv4 refused it", Some(e.into())))?
        .into_parts();
    instructions.apply_to_request_http1x(request);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    // AWS's published SigV4 example (the "get-vanilla" case of the signature test suite):
    // GET / on example.amazonaws.com, service "service", us-east-1, 2015-08-30T12:36:00Z.
    #[test]
    fn signs_the_vanilla_request_of_the_aws_test_suite() {
        let credentials = SesCredentials::new(Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "static",
        ));
        let mut request = http::Request::get("https://example.amazonaws.com/")
            .body(Bytes::new())
            .unwrap();
        let time = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        sign_request(&mut request, &credentials, "us-east-1", "service", time).unwrap();
        let authorization = request.headers()["authorization"].to_str().unwrap();
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, \
             Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        assert_eq!(request.headers()["x-amz-date"], "20150830T123600Z");
    }
}
