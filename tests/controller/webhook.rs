//! The conversion webhook: ConversionReview round trips, malformed reviews, unknown
//! versions, and HTTPS with generated (and renewed) certificates.

use std::sync::Arc;

use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::webhook::{self, CertStore, PolicySource, StaticPolicies, certs};
use serde_json::{Value, json};

const CONVERSION_POLICY: &str = include_str!("../../examples/conversion/policy.yaml");

fn policies() -> Arc<dyn PolicySource> {
    let policy: VersionPolicy =
        crd_lifecycle::manifest::parse_policy(CONVERSION_POLICY, "policy.yaml").expect("example policy");
    Arc::new(StaticPolicies(vec![policy]))
}

/// A review as the apiserver sends it (apiserver-samples/18), for `objects`.
fn review(desired: &str, objects: Vec<Value>) -> Value {
    json!({"kind": "ConversionReview", "apiVersion": "apiextensions.k8s.io/v1",
           "request": {"uid": "7ac9d2dc-cd38-4f35-96df-14b1a42c518b", "desiredAPIVersion": desired, "objects": objects}})
}

fn gadget(version: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("example.com/{version}"), "kind": "Gadget",
           "metadata": {"name": name, "namespace": "ns1", "uid": "u", "creationTimestamp": "2026-11-22T08:11:18Z",
                        "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]},
           "spec": spec})
}

fn answer(body: &Value, policy: &str) -> (u16, Value) {
    let (code, review) = webhook::review(body.to_string().as_bytes(), policy, &policies());
    (code, serde_json::to_value(review).expect("serializable"))
}

#[test]
fn a_review_converts_every_object_and_round_trips() {
    let objects = vec![
        gadget("v1alpha1", "a", json!({"size": 1, "legacyMode": true})),
        gadget("v1beta1", "b", json!({"replicas": 2, "color": "red"})),
    ];
    let (code, reply) = answer(&review("example.com/v1", objects.clone()), "gadgets");
    assert_eq!(code, 200);
    let response = &reply["response"];
    assert_eq!(
        response["uid"], "7ac9d2dc-cd38-4f35-96df-14b1a42c518b",
        "uid copied"
    );
    assert_eq!(response["result"]["status"], "Success");
    let converted = response["convertedObjects"].as_array().expect("objects").clone();
    assert_eq!(converted[0]["apiVersion"], "example.com/v1");
    assert_eq!(
        converted[0]["spec"],
        json!({"scale": {"replicas": 1}, "color": "blue"})
    );
    assert_eq!(
        converted[1]["spec"],
        json!({"scale": {"replicas": 2}, "color": "red"})
    );
    // Metadata (managedFields included) passes through.
    assert_eq!(
        converted[0]["metadata"]["managedFields"],
        objects[0]["metadata"]["managedFields"]
    );

    // Back, one object at a time: exactly the originals.
    for (original, object) in objects.iter().zip(converted) {
        let version = original["apiVersion"].as_str().expect("apiVersion").to_owned();
        let (_, back) = answer(&review(&version, vec![object]), "gadgets");
        assert_eq!(&back["response"]["convertedObjects"][0], original);
    }
}

#[test]
fn objects_that_cannot_convert_fail_the_review_with_a_message() {
    let bad = gadget("v1alpha1", "odd", json!({"size": 1, "replicas": 2}));
    let (code, reply) = answer(&review("example.com/v1", vec![bad]), "gadgets");
    assert_eq!(code, 200);
    assert_eq!(reply["response"]["result"]["status"], "Failure");
    let message = reply["response"]["result"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("cannot convert ns1/odd to v1: cannot move spec.size to spec.replicas"),
        "{message}"
    );
    assert_eq!(reply["response"]["convertedObjects"], json!([]));

    let (_, reply) = answer(
        &review("example.com/v9", vec![gadget("v1", "a", json!({}))]),
        "gadgets",
    );
    assert!(
        reply["response"]["result"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unknown version v9")
    );
    let (_, reply) = answer(
        &review("example.com/v1", vec![gadget("v2", "a", json!({}))]),
        "gadgets",
    );
    assert!(
        reply["response"]["result"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unknown version v2")
    );
    let (_, reply) = answer(&review("example.com/v1", vec![]), "nosuchpolicy");
    assert!(
        reply["response"]["result"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("VersionPolicy nosuchpolicy")
    );
}

#[test]
fn malformed_reviews_are_answered_not_panicked_on() {
    for body in [
        &b"not json"[..],
        b"{}",
        br#"{"kind":"ConversionReview","apiVersion":"apiextensions.k8s.io/v1"}"#,
        b"[1,2]",
    ] {
        let (code, review) = webhook::review(body, "gadgets", &policies());
        assert_eq!(code, 400, "{}", String::from_utf8_lossy(body));
        let value = serde_json::to_value(review).expect("serializable");
        assert_eq!(value["response"]["result"]["status"], "Failure");
    }
}

#[tokio::test]
async fn the_webhook_serves_https_and_picks_up_renewed_certificates() {
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let now = jiff::Timestamp::now();
    let bundle = certs::new_bundle(&names, now).expect("certificates");
    let store = Arc::new(CertStore::default());
    store
        .set_pem(&bundle.cert_pem, &bundle.key_pem)
        .expect("installed");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let address: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook::serve(address, store.clone(), policies(), async move {
        let _ = stopped.await;
    }));

    // A client that trusts only the generated CA, as the apiserver does with caBundle.
    let ca = rustls_pem_to_der(&bundle.ca_pem);
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().expect("url"));
    config.root_cert = Some(vec![ca]);
    let client = kube::Client::try_from(config).expect("client");
    let post = |body: Value| {
        http::Request::post("/convert/gadgets")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("json"))
            .expect("request")
    };
    let body = review(
        "example.com/v1",
        vec![gadget("v1alpha1", "a", json!({"size": 4}))],
    );
    let mut reply = None;
    for _ in 0..50 {
        match client.request::<Value>(post(body.clone())).await {
            Ok(value) => {
                reply = Some(value);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    let reply = reply.expect("the webhook answers over HTTPS");
    assert_eq!(
        reply["response"]["convertedObjects"][0]["spec"]["scale"]["replicas"],
        4
    );

    // A renewed serving certificate (same CA) is used from the next connection on.
    let renewed = bundle.renewed(&names, now).expect("renewed");
    store
        .set_pem(&renewed.cert_pem, &renewed.key_pem)
        .expect("installed");
    let fresh = {
        let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().expect("url"));
        config.root_cert = Some(vec![rustls_pem_to_der(&bundle.ca_pem)]);
        kube::Client::try_from(config).expect("client")
    };
    let reply: Value = fresh.request(post(body)).await.expect("still trusted");
    assert_eq!(reply["response"]["result"]["status"], "Success");
    let _ = stop.send(());
    let _ = server.await;
}

fn rustls_pem_to_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("PEM")
        .to_vec()
}
