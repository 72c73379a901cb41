//! A digest of a CRD's objects (each one's namespace, name and resourceVersion): equal
//! digests mean no object was created, changed or deleted in between.

use kube::Client;

use super::crd_reads::read_target;
use super::lister::{Collection, ListSettings, Lister};
use super::requests::ObjectKey;
use super::{Error, Settings};

/// An order-independent digest of a set of objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectsDigest {
    count: u64,
    sum: u64,
}

impl ObjectsDigest {
    /// Adds one object as listed.
    pub fn add(&mut self, key: &ObjectKey) {
        let text = format!(
            "{}\0{}\0{}",
            key.namespace.as_deref().unwrap_or_default(),
            key.name,
            key.resource_version
        );
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest.as_ref()[..8]);
        self.count += 1;
        self.sum = self.sum.wrapping_add(u64::from_be_bytes(first));
    }

    /// `<objects>-<hex>`, as recorded in `status.preflight.objectsDigest`.
    pub fn value(&self) -> String {
        format!("{}-{:016x}", self.count, self.sum)
    }
}

/// Lists every object (metadata only, through the lister's version) and digests them, a
/// page at a time (`Lister::fold`: expired continue tokens are followed with the fresh one).
pub(super) async fn list_digest(lister: &Lister<'_>) -> Result<ObjectsDigest, Error> {
    let folded = lister
        .fold(ObjectsDigest::default, |digest, page| {
            page.objects.iter().for_each(|key| digest.add(key));
        })
        .await?;
    Ok(folded.state)
}

/// A digest of the CRD's objects as they are now (one metadata-only listing through the
/// storage version), to compare with `Report::objects_digest` of an earlier run.
pub async fn objects_digest(client: &Client, crd_name: &str, settings: &Settings) -> Result<String, Error> {
    let target = read_target(client, crd_name, None, settings).await?;
    let lister = Lister::new(client, Collection::from(&target), ListSettings::from(settings));
    list_digest(&lister).await.map(|d| d.value())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, rv: &str) -> ObjectKey {
        ObjectKey {
            namespace: Some("ns".to_owned()),
            name: name.to_owned(),
            resource_version: rv.to_owned(),
            managed_fields: Vec::new(),
        }
    }

    #[test]
    fn the_digest_ignores_order_and_sees_every_change() {
        let mut a = ObjectsDigest::default();
        a.add(&key("a", "1"));
        a.add(&key("b", "2"));
        let mut b = ObjectsDigest::default();
        b.add(&key("b", "2"));
        b.add(&key("a", "1"));
        assert_eq!(a.value(), b.value());
        let mut changed = ObjectsDigest::default();
        changed.add(&key("a", "1"));
        changed.add(&key("b", "3"));
        assert_ne!(a.value(), changed.value());
        let mut fewer = ObjectsDigest::default();
        fewer.add(&key("a", "1"));
        assert_ne!(a.value(), fewer.value());
        assert!(a.value().starts_with("2-"));
    }
}
