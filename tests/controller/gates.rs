//! Each gate holds its milestone back, says why in status and events, and lets it proceed
//! once its condition holds.

use crd_lifecycle::controller::traffic::parse_metrics;
use serde_json::{Value, json};

use super::{CRD, EXAMPLE_CRD, Harness, preflight_of, ts, wait_until, yaml};
use crate::apiserver::ObjectFault;

/// The example CRD with a policy whose versions are `versions` (migration off unless
/// `migration` says otherwise).
fn harness(versions: Value, migration: Value) -> Harness {
    let mut h = Harness::new();
    h.fake.create_crd(yaml(EXAMPLE_CRD));
    h.add_policy(
        json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy", "metadata": {"name": "widgets"},
               "spec": {"crdName": CRD, "versions": versions, "migration": migration}}),
        "2025-11-01T00:00:00Z",
    );
    h
}

fn warnings(h: &Harness, reason: &str) -> Vec<String> {
    h.fake
        .event_summaries()
        .into_iter()
        .filter(|(t, r, _)| t == "Warning" && r == reason)
        .map(|(_, _, note)| note)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_approval_holds_the_store_until_the_annotation_names_it() {
    let mut h = harness(
        json!([{"name": "v1", "introduce": {"at": "2026-01-15T00:00:00Z"},
                "store": {"at": "2026-02-01T00:00:00Z", "approval": "Required"}}]),
        json!({"enabled": false}),
    );
    h.at("2026-02-02T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:s", "introduced, not stored");
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "AwaitingApproval"));
    let command = "kubectl annotate --overwrite versionpolicy widgets crdlifecycle.io/approve=v1.store";
    assert!(message.contains(command), "{message}");
    assert!(
        warnings(&h, "AwaitingApproval")
            .iter()
            .any(|n| n.contains(command))
    );

    // Approved with kubectl annotate (its managedFields entry names the manager).
    h.edit_policy("widgets", |p| {
        p["metadata"]["annotations"] = json!({"crdlifecycle.io/approve": "v1.store"});
        p["metadata"]["managedFields"] = json!([{
            "manager": "kubectl-annotate", "operation": "Update", "apiVersion": "crdlifecycle.io/v1alpha1",
            "time": "2026-02-02T09:30:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:crdlifecycle.io/approve": {}}}}
        }]);
    });
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:s v1:sS");
    assert_eq!(h.condition("widgets", "Blocked").0, "False");
    let history = h.status("widgets")["history"].clone();
    let store = history
        .as_array()
        .and_then(|entries| entries.iter().find(|e| e["milestone"] == "store"))
        .cloned()
        .expect("store in history");
    assert_eq!(store["approvedBy"], "kubectl-annotate");
    assert_eq!(store["approvedAt"], "2026-02-02T09:30:00Z");
    let introduce = history
        .as_array()
        .and_then(|e| e.iter().find(|e| e["milestone"] == "introduce"))
        .cloned();
    assert!(
        introduce.is_some_and(|e| e.get("approvedBy").is_none()),
        "introduce needed no approval"
    );
}

const METRICS_QUIET: &str = r#"apiserver_request_total{code="200",group="example.com",resource="widgets",verb="LIST",version="v1"} 40
apiserver_request_total{code="200",group="example.com",resource="widgets",verb="GET",version="v1beta1"} 7
"#;

#[tokio::test(start_paused = true)]
async fn a_traffic_gate_holds_the_unserve_while_clients_call_the_version() {
    let mut h = harness(
        json!([
            {"name": "v1", "introduce": {"at": "2026-01-15T00:00:00Z"}, "store": {"at": "2026-02-01T00:00:00Z"}},
            {"name": "v1beta1", "deprecate": {"at": "2026-03-01T00:00:00Z"},
             "unserve": {"at": "2026-04-01T00:00:00Z", "requireNoTrafficFor": "1h"}},
        ]),
        json!({"enabled": false}),
    );
    h.trim_stored_versions(&["v1alpha1"]);
    h.fake.lock().metrics_text = METRICS_QUIET.to_owned();

    // Not sampled yet: held, and the status says why.
    h.at("2026-04-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.condition("widgets", "Blocked").1, "VersionInUse");
    assert!(
        h.status("widgets")["traffic"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("first sample")
    );

    // Sampled at 20:00 (watching starts), then a client request by 00:40.
    h.ctx
        .traffic
        .record(&parse_metrics(METRICS_QUIET), ts("2026-03-31T20:00:00Z"));
    let busier = METRICS_QUIET.replace("} 7", "} 9");
    h.ctx
        .traffic
        .record(&parse_metrics(&busier), ts("2026-04-01T00:40:00Z"));
    h.at("2026-04-01T01:00:00Z");
    h.reconcile("widgets").await;
    assert!(h.flags().contains("v1beta1:sd"), "still served: {}", h.flags());
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "VersionInUse");
    assert!(
        message.contains("last request seen at 2026-04-01T00:40:00Z"),
        "{message}"
    );
    let traffic = &h.status("widgets")["traffic"][0];
    assert_eq!(traffic["lastRequestAt"], "2026-04-01T00:40:00Z");
    assert_eq!(traffic["windowSatisfiedAt"], "2026-04-01T01:40:00Z");
    assert!(
        warnings(&h, "VersionInUse")
            .iter()
            .any(|n| n.contains("v1beta1 unserve waits for"))
    );

    // Quiet since: once the hour has passed, the version stops being served.
    h.ctx
        .traffic
        .record(&parse_metrics(&busier), ts("2026-04-01T01:41:00Z"));
    h.at("2026-04-01T01:41:00Z");
    h.reconcile("widgets").await;
    assert!(h.flags().contains("v1beta1:d"), "unserved: {}", h.flags());
    assert_eq!(h.condition("widgets", "Blocked").0, "False");
}

#[tokio::test(start_paused = true)]
async fn a_failed_conversion_preflight_holds_the_store_until_objects_convert() {
    let mut h = harness(
        json!([{"name": "v1", "introduce": {"at": "2026-01-15T00:00:00Z"}, "store": {"at": "2026-02-01T00:00:00Z"}}]),
        json!({"enabled": true, "pageSize": 20}),
    );
    h.fake.add_objects(CRD, 50, 2, "v1alpha1");
    h.fake.set_fault(
        "ns1",
        "w00007",
        ObjectFault::ConversionFails("spec.size must be an integer".into()),
    );
    h.at("2026-02-01T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "ConversionPreflightFailed");
    assert!(message.contains("ns1/w00007"), "{message}");
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:s", "storage not switched");
    let preflight = h.preflight("widgets", "v1");
    assert_eq!(preflight["phase"], "Failed");
    assert_eq!(preflight["version"], "v1");
    assert!(
        h.fake.object_requests().iter().all(|r| r.method == "GET"),
        "the preflight writes nothing"
    );
    assert!(!warnings(&h, "ConversionPreflightFailed").is_empty());

    // The object is fixed: once the wait after a failure is over (100 ms here, by the
    // failure's finishedAt), the preflight runs again and the store proceeds.
    h.fake.lock().faults.clear();
    h.reconcile("widgets").await;
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    assert_eq!(
        h.preflight("widgets", "v1")["phase"],
        "Failed",
        "not before the wait"
    );
    h.at("2026-02-01T00:00:01Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    wait_until("the preflight passes", || {
        preflight_of(&fake, "widgets", "v1")["phase"] == "Succeeded"
    })
    .await;
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:s v1:sS");
}

#[tokio::test(start_paused = true)]
async fn traffic_is_sampled_from_the_apiserver_metrics() {
    let h = Harness::new();
    let key = (
        "example.com".to_owned(),
        "v1alpha1".to_owned(),
        "widgets".to_owned(),
    );
    assert_eq!(h.ctx.traffic.observation(&key), None, "unknown until sampled");
    h.fake.lock().metrics_text = include_str!("../fixtures/metrics-excerpt.txt").to_owned();
    h.ctx.traffic.sample_once().await;
    let first = h.ctx.traffic.observation(&key).expect("watching");
    assert_eq!(first.last_request, None, "the first sample only starts the watch");
    assert!(
        h.fake
            .requests()
            .iter()
            .any(|r| r.method == "GET" && r.path == "/metrics")
    );
    // A client lists v1alpha1 once more.
    let more = include_str!("../fixtures/metrics-excerpt.txt").replace(
        r#"verb="LIST",version="v1alpha1"} 1"#,
        r#"verb="LIST",version="v1alpha1"} 2"#,
    );
    h.fake.lock().metrics_text = more;
    h.ctx.traffic.sample_once().await;
    let second = h.ctx.traffic.observation(&key).expect("watching");
    assert!(second.last_request.is_some());
    assert_eq!(second.watching_since, first.watching_since);
}
