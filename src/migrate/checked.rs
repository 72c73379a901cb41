//! The objects a conversion preflight read and found fit, by namespace, name and
//! resourceVersion: a later check of the same preflight lists the objects again and reads
//! only those created or changed since (any write moves an object's resourceVersion).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::requests::ObjectKey;

/// Objects as a preflight listed them. Held in memory only (16 bytes and the map's overhead
/// per object): each object's namespace and name and its resourceVersion are kept as 64-bit
/// hashes. Two objects whose names hash alike make one of them look changed (it is read
/// again); a changed object looks unchanged only if its new resourceVersion hashes like the
/// old one (about one chance in 2^64).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckedObjects {
    objects: HashMap<u64, u64>,
}

fn hash(parts: &[&str]) -> u64 {
    let mut hasher = DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

impl CheckedObjects {
    /// Adds an object as listed.
    pub fn add(&mut self, key: &ObjectKey) {
        self.objects.insert(
            hash(&[key.namespace.as_deref().unwrap_or_default(), &key.name]),
            hash(&[&key.resource_version]),
        );
    }

    /// Whether the object is here at the same resourceVersion (unchanged since).
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.objects
            .get(&hash(&[key.namespace.as_deref().unwrap_or_default(), &key.name]))
            .is_some_and(|rv| *rv == hash(&[&key.resource_version]))
    }

    /// How many objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str, rv: &str) -> ObjectKey {
        ObjectKey {
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            resource_version: rv.to_owned(),
            managed_fields: Vec::new(),
        }
    }

    #[test]
    fn an_object_is_unchanged_only_at_the_same_resource_version() {
        let mut checked = CheckedObjects::default();
        checked.add(&key("ns", "a", "10"));
        checked.add(&key("ns", "b", "11"));
        assert_eq!(checked.len(), 2);
        assert!(checked.contains(&key("ns", "a", "10")));
        assert!(!checked.contains(&key("ns", "a", "12")), "written since");
        assert!(!checked.contains(&key("other", "a", "10")), "another object");
        assert!(!checked.contains(&key("ns", "c", "13")), "created since");
    }
}
