//! What another migrator (Kubernetes' built-in one, which has no settle check and no
//! storage guard of its own) gets of ours: the settle check before it is started, and the
//! guarded trim of `status.storedVersions` after it.

use kube::Client;

use super::crd_reads::read_current;
use super::discovery::{self, Expect};
use super::requests::Requester;
use super::trim::{TrimResult, trim};
use super::{Error, Outcome, Settings, StorageGuard, Target};

/// The CRD as it is now, once discovery confirms that the apiservers answering store in its
/// storage version (the settle check, docs/src/internals/architecture.md): what another migrator (Kubernetes'
/// built-in one, which has no settle of its own) may be started for. Its rewrites go through
/// any apiserver, and one that has not acted on the switch yet encodes in the old version.
pub async fn settled_target(client: &Client, crd_name: &str, settings: &Settings) -> Result<Target, Error> {
    let requester = Requester::unthrottled(client, settings.request_timeout);
    let target = read_current(client, crd_name, settings).await?;
    discovery::wait(&requester, &target, Expect::Storage, &settings.settle).await?;
    Ok(target)
}

/// After another migrator (Kubernetes' built-in one) rewrote every object: trims
/// `status.storedVersions` to the storage version with the same guards as a run's last step.
/// `guard` watches the CRD from the state the migration was created for (its storage version
/// is the one the objects were migrated into); `stored_versions` and `conversion` are what
/// the CRD had then. Nothing is trimmed if the storage version changed since (objects may
/// have been written in another version), if the conversion changed, or unless the storage
/// version is confirmed through discovery at the resourceVersion the trim is made at.
/// `Trimmed` (empty `previous` if it already was) or `NotTrimmed` with the reason.
pub async fn trim_after(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
    guard: &StorageGuard,
    stored_versions: &[String],
    conversion: &str,
) -> Result<Outcome, Error> {
    let requester = Requester::unthrottled(client, settings.request_timeout);
    let mut target = read_current(client, crd_name, settings).await?;
    // What the migration was created for, not what the CRD says now.
    target.storage_version = guard.started_from().storage_version.clone();
    target.stored_versions = stored_versions.to_vec();
    target.conversion = conversion.to_owned();
    Ok(match trim(&requester, &target, guard, settings, None).await? {
        TrimResult::Trimmed(previous) => Outcome::Trimmed { previous },
        TrimResult::NotTrimmed(reason) => Outcome::NotTrimmed { reason },
        TrimResult::StorageChanged(why) => Outcome::NotTrimmed {
            reason: format!("{why} since the migration was created"),
        },
    })
}
