//! The floor of the webhook benchmarks: a conversion webhook that parses the review, sets
//! `apiVersion` on every object and answers, on the same TLS (rustls, ring) and HTTP/1.1 +
//! HTTP/2 server (hyper-util's auto builder) as `crd-lifecycle`'s, and nothing else.

use std::sync::Arc;

use bytes::Bytes;
use crd_lifecycle::webhook::certs;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

/// The floor: parses the review, sets `apiVersion` on every object, answers. Same TLS,
/// same HTTP/1.1 + HTTP/2 server as the real one. Writes its CA to `ca_file` once listening.
pub async fn serve(port: u16, ca_file: &str) {
    let names = vec!["127.0.0.1".to_owned()];
    let bundle = certs::new_bundle(&names, jiff::Timestamp::now()).expect("certificates");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(bundle.key_pem.as_bytes()).expect("key");
    let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(bundle.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("chain");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("certificate");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    std::fs::write(ca_file, &bundle.ca_pem).expect("CA written");
    {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |request: http::Request<hyper::body::Incoming>| async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let mut review: Value = serde_json::from_slice(&body).unwrap_or_default();
                        let desired = review["request"]["desiredAPIVersion"].clone();
                        let mut objects = review["request"]["objects"].take();
                        for object in objects.as_array_mut().into_iter().flatten() {
                            object["apiVersion"] = desired.clone();
                        }
                        let reply = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                        "response": {"uid": review["request"]["uid"], "result": {"status": "Success"}, "convertedObjects": objects}});
                        Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from(
                            serde_json::to_vec(&reply).unwrap_or_default(),
                        ))))
                    },
                );
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    }
}
