//! The conversion webhook through a rollout: after SIGTERM it reports not ready and keeps
//! serving for its drain, then refuses new connections, sends HTTP/2 GOAWAY and lets the
//! requests in flight finish; and connections older than the maximum age are asked to
//! close, so that the apiserver's reviews spread over the replicas. Requests in flight are
//! conversions held at a gate; the drain's end is the test's to decide. Waits for what the
//! server does on its own (a connection closing) are bounded only to report a failure.

use std::sync::Arc;
use std::time::Duration;

use crd_lifecycle::webhook::{Connections, Limits};
use serde_json::{Value, json};

use crate::webhook_limits::conversion_gate::{Gate, GatedPolicies};
use crate::webhook_limits::webhook_client::{Client, Served, serve_with, test_connections};
use crate::webhook_limits::{ALPN_AS_THE_APISERVER, policy_changing, thing};

const HTTP1: &[&[u8]] = &[b"http/1.1"];

/// How long a test waits for what the server does on its own before failing.
const AT_MOST: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(AT_MOST, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {AT_MOST:?}"))
}

/// A webhook whose conversions of `held*` objects wait at the returned gate.
async fn gated(connections: Connections) -> (Served, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let policies = GatedPolicies {
        policies: policy_changing("int(self)", "string(self)"),
        gate: gate.clone(),
    };
    let served = serve_with(Arc::new(policies), Limits::default(), connections).await;
    (served, gate)
}

/// A review of one object `held` (over 64 KiB, so converted on the blocking pool, where it
/// waits at the gate) whose `spec.value` converts from "8080" to 8080.
fn held_review() -> Vec<u8> {
    let mut object = thing("held", json!("8080"));
    object["spec"]["padding"] = json!("x".repeat(80_000));
    crate::webhook_limits::review(vec![object])
}

fn converted(body: &[u8]) -> Value {
    let reply: Value = serde_json::from_slice(body).expect("a JSON answer");
    assert_eq!(reply["response"]["result"]["status"], "Success", "{reply}");
    reply["response"]["convertedObjects"][0]["spec"]["value"].clone()
}

/// Opens the gate: the conversion held in flight is answered, converted.
async fn released(gate: &Gate, in_flight: tokio::task::JoinHandle<(u16, bytes::Bytes)>) {
    gate.open();
    let (code, body) = within("the conversion in flight is answered", in_flight)
        .await
        .expect("answered");
    assert_eq!((code, converted(&body)), (200, json!(8080)));
}

async fn readyz(client: &mut Client) -> (u16, String) {
    let (code, body) = client.get("/readyz").await;
    (code, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn sigterm_drains_then_refuses_new_connections_and_lets_conversions_in_flight_finish() {
    let (mut served, gate) = gated(test_connections()).await;
    // The apiserver's connection (HTTP/2) with a conversion in flight.
    let apiserver = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    assert_eq!(apiserver.version, http::Version::HTTP_2);
    let in_flight = apiserver.post_in_flight("/convert/things", held_review());
    gate.arrived(1).await;
    // The kubelet's probe (HTTP/1.1, kept alive).
    let mut probe = Client::connect(&served, HTTP1).await;
    assert_eq!(readyz(&mut probe).await, (200, "ok\n".to_owned()));

    served.terminate();
    // Draining: not ready, so that the endpoints drop the replica...
    let answer = within("readyz answers 503 after SIGTERM", async {
        loop {
            let answer = readyz(&mut probe).await;
            if answer.0 != 200 {
                return answer;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        answer,
        (
            503,
            "not ready: draining: the process is shutting down\n".to_owned()
        )
    );
    // ...while it still serves everyone, on new connections too (endpoints take a while).
    let mut late = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let (code, body) = late
        .post(
            "/convert/things",
            crate::webhook_limits::review(vec![thing("late", json!("81"))]),
        )
        .await;
    assert_eq!((code, converted(&body)), (200, json!(81)));

    // The drain is over: the listener closes while the conversion is still held.
    served.end_drain();
    within("new connections are refused", async {
        while tokio::net::TcpStream::connect(("127.0.0.1", served.port))
            .await
            .is_ok()
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(!in_flight.is_finished(), "the conversion is still held");
    released(&gate, in_flight).await;
    // Every connection was asked to close (HTTP/2 GOAWAY) and closed cleanly.
    within("the apiserver's connection closes", apiserver.closed())
        .await
        .expect("a graceful close");
    within("the late connection closes", late.closed())
        .await
        .expect("a graceful close");
    within("the probe's connection closes", probe.closed())
        .await
        .expect("a graceful close");
    within("the server stops", served.stopped())
        .await
        .expect("stopped cleanly");
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", served.port))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn requests_in_flight_past_the_deadline_are_cut_off() {
    let connections = Connections {
        in_flight_deadline: Duration::from_millis(200),
        idle_grace: Duration::ZERO,
        ..test_connections()
    };
    let (mut served, gate) = gated(connections).await;
    let apiserver = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let in_flight = apiserver.post_in_flight("/convert/things", held_review());
    gate.arrived(1).await;
    served.terminate();
    served.end_drain();
    // The server stops at its deadline although the conversion is still held, and closes
    // the connection: the request gets no answer.
    within("the server stops at its deadline", served.stopped())
        .await
        .expect("stopped");
    let cut_off = within("the request in flight ends", in_flight).await;
    assert!(cut_off.is_err(), "no answer: {cut_off:?}");
    drop(apiserver);
    gate.open();
}

#[tokio::test]
async fn connections_past_their_maximum_age_are_asked_to_close() {
    let connections = Connections {
        max_age: Some(Duration::from_millis(200)),
        ..test_connections()
    };
    let (served, gate) = gated(connections).await;
    let apiserver = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let in_flight = apiserver.post_in_flight("/convert/things", held_review());
    gate.arrived(1).await;
    within("the connection reaches its maximum age", async {
        while served.metrics.connections_aged_out.get() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Asked to close (GOAWAY), it still finishes its stream in flight...
    released(&gate, in_flight).await;
    // ...then closes, and the client reconnects (to any replica).
    within("the aged connection closes", apiserver.closed())
        .await
        .expect("a graceful close");
    let mut again = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let (code, _) = again.get("/healthz").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn an_http1_connection_past_its_maximum_age_closes_after_its_next_answer_never_while_idle() {
    let connections = Connections {
        max_age: Some(Duration::from_millis(200)),
        ..test_connections()
    };
    let (served, _gate) = gated(connections).await;
    // The apiserver's webhook client speaks HTTP/1.1 to a Service (Kubernetes 1.16 on),
    // keeping idle connections for reuse.
    let mut http1 = Client::connect(&served, HTTP1).await;
    let (code, headers, _) = http1.get_with_headers("/healthz").await;
    assert_eq!((code, headers.get("connection")), (200, None), "kept alive");
    within("the connection reaches its maximum age", async {
        while served.metrics.connections_aged_out.get() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Idle past its age, it stays open: closing it now could close it under a request
    // the client has just written, which Go's client does not retry for a POST.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!http1.is_closed(), "an idle connection is left to its client");
    // Its next request is answered, saying `Connection: close`, and then it closes.
    let (code, headers, body) = http1
        .post_with_headers(
            "/convert/things",
            crate::webhook_limits::review(vec![thing("aged", json!("8080"))]),
        )
        .await;
    assert_eq!((code, converted(&body)), (200, json!(8080)));
    assert_eq!(
        headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    within("the aged connection closes after its answer", http1.closed())
        .await
        .expect("a graceful close");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_starts_its_tls_handshake_is_dropped_after_ten_seconds() {
    use tokio::io::AsyncReadExt;
    let served = serve_with(
        policy_changing("int(self)", "string(self)"),
        Limits::default(),
        test_connections(),
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", served.port))
        .await
        .expect("connects");
    let connected = tokio::time::Instant::now();
    let mut byte = [0u8; 1];
    let read = silent.read(&mut byte).await.expect("read");
    assert_eq!(read, 0, "the server closed the connection");
    // The clock is paused: this is the server's own timeout, to the millisecond.
    let waited = connected.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "{waited:?}"
    );
}

/// A review the apiserver would send over its kept-alive HTTP/1.1 connection.
fn small_review(name: &str) -> Vec<u8> {
    crate::webhook_limits::review(vec![thing(name, json!("8080"))])
}

fn says_close(headers: &http::HeaderMap) -> bool {
    headers.get("connection").map(|value| value.as_bytes()) == Some(&b"close"[..])
}

async fn refuses_new_connections(served: &Served) {
    within("new connections are refused", async {
        while tokio::net::TcpStream::connect(("127.0.0.1", served.port))
            .await
            .is_ok()
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// The apiserver's webhook client speaks HTTP/1.1 to a Service (every version since 1.16)
/// and keeps idle connections for reuse. Closing one of them can close it under a POST the
/// client has just written, which Go's client reports as `EOF` rather than retry (issue 34,
/// finding 9: `conversion webhook ... failed: Post "...": EOF` on Kubernetes 1.24). So
/// during the drain every HTTP/1.1 answer says `Connection: close` (the client reconnects,
/// through the Service, elsewhere), and a connection left idle is still answered after the
/// drain, then closes.
#[tokio::test]
async fn an_http1_keep_alive_client_gets_connection_close_on_its_last_answer_never_a_closed_socket() {
    let (mut served, _gate) = gated(test_connections()).await;
    let mut busy = Client::connect(&served, HTTP1).await;
    let mut idle = Client::connect(&served, HTTP1).await;
    for client in [&mut busy, &mut idle] {
        let (code, headers, body) = client
            .post_with_headers("/convert/things", small_review("kept"))
            .await;
        assert_eq!((code, converted(&body)), (200, json!(8080)));
        assert!(!says_close(&headers), "kept alive before the drain: {headers:?}");
    }

    served.terminate();
    within("the drain starts", async {
        while !served.readiness.is_draining() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // During the drain: answered, saying `Connection: close`; the connection then closes
    // after that answer, as the client expects.
    let (code, headers, body) = busy
        .post_with_headers("/convert/things", small_review("busy"))
        .await;
    assert_eq!((code, converted(&body)), (200, json!(8080)));
    assert!(says_close(&headers), "{headers:?}");
    within("the connection closes after its last answer", busy.closed())
        .await
        .expect("a graceful close");

    // The drain ends: no new connections, but the connection idle since before the drain
    // stays open for its client, which may be writing a review on it at this very moment.
    served.end_drain();
    refuses_new_connections(&served).await;
    assert!(
        !idle.is_closed(),
        "an idle HTTP/1.1 connection is left to its client"
    );
    let (code, headers, body) = idle
        .post_with_headers("/convert/things", small_review("late"))
        .await;
    assert_eq!((code, converted(&body)), (200, json!(8080)));
    assert!(says_close(&headers), "{headers:?}");
    within("the idle connection closes after its last answer", idle.closed())
        .await
        .expect("a graceful close");
    within("the server stops once every connection closed", served.stopped())
        .await
        .expect("stopped cleanly");
}

/// An idle HTTP/1.1 connection its client never uses again (Go's closes it after 90 s) is
/// closed by the webhook once it has been idle for the grace, never sooner.
#[tokio::test]
async fn an_idle_http1_connection_is_closed_only_after_its_grace() {
    let grace = Duration::from_millis(500);
    let connections = Connections {
        idle_grace: grace,
        ..test_connections()
    };
    let (mut served, _gate) = gated(connections).await;
    let mut idle = Client::connect(&served, HTTP1).await;
    let sent = tokio::time::Instant::now();
    assert_eq!(idle.get("/healthz").await.0, 200);
    served.terminate();
    served.end_drain();
    refuses_new_connections(&served).await;
    within("the idle connection is closed after its grace", idle.closed())
        .await
        .expect("a graceful close");
    assert!(sent.elapsed() >= grace, "closed after {:?}", sent.elapsed());
    within("the server stops", served.stopped())
        .await
        .expect("stopped cleanly");
}

/// A connection accepted before the drain ended whose TLS handshake is still under way is
/// not dropped (its client dialled it to send a review, and Go's client does not retry a
/// handshake cut off with `EOF`): it is served, and asked to close.
#[tokio::test]
async fn a_connection_still_in_its_tls_handshake_when_the_drain_ends_is_served() {
    let (mut served, _gate) = gated(test_connections()).await;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.port))
        .await
        .expect("connects");
    within("the server accepts the connection", async {
        while served.metrics.open_connections.get() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    served.terminate();
    served.end_drain();
    refuses_new_connections(&served).await;
    let mut client = Client::try_connect_over(tcp, &served, HTTP1)
        .await
        .expect("the handshake completes");
    let (code, headers, body) = client
        .post_with_headers("/convert/things", small_review("dialled"))
        .await;
    assert_eq!((code, converted(&body)), (200, json!(8080)));
    assert!(says_close(&headers), "{headers:?}");
    within("the connection closes after its answer", client.closed())
        .await
        .expect("a graceful close");
    within("the server stops", served.stopped())
        .await
        .expect("stopped cleanly");
}
