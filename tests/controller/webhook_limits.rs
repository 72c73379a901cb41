//! The conversion webhook under hostile input: expressions and objects that would stall or
//! exhaust it, reviews larger than it accepts, and the HTTP/2 path the apiserver uses.

use std::sync::Arc;

use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::webhook::{Limits, PolicySource, StaticPolicies};
use serde_json::{Value, json};

#[path = "../support/conversion_gate.rs"]
pub(crate) mod conversion_gate;
#[path = "../support/webhook_client.rs"]
pub(crate) mod webhook_client;
use conversion_gate::{Gate, GatedPolicies};
use webhook_client::{Client, serve};

pub(crate) const UID: &str = "7ac9d2dc-cd38-4f35-96df-14b1a42c518b";
pub(crate) const ALPN_AS_THE_APISERVER: &[&[u8]] = &[b"h2", b"http/1.1"];

/// A two-version policy `things` whose `spec.value` changes with `upgrade` / `downgrade`.
pub(crate) fn policy_changing(upgrade: &str, downgrade: &str) -> Arc<dyn PolicySource> {
    let text = format!(
        r#"
apiVersion: crdlifecycle.io/v1alpha1
kind: VersionPolicy
metadata: {{name: things}}
spec:
  crdName: things.example.com
  versions:
  - name: v1
  - name: v2
  conversion:
    changes:
    - from: v1
      to: v2
      changed: [{{path: spec.value, upgrade: "{upgrade}", downgrade: "{downgrade}"}}]
"#
    );
    let policy: VersionPolicy = crd_lifecycle::manifest::parse_policy(&text, "things.yaml").expect("policy");
    Arc::new(StaticPolicies::new(vec![policy]))
}

pub(crate) fn thing(name: &str, value: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Thing",
           "metadata": {"name": name, "namespace": "ns1"}, "spec": {"value": value}})
}

pub(crate) fn review(objects: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"kind": "ConversionReview", "apiVersion": "apiextensions.k8s.io/v1",
        "request": {"uid": UID, "desiredAPIVersion": "example.com/v2", "objects": objects}}),
    )
    .expect("json")
}

pub(crate) async fn post(client: &mut Client, body: Vec<u8>) -> (u16, Value) {
    let (code, body) = client.post("/convert/things", body).await;
    (code, serde_json::from_slice(&body).expect("a JSON answer"))
}

pub(crate) fn message(reply: &Value) -> &str {
    reply["response"]["result"]["message"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn reviews_are_served_over_http2_and_http1_on_kept_alive_connections() {
    let served = serve(policy_changing("int(self)", "string(self)"), Limits::default()).await;
    for (alpn, version) in [
        (ALPN_AS_THE_APISERVER, http::Version::HTTP_2),
        (&[&b"http/1.1"[..]][..], http::Version::HTTP_11),
    ] {
        let mut client = Client::connect(&served, alpn).await;
        assert_eq!(client.version, version, "ALPN {alpn:?}");
        // Several reviews over the one connection, as the apiserver sends a LIST's.
        for i in 0..3 {
            let (code, reply) = post(&mut client, review(vec![thing(&format!("t{i}"), json!("80"))])).await;
            assert_eq!(code, 200);
            assert_eq!(reply["response"]["uid"], UID);
            assert_eq!(reply["response"]["result"]["status"], "Success", "{reply}");
            assert_eq!(reply["response"]["convertedObjects"][0]["spec"]["value"], 80);
        }
    }
}

fn large_review(bytes: usize) -> Vec<u8> {
    review(vec![thing("large", json!("x".repeat(bytes)))])
}

#[tokio::test]
async fn a_review_over_the_limit_gets_a_failure_the_apiserver_shows() {
    let served = serve(policy_changing("self", "self"), Limits::default()).await;
    let mut client = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let body = large_review(20_000_000);
    let size = body.len();
    let (code, reply) = post(&mut client, body).await;
    // A Failed result with the request's uid, not a bare 413: the apiserver shows the
    // message to the client (apiserver-samples/20, 33).
    assert_eq!(code, 200);
    assert_eq!(reply["response"]["uid"], UID);
    assert_eq!(reply["response"]["result"]["status"], "Failure");
    assert_eq!(reply["response"]["result"]["reason"], "RequestEntityTooLarge");
    assert_eq!(
        message(&reply),
        format!(
            "the ConversionReview is too large for the crd-lifecycle conversion webhook: {size} bytes, over its limit of 16777216 bytes (--max-review-bytes)"
        )
    );
    // The connection is still usable.
    let (_, reply) = post(&mut client, review(vec![thing("small", json!(1))])).await;
    assert_eq!(reply["response"]["result"]["status"], "Success");
}

#[tokio::test]
async fn a_20_mb_review_converts_under_a_raised_limit() {
    let limits = Limits {
        max_review_bytes: 32 << 20,
        ..Limits::default()
    };
    let served = serve(policy_changing("self", "self"), limits).await;
    let mut client = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let (code, reply) = post(&mut client, large_review(20_000_000)).await;
    assert_eq!(code, 200);
    assert_eq!(reply["response"]["result"]["status"], "Success");
    let converted = &reply["response"]["convertedObjects"][0];
    assert_eq!(converted["apiVersion"], "example.com/v2");
    assert_eq!(
        converted["spec"]["value"].as_str().map(str::len),
        Some(20_000_000)
    );
}

#[tokio::test]
async fn a_bomb_policy_is_refused_at_its_limit_naming_object_path_and_expression() {
    let bomb = "self.replace('', self).replace('', self)";
    let served = serve(policy_changing(bomb, "self"), Limits::default()).await;
    let mut client = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let (code, reply) = post(&mut client, review(vec![thing("t1", json!("a".repeat(1000)))])).await;
    assert_eq!(code, 200);
    assert_eq!(reply["response"]["result"]["status"], "Failure");
    let text = message(&reply);
    for part in [
        "cannot convert ns1/t1 to v2",
        "spec.value",
        bomb,
        "would build a string of",
        "at most 1048576 are allowed",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    // The value is cut short in the message the apiserver shows to every client.
    assert!(text.len() < 600, "{} bytes: {text}", text.len());
}

#[tokio::test]
async fn a_bomb_object_is_bounded_and_linear_expressions_stay_cheap() {
    let served = serve(
        policy_changing("self.map(x, x + x)", "self.map(x, x / 2)"),
        Limits::default(),
    )
    .await;
    let mut client = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    // 16,000 items: linear, converts.
    let items: Vec<i64> = (0..16_000).collect();
    let (_, reply) = post(&mut client, review(vec![thing("many", json!(items))])).await;
    assert_eq!(
        reply["response"]["result"]["status"],
        "Success",
        "{}",
        message(&reply)
    );
    assert_eq!(
        reply["response"]["convertedObjects"][0]["spec"]["value"][15_999],
        31_998
    );
    // An object so large that mapping it is over the per-call limit.
    let items: Vec<i64> = (0..150_000).collect();
    let (_, reply) = post(&mut client, review(vec![thing("huge", json!(items))])).await;
    assert_eq!(reply["response"]["result"]["status"], "Failure");
    assert!(
        message(&reply).contains("cannot convert ns1/huge to v2: spec.value: upgrade `self.map(x, x + x)`")
            && message(&reply).ends_with(
                "(938891 bytes): the expression exceeded its cost limit of 1000000 units per evaluation"
            ),
        "{}",
        message(&reply)
    );
    // Objects that each fit their per-call limit still share the review's budget.
    let served = serve(
        policy_changing("self.map(x, [x, x, x])", "self.map(x, x[0])"),
        Limits::default(),
    )
    .await;
    let mut client = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let many: Vec<Value> = (0..40)
        .map(|i| thing(&format!("t{i}"), json!((0..20_000).collect::<Vec<i64>>())))
        .collect();
    let (_, reply) = post(&mut client, review(many)).await;
    assert_eq!(reply["response"]["result"]["status"], "Failure");
    assert!(
        message(&reply).contains("review's cost budget of 10000000"),
        "{}",
        message(&reply)
    );
}

/// On a runtime with a single worker thread, a conversion that ran on it would hold every
/// other request until it finished. Conversions with expressions run on the blocking pool
/// instead (one per core), so health, readiness and small reviews are answered while every
/// one of those slots holds a review that spends its whole budget. The reviews wait at a
/// gate until the test has its answers, so nothing races: were a conversion run on the
/// runtime's thread, the gate would hold that thread and no answer would come before the
/// bombs'.
#[tokio::test(flavor = "current_thread")]
async fn health_answers_while_reviews_spend_their_whole_budget() {
    let gate = Arc::new(Gate::default());
    let policies = GatedPolicies {
        policies: policy_changing("self.map(x, self.join(','))", "self"),
        gate: gate.clone(),
    };
    let served = serve(Arc::new(policies), Limits::default()).await;
    let slots = std::thread::available_parallelism().map_or(2, usize::from).max(2);
    let words: Vec<String> = vec!["w".repeat(1_000); 1_000];
    let mut bombs = Vec::new();
    for _ in 0..slots + 2 {
        let mut client = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
        let body = review(vec![thing("held-bomb", json!(words))]);
        bombs.push(tokio::spawn(async move { post(&mut client, body).await }));
    }
    // Every conversion slot holds a bomb; two more wait for a slot.
    gate.arrived(slots).await;
    let mut client = Client::connect(&served, ALPN_AS_THE_APISERVER).await;
    let (code, body) = client.get("/healthz").await;
    assert_eq!((code, &body[..]), (200, &b"ok\n"[..]));
    let (code, body) = client.get("/readyz").await;
    assert_eq!((code, &body[..]), (200, &b"ok\n"[..]));
    let (_, reply) = post(&mut client, review(vec![thing("fine", json!(["a"]))])).await;
    assert_eq!(reply["response"]["result"]["status"], "Success");
    assert!(
        bombs.iter().all(|bomb| !bomb.is_finished()),
        "health and a small review were answered while every bomb still ran"
    );
    gate.open();
    for bomb in bombs {
        let (_, reply) = bomb.await.expect("answered");
        assert!(
            message(&reply).contains("cost limit of 1000000"),
            "{}",
            message(&reply)
        );
    }
}
