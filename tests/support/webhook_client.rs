//! The conversion webhook served on a loopback port with a fresh self-signed certificate,
//! and a TLS client for it that speaks HTTP/2 (ALPN `h2`, as the apiserver's client does)
//! or HTTP/1.1 over one kept-alive connection. Used by the webhook tests and the webhook
//! benchmark.

#![allow(dead_code)]

use std::sync::Arc;

use bytes::Bytes;
use crd_lifecycle::webhook::{self, CertStore, Limits, PolicySource, WebhookMetrics, certs};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// A running webhook.
pub struct Served {
    pub port: u16,
    pub ca_pem: String,
    pub metrics: Arc<WebhookMetrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
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
            stop: None,
        }
    }
}

/// Serves `policies` on a free loopback port until the result is dropped.
pub async fn serve(policies: Arc<dyn PolicySource>, limits: Limits) -> Served {
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let bundle = certs::new_bundle(&names, jiff::Timestamp::now()).expect("certificates");
    let store = Arc::new(CertStore::default());
    store
        .set_pem(&bundle.cert_pem, &bundle.key_pem)
        .expect("installed");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics = Arc::new(WebhookMetrics::default());
    tokio::spawn(webhook::serve(
        ([127, 0, 0, 1], port).into(),
        store,
        policies,
        metrics.clone(),
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    // Listening once a plain TCP connection is accepted.
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Served {
        port,
        ca_pem: bundle.ca_pem,
        metrics,
        stop: Some(stop),
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
}

impl Client {
    /// Connects, trusting only `ca_pem` (as the apiserver trusts the CRD's caBundle) and
    /// offering `alpn` (e.g. `[b"h2", b"http/1.1"]`, the apiserver's order).
    pub async fn connect(served: &Served, alpn: &[&[u8]]) -> Client {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(served.ca_pem.as_bytes()).expect("CA PEM"))
            .expect("CA");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.port))
            .await
            .expect("connects");
        tcp.set_nodelay(true).expect("nodelay");
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let tls = connector.connect(name, tcp).await.expect("TLS handshake");
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        if h2 {
            let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("HTTP/2 handshake");
            tokio::spawn(connection);
            Client {
                sender: Sender::Http2(sender),
                version: http::Version::HTTP_2,
            }
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(io)
                .await
                .expect("HTTP/1.1 handshake");
            tokio::spawn(connection);
            Client {
                sender: Sender::Http1(sender),
                version: http::Version::HTTP_11,
            }
        }
    }

    /// POSTs `body` to `path`; the status code and the body of the answer.
    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> (u16, Bytes) {
        self.send(http::Method::POST, path, body).await
    }

    /// GETs `path`; the status code and the body of the answer.
    pub async fn get(&mut self, path: &str) -> (u16, Bytes) {
        self.send(http::Method::GET, path, Vec::new()).await
    }

    async fn send(&mut self, method: http::Method, path: &str, body: Vec<u8>) -> (u16, Bytes) {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("https://127.0.0.1{path}"))
            .header("content-type", "application/json")
            .header("content-length", body.len())
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let response = match &mut self.sender {
            Sender::Http1(sender) => {
                sender.ready().await.expect("ready");
                // HTTP/1.1 sends the path alone, and the host as a header.
                let mut request = request;
                *request.uri_mut() = path.parse().expect("path");
                request
                    .headers_mut()
                    .insert("host", http::HeaderValue::from_static("127.0.0.1"));
                sender.send_request(request).await.expect("answered")
            }
            Sender::Http2(sender) => {
                sender.ready().await.expect("ready");
                sender.send_request(request).await.expect("answered")
            }
        };
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.expect("body").to_bytes();
        (status, body)
    }
}
