//! What a passed preflight read (`migrate::CheckedObjects`: 16 bytes per object, more than a
//! status could hold), remembered in memory for the check before its store, which then reads
//! only the objects created or changed since. A cache: a controller without it compares the
//! objects' digest instead.

use std::sync::Arc;

use crate::controller::jobs::BackgroundJobs;
use crate::controller::jobs::goal::JobKey;
use crate::migrate;
use crate::sync::lock;

/// The objects a passed preflight read (`migrate::CheckedObjects`), and the result they
/// belong to (its objects digest and fingerprint, as in its status).
pub(in crate::controller::jobs) struct RememberedObjects {
    digest: String,
    fingerprint: String,
    objects: Arc<migrate::CheckedObjects>,
}

impl BackgroundJobs {
    /// Remembers the objects the passed preflight of `key` read, for the result with
    /// `digest` and `fingerprint`.
    pub(super) fn remember_checked_objects(
        &self,
        key: &JobKey,
        digest: &str,
        fingerprint: &str,
        objects: migrate::CheckedObjects,
    ) {
        lock(&self.checked_objects).insert(
            key.clone(),
            RememberedObjects {
                digest: digest.to_owned(),
                fingerprint: fingerprint.to_owned(),
                objects: Arc::new(objects),
            },
        );
    }

    /// The objects the passed preflight of `key` read, if they are those of the result with
    /// `digest` and `fingerprint`.
    pub(super) fn checked_objects_of(
        &self,
        key: &JobKey,
        digest: &str,
        fingerprint: &str,
    ) -> Option<Arc<migrate::CheckedObjects>> {
        lock(&self.checked_objects)
            .get(key)
            .filter(|r| r.digest == digest && r.fingerprint == fingerprint)
            .map(|r| r.objects.clone())
    }

    /// Forgets the objects the preflight of `key` read.
    pub(super) fn forget_checked_objects_of(&self, key: &JobKey) {
        lock(&self.checked_objects).remove(key);
    }

    /// Forgets the objects preflights of the CRD read, but for those through `keep`
    /// (versions whose store is still to come).
    pub(super) fn forget_checked_objects(&self, crd: &str, keep: &[&str]) {
        lock(&self.checked_objects).retain(|key, _| match key {
            JobKey::Preflight { crd: of, version } if of == crd => keep.contains(&version.as_str()),
            _ => true,
        });
    }
}
