//! A real HTTPS client for the tests of failures before a request leaves: hyper-util's legacy
//! client over a connector that opens a TCP connection and runs a rustls handshake on it, as
//! hyper-rustls does. The handshake verifies against an empty root store, so it cannot
//! succeed against anything; the tests point it at a plain TCP port, where it fails on the
//! server's first bytes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tower::util::MapRequest;
use tower::{Service, ServiceBuilder};
use tower_idempotency::BoxError;

/// A connector for `https` URLs: TCP, then a TLS handshake.
#[derive(Clone)]
pub struct Https(TlsConnector);

impl Https {
    pub fn new() -> Self {
        let provider = tokio_rustls::rustls::crypto::ring::default_provider();
        let config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default versions")
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        Self(TlsConnector::from(Arc::new(config)))
    }
}

/// The TLS stream as a connection hyper-util can pool.
pub struct Tls(TlsStream<TcpStream>);

impl Connection for Tls {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Tls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Service<http::Uri> for Https {
    type Response = TokioIo<Tls>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connector = self.0.clone();
        Box::pin(async move {
            let host = uri.host().ok_or("no host")?.to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let name = ServerName::try_from(host)?;
            let tls = connector.connect(name, tcp).await?;
            Ok(TokioIo::new(Tls(tls)))
        })
    }
}

/// hyper-util's legacy client over [`Https`], with the codec's bytes wrapped in `Full`.
pub type HttpsClient =
    MapRequest<Client<Https, Full<Bytes>>, fn(http::Request<Bytes>) -> http::Request<Full<Bytes>>>;

pub fn https_client() -> HttpsClient {
    let full: fn(http::Request<Bytes>) -> http::Request<Full<Bytes>> = |r| r.map(Full::new);
    ServiceBuilder::new()
        .map_request(full)
        .service(Client::builder(TokioExecutor::new()).build(Https::new()))
}
