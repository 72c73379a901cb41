//! The govern step: whether the policy acts on its CRD at all. The oldest policy for a CRD
//! governs it; `spec.suspend` holds every change.

use kube::ResourceExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::Store;

use crate::api::VersionPolicy;

/// Whether a policy acts on its CRD.
#[derive(Debug, PartialEq, Eq)]
pub enum Governance {
    /// It governs its CRD and acts.
    Acts,
    /// An older policy governs the same CRD (named).
    Overruled { owner: String },
    /// `spec.suspend`: it changes nothing.
    Suspended,
}

/// Whether `policy` acts on its CRD, given the other policies.
pub fn governance(policy: &VersionPolicy, policies: &Store<DeserializeGuard<VersionPolicy>>) -> Governance {
    if let Some(owner) = competing_owner(policy, policies) {
        Governance::Overruled { owner }
    } else if policy.spec.suspend {
        Governance::Suspended
    } else {
        Governance::Acts
    }
}

/// The name of an older policy governing the same CRD, if there is one: the policy with
/// the earliest creationTimestamp (then name) keeps the CRD.
pub fn competing_owner(
    policy: &VersionPolicy,
    policies: &Store<DeserializeGuard<VersionPolicy>>,
) -> Option<String> {
    let key = |p: &VersionPolicy| (p.metadata.creation_timestamp.clone().map(|t| t.0), p.name_any());
    let mine = key(policy);
    policies
        .state()
        .iter()
        .filter_map(|guard| guard.0.as_ref().ok())
        .filter(|other| {
            other.spec.crd_name == policy.spec.crd_name
                && other.metadata.deletion_timestamp.is_none()
                && other.name_any() != policy.name_any()
        })
        .map(key)
        .filter(|other| *other < mine)
        .min()
        .map(|(_, name)| name)
}
