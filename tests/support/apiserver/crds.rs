//! CustomResourceDefinitions: guarded JSON Patches with the apiserver's checks, and the
//! status subresource.

use serde_json::Value;

use super::*;

/// JSON Patch or merge patch (`merge`) on a CRD, with the apiserver's checks:
/// - a failing `test` op answers 422 with a generic message (apiserver-samples/03);
/// - a merge patch carrying a stale `metadata.resourceVersion` answers 409 Conflict
///   (tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 3b);
/// - exactly one storage version (05), every stored version still in spec.versions (04);
/// - every deprecationWarning as `deprecation_warning_problem` (22-24);
/// - the webhook's `caBundle` as `ca_bundle_problem`; an empty one is dropped (ibid., 4b);
/// - a new storage version is appended to status.storedVersions (02, 06);
/// - a patch that changes nothing keeps the resourceVersion and sends no watch event
///   (tests/fixtures/watch/crds-metadata.txt).
pub(super) fn patch_crd(state: &mut State, name: &str, body: Value, merge: bool) -> (u16, Value) {
    if let Some(hook) = state.before_crd_patch.pop_front() {
        hook(state);
    }
    if let Some((code, message)) = state.crd_patch_failures.pop_front() {
        return (code, status_body(code, "Invalid", &message));
    }
    let Some(mut crd) = state.crds.get(name).cloned() else {
        return not_found("customresourcedefinitions.apiextensions.k8s.io", name);
    };
    let before = crd["spec"].clone();
    if merge {
        if let Some(expected) = body.pointer("/metadata/resourceVersion")
            && *expected != crd["metadata"]["resourceVersion"]
        {
            return conflict("customresourcedefinitions.apiextensions.k8s.io", name);
        }
        json_patch::merge(&mut crd, &body);
    } else if let Err(answer) = apply_json_patch(&mut crd, &body) {
        return answer;
    }
    let client_config = crd
        .pointer_mut("/spec/conversion/webhook/clientConfig")
        .and_then(Value::as_object_mut);
    if let Some(config) = client_config {
        if config.get("caBundle").and_then(Value::as_str) == Some("") {
            config.remove("caBundle");
        }
        if let Some(encoded) = config.get("caBundle").cloned() {
            let Some(pem) = encoded
                .as_str()
                .and_then(|b| base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b).ok())
            else {
                // Not base64: no recorded answer, so no test may send it.
                state
                    .unknown_requests
                    .push(format!("PATCH of CRD {name} with a caBundle that is not base64"));
                return (501, status_body(501, "NotImplemented", "caBundle is not base64"));
            };
            if let Some(problem) = ca_bundle_problem(&pem) {
                return refused_validation(state, ca_bundle_invalid(name, &encoded, problem));
            }
        }
    }
    let versions = crd["spec"]["versions"].as_array().cloned().unwrap_or_default();
    let storage: Vec<&Value> = versions.iter().filter(|v| v["storage"] == true).collect();
    if storage.len() != 1 {
        let message = format!(
            "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: spec.versions: Invalid value: ...: \
             must have exactly one version marked as storage version"
        );
        return refused_validation(state, (422, status_body(422, "Invalid", &message)));
    }
    for (i, version) in versions.iter().enumerate() {
        if let Some(warning) = version["deprecationWarning"].as_str()
            && let Some(problem) = deprecation_warning_problem(warning)
        {
            let message = format!(
                "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: \
                 spec.versions[{i}].deprecationWarning: Invalid value: {}: {problem}",
                Value::String(warning.to_owned())
            );
            return refused_validation(state, (422, status_body(422, "Invalid", &message)));
        }
    }
    let storage_name = storage[0]["name"].clone();
    let stored = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, stored_version) in stored.iter().enumerate() {
        if !versions.iter().any(|v| v["name"] == *stored_version) {
            let refused = format!("{name}: {stored_version} dropped from spec.versions");
            let sender = state.sender.clone();
            state.refused_stored_version_drops.push((sender, refused));
            return stored_version_invalid(
                state.version(),
                name,
                i,
                stored_version.as_str().unwrap_or_default(),
            );
        }
    }
    if !stored.contains(&storage_name) {
        let mut stored = stored;
        stored.push(storage_name);
        crd["status"]["storedVersions"] = Value::Array(stored);
    }
    if state.crds.get(name) == Some(&crd) {
        return (200, crd);
    }
    let spec_changed = crd["spec"] != before;
    state.store_crd(crd, spec_changed);
    (200, state.crds[name].clone())
}

/// A CRD patch refused by the apiserver's validation, counted against its sender
/// (`State::refused_crd_validations`).
fn refused_validation(state: &mut State, (code, body): (u16, Value)) -> (u16, Value) {
    let message = body["message"].as_str().unwrap_or_default().to_owned();
    let sender = state.sender.clone();
    state.refused_crd_validations.push((sender, message));
    (code, body)
}

/// Why the apiserver refuses a `caBundle` (PEM), as client-go's root pool words it
/// (tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 4): none when one PEM
/// `CERTIFICATE` block parses as X.509, whatever else the bundle holds (4d); else the first
/// problem: no PEM block at all (4a: base64 that does not decode counts as none), a
/// `CERTIFICATE` block that is not X.509 (4c; Go's wording of the parse error varies, the
/// fake gives the recorded one), or no `CERTIFICATE` block (4e).
pub(super) fn ca_bundle_problem(pem: &[u8]) -> Option<&'static str> {
    use x509_parser::pem::Pem;
    let mut blocks = 0;
    let mut problem = None;
    for block in Pem::iter_from_buffer(pem) {
        let Ok(block) = block else {
            problem.get_or_insert("unable to parse bytes as PEM block");
            break;
        };
        blocks += 1;
        if block.label != "CERTIFICATE" {
            continue;
        }
        if x509_parser::parse_x509_certificate(&block.contents).is_ok() {
            return None;
        }
        problem.get_or_insert("failed to parse certificate: x509: malformed certificate");
    }
    if blocks == 0 {
        return Some("unable to parse bytes as PEM block");
    }
    Some(problem.unwrap_or("no valid certificate authority data seen"))
}

/// The 422 for a `caBundle` the apiserver cannot load, naming the field and the value
/// (base64) as tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 4a, does.
fn ca_bundle_invalid(name: &str, encoded: &Value, problem: &str) -> (u16, Value) {
    let field = "spec.conversion.webhookClientConfig.caBundle";
    let cause = format!("Invalid value: {encoded}: unable to load root certificates: {problem}");
    let mut body = status_body(
        422,
        "Invalid",
        &format!("CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: {field}: {cause}"),
    );
    body["details"] = serde_json::json!({
        "name": name, "group": "apiextensions.k8s.io", "kind": "CustomResourceDefinition",
        "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": field}],
    });
    (422, body)
}

/// The 422 for a stored version missing from `spec.versions`, as the apiserver of `server`
/// words it: up to 1.32 "must appear in spec.versions" (apiserver-samples/04, v1.21; the
/// samples' README: v1.24 answers in the same words), from 1.33 (kubernetes/kubernetes PR
/// 128746, ibid.) the long form of tests/fixtures/apiserver/crd-remove-stored-version-rejected-v1.36.txt.
/// The cause names the field, as both recordings do.
pub(super) fn stored_version_invalid(
    server: (u32, u32),
    name: &str,
    index: usize,
    version: &str,
) -> (u16, Value) {
    let words = if server < (1, 33) {
        "must appear in spec.versions".to_owned()
    } else {
        format!(
            "missing from spec.versions; {version} was previously a storage version, and must remain in spec.versions \
             until a storage migration ensures no data remains persisted in {version} and removes {version} from \
             status.storedVersions"
        )
    };
    let field = format!("status.storedVersions[{index}]");
    let cause = format!("Invalid value: \"{version}\": {words}");
    let mut body = status_body(
        422,
        "Invalid",
        &format!("CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: {field}: {cause}"),
    );
    body["details"] = serde_json::json!({
        "name": name, "group": "apiextensions.k8s.io", "kind": "CustomResourceDefinition",
        "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": field}],
    });
    (422, body)
}

/// A dry run (`dryRun=All`) of a CRD's update (PUT), as kube-apiserver v1.36.2 answers it
/// (tests/fixtures/apiserver/crd-dry-run-update-rejected-v1.36.txt): the body replaces the
/// spec, the status stays the stored one, and the CRD is validated as a write would be (its
/// storage versions, sample 05; its stored versions, `stored_version_invalid`), but nothing is
/// stored. A stale resourceVersion answers 409 (sample 12, as any write with a stale
/// precondition); a caller without `update` on CRDs (`crd_updates_forbidden`) 403
/// (tests/fixtures/apiserver/crd-dry-run-update-forbidden-v1.36.txt). A PUT that is not a dry
/// run is not served: nothing crd-lifecycle runs replaces a CRD.
pub(super) fn dry_run_update_crd(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    if state.crd_updates_forbidden {
        let mut answer = status_body(
            403,
            "Forbidden",
            &format!(
                "customresourcedefinitions.apiextensions.k8s.io \"{name}\" is forbidden: User \
                 \"system:serviceaccount:default:upgrade-check\" cannot update resource \
                 \"customresourcedefinitions\" in API group \"apiextensions.k8s.io\" at the cluster scope"
            ),
        );
        answer["details"] = serde_json::json!({
            "name": name, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"
        });
        return (403, answer);
    }
    let Some(live) = state.crds.get(name).cloned() else {
        return not_found("customresourcedefinitions.apiextensions.k8s.io", name);
    };
    if body["metadata"]["resourceVersion"] != live["metadata"]["resourceVersion"] {
        return conflict("customresourcedefinitions.apiextensions.k8s.io", name);
    }
    let mut crd = live;
    crd["spec"] = body["spec"].clone();
    let versions = crd["spec"]["versions"].as_array().cloned().unwrap_or_default();
    if versions.iter().filter(|v| v["storage"] == true).count() != 1 {
        let message = format!(
            "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: spec.versions: Invalid value: ...: \
             must have exactly one version marked as storage version"
        );
        return (422, status_body(422, "Invalid", &message));
    }
    let stored = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, stored_version) in stored.iter().enumerate() {
        if !versions.iter().any(|v| v["name"] == *stored_version) {
            return stored_version_invalid(
                state.version(),
                name,
                i,
                stored_version.as_str().unwrap_or_default(),
            );
        }
    }
    (200, crd)
}

/// The apiserver's deprecationWarning checks, with its messages: not empty (sample 23), at
/// most 256 bytes although the message says characters (22), printable only, naming the
/// byte index (24). Printable is Go's `unicode.IsPrint`: categories L, M, N, P, S and the
/// ASCII space.
pub(super) fn deprecation_warning_problem(warning: &str) -> Option<String> {
    if warning.is_empty() {
        return Some("must not be an empty string".to_owned());
    }
    if warning.len() > 256 {
        return Some("must be <= 256 characters long".to_owned());
    }
    let not_printable = regex::Regex::new(r"[^\p{L}\p{M}\p{N}\p{P}\p{S} ]").expect("pattern");
    not_printable.find(warning).map(|found| {
        format!(
            "must only contain printable UTF-8 characters; non-printable character found at index {}",
            found.start()
        )
    })
}

impl State {
    /// Another writer (a GitOps tool re-applying an older CRD, or the controller restoring
    /// the newer one) makes `version` the storage version: the apiserver appends it to
    /// `status.storedVersions` if missing (samples 02, 06), and the generation moves.
    pub fn switch_storage(&mut self, name: &str, version: &str) {
        let Some(mut crd) = self.crds.get(name).cloned() else {
            return;
        };
        for v in crd["spec"]["versions"].as_array_mut().into_iter().flatten() {
            v["storage"] = Value::Bool(v["name"] == version);
        }
        let stored = crd["status"]["storedVersions"]
            .as_array_mut()
            .expect("storedVersions");
        if !stored.iter().any(|v| v == version) {
            stored.push(Value::String(version.to_owned()));
        }
        self.store_crd(crd, true);
    }
}

/// Merge patch on the CRD status subresource: accepted whatever the objects are stored
/// as (apiserver-samples/14); a stale `metadata.resourceVersion` answers 409 Conflict, as
/// any write with a stale precondition (sample 12).
pub(super) fn patch_crd_status(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    if let Some(hook) = state.before_crd_status_patch.pop_front() {
        hook(state);
    }
    let Some(mut crd) = state.crds.get(name).cloned() else {
        return not_found("customresourcedefinitions.apiextensions.k8s.io", name);
    };
    if let Some(expected) = body.pointer("/metadata/resourceVersion").and_then(Value::as_str)
        && crd["metadata"]["resourceVersion"].as_str() != Some(expected)
    {
        return conflict("customresourcedefinitions.apiextensions.k8s.io", name);
    }
    if let Some(status) = body.get("status") {
        json_patch::merge(&mut crd["status"], status);
    }
    state.store_crd(crd, false);
    (200, state.crds[name].clone())
}

/// `kubectl delete crd`, as kube-apiserver v1.36.2 carries it out
/// (tests/fixtures/apiserver/crd-deletion-v1.36.txt). The DELETE sets `deletionTimestamp`,
/// appends the apiserver's finalizer `customresourcecleanup.apiextensions.k8s.io` and the
/// condition `Terminating` True/`InstanceDeletionPending`; within ~30 ms its finalizer moves
/// it to `InstanceDeletionInProgress` and deletes every instance (the fake's objects carry no
/// finalizers: they go at once). `finish_crd_deletion` does the rest, ~5 s later in the
/// recording.
impl State {
    pub fn start_crd_deletion(&mut self, name: &str) {
        let Some(mut crd) = self.crds.get(name).cloned() else {
            return;
        };
        let now = self.now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        crd["metadata"]["deletionTimestamp"] = Value::String(now.clone());
        let finalizers = crd["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .chain([Value::String(CRD_CLEANUP_FINALIZER.into())])
            .collect();
        crd["metadata"]["finalizers"] = Value::Array(finalizers);
        for (reason, message) in [
            (
                "InstanceDeletionPending",
                "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
            ),
            (
                "InstanceDeletionInProgress",
                "CustomResource deletion is in progress",
            ),
        ] {
            set_terminating(&mut crd, "True", reason, message, &now);
            self.store_crd(crd.clone(), false);
            crd = self.crds[name].clone();
        }
        self.objects.retain(|(of, _, _), _| of != name);
    }

    /// The end of a CRD's deletion (the recording's +5 s): `Terminating` False
    /// `InstanceDeletionCompleted` "removed all instances" and the apiserver's finalizer
    /// removed in one update; with another finalizer left, the CRD stays (as recorded), else
    /// that update deletes it: `DELETED` with the CRD as last stored, at a new
    /// resourceVersion (the recording's DELETED event shows the state before the update that
    /// removed the last finalizer), then GET 404 NotFound and, for its objects' paths, the
    /// plain-text 404 of an unserved path.
    pub fn finish_crd_deletion(&mut self, name: &str) {
        let Some(mut crd) = self.crds.get(name).cloned() else {
            return;
        };
        if crd["metadata"]["deletionTimestamp"].is_null() {
            return;
        }
        let last_stored = crd.clone();
        let now = self.now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        set_terminating(
            &mut crd,
            "False",
            "InstanceDeletionCompleted",
            "removed all instances",
            &now,
        );
        let finalizers: Vec<Value> = crd["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != CRD_CLEANUP_FINALIZER)
            .collect();
        if !finalizers.is_empty() {
            crd["metadata"]["finalizers"] = Value::Array(finalizers);
            self.store_crd(crd, false);
            return;
        }
        let mut crd = last_stored;
        let rv = self.next_resource_version();
        crd["metadata"]["resourceVersion"] = Value::String(rv);
        self.crds.remove(name);
        self.lagging.remove(name);
        if let (Some(group), Some(plural)) = (
            crd["spec"]["group"].as_str(),
            crd["spec"]["names"]["plural"].as_str(),
        ) {
            self.gone_resources.insert((group.to_owned(), plural.to_owned()));
        }
        // `DELETED` with the CRD as last stored, at a new resourceVersion
        // (tests/fixtures/apiserver/crd-deletion-v1.36.txt).
        self.record(Watched::Crds, "DELETED", &crd);
    }
}

/// The finalizer the apiserver adds to a CRD being deleted.
const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

fn set_terminating(crd: &mut Value, status: &str, reason: &str, message: &str, now: &str) {
    let condition = serde_json::json!({"type": "Terminating", "status": status, "reason": reason,
                                       "message": message, "lastTransitionTime": now});
    let conditions = crd["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != "Terminating")
        .chain([condition])
        .collect();
    crd["status"]["conditions"] = Value::Array(conditions);
}
