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
    // An idle HTTP/1.1 connection is closed at its age too.
    let mut http1 = Client::connect(&served, HTTP1).await;
    assert_eq!(http1.get("/healthz").await.0, 200);
    within("the idle HTTP/1.1 connection closes", http1.closed())
        .await
        .expect("a graceful close");
    assert!(served.metrics.connections_aged_out.get() >= 2);
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
