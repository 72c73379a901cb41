//! `crd-lifecycle plan`: the CRD as a policy says it must be at an instant, offline.

mod markdown;
mod table;

use std::io::Write;

use jiff::Timestamp;

use crate::api::VersionPolicy;
use crate::lifecycle::{self, CrdState, Evaluation, FieldErrors, Schedule};
use crate::manifest::{self, origin_of};

/// Failures of `plan`; all of them are bad input (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Manifest(#[from] manifest::Error),
    #[error("{origin}: {source}")]
    Policy {
        origin: String,
        #[source]
        source: lifecycle::Error,
    },
    #[error("--policy and --crd cannot both be read from stdin")]
    BothFromStdin,
    #[error("--stored-versions: {0}")]
    StoredVersions(String),
    #[error("cannot write the output: {0}")]
    Output(String),
}

/// How `plan` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// The CRD manifest as YAML.
    Yaml,
    /// The CRD manifest as JSON.
    Json,
    /// The timeline and the versions, for people.
    Table,
    /// The lifecycle page for the CRD's users (independent of the instant).
    Markdown,
}

/// What `plan` evaluates.
#[derive(Clone, Debug)]
pub struct PlanSettings {
    /// The VersionPolicy file (`-` for stdin).
    pub policy: String,
    /// The CRD file (`-` for stdin).
    pub crd: String,
    /// The instant to evaluate at.
    pub at: Timestamp,
    /// `status.storedVersions` to assume, instead of "every migration completes at its
    /// storage switch".
    pub stored_versions: Option<Vec<String>>,
    pub output: OutputFormat,
}

/// Runs `plan` and writes its output.
pub fn run(args: &PlanSettings, out: &mut impl Write) -> Result<(), Error> {
    if args.policy == "-" && args.crd == "-" {
        return Err(Error::BothFromStdin);
    }
    let policy = manifest::parse_policy(&manifest::read_source(&args.policy)?, &origin_of(&args.policy))?;
    let (crd, crd_value) = manifest::parse_crd(&manifest::read_source(&args.crd)?, &origin_of(&args.crd))?;
    let plan = Plan::new(&policy, CrdState::from_crd(&crd), args).map_err(|source| Error::Policy {
        origin: origin_of(&args.policy),
        source,
    })?;
    let rendered = match args.output {
        OutputFormat::Yaml => {
            let manifest = lifecycle::as_manifest(lifecycle::render_crd(&crd_value, &plan.evaluation));
            serde_saphyr::to_string(&manifest).map_err(|e| Error::Output(e.to_string()))?
        }
        OutputFormat::Json => {
            let manifest = lifecycle::as_manifest(lifecycle::render_crd(&crd_value, &plan.evaluation));
            let mut json =
                serde_json::to_string_pretty(&manifest).map_err(|e| Error::Output(e.to_string()))?;
            json.push('\n');
            json
        }
        OutputFormat::Table => table::render(&policy, &plan),
        OutputFormat::Markdown => markdown::render(&policy, &plan),
    };
    if matches!(args.output, OutputFormat::Yaml | OutputFormat::Json) {
        for blocked in &plan.evaluation.blocked {
            eprintln!(
                "note: {} ({}): {}",
                blocked.version,
                blocked.reason.as_str(),
                blocked.message
            );
        }
    }
    out.write_all(rendered.as_bytes())
        .map_err(|e| Error::Output(e.to_string()))
}

/// A validated policy evaluated for one CRD at one instant. Offline, every gate (approval,
/// traffic, conversion preflight) is assumed to pass at its milestone's instant.
pub struct Plan {
    pub crd: CrdState,
    pub schedule: Schedule,
    pub evaluation: Evaluation,
    /// Whether `storedVersions` came from `--stored-versions` rather than the offline
    /// assumption that every migration completes at its storage switch.
    pub stored_versions_given: bool,
}

impl Plan {
    /// Validates the policy against the CRD and evaluates it at `args.at`.
    pub fn new(policy: &VersionPolicy, crd: CrdState, args: &PlanSettings) -> Result<Plan, lifecycle::Error> {
        let mut errors = FieldErrors::default();
        if policy.spec.crd_name != crd.name {
            errors.push(
                "spec.crdName",
                format!(
                    "the policy governs {:?} but the CRD given is {:?}",
                    policy.spec.crd_name, crd.name
                ),
            );
        }
        if let Some(given) = &args.stored_versions {
            for name in given.iter().filter(|name| crd.version(name).is_none()) {
                errors.push(
                    "--stored-versions",
                    format!(
                        "{name:?} is not a version of {} (its versions: {})",
                        crd.name,
                        crd.version_names()
                    ),
                );
            }
        }
        let schedule = match Schedule::new(&policy.spec, &crd, args.at) {
            Ok(schedule) => schedule,
            Err(lifecycle::Error::InvalidPolicy(more)) => {
                errors.0.extend(more.0);
                return Err(lifecycle::Error::InvalidPolicy(errors));
            }
        };
        errors.into_result(())?;
        let stored_versions = match &args.stored_versions {
            Some(given) => given.clone(),
            None => lifecycle::assume_migrations_complete(&schedule, &crd, args.at),
        };
        let crd = CrdState {
            stored_versions,
            ..crd
        };
        let evaluation = schedule.evaluate(&crd, &[], args.at);
        Ok(Plan {
            crd,
            schedule,
            evaluation,
            stored_versions_given: args.stored_versions.is_some(),
        })
    }
}
