//! A proxy the test controls between one controller replica and the apiserver: plain HTTP on
//! loopback in front, the suite's authenticated client behind. It records every request it
//! receives (method, path, when), forwarded or not, and can **cut** the replica off: open
//! connections are dropped at once (the replica sees resets, as when a network partition
//! starts) and every later request is held unanswered (a black hole), but still recorded, so
//! a test can tell what the replica tried to write after it was cut off. **Healing** the cut
//! forwards requests again (those held meanwhile are answered 502, never delivered): a replica
//! that still believed it led would then write, and the record shows it.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One request as the proxy received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub at: Instant,
    /// Whether it reached the apiserver (`false`: held after a cut).
    pub forwarded: bool,
    /// The apiserver's status code, once it answered.
    pub status: Option<u16>,
}

impl Seen {
    /// A request that changes something (not GET, HEAD or a watch).
    pub fn is_write(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS")
    }
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards through `client`.
    pub async fn start(client: kube::Client) -> Result<Proxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("proxy: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (cut, _) = watch::channel(false);
        let task = {
            let (seen, cut) = (seen.clone(), cut.clone());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (client, seen, mut cut_now) = (client.clone(), seen.clone(), cut.subscribe());
                    let cut_for_requests = cut.subscribe();
                    tokio::spawn(async move {
                        let service = service_fn(move |request| {
                            forward(client.clone(), seen.clone(), cut_for_requests.clone(), request)
                        });
                        let connection = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service);
                        // A cut drops the connection (its in-flight requests with it), unless
                        // it was opened after the cut (its requests are held instead).
                        let was_cut = *cut_now.borrow();
                        tokio::select! {
                            _ = connection => {}
                            _ = cut_now.wait_for(|cut| *cut && !was_cut) => {}
                        }
                    });
                }
            })
        };
        Ok(Proxy {
            port,
            seen,
            cut,
            task,
        })
    }

    /// Cuts the replica off from now on.
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    /// Forwards again from now on.
    pub fn heal(&self) {
        let _ = self.cut.send(false);
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        crate::env::lock(&self.seen).clone()
    }

    /// A kubeconfig (JSON) pointing at the proxy (no credentials: the proxy adds them).
    pub fn kubeconfig(&self) -> String {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": format!("http://127.0.0.1:{}", self.port)}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        })
        .to_string()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    client: kube::Client,
    seen: Arc<Mutex<Vec<Seen>>>,
    mut cut_state: watch::Receiver<bool>,
    request: Request<Incoming>,
) -> Result<Response<kube::client::Body>, Infallible> {
    let cut = *cut_state.borrow_and_update();
    let index = {
        let mut seen = crate::env::lock(&seen);
        seen.push(Seen {
            method: request.method().to_string(),
            path: request
                .uri()
                .path_and_query()
                .map_or_else(String::new, ToString::to_string),
            at: Instant::now(),
            forwarded: !cut,
            status: None,
        });
        seen.len() - 1
    };
    if cut {
        // Held unanswered until the cut heals (the replica's own timeouts decide what happens
        // meanwhile); never delivered.
        let _ = cut_state.wait_for(|cut| !*cut).await;
        return Ok(bad_gateway());
    }
    let (parts, body) = request.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes().to_vec(),
        Err(_) => return Ok(bad_gateway()),
    };
    let mut outgoing = Request::builder()
        .method(parts.method)
        .uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        if name != http::header::HOST && name != http::header::AUTHORIZATION {
            outgoing = outgoing.header(name, value);
        }
    }
    let Ok(outgoing) = outgoing.body(kube::client::Body::from(bytes)) else {
        return Ok(bad_gateway());
    };
    match client.send(outgoing).await {
        Ok(response) => {
            if let Some(entry) = crate::env::lock(&seen).get_mut(index) {
                entry.status = Some(response.status().as_u16());
            }
            Ok(response)
        }
        Err(_) => Ok(bad_gateway()),
    }
}

fn bad_gateway() -> Response<kube::client::Body> {
    let mut response = Response::new(kube::client::Body::empty());
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
