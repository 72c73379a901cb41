//! One reconcile's exact request sequence, over a `tower_test` mock: any extra or missing
//! call fails the test (as kube-rs/controller-rs's `fixtures.rs` pins its reconciles).

use std::sync::Arc;
use std::time::Duration;

use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::controller::{Context, RELEASE_FINALIZER, reconcile};
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use kube::core::DeserializeGuard;
use kube::runtime::reflector;
use serde_json::{Value, json};

use super::{EXAMPLE_CRD, EXAMPLE_POLICY, yaml};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Takes the next request; it must be `method path` (query ignored). Returns its body.
async fn expect(handle: &mut Handle, method: &str, path: &str, answer: Value) -> (String, Value) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request; expected {method} {path}"))
        .unwrap_or_else(|| panic!("the client went away; expected {method} {path}"));
    assert_eq!(
        (request.method().as_str(), request.uri().path()),
        (method, path),
        "unexpected request"
    );
    let query = request.uri().query().unwrap_or_default().to_owned();
    let bytes = request.into_body().collect_bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    send.send_response(
        Response::builder()
            .status(if method == "POST" { 201 } else { 200 })
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&answer).expect("json")))
            .expect("response"),
    );
    (query, body)
}

/// Takes the next request, `GET path`, and answers it as the apiserver answers a group it
/// does not serve: `404 page not found`, as text (tests/fixtures/storagemigration-group-not-served.txt).
async fn expect_group_not_served(handle: &mut Handle, path: &str) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request; expected GET {path}"))
        .unwrap_or_else(|| panic!("the client went away; expected GET {path}"));
    assert_eq!(
        (request.method().as_str(), request.uri().path()),
        ("GET", path),
        "unexpected request"
    );
    send.send_response(
        Response::builder()
            .status(404)
            .header("content-type", "text/plain; charset=utf-8")
            .header("x-content-type-options", "nosniff")
            .body(Body::from(b"404 page not found\n".to_vec()))
            .expect("response"),
    );
}

fn context(client: Client) -> Arc<Context> {
    let (store, _writer) = reflector::store();
    let now: jiff::Timestamp = "2026-01-05T00:00:00Z".parse().expect("instant");
    super::test_context(client, Arc::new(move || now), store)
}

#[tokio::test(start_paused = true)]
async fn a_store_transition_is_exactly_these_requests() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, "default"));
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["metadata"]["uid"] = json!("uid-widgets");
    policy["metadata"]["generation"] = json!(1);
    policy["metadata"]["finalizers"] = json!([RELEASE_FINALIZER]);
    policy["spec"]["migration"] = json!({"enabled": false, "preflight": false});
    let object: DeserializeGuard<VersionPolicy> = serde_json::from_value(policy.clone()).expect("policy");
    let running = tokio::spawn(reconcile(Arc::new(object), ctx));

    let mut crd = yaml(EXAMPLE_CRD);
    crd["metadata"]["resourceVersion"] = json!("7");
    let path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    // Read the CRD.
    expect(&mut handle, "GET", path, crd.clone()).await;
    // A store waits while a StorageVersionMigration of the resource is unfinished: is the
    // built-in migrator's API served at all? (Not here: no migration to wait for.)
    expect_group_not_served(&mut handle, "/apis/storagemigration.k8s.io").await;
    // The guarded patch: v1beta1 becomes the storage version.
    let (_, patch) = expect(&mut handle, "PATCH", path, crd.clone()).await;
    assert_eq!(
        patch[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
    );
    assert!(patch.as_array().is_some_and(|ops| {
        ops.contains(&json!({"op": "replace", "path": "/spec/versions/1/storage", "value": true}))
    }));
    // The event for the transition.
    let (_, event) = expect(
        &mut handle,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        json!({}),
    )
    .await;
    assert_eq!(event["reason"], "StorageVersionChanged");
    // The recorded history, read past the cache; then the status, server-side applied.
    expect(
        &mut handle,
        "GET",
        "/apis/crdlifecycle.io/v1alpha1/versionpolicies/widgets",
        policy.clone(),
    )
    .await;
    let (query, status) = expect(
        &mut handle,
        "PATCH",
        "/apis/crdlifecycle.io/v1alpha1/versionpolicies/widgets/status",
        policy,
    )
    .await;
    assert!(
        query.contains("fieldManager=crd-lifecycle") && query.contains("force=true"),
        "{query}"
    );
    assert_eq!(status["status"]["history"][0]["milestone"], "store");

    running.await.expect("no panic").expect("reconciles");
    // Nothing else.
    let more = tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await;
    assert!(matches!(more, Err(_) | Ok(None)), "an extra request");
}

#[tokio::test(start_paused = true)]
async fn a_new_policy_gets_its_finalizer_first() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, "default"));
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["metadata"]["uid"] = json!("uid-widgets");
    policy["spec"]["migration"] = json!({"enabled": false, "preflight": false});
    let object: DeserializeGuard<VersionPolicy> = serde_json::from_value(policy.clone()).expect("policy");
    let running = tokio::spawn(reconcile(Arc::new(object), ctx));

    let (_, patch) = expect(
        &mut handle,
        "PATCH",
        "/apis/crdlifecycle.io/v1alpha1/versionpolicies/widgets",
        policy.clone(),
    )
    .await;
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/metadata/finalizers", "value": [RELEASE_FINALIZER]}])
    );
    let mut crd = yaml(EXAMPLE_CRD);
    crd["metadata"]["resourceVersion"] = json!("7");
    let path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    expect(&mut handle, "GET", path, crd.clone()).await;
    expect_group_not_served(&mut handle, "/apis/storagemigration.k8s.io").await;
    expect(&mut handle, "PATCH", path, crd).await;
    expect(
        &mut handle,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        json!({}),
    )
    .await;
    expect(
        &mut handle,
        "GET",
        "/apis/crdlifecycle.io/v1alpha1/versionpolicies/widgets",
        policy.clone(),
    )
    .await;
    expect(
        &mut handle,
        "PATCH",
        "/apis/crdlifecycle.io/v1alpha1/versionpolicies/widgets/status",
        policy,
    )
    .await;
    running.await.expect("no panic").expect("reconciles");
}
