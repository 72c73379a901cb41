//! The conversion webhook served on a loopback port with a fresh self-signed certificate,
//! and a TLS client for it that speaks HTTP/2 (ALPN `h2`, as the apiserver's client does)
//! or HTTP/1.1 over one kept-alive connection. Used by the webhook tests and the webhook
//! benchmark.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crd_lifecycle::webhook::{
    self, CertStore, Connections, Limits, PolicySource, Readiness, Server, WebhookMetrics, certs,
};
use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running webhook.
pub struct Served {
    pub port: u16,
    pub ca_pem: String,
    pub metrics: Arc<WebhookMetrics>,
    /// What its `/readyz` answers.
    pub readiness: Arc<Readiness>,
    /// Sent: what SIGTERM does, the drain starts.
    terminate: Option<oneshot::Sender<()>>,
    /// Sent: the drain is over, the server stops accepting.
    end_drain: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.end_drain();
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

impl Served {
    /// A webhook served by someone else (another process).
    pub fn external(port: u16, ca_pem: String) -> Served {
        Served {
            port,
            ca_pem,
            metrics: Arc::new(WebhookMetrics::default()),
            readiness: Arc::new(Readiness::ready()),
            terminate: None,
            end_drain: None,
            server: None,
        }
    }

    /// What SIGTERM does to the process: the webhook starts draining.
    pub fn terminate(&mut self) {
        if let Some(terminate) = self.terminate.take() {
            let _ = terminate.send(());
        }
    }

    /// The drain period is over (however long it was configured): the server stops
    /// accepting and asks its connections to close.
    pub fn end_drain(&mut self) {
        if let Some(end) = self.end_drain.take() {
            let _ = end.send(());
        }
    }

    /// Waits until the server has stopped.
    pub async fn stopped(&mut self) -> std::io::Result<()> {
        match self.server.take() {
            Some(server) => server.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }
}

/// Connections that never age out, a drain that lasts until the test ends it, and idle
/// HTTP/1.1 connections left to their clients for longer than any test.
pub fn test_connections() -> Connections {
    Connections {
        drain: Duration::from_secs(3600),
        in_flight_deadline: Duration::from_secs(30),
        max_age: None,
        idle_grace: Duration::from_secs(3600),
    }
}

/// Serves `policies` on a free loopback port until the result is dropped.
pub async fn serve(policies: Arc<dyn PolicySource>, limits: Limits) -> Served {
    serve_with(policies, limits, test_connections()).await
}

/// Serves `policies` with `connections` on a free loopback port until the result is
/// dropped. Its drain starts with `Served::terminate` and ends after `connections.drain`
/// or at `Served::end_drain`, whichever comes first.
pub async fn serve_with(policies: Arc<dyn PolicySource>, limits: Limits, connections: Connections) -> Served {
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let bundle = certs::new_bundle(&names, jiff::Timestamp::now()).expect("certificates");
    let store = Arc::new(CertStore::default());
    store
        .set_pem(&bundle.cert_pem, &bundle.key_pem)
        .expect("installed");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let port = listener.local_addr().expect("address").port();
    let (terminate, terminated) = oneshot::channel::<()>();
    let (end_drain, drain_ended) = oneshot::channel::<()>();
    let metrics = Arc::new(WebhookMetrics::default());
    let readiness = Arc::new(Readiness::ready());
    let drained = webhook::drain_after(terminated.map(|_| ()), readiness.clone(), connections.drain);
    let stop = async move {
        tokio::select! {
            () = drained => {}
            _ = drain_ended => {}
        }
    };
    let server = Server {
        certs: store,
        policies,
        metrics: metrics.clone(),
        limits,
        readiness: readiness.clone(),
        connections,
    };
    let server = tokio::spawn(server.serve(listener, stop));
    Served {
        port,
        ca_pem: bundle.ca_pem,
        metrics,
        readiness,
        terminate: Some(terminate),
        end_drain: Some(end_drain),
        server: Some(server),
    }
}

enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    Http2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// One TLS connection to the webhook.
pub struct Client {
    sender: Sender,
    /// The protocol ALPN settled on.
    pub version: http::Version,
    /// The connection: ends when either side closes it.
    connection: JoinHandle<Result<(), hyper::Error>>,
}

impl Client {
    /// Connects, trusting only `ca_pem` (as the apiserver trusts the CRD's caBundle) and
    /// offering `alpn` (e.g. `[b"h2", b"http/1.1"]`, the apiserver's order).
    pub async fn connect(served: &Served, alpn: &[&[u8]]) -> Client {
        Client::try_connect(served, alpn).await.expect("connects")
    }

    /// As `connect`, saying why it could not.
    pub async fn try_connect(served: &Served, alpn: &[&[u8]]) -> Result<Client, String> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.port))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        Client::try_connect_over(tcp, served, alpn).await
    }

    /// As `try_connect`, over a TCP connection made already (its TLS handshake not begun).
    pub async fn try_connect_over(
        tcp: tokio::net::TcpStream,
        served: &Served,
        alpn: &[&[u8]],
    ) -> Result<Client, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(served.ca_pem.as_bytes()).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        if h2 {
            let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
            Ok(Client {
                sender: Sender::Http2(sender),
                version: http::Version::HTTP_2,
                connection: tokio::spawn(connection),
            })
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
            Ok(Client {
                sender: Sender::Http1(sender),
                version: http::Version::HTTP_11,
                connection: tokio::spawn(connection),
            })
        }
    }

    /// POSTs `body` to `path`; the status code and the body of the answer.
    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> (u16, Bytes) {
        self.send(http::Method::POST, path, body).await
    }

    /// POSTs `body` to `path` on this HTTP/2 connection, in a task of its own (a stream in
    /// flight while the test goes on).
    pub fn post_in_flight(&self, path: &str, body: Vec<u8>) -> JoinHandle<(u16, Bytes)> {
        let Sender::Http2(sender) = &self.sender else {
            panic!("concurrent requests need HTTP/2");
        };
        let mut sender = Sender::Http2(sender.clone());
        let path = path.to_owned();
        tokio::spawn(async move { send(&mut sender, http::Method::POST, &path, body).await })
    }

    /// Waits until the server has closed the connection: `Ok` for a graceful close (an
    /// HTTP/2 GOAWAY, or HTTP/1.1 `Connection: close`), the error otherwise.
    pub async fn closed(self) -> Result<(), String> {
        match self.connection.await {
            Ok(closed) => closed.map_err(|error| error.to_string()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// GETs `path`; the status code and the body of the answer.
    pub async fn get(&mut self, path: &str) -> (u16, Bytes) {
        self.send(http::Method::GET, path, Vec::new()).await
    }

    /// POSTs `body` to `path`; the answer's status code, headers and body.
    pub async fn post_with_headers(&mut self, path: &str, body: Vec<u8>) -> (u16, http::HeaderMap, Bytes) {
        try_send_with_headers(&mut self.sender, http::Method::POST, path, body)
            .await
            .expect("answered")
    }

    /// GETs `path`; the answer's status code, headers and body.
    pub async fn get_with_headers(&mut self, path: &str) -> (u16, http::HeaderMap, Bytes) {
        try_send_with_headers(&mut self.sender, http::Method::GET, path, Vec::new())
            .await
            .expect("answered")
    }

    /// Whether the connection has ended (either side closed it).
    pub fn is_closed(&self) -> bool {
        self.connection.is_finished()
    }

    /// As `get`, saying why there is no answer.
    pub async fn try_get(&mut self, path: &str) -> Result<(u16, Bytes), String> {
        try_send(&mut self.sender, http::Method::GET, path, Vec::new()).await
    }

    async fn send(&mut self, method: http::Method, path: &str, body: Vec<u8>) -> (u16, Bytes) {
        send(&mut self.sender, method, path, body).await
    }
}

async fn send(sender: &mut Sender, method: http::Method, path: &str, body: Vec<u8>) -> (u16, Bytes) {
    try_send(sender, method, path, body).await.expect("answered")
}

async fn try_send(
    sender: &mut Sender,
    method: http::Method,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Bytes), String> {
    let (status, _, body) = try_send_with_headers(sender, method, path, body).await?;
    Ok((status, body))
}

async fn try_send_with_headers(
    sender: &mut Sender,
    method: http::Method,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, http::HeaderMap, Bytes), String> {
    let request = http::Request::builder()
        .method(method)
        .uri(format!("https://127.0.0.1{path}"))
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = match sender {
        Sender::Http1(sender) => {
            sender.ready().await.map_err(|e| e.to_string())?;
            // HTTP/1.1 sends the path alone, and the host as a header.
            let mut request = request;
            *request.uri_mut() = path.parse().expect("path");
            request
                .headers_mut()
                .insert("host", http::HeaderValue::from_static("127.0.0.1"));
            sender.send_request(request).await.map_err(|e| e.to_string())?
        }
        Sender::Http2(sender) => {
            sender.ready().await.map_err(|e| e.to_string())?;
            sender.send_request(request).await.map_err(|e| e.to_string())?
        }
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, headers, body))
}
