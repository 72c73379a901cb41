//! Validation of a policy against its CRD: resolving the schedule, its own rules, the
//! Kubernetes deprecation policy when enforced, and the declarative conversion. Every problem
//! is reported at once, each with its field path.

use jiff::Timestamp;

use super::crd::CrdState;
use super::deprecation_policy;
use super::error::{Error, FieldErrors};
use super::schedule::{Schedule, resolve};
use crate::api::{Enforce, VersionPolicySpec};

impl Schedule {
    /// Resolves the policy and runs every validation rule that needs its CRD and the
    /// current instant (`now` decides whether a version missing from the CRD is already
    /// due for removal). Every problem is reported at once.
    pub fn new(spec: &VersionPolicySpec, crd: &CrdState, now: Timestamp) -> Result<Schedule, Error> {
        let mut errors = FieldErrors::default();
        let (schedule, complete) = resolve(spec, &mut errors);
        schedule.check_versions(&mut errors);
        schedule.check_against_crd(crd, now, &mut errors);
        if let Some(conversion) = &spec.conversion {
            let versions: Vec<String> = crd.versions.iter().map(|v| v.name.clone()).collect();
            let governed: Vec<String> = spec.versions.iter().map(|v| v.name.clone()).collect();
            match crate::conversion::Converter::new(conversion, &versions, &governed) {
                Ok(converter) => {
                    let schemas = crd
                        .schemas
                        .iter()
                        .map(|(version, schema)| (version.clone(), crate::schema::Schema::parse(schema)))
                        .collect();
                    let uncovered = crate::conversion::coverage::check(conversion, &converter, &schemas);
                    errors.0.extend(uncovered.0);
                }
                Err(problems) => errors.0.extend(problems.0),
            }
        }
        // Timeline rules only make sense once every milestone has an instant; otherwise
        // they would report the consequences of errors already listed.
        if complete {
            schedule.check_timeline(crd, &mut errors);
            if schedule.enforce == Some(Enforce::KubernetesDeprecationPolicy) {
                deprecation_policy::check(&schedule, crd, &mut errors);
            }
        }
        errors.into_result(schedule).map_err(Error::from)
    }
}
