//! Waiting for the apiserver to act on a CRD change before the migrator relies on it.
//!
//! Each apiserver of an HA control plane swaps a CRD's storage version (and starts serving a
//! new version) on its own watch, some time after the CRD update. A rewrite answered by an
//! apiserver that has not swapped yet re-encodes the object in the old storage version, so
//! the migrator first confirms the switch through discovery: `storageVersionHash` is derived
//! from the storage version (samples 25, 26). Behind a load balancer each request may reach a
//! different apiserver, so the answer must hold several times in a row, over a few seconds.
//!
//! A CRD that had not changed for `SettleCheck::settled_after` (a minute) when it was read,
//! measured on the apiserver's clock alone, has had far longer than that span for every
//! apiserver to act on it: one agreeing answer is enough there (docs/src/internals/architecture.md, "The
//! settle check"). The check is always about the CRD as last read: the trim confirms the
//! state it is about to act on, not the one the run started from.

use std::time::Duration;
use tokio::time::Instant;

use base64::Engine as _;
use tracing::{debug, warn};

use super::Error;
use super::requests::{Answer, Discovered, Requester};
use super::target::Target;

/// How a CRD change is confirmed through discovery.
#[derive(Clone, Debug)]
pub struct SettleCheck {
    /// Consecutive discovery answers that must agree.
    pub confirmations: u32,
    /// Wait between two discovery requests.
    pub interval: Duration,
    /// Give up after this long.
    pub timeout: Duration,
    /// A CRD whose newest managedFields time is at least this much older than the `date`
    /// of the answer it was read in (both the apiserver's clock) needs one agreeing answer,
    /// not `confirmations`: every apiserver has had this long to act on its last change.
    /// Fifteen times the confirmations' span, for clock skew between apiservers.
    pub settled_after: Duration,
}

impl Default for SettleCheck {
    fn default() -> Self {
        Self {
            confirmations: 5,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(300),
            settled_after: Duration::from_secs(60),
        }
    }
}

/// The `storageVersionHash` an apiserver publishes for a resource stored as
/// `group/version, Kind=kind`: the first 8 bytes of the SHA-256 of `group/version/kind`,
/// base64 (Kubernetes' `discovery.StorageVersionHash`; reproduces samples 25 and 26).
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{group}/{version}/{kind}").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(&digest.as_ref()[..8])
}

/// What must be seen in discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect<'a> {
    /// The apiserver stores the resource in the target's storage version.
    Storage,
    /// The apiserver serves the resource through the target's version.
    Served,
    /// The apiserver no longer serves the resource through this version (unserved, or gone
    /// from the CRD): a managedFields cleanup's pass waits for it, so that no apiserver of
    /// an HA control plane still accepts a server-side apply through it.
    Unserved(&'a str),
}

/// Waits until `confirmations` discovery answers in a row show what `expect` asks.
pub async fn wait(
    requester: &Requester<'_>,
    target: &Target,
    expect: Expect<'_>,
    check: &SettleCheck,
) -> Result<(), Error> {
    let wanted = storage_version_hash(&target.group, &target.storage_version, &target.kind);
    let version = match expect {
        Expect::Storage => &target.storage_version,
        Expect::Served => &target.version,
        Expect::Unserved(version) => version,
    };
    let started = Instant::now();
    let needed = if target.unchanged_for(check.settled_after) {
        1
    } else {
        check.confirmations.max(1)
    };
    let mut agreeing = 0;
    let mut last = String::new();
    let mut warned_no_hash = false;
    loop {
        let seen = requester.discover(&target.group, version, &target.plural).await;
        let confirmed = match (&seen, expect) {
            (Ok(Discovered::Served { .. }), Expect::Served) => true,
            (Ok(Discovered::Absent), Expect::Unserved(_)) => true,
            (Ok(Discovered::Served { .. }), Expect::Unserved(_)) => {
                last = format!("{}/{version} still serves {}", target.group, target.plural);
                false
            }
            (
                Ok(Discovered::Served {
                    storage_version_hash: Some(hash),
                }),
                Expect::Storage,
            ) => {
                last = format!("storageVersionHash {hash}, expected {wanted}");
                *hash == wanted
            }
            (
                Ok(Discovered::Served {
                    storage_version_hash: None,
                }),
                Expect::Storage,
            ) => {
                // An apiserver with the StorageVersionHash feature off publishes no hash:
                // nothing to confirm with.
                if !warned_no_hash {
                    warn!(crd = %target.crd, "discovery gives no storageVersionHash; cannot confirm the storage switch");
                    warned_no_hash = true;
                }
                true
            }
            (Ok(Discovered::Absent), _) => {
                // The CRD may be gone (`kubectl delete crd`): no wait of up to `timeout` for a
                // version that will never be served (found by the simulation).
                if matches!(requester.crd_exists(&target.crd).await, Ok(false)) {
                    return Err(Error::CrdNotFound(target.crd.clone()));
                }
                last = format!("{}/{version} does not serve {} yet", target.group, target.plural);
                false
            }
            (Err(answer), _) => {
                last = describe(answer);
                false
            }
        };
        agreeing = if confirmed { agreeing + 1 } else { 0 };
        debug!(crd = %target.crd, agreeing, "{last}");
        if agreeing >= needed {
            return Ok(());
        }
        if started.elapsed() >= check.timeout {
            return Err(not_settled(target, expect, version, check, last));
        }
        tokio::time::sleep(check.interval).await;
    }
}

/// The wait for `expect` timed out; `last` says what discovery answered last.
fn not_settled(
    target: &Target,
    expect: Expect<'_>,
    version: &str,
    check: &SettleCheck,
    last: String,
) -> Error {
    let what = match expect {
        Expect::Storage => format!("storing {} as {}", target.plural, target.storage_version),
        Expect::Served => format!("serving {}/{version}", target.group),
        Expect::Unserved(_) => format!("no longer serving {}/{version}", target.group),
    };
    Error::NotSettled {
        crd: target.crd.clone(),
        what,
        waited: check.timeout,
        last,
    }
}

fn describe(answer: &Answer) -> String {
    match answer {
        Answer::Ok => "ok".to_owned(),
        Answer::Status { code, message, .. } => format!("discovery answered {code}: {message}"),
        Answer::Transport(message) => format!("discovery failed: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_the_recorded_discovery() {
        // apiserver-samples/25 (v1alpha1 stored) and 26 (after the switch to v1).
        assert_eq!(
            storage_version_hash("example.com", "v1alpha1", "Widget"),
            "aXSEt3iQTdQ="
        );
        assert_eq!(
            storage_version_hash("example.com", "v1", "Widget"),
            "gIwvi5rymmg="
        );
    }
}
