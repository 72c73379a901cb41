//! One object of a run processed, retrying what may succeed later: rewritten through the
//! storage version, read and checked against the target version's schema (a preflight), or
//! its stale managedFields entries rewritten (a cleanup); and what each answer means.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::Run;
use crate::migrate::managed_fields;
use crate::migrate::{Answer, Mode, ObjectKey};

/// What became of one object.
pub(super) enum Processed {
    Done,
    Skipped,
    Failed(String),
}

impl Run<'_> {
    /// Rewrites the object's stale managedFields entries with a guarded JSON Patch (the
    /// resourceVersion it was read at is tested); an object changed since is read again (a
    /// failed `test` answers 422, as apiserver-samples/03). `Ok(false)`: nothing to rewrite.
    async fn clean_managed_fields(&self, key: &ObjectKey) -> Result<bool, Answer> {
        let cleanup = &self.settings.managed_fields;
        let storage = self.target.storage_version.as_str();
        let translate = |path: &[String], from: &str| match &self.converter {
            Some(converter) => converter.translate_path(path, from, storage),
            None => Some(path.to_vec()),
        };
        let (mut resource_version, mut entries) = (key.resource_version.clone(), key.managed_fields.clone());
        for _ in 0..3 {
            let stale: std::collections::BTreeSet<String> = match &cleanup.versions {
                Some(versions) => versions.iter().cloned().collect(),
                None => managed_fields::named_versions(&entries, &self.target.group)
                    .into_iter()
                    .filter(|v| !self.target.versions.contains(v))
                    .collect(),
            };
            let rewrite = managed_fields::Rewrite {
                group: &self.target.group,
                stale: &stale,
                into: storage,
                translate: &translate,
            };
            let Some(rewritten) = rewrite.apply(&entries) else {
                return Ok(false);
            };
            if cleanup.dry_run {
                return Ok(true);
            }
            match self
                .requester
                .replace_managed_fields(self.target, key, &resource_version, &rewritten)
                .await
            {
                Answer::Ok => return Ok(true),
                // A 422 is a lost race (the `test` of the resourceVersion failed, sample 03)
                // only if the object changed: re-read it. Unchanged, the apiserver refused the
                // object itself (invalid under the current schema): a permanent failure of
                // this object, reported once with the apiserver's message, not retried.
                invalid @ Answer::Status { code: 422, .. } => {
                    let previous = resource_version.clone();
                    (resource_version, entries) = self.requester.managed_fields(self.target, key).await?;
                    if resource_version == previous {
                        return Err(invalid);
                    }
                }
                other => return Err(other),
            }
        }
        Err(Answer::Transport(format!(
            "{key} kept changing while its managedFields were being rewritten"
        )))
    }

    pub(super) async fn process_object(&self, page: usize, key: ObjectKey) -> (usize, Processed, ObjectKey) {
        let processed = self.process(&key).await;
        (page, processed, key)
    }

    /// With a declarative conversion: the object read through the storage version and
    /// converted as the webhook converts it, checked against the target version's schema.
    /// A problem says what the apiserver would prune or reject, and where.
    async fn fits_target_schema(&self, key: &ObjectKey) -> Result<Option<String>, Answer> {
        let (Some(converter), Some(schema)) = (&self.converter, &self.preflight_schema) else {
            return Ok(None);
        };
        let mut at_storage = self.target.clone();
        at_storage.version = self.target.storage_version.clone();
        let stored = self.requester.object(&at_storage, key).await?;
        let pair = format!("{} -> {}", self.target.storage_version, self.target.version);
        let converted = match converter.convert(&stored, &self.target.version) {
            Ok(converted) => converted,
            Err(error) => return Ok(Some(format!("{pair}: {error}"))),
        };
        Ok(crate::schema::validate(schema, &converted)
            .into_iter()
            .next()
            .map(|problem| format!("{pair}: {problem}")))
    }
    /// Rewrites (or reads) one object, retrying what may succeed later.
    async fn process(&self, key: &ObjectKey) -> Processed {
        let attempts = AtomicU32::new(0);
        let result = self
            .with_retries(|| async {
                attempts.fetch_add(1, Ordering::Relaxed);
                let answer = match self.settings.mode {
                    Mode::Rewrite => self.requester.rewrite(self.target, key).await,
                    // Read, converted and checked before, and unchanged since.
                    Mode::Preflight
                        if self
                            .settings
                            .preflight_checked
                            .as_ref()
                            .is_some_and(|checked| checked.contains(key)) =>
                    {
                        return Ok(Processed::Skipped);
                    }
                    Mode::Preflight => match self.requester.read(self.target, key).await {
                        Answer::Ok => match self.fits_target_schema(key).await {
                            Ok(None) => Answer::Ok,
                            Ok(Some(problem)) => return Ok(Processed::Failed(problem)),
                            Err(answer) => answer,
                        },
                        answer => answer,
                    },
                    Mode::CleanManagedFields => match self.clean_managed_fields(key).await {
                        Ok(true) => Answer::Ok,
                        Ok(false) => return Ok(Processed::Skipped),
                        Err(answer) => answer,
                    },
                };
                match classify(&answer) {
                    Verdict::Done => Ok(Processed::Done),
                    Verdict::Skipped => Ok(Processed::Skipped),
                    Verdict::Fail | Verdict::Retry => Err(answer),
                }
            })
            .await;
        match result {
            Ok(processed) => processed,
            Err(answer) => match classify(&answer) {
                Verdict::Retry => Processed::Failed(format!(
                    "{answer} (gave up after {} attempts)",
                    attempts.load(Ordering::Relaxed)
                )),
                _ => Processed::Failed(answer.to_string()),
            },
        }
    }
}

/// The apiserver's `Retry-After` instead of the backoff, while retries are left.
pub(super) fn retry_after(answer: &Answer, backoff: Option<Duration>) -> Option<Duration> {
    match (answer, backoff) {
        (
            Answer::Status {
                retry_after: Some(wait),
                ..
            },
            Some(_),
        ) => Some(*wait),
        _ => backoff,
    }
}
/// What to do after an answer.
pub(super) enum Verdict {
    Done,
    Skipped,
    Fail,
    /// Retry (after the apiserver's `Retry-After` if it gave one).
    Retry,
}

pub(super) fn classify(answer: &Answer) -> Verdict {
    match answer {
        Answer::Ok => Verdict::Done,
        // Written since it was listed, so already stored in the storage version (12).
        Answer::Status { code: 409, .. } => Verdict::Skipped,
        // Deleted since it was listed (13) — but a plain-text 404 means the version is not
        // served (15), which must not pass for "deleted".
        Answer::Status {
            code: 404,
            is_status_object: true,
            ..
        } => Verdict::Skipped,
        Answer::Status { code: 429, .. } => Verdict::Retry,
        // 5xx may be transient, or a conversion webhook failing for good (20, 21): retried
        // a bounded number of times, then recorded.
        Answer::Status { code, .. } if *code >= 500 => Verdict::Retry,
        Answer::Status { .. } => Verdict::Fail,
        // No answer, a reset, or a timeout.
        Answer::Transport(_) => Verdict::Retry,
    }
}
