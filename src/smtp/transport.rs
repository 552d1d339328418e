//! [`SmtpTransport`]: its configuration, and one send as the steps of an SMTP session.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use lettre::Address;
use lettre::address::Envelope as SmtpEnvelope;
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use tower_service::Service;

use super::reply::{Step, judge, timed_out};
use crate::message::{Channel, Message, RawMessage};
use crate::mime::{build, message_id_for_key};
use crate::outcome::{Receipt, SendError, codes};

/// The transport name in receipts from [`SmtpTransport`].
pub const SMTP: &str = "smtp";

/// The default bound on each step of a session (connect, each command, the message).
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// How the connection to the server is encrypted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encryption {
    /// TLS from the first byte (SMTPS, port 465).
    Implicit,
    /// `STARTTLS` after the greeting, required: a server that does not offer it is not sent
    /// to (submission, port 587).
    StartTls,
    /// None: a relay on loopback or a trusted network only.
    None,
}

#[derive(Clone)]
struct Config {
    host: String,
    port: u16,
    encryption: Encryption,
    tls: Option<TlsParameters>,
    credentials: Option<Credentials>,
    hello: ClientId,
    step_timeout: Duration,
}

/// An SMTP client as a `Service<Message>` and a `Service<RawMessage>`: one SMTP session per
/// send, whose errors say whether the server can have taken the message (see the
/// [module docs](super)).
///
/// ```
/// use tower_idempotency::smtp::SmtpTransport;
///
/// let smtp = SmtpTransport::starttls_relay("smtp.example.com")
///     .credentials("user", "password")
///     .port(2587);
/// assert!(!format!("{smtp:?}").contains("password"));
/// ```
#[derive(Clone)]
pub struct SmtpTransport {
    config: Arc<Config>,
}

impl SmtpTransport {
    fn with(host: impl Into<String>, port: u16, encryption: Encryption) -> Self {
        Self {
            config: Arc::new(Config {
                host: host.into(),
                port,
                encryption,
                tls: None,
                credentials: None,
                hello: ClientId::default(),
                step_timeout: DEFAULT_STEP_TIMEOUT,
            }),
        }
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// A relay at `host` over implicit TLS, port 465, its certificate checked against the
    /// webpki roots.
    pub fn relay(host: impl Into<String>) -> Self {
        Self::with(host, 465, Encryption::Implicit)
    }

    /// A relay at `host` on port 587, `STARTTLS` required.
    pub fn starttls_relay(host: impl Into<String>) -> Self {
        Self::with(host, 587, Encryption::StartTls)
    }

    /// A relay at `host` on port 25 without encryption: for a relay on loopback or a trusted
    /// network only (a local MTA, a test server).
    pub fn unencrypted(host: impl Into<String>) -> Self {
        Self::with(host, 25, Encryption::None)
    }

    /// Connects to `port` instead of the default of the encryption.
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.config_mut().port = port;
        self
    }

    /// Logs in with `user` and `password` (`AUTH PLAIN` or `LOGIN`, whichever the server
    /// offers) after TLS.
    #[must_use]
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.config_mut().credentials = Some(Credentials::new(user.into(), password.into()));
        self
    }

    /// TLS with these parameters (another root store, a client certificate) instead of the
    /// webpki roots for the host.
    #[must_use]
    pub fn tls_parameters(mut self, tls: TlsParameters) -> Self {
        self.config_mut().tls = Some(tls);
        self
    }

    /// Says `name` in `EHLO` instead of `localhost`.
    #[must_use]
    pub fn hello_name(mut self, name: impl Into<String>) -> Self {
        self.config_mut().hello = ClientId::Domain(name.into());
        self
    }

    /// Bounds each step of a session (default [`DEFAULT_STEP_TIMEOUT`]): a step before the
    /// body that overruns it is not sent, and retryable; the body's overrun is of unknown
    /// delivery.
    #[must_use]
    pub fn step_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().step_timeout = timeout;
        self
    }

    /// The server's host and port.
    pub fn server(&self) -> (&str, u16) {
        (&self.config.host, self.config.port)
    }
}

impl fmt::Debug for SmtpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmtpTransport")
            .field("host", &self.config.host)
            .field("port", &self.config.port)
            .field("encryption", &self.config.encryption)
            .field(
                "credentials",
                &self.config.credentials.as_ref().map(|_| "<redacted>"),
            )
            .field("step_timeout", &self.config.step_timeout)
            .finish_non_exhaustive()
    }
}

/// The future of a send through [`SmtpTransport`].
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<Receipt, SendError>> + Send>>,
}

impl Future for ResponseFuture {
    type Output = Result<Receipt, SendError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

fn refused(why: impl fmt::Display) -> SendError {
    SendError::validation(
        codes::INVALID_REQUEST,
        format!("SMTP cannot send this message: {why}; not sent"),
    )
}

/// A message sent over SMTP: its `Message-ID` derived from the stored key (when it has none
/// of its own), the receipt's id that `Message-ID` without its angle brackets.
impl Service<Message> for SmtpTransport {
    type Response = Receipt;
    type Error = SendError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> ResponseFuture {
        let config = Arc::clone(&self.config);
        ResponseFuture {
            inner: Box::pin(async move {
                if message.channel() != Channel::Email {
                    return Err(refused("it is an SMS"));
                }
                if message.send_at().is_some() {
                    return Err(refused(
                        "SMTP sends at once and takes no schedule (send_at)",
                    ));
                }
                let id = message
                    .provider_key()
                    .map(|key| message_id_for_key(key, message.from()));
                let built = build(&message, id, "SMTP")?;
                let message_id = built
                    .headers()
                    .get_raw("Message-ID")
                    .map(|id| {
                        id.trim()
                            .trim_start_matches('<')
                            .trim_end_matches('>')
                            .to_owned()
                    })
                    .unwrap_or_default();
                session(&config, built.envelope(), &built.formatted()).await?;
                Ok(Receipt::new(message_id, SMTP).with_accepted(message.recipients()))
            }),
        }
    }
}

/// A raw message sent over SMTP as it is, to its envelope; the receipt's id is the server's
/// answer to the message (`2.0.0 Ok: queued as …`).
impl Service<RawMessage> for SmtpTransport {
    type Response = Receipt;
    type Error = SendError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, raw: RawMessage) -> ResponseFuture {
        let config = Arc::clone(&self.config);
        ResponseFuture {
            inner: Box::pin(async move {
                let address = |a: &str| {
                    a.parse::<Address>().map_err(|e| {
                        refused(format_args!("an envelope address lettre refuses ({e})"))
                    })
                };
                let to = raw
                    .envelope()
                    .to()
                    .iter()
                    .map(|a| address(a))
                    .collect::<Result<Vec<_>, _>>()?;
                let envelope = SmtpEnvelope::new(Some(address(raw.envelope().from())?), to)
                    .map_err(|e| refused(format_args!("an envelope lettre refuses ({e})")))?;
                let answer = session(&config, &envelope, raw.bytes()).await?;
                let id: String = answer.chars().take(200).collect();
                Ok(Receipt::new(id, SMTP).with_accepted(raw.envelope().to().iter().cloned()))
            }),
        }
    }
}

/// `step` bounded by the configured timeout.
async fn bounded<T>(
    config: &Config,
    step: Step,
    future: impl Future<Output = Result<T, lettre::transport::smtp::Error>>,
) -> Result<T, SendError> {
    match tokio::time::timeout(config.step_timeout, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(judge(error, step)),
        Err(_) => Err(timed_out(step)),
    }
}

fn tls_parameters(config: &Config) -> Result<TlsParameters, SendError> {
    match &config.tls {
        Some(tls) => Ok(tls.clone()),
        None => TlsParameters::new(config.host.clone()).map_err(|e| {
            SendError::permanent(
                codes::REJECTED,
                "TLS cannot be set up for the SMTP host; not sent",
            )
            .with_source(e)
        }),
    }
}

/// One SMTP session: connect, TLS, AUTH, `MAIL FROM`, `RCPT TO` each, `DATA`, the message.
/// Answers the server's reply to the message; every failure is judged by its [`Step`].
async fn session(
    config: &Config,
    envelope: &SmtpEnvelope,
    body: &[u8],
) -> Result<String, SendError> {
    let implicit = match config.encryption {
        Encryption::Implicit => Some(tls_parameters(config)?),
        Encryption::StartTls | Encryption::None => None,
    };
    let server = (config.host.as_str(), config.port);
    let mut connection = bounded(
        config,
        Step::Envelope,
        AsyncSmtpConnection::connect_tokio1(
            server,
            Some(config.step_timeout),
            &config.hello,
            implicit,
            None,
        ),
    )
    .await?;
    let answer = transaction(config, &mut connection, envelope, body).await;
    if answer.is_ok() {
        // The message is taken; a failed QUIT changes nothing.
        let _ = tokio::time::timeout(config.step_timeout, connection.quit()).await;
    } else {
        let _ = tokio::time::timeout(config.step_timeout, connection.abort()).await;
    }
    answer
}

async fn transaction(
    config: &Config,
    connection: &mut AsyncSmtpConnection,
    envelope: &SmtpEnvelope,
    body: &[u8],
) -> Result<String, SendError> {
    if config.encryption == Encryption::StartTls {
        let tls = tls_parameters(config)?;
        bounded(
            config,
            Step::Envelope,
            connection.starttls(tls, &config.hello),
        )
        .await?;
    }
    if let Some(credentials) = &config.credentials {
        bounded(
            config,
            Step::Envelope,
            connection.auth(DEFAULT_MECHANISMS, credentials),
        )
        .await?;
    }
    let mut options = Vec::new();
    let non_ascii = |a: &Address| !AsRef::<str>::as_ref(a).is_ascii();
    if envelope.from().is_some_and(non_ascii) || envelope.to().iter().any(non_ascii) {
        if !connection
            .server_info()
            .supports_feature(Extension::SmtpUtfEight)
        {
            return Err(refused(
                "its addresses are not ASCII and the server does not take SMTPUTF8",
            ));
        }
        options.push(MailParameter::SmtpUtfEight);
    }
    if !body.is_ascii() {
        if !connection
            .server_info()
            .supports_feature(Extension::EightBitMime)
        {
            return Err(refused(
                "it is not 7-bit and the server does not take 8BITMIME",
            ));
        }
        options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    bounded(
        config,
        Step::Envelope,
        connection.command(Mail::new(envelope.from().cloned(), options)),
    )
    .await?;
    for to in envelope.to() {
        bounded(
            config,
            Step::Envelope,
            connection.command(Rcpt::new(to.clone(), Vec::new())),
        )
        .await?;
    }
    bounded(config, Step::Envelope, connection.command(Data)).await?;
    // lettre writes the body and the final `.` in one call: a connection lost while the body
    // is written cannot be told from one lost after the `.`, and both keep the key.
    let reply = bounded(config, Step::Body, connection.message(body)).await?;
    Ok(reply.message().collect::<Vec<_>>().join(" "))
}
