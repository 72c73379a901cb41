//! Resolving a policy into instants, and every validation rule, each error naming its path.

use jiff::{SignedDuration, Timestamp};

use super::crd::CrdState;
use super::duration::parse_duration;
use super::error::FieldErrors;
use crate::api::{Enforce, MAX_VERSIONS, MigrationSettings, MilestoneKind, VersionPolicySpec};

/// One governed version with every milestone resolved to an instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledVersion {
    /// The version's name.
    pub name: String,
    /// Its position in the policy's `spec.versions`, for field paths.
    pub index: usize,
    instants: [Option<Timestamp>; 5],
    /// The deprecation warning, if the policy gives one.
    pub warning: Option<String>,
    /// Which milestones need an approval.
    approvals: [bool; 5],
    /// The traffic gate of `unserve`: no client request for this long first.
    pub no_traffic_for: Option<SignedDuration>,
    /// The writers gate of its `unserve`: no write through it (managedFields) for this long.
    pub no_writers_for: Option<SignedDuration>,
}

impl ScheduledVersion {
    /// The instant of the milestone of this kind, if the policy sets it.
    pub fn at(&self, kind: MilestoneKind) -> Option<Timestamp> {
        self.instants[kind as usize]
    }

    /// Whether the milestone of this kind needs an approval.
    pub fn needs_approval(&self, kind: MilestoneKind) -> bool {
        self.approvals[kind as usize]
    }

    /// Holds a milestone (and every later one of this version) back: they are treated as
    /// not reached, whatever the instant.
    pub(crate) fn postpone_from(&mut self, kind: MilestoneKind) {
        for later in MilestoneKind::ALL.into_iter().filter(|k| *k >= kind) {
            if self.instants[later as usize].is_some() {
                self.instants[later as usize] = Some(Timestamp::MAX);
            }
        }
    }

    /// Holds this one milestone back (a superseded `store`).
    pub(crate) fn postpone_only(&mut self, kind: MilestoneKind) {
        if self.instants[kind as usize].is_some() {
            self.instants[kind as usize] = Some(Timestamp::MAX);
        }
    }

    /// Whether the milestone of this kind is set and due at `t`.
    pub fn reached(&self, kind: MilestoneKind, t: Timestamp) -> bool {
        self.at(kind).is_some_and(|at| at <= t)
    }

    /// Field path of a milestone, e.g. `spec.versions[1].unserve`.
    pub fn path(&self, kind: MilestoneKind) -> String {
        format!("spec.versions[{}].{kind}", self.index)
    }

    /// Still in the CRD at `t` (ignoring any hold on the removal).
    pub fn present(&self, t: Timestamp) -> bool {
        !self.reached(MilestoneKind::Remove, t)
    }

    /// Served at `t` if it were still present: introduced (or no introduce) and not unserved.
    pub fn served_if_present(&self, t: Timestamp) -> bool {
        self.at(MilestoneKind::Introduce).is_none_or(|at| at <= t) && !self.reached(MilestoneKind::Unserve, t)
    }

    /// Served at `t`.
    pub fn served(&self, t: Timestamp) -> bool {
        self.present(t) && self.served_if_present(t)
    }

    /// Deprecated at `t`.
    pub fn deprecated(&self, t: Timestamp) -> bool {
        self.reached(MilestoneKind::Deprecate, t)
    }
}

/// A policy with every `after` resolved, checked on its own and against its CRD.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// The governed CRD.
    pub crd_name: String,
    /// The governed versions, in policy order.
    pub versions: Vec<ScheduledVersion>,
    /// Migration settings, as given.
    pub migration: MigrationSettings,
    /// Extra rules the schedule follows.
    pub enforce: Option<Enforce>,
}

/// One milestone of one version at its instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub version: String,
    pub milestone: MilestoneKind,
    pub at: Timestamp,
}

impl std::fmt::Display for Transition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.version, self.milestone, self.at)
    }
}

impl Schedule {
    pub fn version(&self, name: &str) -> Option<&ScheduledVersion> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// The governed version that is the storage version at `t`: the one with the latest
    /// `store` at or before `t`. `None` until the first `store` is due.
    pub fn storage_at(&self, t: Timestamp) -> Option<&ScheduledVersion> {
        self.versions
            .iter()
            .filter_map(|v| v.at(MilestoneKind::Store).filter(|at| *at <= t).map(|at| (at, v)))
            .max_by_key(|(at, v)| (*at, std::cmp::Reverse(v.index)))
            .map(|(_, v)| v)
    }

    /// Every milestone with its instant, in the order they happen (ties: lifecycle order,
    /// then policy order).
    pub fn transitions(&self) -> Vec<Transition> {
        let mut all: Vec<(Timestamp, MilestoneKind, usize, &str)> = self
            .versions
            .iter()
            .flat_map(|v| {
                MilestoneKind::ALL
                    .into_iter()
                    .filter_map(move |kind| v.at(kind).map(|at| (at, kind, v.index, v.name.as_str())))
            })
            .collect();
        all.sort();
        all.into_iter()
            .map(|(at, milestone, _, version)| Transition {
                version: version.to_owned(),
                milestone,
                at,
            })
            .collect()
    }

    /// Rules about each version on its own: order of milestones, deprecate before unserve
    /// before remove, and distinct storage instants.
    pub(super) fn check_versions(&self, errors: &mut FieldErrors) {
        for v in &self.versions {
            let mut previous: Option<(MilestoneKind, Timestamp)> = None;
            for kind in MilestoneKind::ALL {
                let Some(at) = v.at(kind) else { continue };
                if let Some((prev_kind, prev_at)) = previous
                    && at < prev_at
                {
                    errors.push(
                        v.path(kind),
                        format!(
                            "{kind} ({at}) is before {prev_kind} ({prev_at}); milestones must be in the order \
                             introduce, store, deprecate, unserve, remove"
                        ),
                    );
                }
                previous = Some((kind, at));
            }
        }
        for (i, v) in self.versions.iter().enumerate() {
            let Some(at) = v.at(MilestoneKind::Store) else {
                continue;
            };
            if let Some(other) = self.versions[..i]
                .iter()
                .find(|o| o.at(MilestoneKind::Store) == Some(at))
            {
                errors.push(
                    v.path(MilestoneKind::Store),
                    format!(
                        "{} and {} (spec.versions[{}]) would both become the storage version at {at}; \
                         a CRD has exactly one storage version",
                        v.name, other.name, other.index
                    ),
                );
            }
        }
    }

    /// Rules that need the CRD: governed versions exist in it.
    pub(super) fn check_against_crd(&self, crd: &CrdState, now: Timestamp, errors: &mut FieldErrors) {
        for v in &self.versions {
            if crd.version(&v.name).is_none() && v.present(now) {
                errors.push(
                    format!("spec.versions[{}].name", v.index),
                    format!(
                        "version {} is not in CRD {} (its versions: {}) and its removal is not due",
                        v.name,
                        crd.name,
                        crd.version_names()
                    ),
                );
            }
        }
    }

    /// Rules over the whole timeline: at every instant the storage version is present and
    /// served, and some version is served.
    pub(super) fn check_timeline(&self, crd: &CrdState, errors: &mut FieldErrors) {
        let mut instants: Vec<Timestamp> = self.transitions().into_iter().map(|t| t.at).collect();
        instants.dedup();
        let Some(first) = instants.first().copied() else {
            return;
        };
        let before_first = first.checked_sub(SignedDuration::from_nanos(1)).unwrap_or(first);
        for t in std::iter::once(before_first).chain(instants.iter().copied()) {
            self.check_storage_at(crd, t, errors);
            self.check_something_served_at(crd, t, errors);
        }
    }

    fn check_storage_at(&self, crd: &CrdState, t: Timestamp, errors: &mut FieldErrors) {
        let storage = match self.storage_at(t) {
            Some(v) => v,
            // Before the first store, the CRD's own storage version stays. It only matters
            // here when the policy governs it, and only while it is the CRD's original one:
            // a version the policy stores itself is there because a store already happened
            // (or was put back by hand), which says nothing about the time before it.
            None => match crd
                .storage_version()
                .and_then(|name| self.version(name))
                .filter(|v| v.at(MilestoneKind::Store).is_none())
            {
                Some(v) => v,
                None => return,
            },
        };
        let successor = |from: Timestamp| {
            self.versions
                .iter()
                .filter_map(|o| {
                    o.at(MilestoneKind::Store)
                        .filter(|at| *at > from)
                        .map(|at| (at, &o.name))
                })
                .min()
        };
        let hint = match successor(t) {
            Some((at, name)) => format!("the next storage version, {name}, is only stored at {at}"),
            None => "no later version is stored".to_owned(),
        };
        if !storage.present(t) {
            errors.push(
                storage.path(MilestoneKind::Remove),
                format!(
                    "{} would be removed at {t} while it is still the storage version ({hint}); \
                     store another version at or before its removal",
                    storage.name
                ),
            );
        } else if storage.reached(MilestoneKind::Unserve, t) {
            errors.push(
                storage.path(MilestoneKind::Unserve),
                format!(
                    "{} would stop being served at {t} while it is still the storage version ({hint}); \
                     the storage version must be served, so store another version at or before it is unserved",
                    storage.name
                ),
            );
        } else if !storage.served(t) {
            errors.push(
                storage.path(MilestoneKind::Introduce),
                format!(
                    "{} is the CRD's storage version but would not be served until it is introduced; \
                     the storage version must be served",
                    storage.name
                ),
            );
        }
    }

    fn check_something_served_at(&self, crd: &CrdState, t: Timestamp, errors: &mut FieldErrors) {
        // A governed version the CRD no longer has was removed (`check_against_crd` reports
        // one whose removal is not due): it was served as the schedule says until then.
        let any_served = crd.versions.iter().any(|cv| match self.version(&cv.name) {
            Some(v) => v.served(t),
            None => cv.served,
        }) || self
            .versions
            .iter()
            .any(|v| crd.version(&v.name).is_none() && v.served(t));
        if any_served {
            return;
        }
        let culprit = self.versions.iter().find_map(|v| {
            [MilestoneKind::Unserve, MilestoneKind::Remove]
                .into_iter()
                .find(|kind| v.at(*kind) == Some(t))
                .map(|kind| v.path(kind))
        });
        errors.push(
            culprit.unwrap_or_else(|| "spec.versions".to_owned()),
            format!(
                "no version of {} would be served at {t}; at every instant some version must be served",
                crd.name
            ),
        );
    }
}

/// Resolves every milestone to an instant, reporting what cannot be parsed or counted
/// from. Returns the schedule and whether every milestone resolved.
pub(super) fn resolve(spec: &VersionPolicySpec, errors: &mut FieldErrors) -> (Schedule, bool) {
    check_crd_name(&spec.crd_name, errors);
    if spec.versions.is_empty() {
        errors.push("spec.versions", "at least one version must be listed");
    }
    if spec.versions.len() > MAX_VERSIONS {
        errors.push(
            "spec.versions",
            format!("at most {MAX_VERSIONS} versions may be listed"),
        );
    }
    let mut complete = true;
    let mut versions = Vec::with_capacity(spec.versions.len());
    for (index, entry) in spec.versions.iter().enumerate() {
        let base = format!("spec.versions[{index}]");
        check_version_name(&entry.name, &format!("{base}.name"), errors);
        if let Some(first) = spec.versions[..index].iter().position(|o| o.name == entry.name) {
            errors.push(
                format!("{base}.name"),
                format!(
                    "version {} is listed twice (also spec.versions[{first}])",
                    entry.name
                ),
            );
        }
        let mut instants = [None; 5];
        // The instant `after` counts from; `Err(())` once an earlier milestone failed, so
        // that a broken milestone is reported once, not again by every `after` behind it.
        let mut anchor: Option<Result<Timestamp, ()>> = None;
        for kind in MilestoneKind::ALL {
            let Some((at, after)) = entry.timing(kind) else {
                continue;
            };
            let resolved = resolve_milestone(kind, at, after, anchor).map_err(|problem| {
                if let Some((field, message)) = problem {
                    let path = format!("{base}.{kind}{field}");
                    errors.push(path, message);
                }
            });
            complete &= resolved.is_ok();
            instants[kind as usize] = resolved.ok();
            anchor = Some(resolved);
        }
        let warning = entry.deprecate.as_ref().and_then(|d| d.warning.clone());
        if let Some(text) = &warning {
            check_warning(text, &format!("{base}.deprecate.warning"), errors);
        }
        check_prerequisite(
            entry.unserve.is_some(),
            entry.deprecate.is_some(),
            &base,
            "unserve",
            "deprecate",
            errors,
        );
        check_prerequisite(
            entry.remove.is_some(),
            entry.unserve.is_some(),
            &base,
            "remove",
            "unserve",
            errors,
        );
        let no_traffic_for = entry
            .unserve
            .as_ref()
            .and_then(|u| u.require_no_traffic_for.as_deref())
            .and_then(|text| {
                parse_duration(text)
                    .map_err(|message| errors.push(format!("{base}.unserve.requireNoTrafficFor"), message))
                    .ok()
            });
        let no_writers_for = entry
            .unserve
            .as_ref()
            .and_then(|u| u.require_no_writers_for.as_deref())
            .and_then(|text| {
                parse_duration(text)
                    .map_err(|message| errors.push(format!("{base}.unserve.requireNoWritersFor"), message))
                    .ok()
            });
        versions.push(ScheduledVersion {
            name: entry.name.clone(),
            index,
            instants,
            warning,
            approvals: MilestoneKind::ALL.map(|kind| entry.needs_approval(kind)),
            no_traffic_for,
            no_writers_for,
        });
    }
    if let Some(lead) = spec.migration.preflight_lead.as_deref()
        && let Err(message) = parse_duration(lead)
    {
        errors.push("spec.migration.preflightLead".to_owned(), message);
    }
    let schedule = Schedule {
        crd_name: spec.crd_name.clone(),
        versions,
        migration: spec.migration.clone(),
        enforce: spec.enforce,
    };
    (schedule, complete)
}

/// The instant of one milestone. On failure: the problem as (field suffix, message), or
/// `None` when it only follows from an earlier milestone's problem.
fn resolve_milestone(
    kind: MilestoneKind,
    at: Option<&str>,
    after: Option<&str>,
    anchor: Option<Result<Timestamp, ()>>,
) -> Result<Timestamp, Option<(&'static str, String)>> {
    match (at, after) {
        (Some(at), None) => at.parse::<Timestamp>().map_err(|e| {
            Some((
                ".at",
                format!("invalid RFC 3339 instant {at:?} (e.g. 2026-03-01T00:00:00Z): {e}"),
            ))
        }),
        (None, Some(after)) => {
            let duration = parse_duration(after).map_err(|message| Some((".after", message)))?;
            match anchor {
                None => Err(Some((
                    ".after",
                    format!(
                        "`after` counts from this version's previous milestone, but {kind} is its first; use `at` instead"
                    ),
                ))),
                Some(Err(())) => Err(None),
                Some(Ok(from)) => from
                    .checked_add(duration)
                    .map_err(|e| Some((".after", format!("{after} after {from} is out of range: {e}")))),
            }
        }
        (Some(_), Some(_)) => Err(Some((
            "",
            "exactly one of `at` or `after` must be set, not both".to_owned(),
        ))),
        (None, None) => Err(Some((
            "",
            "exactly one of `at` or `after` must be set".to_owned(),
        ))),
    }
}

fn check_prerequisite(
    has: bool,
    has_prerequisite: bool,
    base: &str,
    milestone: &str,
    prerequisite: &str,
    errors: &mut FieldErrors,
) {
    if has && !has_prerequisite {
        errors.push(
            format!("{base}.{milestone}"),
            format!(
                "a version must be {prerequisite}d before it is {milestone}d: \
                 set {base}.{prerequisite} at or before this {milestone}"
            ),
        );
    }
}

fn check_crd_name(name: &str, errors: &mut FieldErrors) {
    let labels_ok = name.split('.').all(is_dns_label);
    if name.is_empty() {
        errors.push(
            "spec.crdName",
            "must be set to the name of a CustomResourceDefinition",
        );
    } else if name.len() > 253 || !name.contains('.') || !labels_ok {
        errors.push(
            "spec.crdName",
            format!("{name:?} is not a CRD name (<plural>.<group>, lower-case DNS labels, e.g. widgets.example.com)"),
        );
    }
}

fn check_version_name(name: &str, path: &str, errors: &mut FieldErrors) {
    if !is_dns_label(name) || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        errors.push(
            path,
            format!(
                "{name:?} is not a version name (a lower-case DNS label starting with a letter, e.g. v1beta1)"
            ),
        );
    }
}

fn is_dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

fn check_warning(text: &str, path: &str, errors: &mut FieldErrors) {
    // Exactly the apiserver's rules for deprecationWarning (samples 22-24).
    if let Err(message) = super::apiserver_rules::check_deprecation_warning(text) {
        errors.push(path, message);
    }
}
