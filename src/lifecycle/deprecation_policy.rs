//! `spec.enforce: KubernetesDeprecationPolicy`: schedules must follow the Kubernetes API
//! deprecation policy (kubernetes.io/docs/reference/using-api/deprecation-policy/).

use std::cmp::Ordering;

use jiff::{Timestamp, ToSpan, tz::TimeZone};

use super::crd::CrdState;
use super::error::FieldErrors;
use super::schedule::Schedule;
use crate::api::MilestoneKind;

/// How stable a Kubernetes-style version is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stability {
    Alpha,
    Beta,
    Ga,
}

impl Stability {
    fn name(self) -> &'static str {
        match self {
            Stability::Alpha => "alpha",
            Stability::Beta => "beta",
            Stability::Ga => "GA",
        }
    }
}

/// A version name of the form `v<major>[(alpha|beta)<minor>]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeVersion {
    pub major: u32,
    pub stability: Stability,
    pub minor: u32,
}

impl KubeVersion {
    /// Parses `v1`, `v1beta2`, `v2alpha1`; `None` for other names.
    pub fn parse(name: &str) -> Option<KubeVersion> {
        let rest = name.strip_prefix('v')?;
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let major: u32 = rest[..digits].parse().ok().filter(|m| *m > 0)?;
        let suffix = &rest[digits..];
        let (stability, minor) = if suffix.is_empty() {
            (Stability::Ga, 0)
        } else if let Some(minor) = suffix.strip_prefix("beta") {
            (Stability::Beta, minor.parse().ok().filter(|m| *m > 0)?)
        } else if let Some(minor) = suffix.strip_prefix("alpha") {
            (Stability::Alpha, minor.parse().ok().filter(|m| *m > 0)?)
        } else {
            return None;
        };
        Some(KubeVersion {
            major,
            stability,
            minor,
        })
    }
}

/// Kubernetes version priority: GA before beta before alpha, then higher major, then
/// higher minor (`v2` > `v1` > `v1beta2` > `v1beta1` > `v1alpha1`).
impl Ord for KubeVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.stability, self.major, self.minor).cmp(&(other.stability, other.major, other.minor))
    }
}

impl PartialOrd for KubeVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Adds every violation of the policy to `errors`.
pub fn check(schedule: &Schedule, crd: &CrdState, errors: &mut FieldErrors) {
    for version in &schedule.versions {
        let Some(kube) = KubeVersion::parse(&version.name) else {
            continue;
        };
        // Rule #3: an API version may not be deprecated in favor of a less stable one.
        if let Some(deprecated_at) = version.at(MilestoneKind::Deprecate) {
            let replacement = crd.versions.iter().any(|other| {
                let Some(other_kube) = KubeVersion::parse(&other.name) else {
                    return false;
                };
                let served = match schedule.version(&other.name) {
                    Some(scheduled) => scheduled.served(deprecated_at),
                    None => other.served,
                };
                other.name != version.name
                    && other_kube > kube
                    && other_kube.stability >= kube.stability
                    && served
            });
            if !replacement {
                errors.push(
                    version.path(MilestoneKind::Deprecate),
                    format!(
                        "Kubernetes deprecation policy rule #3: {} is deprecated at {deprecated_at} but no newer \
                         version at least as stable ({} or more) is served then; an API version may not be \
                         deprecated in favor of a less stable one",
                        version.name,
                        kube.stability.name()
                    ),
                );
            }
        }
        // Rule #4a: beta versions stay served 9 months after deprecation; GA versions are
        // never removed.
        if kube.stability == Stability::Beta
            && let (Some(deprecated_at), Some(unserved_at)) = (
                version.at(MilestoneKind::Deprecate),
                version.at(MilestoneKind::Unserve),
            )
        {
            let earliest = nine_months_after(deprecated_at);
            if unserved_at < earliest {
                errors.push(
                    version.path(MilestoneKind::Unserve),
                    format!(
                        "Kubernetes deprecation policy rule #4a: beta version {} must stay served at least 9 months \
                         after its deprecation ({deprecated_at}), so not be unserved before {earliest}",
                        version.name
                    ),
                );
            }
        }
        if kube.stability == Stability::Ga && version.at(MilestoneKind::Remove).is_some() {
            errors.push(
                version.path(MilestoneKind::Remove),
                format!(
                    "Kubernetes deprecation policy rule #4a: GA version {} may be deprecated but must not be removed",
                    version.name
                ),
            );
        }
    }
}

fn nine_months_after(instant: Timestamp) -> Timestamp {
    instant
        .to_zoned(TimeZone::UTC)
        .checked_add(9.months())
        .map_or(Timestamp::MAX, |z| z.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_version_names() {
        assert_eq!(
            KubeVersion::parse("v1"),
            Some(KubeVersion {
                major: 1,
                stability: Stability::Ga,
                minor: 0
            })
        );
        assert_eq!(
            KubeVersion::parse("v2beta3"),
            Some(KubeVersion {
                major: 2,
                stability: Stability::Beta,
                minor: 3
            })
        );
        assert_eq!(
            KubeVersion::parse("v1alpha1"),
            Some(KubeVersion {
                major: 1,
                stability: Stability::Alpha,
                minor: 1
            })
        );
        for other in ["v", "v0", "1", "v1beta", "v1gamma1", "foo", "v1alpha0", "V1"] {
            assert_eq!(KubeVersion::parse(other), None, "{other}");
        }
    }

    #[test]
    fn orders_by_kubernetes_priority() {
        let mut names = vec![
            "v1alpha1",
            "v11alpha2",
            "v1",
            "v10beta3",
            "v1beta2",
            "v2",
            "v1beta1",
            "v3beta1",
            "v12alpha1",
        ];
        names.sort_by_key(|n| std::cmp::Reverse(KubeVersion::parse(n).expect("kube version")));
        assert_eq!(
            names,
            [
                "v2",
                "v1",
                "v10beta3",
                "v3beta1",
                "v1beta2",
                "v1beta1",
                "v12alpha1",
                "v11alpha2",
                "v1alpha1"
            ]
        );
    }

    #[test]
    fn nine_calendar_months() {
        let at: Timestamp = "2026-05-31T00:00:00Z".parse().expect("instant");
        assert_eq!(nine_months_after(at).to_string(), "2027-02-28T00:00:00Z");
    }
}
