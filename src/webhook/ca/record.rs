//! What each replica's webhook serves, kept where every replica and a restarted one can see
//! it: annotations of the webhook Secret (`--webhook-secret`, in the lease namespace; created
//! with no data when certificates come from files). Each replica writes
//! `serving.crdlifecycle.io/<replica>: <CA fingerprint> <time>` whenever what it serves
//! changes and at least every third of the time to live; an entry older than its time to
//! live belongs to a replica that is gone and is dropped.
//! A CA stays in the CRDs' `caBundle` while a live replica serves a certificate it signed.
//! The record says since when it is kept (`crdlifecycle.io/serving-record-since`): only a
//! record kept for a whole time to live names every live replica (one re-created with its
//! Secret, e.g. deleted to make a new CA, does not yet), so only then may a CA leave.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};

/// Prefix of the annotations.
pub(crate) const ANNOTATION_PREFIX: &str = "serving.crdlifecycle.io/";
/// Since when the record is kept (RFC 3339).
pub const SINCE_ANNOTATION: &str = "crdlifecycle.io/serving-record-since";

/// What the record says after this replica's entry was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    /// The CA fingerprints live replicas serve, this one's included.
    pub(crate) fingerprints: Vec<String>,
    /// Whether the record has been kept for a whole time to live, so that every live
    /// replica had time to write its entry: only then may a CA missing from it leave the
    /// bundle.
    pub(crate) complete: bool,
}

/// A short, stable fingerprint of a CA certificate (PEM): SHA-256 of its trimmed text.
pub(crate) fn fingerprint(ca_pem: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, ca_pem.trim().as_bytes());
    digest.as_ref()[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// Where the record is, and whose entry this replica writes.
#[derive(Clone, Debug)]
pub struct RotationRecord {
    pub namespace: String,
    pub secret: String,
    /// This replica's identity (leader-election identity).
    pub replica: String,
    /// How long an entry stands without being written again; each replica writes its own
    /// at least every third of this.
    pub ttl: Duration,
}

impl RotationRecord {
    fn key(&self) -> String {
        // An annotation name is at most 63 characters: the identity's fingerprint.
        format!("{ANNOTATION_PREFIX}{}", &fingerprint(&self.replica)[..16])
    }

    /// Writes that this replica serves a certificate signed by the CA with `serving`
    /// fingerprint (none: nothing served yet), drops entries past their time to live, and
    /// returns what live replicas serve.
    pub async fn publish(
        &self,
        client: &Client,
        serving: Option<&str>,
        now: Timestamp,
    ) -> Result<Live, String> {
        let api: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        let failed = |e: kube::Error| {
            format!(
                "cannot record what this replica serves in Secret {}/{}: {e}",
                self.namespace, self.secret
            )
        };
        for _ in 0..5 {
            let existing = api.get_opt(&self.secret).await.map_err(failed)?;
            let mut secret = existing.clone().unwrap_or_else(|| Secret {
                metadata: ObjectMeta {
                    name: Some(self.secret.clone()),
                    namespace: Some(self.namespace.clone()),
                    labels: Some([("app.kubernetes.io/name".to_owned(), "crd-lifecycle".to_owned())].into()),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            });
            let annotations = secret.metadata.annotations.get_or_insert_with(BTreeMap::new);
            let live = update(annotations, &self.key(), serving, now, self.ttl);
            let written = match existing {
                Some(_) => api.replace(&self.secret, &PostParams::default(), &secret).await,
                None => api.create(&PostParams::default(), &secret).await,
            };
            match written {
                Ok(_) => return Ok(live),
                // Another replica wrote meanwhile: read again.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => return Err(failed(error)),
            }
        }
        Err(format!(
            "Secret {}/{} kept changing while this replica recorded what it serves",
            self.namespace, self.secret
        ))
    }
}

/// Sets this replica's entry, drops expired ones, and returns the fingerprints live
/// replicas serve.
fn update(
    annotations: &mut BTreeMap<String, String>,
    key: &str,
    serving: Option<&str>,
    now: Timestamp,
    ttl: Duration,
) -> Live {
    match serving {
        Some(fingerprint) => {
            annotations.insert(key.to_owned(), format!("{fingerprint} {now}"));
        }
        None => {
            annotations.remove(key);
        }
    }
    let ttl = jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::MAX);
    let since = match annotations
        .get(SINCE_ANNOTATION)
        .and_then(|at| at.parse::<Timestamp>().ok())
    {
        Some(since) => since,
        None => {
            annotations.insert(SINCE_ANNOTATION.to_owned(), now.to_string());
            now
        }
    };
    annotations.retain(|name, value| {
        !name.starts_with(ANNOTATION_PREFIX)
            || value
                .split_once(' ')
                .and_then(|(_, at)| at.parse::<Timestamp>().ok())
                .is_some_and(|at| now.duration_since(at) <= ttl)
    });
    let mut live: Vec<String> = annotations
        .iter()
        .filter(|(name, _)| name.starts_with(ANNOTATION_PREFIX))
        .filter_map(|(_, value)| {
            value
                .split_once(' ')
                .map(|(fingerprint, _)| fingerprint.to_owned())
        })
        .collect();
    live.sort();
    live.dedup();
    Live {
        fingerprints: live,
        complete: now.duration_since(since) >= ttl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_live_fingerprints_are_listed() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().expect("time");
        let mut annotations = BTreeMap::from([
            (
                format!("{ANNOTATION_PREFIX}a"),
                "old-ca 2026-11-23T11:59:00Z".to_owned(),
            ),
            (
                format!("{ANNOTATION_PREFIX}b"),
                "gone-ca 2026-11-23T10:00:00Z".to_owned(),
            ),
            ("other".to_owned(), "kept".to_owned()),
        ]);
        let live = update(
            &mut annotations,
            &format!("{ANNOTATION_PREFIX}c"),
            Some("new-ca"),
            now,
            Duration::from_secs(600),
        );
        assert_eq!(live.fingerprints, ["new-ca", "old-ca"]);
        assert!(!live.complete, "a record just started may miss replicas");
        assert_eq!(annotations[SINCE_ANNOTATION], "2026-11-23T12:00:00Z");
        let later = update(
            &mut annotations,
            &format!("{ANNOTATION_PREFIX}c"),
            Some("new-ca"),
            "2026-11-23T12:10:00Z".parse().expect("time"),
            Duration::from_secs(600),
        );
        assert!(later.complete, "kept for a whole time to live");
        assert_eq!(later.fingerprints, ["new-ca"], "old-ca's entry expired");
        assert!(
            !annotations.contains_key(&format!("{ANNOTATION_PREFIX}b")),
            "expired"
        );
        assert_eq!(annotations["other"], "kept");
    }
}
