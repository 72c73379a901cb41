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
    Arc::new(StaticPolicies::new(vec![policy]))
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let port = listener.local_addr().expect("address").port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut registry = prometheus_client::registry::Registry::with_prefix("crd_lifecycle");
    let metrics = Arc::new(webhook::WebhookMetrics::registered(&mut registry));
    let server = webhook::Server {
        certs: store.clone(),
        policies: policies(),
        metrics: metrics.clone(),
        limits: webhook::Limits::default(),
        readiness: Arc::new(webhook::Readiness::ready()),
        connections: webhook::Connections::default(),
    };
    let server = tokio::spawn(server.serve(listener, async move {
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

    // Every review is counted by result; a policy the webhook does not know is no label.
    let failed: Value = fresh
        .request(post(review(
            "example.com/v9",
            vec![gadget("v1alpha1", "b", json!({"size": 4}))],
        )))
        .await
        .expect("answered");
    assert_eq!(failed["response"]["result"]["status"], "Failure");
    let unknown = http::Request::post("/convert/no-such-policy")
        .header("content-type", "application/json")
        .body(b"{}".to_vec())
        .expect("request");
    let _ = fresh.request_text(unknown).await;
    let count = |policy: &str, result| {
        metrics
            .reviews
            .get_or_create(&webhook::metrics::ReviewLabels {
                policy: policy.to_owned(),
                result,
            })
            .get()
    };
    use webhook::metrics::ReviewResult;
    assert_eq!(count("gadgets", ReviewResult::success), 2);
    assert_eq!(count("gadgets", ReviewResult::failure), 1);
    assert_eq!(count("unknown", ReviewResult::invalid), 1);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
    assert!(
        text.contains("crd_lifecycle_conversion_review_duration_seconds_count 4"),
        "four reviews timed: {text}"
    );
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

pub(crate) mod crd_conversion {
    use std::sync::Arc;

    use crd_lifecycle::api::VersionPolicy;
    use crd_lifecycle::controller::{RELEASE_FINALIZER, reconcile};
    use crd_lifecycle::conversion::{CRD_CONVERSION_ANNOTATION, CRD_CONVERSION_BEFORE_ANNOTATION};
    use crd_lifecycle::webhook::ca::{WebhookEndpoint, WebhookTarget};
    use crd_lifecycle::webhook::{self, CachedPolicies, PolicySource};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::core::{DeserializeGuard, PartialObjectMeta};
    use kube::runtime::{reflector, watcher};
    use serde_json::json;

    use crate::{Harness, yaml};

    const CRD: &str = "gadgets.example.com";

    /// A CA certificate (PEM): the apiserver refuses a `caBundle` that holds none
    /// (tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 4).
    fn a_ca() -> String {
        webhook::certs::new_bundle(
            &["crd-lifecycle-webhook.crd-lifecycle.svc".to_owned()],
            jiff::Timestamp::now(),
        )
        .expect("a CA")
        .ca_pem
    }

    /// The conversion example's CRD and policy (migrations off).
    pub(crate) fn harness() -> Harness {
        let mut h = Harness::new();
        h.fake
            .create_crd(yaml(include_str!("../../examples/conversion/crd.yaml")));
        let mut policy = yaml(super::CONVERSION_POLICY);
        policy["spec"]["migration"]["enabled"] = json!(false);
        h.add_policy(policy, "2025-11-01T00:00:00Z");
        h
    }

    /// The webhook behind the `crd-lifecycle/crd-lifecycle-webhook` Service, its CA loaded.
    fn service_endpoint() -> Arc<WebhookEndpoint> {
        let endpoint = Arc::new(WebhookEndpoint::new(
            WebhookTarget::parse_service("crd-lifecycle/crd-lifecycle-webhook").expect("service"),
        ));
        endpoint.set_ca_bundle(a_ca());
        endpoint
    }

    /// A dry run computes the conversion's patch but sends nothing: no Event says the CRD
    /// now converts through the webhook (it does not).
    #[tokio::test]
    async fn a_dry_run_does_not_announce_the_webhook_conversion() {
        let mut h = harness();
        h.fake
            .edit_policy("gadgets", |policy| policy["spec"]["dryRun"] = json!(true));
        h.serve_webhook(service_endpoint());
        h.at("2026-01-20T00:00:00Z");
        h.reconcile("gadgets").await;
        assert!(h.fake.crd_writes().is_empty(), "a dry run patches nothing");
        let reasons: Vec<String> = h.fake.event_summaries().into_iter().map(|(_, r, _)| r).collect();
        assert!(reasons.iter().any(|r| r == "DryRun"), "{reasons:?}");
        assert!(
            !reasons.iter().any(|r| r == "ConversionWebhookConfigured"),
            "{reasons:?}"
        );
    }

    #[tokio::test]
    async fn the_crd_is_pointed_at_the_webhook_in_the_same_guarded_patch() {
        let mut h = harness();
        h.serve_webhook(service_endpoint());
        h.at("2026-01-20T00:00:00Z");
        h.reconcile("gadgets").await;
        let writes = h.fake.crd_writes();
        assert_eq!(
            writes.len(),
            1,
            "one patch for the introductions and the conversion"
        );
        let ops = writes[0].body.as_array().expect("ops").clone();
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(ops[0]["path"], "/metadata/resourceVersion");
        let conversion = ops
            .iter()
            .find(|op| op["path"] == "/spec/conversion")
            .expect("conversion op");
        assert_eq!(conversion["value"]["strategy"], "Webhook");
        let crd = h.fake.crd(CRD);
        let client_config = &crd["spec"]["conversion"]["webhook"]["clientConfig"];
        assert_eq!(
            client_config["service"],
            json!({"namespace": "crd-lifecycle", "name": "crd-lifecycle-webhook", "path": "/convert/gadgets", "port": 443})
        );
        assert!(client_config["caBundle"].is_string());
        assert_eq!(
            crd["spec"]["conversion"]["webhook"]["conversionReviewVersions"],
            json!(["v1"])
        );
        assert!(
            h.fake
                .event_summaries()
                .iter()
                .any(|(_, r, _)| r == "ConversionWebhookConfigured")
        );
        // In step: the next reconcile patches nothing.
        h.fake.clear_requests();
        h.reconcile("gadgets").await;
        assert!(h.fake.crd_writes().is_empty());
        // Someone resets spec.conversion: it is put back.
        h.fake
            .edit_crd(CRD, |crd| crd["spec"]["conversion"] = json!({"strategy": "None"}));
        h.reconcile("gadgets").await;
        assert_eq!(h.fake.crd(CRD)["spec"]["conversion"]["strategy"], "Webhook");
    }

    fn configured() -> Harness {
        let mut h = harness();
        h.serve_webhook(service_endpoint());
        h
    }

    /// The webhook as `run` serves it: no policy left in its cache, only the CRDs' metadata.
    fn webhook_without_the_policy(crd: &serde_json::Value) -> Arc<dyn PolicySource> {
        let (policies, _) = reflector::store::<DeserializeGuard<VersionPolicy>>();
        let (crds, mut writer) = reflector::store::<PartialObjectMeta<CustomResourceDefinition>>();
        let meta: PartialObjectMeta<CustomResourceDefinition> = serde_json::from_value(
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                                          "metadata": crd["metadata"]}),
        )
        .expect("metadata");
        writer.apply_watcher_event(&watcher::Event::Apply(meta));
        Arc::new(CachedPolicies::new(policies, crds))
    }

    #[tokio::test]
    async fn the_conversion_is_recorded_on_the_crd_in_the_same_patch() {
        let mut h = configured();
        h.at("2026-01-20T00:00:00Z");
        h.reconcile("gadgets").await;
        assert_eq!(h.fake.crd_writes().len(), 1, "one guarded patch");
        let annotations = &h.fake.crd(CRD)["metadata"]["annotations"];
        let recorded: serde_json::Value =
            serde_json::from_str(annotations[CRD_CONVERSION_ANNOTATION].as_str().expect("recorded"))
                .expect("json");
        assert_eq!(recorded["policy"], "gadgets");
        assert_eq!(recorded["conversion"]["changes"][0]["from"], "v1alpha1");
        assert_eq!(
            annotations[CRD_CONVERSION_BEFORE_ANNOTATION],
            json!({"strategy": "None"}).to_string(),
            "what the CRD had before"
        );
    }

    #[tokio::test]
    async fn deleting_the_policy_keeps_every_version_readable() {
        let mut h = configured();
        h.at("2026-01-20T00:00:00Z");
        h.reconcile("gadgets").await;
        assert_eq!(
            h.fake.policy("gadgets")["metadata"]["finalizers"],
            json!([RELEASE_FINALIZER])
        );
        let conversion = h.fake.crd(CRD)["spec"]["conversion"].clone();

        // `kubectl delete vp gadgets`: the finalizer releases the CRD, then the policy goes.
        h.fake.delete_policy("gadgets");
        h.reconcile("gadgets").await;
        assert!(h.fake.policy("gadgets").is_null(), "deleted once released");
        let crd = h.fake.crd(CRD);
        assert_eq!(
            crd["spec"]["conversion"], conversion,
            "still converting through the webhook"
        );
        let released = h
            .fake
            .event_summaries()
            .into_iter()
            .find(|(_, r, _)| r == "CRDReleased")
            .expect("an event");
        assert!(released.2.contains("keeps converting"), "{released:?}");

        // The webhook still answers /convert/gadgets, from the CRD's record.
        let review = json!({"kind": "ConversionReview", "apiVersion": "apiextensions.k8s.io/v1",
            "request": {"uid": "u1", "desiredAPIVersion": "example.com/v1",
                        "objects": [super::gadget("v1alpha1", "g1", json!({"size": 3}))]}});
        let (code, answer) = webhook::review(
            review.to_string().as_bytes(),
            "gadgets",
            &webhook_without_the_policy(&crd),
        );
        assert_eq!(code, 200);
        let answer = serde_json::to_value(answer).expect("json");
        assert_eq!(answer["response"]["result"]["status"], "Success", "{answer}");
        assert_eq!(
            answer["response"]["convertedObjects"][0]["spec"]["scale"]["replicas"],
            3
        );
    }

    #[tokio::test]
    async fn a_release_that_cannot_record_the_conversion_yet_holds_the_policy() {
        let mut h = configured();
        h.at("2026-01-20T00:00:00Z");
        h.reconcile("gadgets").await;
        // As an older operator left it: pointed at the webhook, nothing recorded.
        h.fake
            .edit_crd(CRD, |crd| crd["metadata"]["annotations"] = json!({}));
        h.fake.delete_policy("gadgets");
        h.fake.fail_next_crd_patch(500, "etcd is unavailable");
        let object: DeserializeGuard<VersionPolicy> =
            serde_json::from_value(h.fake.policy("gadgets")).expect("decodes");
        let result = reconcile(Arc::new(object), h.ctx.clone()).await;
        assert!(result.is_err(), "retried");
        assert!(
            !h.fake.policy("gadgets").is_null(),
            "kept until the CRD is released"
        );
        let (status, reason, message) = h.condition("gadgets", "Blocked");
        assert_eq!((status.as_str(), reason.as_str()), ("True", "ReleasingCRD"));
        assert!(message.contains("cannot record the conversion"), "{message}");
        assert!(
            h.fake
                .event_summaries()
                .iter()
                .any(|(t, r, _)| t == "Warning" && r == "CannotReleaseCRD")
        );

        // The next attempt records it, then lets the policy go.
        h.reconcile("gadgets").await;
        assert!(h.fake.policy("gadgets").is_null());
        let annotations = &h.fake.crd(CRD)["metadata"]["annotations"];
        assert!(
            annotations[CRD_CONVERSION_ANNOTATION]
                .as_str()
                .is_some_and(|r| r.contains("\"gadgets\""))
        );
    }

    #[tokio::test]
    async fn turning_the_webhook_off_restores_the_conversion_the_crd_had() {
        let mut h = configured();
        h.at("2026-01-20T00:00:00Z");
        h.reconcile("gadgets").await;
        assert_eq!(h.fake.crd(CRD)["spec"]["conversion"]["strategy"], "Webhook");
        h.edit_policy("gadgets", |p| {
            p["spec"]["conversion"]["webhook"]["enabled"] = json!(false)
        });
        h.reconcile("gadgets").await;
        let crd = h.fake.crd(CRD);
        assert_eq!(crd["spec"]["conversion"], json!({"strategy": "None"}));
        let annotations = crd["metadata"]["annotations"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(
            !annotations.contains_key(CRD_CONVERSION_ANNOTATION),
            "{annotations:?}"
        );
        assert!(!annotations.contains_key(CRD_CONVERSION_BEFORE_ANNOTATION));
        assert!(
            h.fake
                .event_summaries()
                .iter()
                .any(|(_, r, _)| r == "ConversionRestored")
        );
        // And so does removing spec.conversion, after turning it on again.
        h.edit_policy("gadgets", |p| {
            p["spec"]["conversion"]["webhook"]["enabled"] = json!(true)
        });
        h.reconcile("gadgets").await;
        assert_eq!(h.fake.crd(CRD)["spec"]["conversion"]["strategy"], "Webhook");
        h.edit_policy("gadgets", |p| {
            p["spec"].as_object_mut().expect("spec").remove("conversion");
        });
        h.reconcile("gadgets").await;
        assert_eq!(h.fake.crd(CRD)["spec"]["conversion"], json!({"strategy": "None"}));
    }

    #[tokio::test]
    async fn without_a_webhook_the_policy_says_so_and_the_conversion_is_left_alone() {
        let mut h = harness();
        h.at("2026-01-20T00:00:00Z");
        h.reconcile("gadgets").await;
        let (status, reason, message) = h.condition("gadgets", "Blocked");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "WebhookNotConfigured")
        );
        assert!(message.contains("--webhook-port"), "{message}");
        assert!(h.fake.crd(CRD)["spec"].get("conversion").is_none());
        // The schedule itself still proceeds.
        assert_eq!(
            h.fake.crd(CRD)["spec"]["versions"][2]["served"],
            true,
            "v1 introduced"
        );
    }
}

#[tokio::test]
async fn certificates_are_kept_in_a_secret_and_renewed_with_the_same_ca() {
    let h = crate::Harness::new();
    let client = h.fake.client();
    let names = vec!["hook.ops.svc".to_owned()];
    let first = certs::ensure_secret(&client, "ops", "hook-tls", &names)
        .await
        .expect("created");
    let secret = h.fake.lock().secrets["hook-tls"].clone();
    assert_eq!(secret["type"], "kubernetes.io/tls");
    for key in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(secret["data"][key].is_string(), "{key}");
    }
    // Another replica reads the same certificates.
    let second = certs::ensure_secret(&client, "ops", "hook-tls", &names)
        .await
        .expect("read");
    assert_eq!(second, first);
    // New names: the serving certificate is re-issued by the same CA.
    let renamed = vec!["hook.ops.svc".to_owned(), "hook.ops.svc.cluster.local".to_owned()];
    let third = certs::ensure_secret(&client, "ops", "hook-tls", &renamed)
        .await
        .expect("renewed");
    assert_eq!(third.ca_pem, first.ca_pem);
    assert_ne!(third.cert_pem, first.cert_pem);
    assert_eq!(third.names, renamed);
}

/// Every `tests/fixtures/conversionreview/<case>.request.json`, answered for the example
/// conversion policy, must be exactly `<case>.response.json` (status code in `"code"`).
/// `UPDATE_FIXTURES=1` writes the responses instead (then review the diff).
#[test]
fn conversion_reviews_match_their_fixtures() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conversionreview");
    let mut cases = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir).expect("fixtures").flatten().collect();
    entries.sort_by_key(std::fs::DirEntry::path);
    for entry in entries {
        let path = entry.path();
        let Some(case) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".request.json"))
        else {
            continue;
        };
        cases += 1;
        let request = std::fs::read(&path).expect("request");
        let (code, review) = webhook::review(&request, "gadgets", &policies());
        let answered = json!({"code": code, "review": review});
        let expected_path = dir.join(format!("{case}.response.json"));
        if std::env::var_os("UPDATE_FIXTURES").is_some() {
            let text = serde_json::to_string_pretty(&answered).expect("json") + "\n";
            std::fs::write(&expected_path, text).expect("write");
            continue;
        }
        let expected: Value =
            serde_json::from_slice(&std::fs::read(&expected_path).expect("response fixture")).expect("json");
        assert_eq!(answered, expected, "{case}");
    }
    assert!(cases >= 5, "{cases} fixtures");
}
