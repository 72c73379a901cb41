//! The StorageVersionMigration a job follows: the policy's latest into the storage version
//! if it was created for the CRD as it is now (its recorded generation is the current one,
//! or a storage guard from the state it was created for saw the storage version unchanged
//! since), or a new attempt, created only once the CRD's storage version has settled.

use crate::controller::events::EventReason;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource;
use kube::api::Api;
use tracing::info;

use super::{between, group_resource};
use crate::api::VersionPolicy;
use crate::controller::jobs::BackgroundJobs;
use crate::migrate::builtin::{self, CreatedFor, Listed, Migration, State};
use crate::migrate::{self, GuardStart, StorageGuard, Target, Verdict};

/// Settles in a row a job of the built-in engine tries while the CRD keeps changing under
/// it, before the attempt fails (and the next one starts over).
const SETTLES_PER_ATTEMPT: u32 = 3;

impl BackgroundJobs {
    /// The policy's migration into `storage_version` that belongs to the CRD as it is now
    /// (with a storage guard from the state it was created for), or a new one.
    pub(super) async fn migration_for_now(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        api: &builtin::Migrations,
        settings: &migrate::Settings,
    ) -> Result<(Migration, CreatedFor, StorageGuard), String> {
        let crd = &policy.spec.crd_name;
        let policy_name = policy.metadata.name.clone().unwrap_or_default();
        let (group, resource) = group_resource(crd);
        let listed = api
            .of_resource(group, resource)
            .await
            .map_err(|e| format!("cannot list StorageVersionMigrations: {e}"))?;
        self.restore_earlier_failures(crd, &policy_name, &listed, api)
            .await?;
        let now = self.settled_now(crd, storage_version, settings).await?;
        // A failed migration no later one supersedes: one of ours that succeeded before it
        // ended cannot release its hold (`builtin::superseded`), the next attempt can.
        let uncovered = listed
            .migrations
            .iter()
            .find(|m| {
                matches!(m.state, State::Failed(_))
                    && !m.running
                    && m.holds_removals()
                    && !builtin::superseded(m, &listed.migrations)
            })
            .map(|m| m.name.clone());
        let ours: Vec<Migration> = listed
            .migrations
            .into_iter()
            .filter(|m| {
                m.policy.as_deref() == Some(policy_name.as_str())
                    && m.storage_version.as_deref() == Some(storage_version)
            })
            .collect();
        if let Some(last) = ours.last()
            && let Some(reused) = self
                .reusable(
                    crd,
                    storage_version,
                    settings,
                    last,
                    uncovered.as_deref(),
                    listed.at,
                    &now,
                )
                .await
        {
            return Ok(reused);
        }
        self.create_next(policy, storage_version, api, settings, &now, ours.len())
            .await
    }

    /// Restores what the policy's earlier failed migrations in `listed` had in
    /// `storedVersions`; `Err` while one's end is not processed yet.
    async fn restore_earlier_failures(
        &self,
        crd: &str,
        policy_name: &str,
        listed: &Listed,
        api: &builtin::Migrations,
    ) -> Result<(), String> {
        // What an earlier failed migration of ours had in storedVersions is listed again
        // before the CRD is read for the next one (Kubernetes trimmed it as that one ended):
        // the next attempt records it, and restores it if it fails too.
        for failed in listed.migrations.iter().filter(|m| {
            m.policy.as_deref() == Some(policy_name) && matches!(m.state, State::Failed(_)) && !m.restored
        }) {
            if failed.running {
                return Err(format!(
                    "StorageVersionMigration {} failed and Kubernetes has not processed its end yet (which may trim \
                     status.storedVersions); the next attempt waits for it",
                    failed.name
                ));
            }
            if let Some(created_for) = &failed.created_for {
                self.restore_stored_versions(crd, failed, created_for, api)
                    .await?;
            }
        }
        Ok(())
    }

    /// The CRD's state once its storage version, `storage_version`, has settled, and the CRD
    /// did not change while it settled (a few tries).
    async fn settled_now(
        &self,
        crd: &str,
        storage_version: &str,
        settings: &migrate::Settings,
    ) -> Result<Target, String> {
        // Settled before the migration is created, as the internal migrator settles before
        // its first rewrite: Kubernetes' migrator re-encodes each object through whichever
        // apiserver answers, and one that has not acted on the switch yet writes the old
        // version; the migration would still succeed and trim `storedVersions`.
        // The settle takes seconds: a CRD changed meanwhile (a storage version moved, or
        // moved and moved back, v2 -> v1 -> v2, by a GitOps self-heal) may not have reached
        // every apiserver either, so it is settled again (this controller's own patches,
        // which change no storage version, cost one more settle each).
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut settles = 0;
        loop {
            let now = migrate::settled_target(&self.client, crd, settings)
                .await
                .map_err(|e| format!("cannot confirm the storage version of {crd}: {e}"))?;
            if now.storage_version != storage_version {
                return Err(format!(
                    "the storage version of {crd} is {}, not {storage_version}",
                    now.storage_version
                ));
            }
            let fresh = crds
                .get(crd)
                .await
                .map_err(|e| format!("cannot read {crd} before creating its StorageVersionMigration: {e}"))?;
            if fresh.metadata.generation == now.generation {
                return Ok(now);
            }
            settles += 1;
            if settles == SETTLES_PER_ATTEMPT {
                return Err(format!(
                    "{crd} changed while it settled, {SETTLES_PER_ATTEMPT} times in a row (generation {} -> {}); \
                     the next attempt settles again",
                    now.generation.unwrap_or_default(),
                    fresh.metadata.generation.unwrap_or_default()
                ));
            }
            info!(
                crd,
                "{crd} changed while it settled (generation {} -> {}); settling again",
                now.generation.unwrap_or_default(),
                fresh.metadata.generation.unwrap_or_default()
            );
        }
    }

    /// The policy's last migration `last` into `storage_version`, with its guard, if it is
    /// still the one to follow for the CRD as it is `now`: a failure within the retry wait
    /// (on the apiserver's clock, `listed_at`), or one created for the CRD as it is now.
    #[allow(clippy::too_many_arguments)]
    async fn reusable(
        &self,
        crd: &str,
        storage_version: &str,
        settings: &migrate::Settings,
        last: &Migration,
        uncovered: Option<&str>,
        listed_at: Option<jiff::Timestamp>,
        now: &Target,
    ) -> Option<(Migration, CreatedFor, StorageGuard)> {
        let guard_from =
            |created_for: &CreatedFor| self.guard_from(crd, storage_version, settings, created_for);
        match (&last.state, &last.created_for) {
            // A failure not older than the retry wait stands (after a restart too), on
            // the apiserver's clock.
            (State::Failed(_), Some(created_for))
                if between(last.changed, listed_at).is_some_and(|ago| ago < self.retry_after_failure) =>
            {
                return Some((last.clone(), created_for.clone(), guard_from(created_for)));
            }
            (State::Failed(_), _) => {}
            (State::Succeeded, _) if let Some(failed) = uncovered => info!(
                crd,
                "StorageVersionMigration {} succeeded before StorageVersionMigration {failed} failed; creating the \
                 next attempt",
                last.name
            ),
            (_, Some(created_for)) if created_for.conversion == now.conversion => {
                let guard = guard_from(created_for);
                if created_for.generation.is_some() && created_for.generation == now.generation {
                    return Some((last.clone(), created_for.clone(), guard));
                }
                match guard.check(now).await {
                    Verdict::Unchanged => return Some((last.clone(), created_for.clone(), guard)),
                    Verdict::Changed(why) => info!(
                        crd,
                        "StorageVersionMigration {} belongs to an earlier state of the CRD ({why}); creating the next attempt",
                        last.name
                    ),
                }
            }
            (_, Some(_)) => info!(
                crd,
                "StorageVersionMigration {} was created for another conversion of the CRD; creating the next attempt",
                last.name
            ),
            (_, None) => info!(
                crd,
                "StorageVersionMigration {} does not record the state of the CRD it was created for; creating the next attempt",
                last.name
            ),
        }
        None
    }

    /// A storage guard from the state `created_for` records.
    fn guard_from(
        &self,
        crd: &str,
        storage_version: &str,
        settings: &migrate::Settings,
        created_for: &CreatedFor,
    ) -> StorageGuard {
        let start = GuardStart {
            resource_version: created_for.resource_version.clone(),
            generation: created_for.generation,
            storage_version: storage_version.to_owned(),
        };
        StorageGuard::start(&self.client, crd, start, settings.history_wait)
    }

    /// Creates the next attempt (after `attempts` of the policy's into `storage_version`)
    /// for the CRD as it is `now`, with its guard.
    async fn create_next(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        api: &builtin::Migrations,
        settings: &migrate::Settings,
        now: &Target,
        attempts: usize,
    ) -> Result<(Migration, CreatedFor, StorageGuard), String> {
        let crd = &policy.spec.crd_name;
        let policy_name = policy.metadata.name.clone().unwrap_or_default();
        let (group, resource) = group_resource(crd);
        let created_for = CreatedFor {
            resource_version: now.resource_version.clone().unwrap_or_default(),
            generation: now.generation,
            stored_versions: now.stored_versions.clone(),
            conversion: now.conversion.clone(),
        };
        let attempt = u32::try_from(attempts).unwrap_or(u32::MAX).saturating_add(1);
        let name = builtin::migration_name(crd, storage_version, attempt);
        let created = api
            .create(
                &name,
                group,
                resource,
                &policy_name,
                storage_version,
                &created_for,
            )
            .await
            .map_err(|e| format!("cannot create StorageVersionMigration {name}: {e}"))?;
        let note = format!(
            "created StorageVersionMigration {name} ({}/{}) for {resource}.{group} into {storage_version}",
            builtin::GROUP,
            api.version
        );
        info!(crd, "{note}");
        self.event(&policy.object_ref(&()), EventReason::MigrationStarted, note)
            .await;
        let guard = self.guard_from(crd, storage_version, settings, &created_for);
        Ok((created, created_for, guard))
    }
}
