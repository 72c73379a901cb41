//! The apiserver's validation of a CRD's versions, as far as it is recorded in
//! `../shared/apiserver-samples/`: the rules a rendered CRD must pass, so that no valid
//! policy ever produces a CRD the apiserver rejects.

use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use regex::Regex;

/// Most bytes (UTF-8) the apiserver accepts in a `deprecationWarning` (sample 22: 200 × "é",
/// 400 bytes, is rejected although its message says "characters").
pub const MAX_WARNING_BYTES: usize = 256;

/// What Go's `unicode.IsPrint` accepts (categories L, M, N, P, S and the ASCII space),
/// restricted to characters Unicode 13.0 had assigned: apiservers built with Go 1.16 to
/// 1.18 (Kubernetes 1.21 to 1.24) use Unicode 13 tables, where a later character is
/// unassigned and so not printable.
static NOT_PRINTABLE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[^\p{L}\p{M}\p{N}\p{P}\p{S} ]|[^\p{Age:13.0}]").expect("a valid pattern"));

/// The apiserver's checks of one `deprecationWarning`, with its wording: not empty (23), at
/// most 256 bytes (22), printable UTF-8 only, naming the byte index of the first other
/// character as Go's `range` does (24).
pub fn check_deprecation_warning(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("must not be an empty string".to_owned());
    }
    if text.len() > MAX_WARNING_BYTES {
        return Err(format!(
            "is {} bytes long in UTF-8 ({} characters); the apiserver accepts at most {MAX_WARNING_BYTES} bytes",
            text.len(),
            text.chars().count()
        ));
    }
    if let Some(found) = NOT_PRINTABLE.find(text) {
        let character = text[found.start()..].chars().next().unwrap_or_default();
        return Err(format!(
            "must only contain printable UTF-8 characters; non-printable character U+{:04X} found at index {}",
            u32::from(character),
            found.start()
        ));
    }
    Ok(())
}

/// Every recorded rule a CRD's versions break, as `field: message`:
/// - exactly one storage version (sample 05);
/// - every `status.storedVersions` entry still in `spec.versions` (04);
/// - every `deprecationWarning` as `check_deprecation_warning` (22-24).
pub fn violations(crd: &CustomResourceDefinition) -> Vec<String> {
    let mut found = Vec::new();
    let versions = &crd.spec.versions;
    let storage = versions.iter().filter(|v| v.storage).count();
    if storage != 1 {
        found.push(format!(
            "spec.versions: must have exactly one version marked as storage version (has {storage})"
        ));
    }
    for (i, name) in missing_stored_versions(crd) {
        found.push(format!(
            "status.storedVersions[{i}]: {name} must appear in spec.versions"
        ));
    }
    for (i, version) in versions.iter().enumerate() {
        if let Some(warning) = &version.deprecation_warning
            && let Err(message) = check_deprecation_warning(warning)
        {
            found.push(format!("spec.versions[{i}].deprecationWarning: {message}"));
        }
    }
    found
}

/// The `status.storedVersions` entries (index, version) missing from `spec.versions`: the
/// apiserver refuses such a CRD (sample 04).
pub fn missing_stored_versions(crd: &CustomResourceDefinition) -> Vec<(usize, String)> {
    crd.status
        .as_ref()
        .and_then(|s| s.stored_versions.as_deref())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, name)| !crd.spec.versions.iter().any(|v| v.name == **name))
        .map(|(i, name)| (i, name.clone()))
        .collect()
}

/// The first Kubernetes version whose apiserver explains the storage migration when a stored
/// version is missing from `spec.versions` (kubernetes/kubernetes PR 128746, as the
/// `../shared/apiserver-samples/` README records it).
pub const LONG_STORED_VERSION_WORDS_SINCE: (u32, u32) = (1, 33);

/// The apiserver's own words for a stored version missing from `spec.versions`, as the
/// server of version `(major, minor)` says them: up to 1.32 "must appear in spec.versions"
/// (sample 04 from v1.21; the samples' README: v1.24 answers in the same words); from 1.33 the
/// long form, as recorded from kube-apiserver v1.36.2
/// (`tests/fixtures/apiserver/crd-remove-stored-version-rejected-v1.36.txt`). A server of
/// unknown version gets the newer wording. Where the caller may update CRDs, `check` quotes a
/// dry run's answer instead (the apiserver's words on any version).
pub fn stored_version_rejection(index: usize, version: &str, server: Option<(u32, u32)>) -> String {
    let value = format!("status.storedVersions[{index}]: Invalid value: \"{version}\"");
    match server {
        Some(server) if server < LONG_STORED_VERSION_WORDS_SINCE => {
            format!("{value}: must appear in spec.versions")
        }
        _ => format!(
            "{value}: missing from spec.versions; {version} was previously a storage version, and must remain in \
             spec.versions until a storage migration ensures no data remains persisted in {version} and removes \
             {version} from status.storedVersions"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_rejections_are_rejected() {
        // Sample 22: 200 × "é" is 400 bytes.
        let message = check_deprecation_warning(&"é".repeat(200)).expect_err("too long");
        assert!(
            message.starts_with("is 400 bytes long in UTF-8 (200 characters)"),
            "{message}"
        );
        // Sample 23.
        assert_eq!(
            check_deprecation_warning("").expect_err("empty"),
            "must not be an empty string"
        );
        // Sample 24: U+00A0 at index 3.
        assert_eq!(
            check_deprecation_warning("use\u{a0}v1").expect_err("nbsp"),
            "must only contain printable UTF-8 characters; non-printable character U+00A0 found at index 3"
        );
    }

    #[test]
    fn a_missing_stored_version_in_the_apiservers_words() {
        // Recorded from kube-apiserver v1.36.2.
        let recorded =
            include_str!("../../tests/fixtures/apiserver/crd-remove-stored-version-rejected-v1.36.txt");
        let words = stored_version_rejection(0, "v1beta1", Some((1, 36)));
        assert!(recorded.contains(&words.replace('"', "\\\"")), "{words}");
        // apiserver-samples/04, from v1.21.
        assert_eq!(
            stored_version_rejection(0, "v1alpha1", Some((1, 21))),
            "status.storedVersions[0]: Invalid value: \"v1alpha1\": must appear in spec.versions"
        );
        // v1.24 answers in v1.21's words (apiserver-samples/README), and so does every server
        // before the long form came with 1.33 (kubernetes/kubernetes PR 128746, ibid.).
        for server in [(1, 22), (1, 24), (1, 32)] {
            assert_eq!(
                stored_version_rejection(1, "v1beta1", Some(server)),
                "status.storedVersions[1]: Invalid value: \"v1beta1\": must appear in spec.versions",
                "{server:?}"
            );
        }
        for server in [(1, 33), (1, 36), (2, 0)] {
            assert_eq!(
                stored_version_rejection(0, "v1beta1", Some(server)),
                words,
                "{server:?}"
            );
        }
    }

    #[test]
    fn printable_means_go_is_print() {
        for accepted in [
            "use v1 instead",
            "é".repeat(128).as_str(),
            "w".repeat(256).as_str(),
            "Schnee ❄ 雪 — «v1»",
            "😀",
        ] {
            assert_eq!(check_deprecation_warning(accepted), Ok(()), "{accepted:?}");
        }
        // Format characters, other spaces, controls, and characters newer than Unicode 13.
        for (rejected, index) in [
            ("a\u{200d}b", 1),
            ("soft\u{ad}hyphen", 4),
            ("zero\u{200b}width", 4),
            ("tab\there", 3),
            ("line\nbreak", 4),
            ("em\u{2003}space", 2),
            ("é\u{feff}", 2),
            ("new \u{1fae0}", 4),
        ] {
            let message = check_deprecation_warning(rejected).expect_err(rejected);
            assert!(
                message.ends_with(&format!("found at index {index}")),
                "{rejected:?}: {message}"
            );
        }
        assert!(check_deprecation_warning(&"w".repeat(257)).is_err());
    }
}
