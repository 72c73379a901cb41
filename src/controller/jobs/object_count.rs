//! Each CRD's object count, for the lead of its preflights: counted with a one-object
//! list when a store is near, and cached for a while.

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::BackgroundJobs;
use crate::api::VersionPolicy;
use crate::migrate;
use crate::sync::lock;

/// How long a CRD's object count stands for the lead of its preflights.
const OBJECT_COUNT_FOR: Duration = Duration::from_secs(600);

impl BackgroundJobs {
    /// How many objects the policy's CRD has: counted at most every `OBJECT_COUNT_FOR`
    /// (one list of a single object); `None` when it cannot be told.
    pub(super) async fn object_count(&self, policy: &VersionPolicy) -> Option<u64> {
        let crd = &policy.spec.crd_name;
        if let Some((at, count)) = lock(&self.object_counts).get(crd)
            && at.elapsed() < OBJECT_COUNT_FOR
        {
            return *count;
        }
        let settings = migrate::Settings {
            retry: self.retry.clone(),
            ..migrate::Settings::default()
        };
        let count = match migrate::count_objects(&self.client, crd, &settings).await {
            Ok(count) => count,
            Err(error) => {
                warn!(crd, error = %error, "cannot count the objects for the preflight's lead");
                None
            }
        };
        let mut counts = lock(&self.object_counts);
        // Counts of CRDs no store is near any more go with the next count.
        counts.retain(|_, (at, _)| at.elapsed() < OBJECT_COUNT_FOR);
        counts.insert(crd.clone(), (Instant::now(), count));
        count
    }
}
