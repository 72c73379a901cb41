//! How the tests write a version's flags: `s` served, `S` storage, `d` deprecated, `-`
//! none of them (e.g. `v1alpha1:sd v1:sS`).

pub fn letters(served: bool, storage: bool, deprecated: bool) -> String {
    let flags: String = [(served, 's'), (storage, 'S'), (deprecated, 'd')]
        .into_iter()
        .filter_map(|(on, letter)| on.then_some(letter))
        .collect();
    if flags.is_empty() { "-".to_owned() } else { flags }
}

/// A CRD's versions as `name:flags`, space-separated.
#[allow(dead_code)] // not every test target reads typed CRDs
pub fn of_crd(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> String {
    crd.spec
        .versions
        .iter()
        .map(|v| {
            format!(
                "{}:{}",
                v.name,
                letters(v.served, v.storage, v.deprecated == Some(true))
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}
