//! The CAs the CRDs must trust and the certificate a replica serves, across CA rotations
//! (pure): a new CA reaches every CRD's `caBundle` before the certificate it signed is
//! served, and leaves it only once no live replica serves one it signed.

/// The `caBundle` (PEM, empty when unset) of each CRD pointed at the webhook, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CrdBundles {
    pub(crate) bundles: Vec<String>,
}

impl CrdBundles {
    /// Whether every CRD pointed at the webhook trusts `ca` (PEM); true when none is.
    pub(crate) fn all_trust(&self, ca: &str) -> bool {
        self.bundles
            .iter()
            .all(|bundle| pem_blocks(bundle).iter().any(|block| same_ca(block, ca)))
    }

    /// How many of the CRDs trust `ca`, and how many there are.
    pub(crate) fn trusting(&self, ca: &str) -> (usize, usize) {
        let trusting = self
            .bundles
            .iter()
            .filter(|bundle| pem_blocks(bundle).iter().any(|block| same_ca(block, ca)))
            .count();
        (trusting, self.bundles.len())
    }

    /// The CAs (PEM) in their bundles, each once.
    pub(crate) fn cas(&self) -> Vec<String> {
        let mut cas: Vec<String> = Vec::new();
        for bundle in &self.bundles {
            for ca in pem_blocks(bundle) {
                if !cas.iter().any(|known| same_ca(known, &ca)) {
                    cas.push(ca);
                }
            }
        }
        cas
    }
}

/// A certificate, its key and the CA that signed it (PEM), as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CertificateSet {
    pub(crate) cert: String,
    pub(crate) key: String,
    pub(crate) ca: String,
}

/// What to do after a certificate set was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rotation {
    /// Serve this set now.
    Serve(CertificateSet),
    /// Its CA is new: it is appended to the bundle, and the set is served once every CRD
    /// trusts it.
    Pending,
    /// Nothing changed.
    Unchanged,
}

/// The CAs the CRDs must trust and the certificate served, across CA rotations: a new CA
/// reaches `caBundle`, appended to the ones in use, before the serving certificate it signed
/// is used (otherwise the apiserver would refuse the webhook until every CRD is updated). It
/// starts from what the CRDs trust (shared by every replica and kept across restarts, unlike
/// this process's memory), and a CA leaves the bundle only once no live replica serves a
/// certificate it signed. Its bundle always holds the CA of the certificate served and of
/// the one waiting to be.
#[derive(Debug, Default)]
pub(crate) struct CaRotation {
    /// The CAs the bundle holds, oldest first.
    trusted: Vec<String>,
    serving: Option<CertificateSet>,
    pending: Option<CertificateSet>,
    /// Whether the CRDs were read at least once: only then is the bundle known (before, it
    /// might leave out a CA another replica serves).
    seeded: bool,
}

fn same_ca(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
}

impl CaRotation {
    /// The CAs the CRDs pointed at the webhook trust now stay in the bundle until no replica
    /// needs them (see `prune`).
    pub(crate) fn learn(&mut self, crds: &CrdBundles) {
        for ca in crds.cas() {
            if !self.trusted.iter().any(|t| same_ca(t, &ca)) {
                self.trusted.push(ca);
            }
        }
        self.seeded = true;
    }

    /// A set was read (from files, or a Secret), and the CRDs with it. It is served at once
    /// when the CA in use signed it (a renewal) or when every CRD already trusts its CA (a
    /// first start, or the CA reached the CRDs); otherwise its CA is appended to the bundle
    /// and it waits (a restart mid-rotation must not serve a certificate the CRDs cannot
    /// verify yet).
    pub(crate) fn load(&mut self, set: CertificateSet, crds: &CrdBundles) -> Rotation {
        self.learn(crds);
        if !self.trusted.iter().any(|t| same_ca(t, &set.ca)) {
            self.trusted.push(set.ca.clone());
        }
        if self.serving.as_ref() == Some(&set) {
            self.pending = None;
            return Rotation::Unchanged;
        }
        let renewal = self.serving.as_ref().is_some_and(|s| same_ca(&s.ca, &set.ca));
        if renewal || crds.all_trust(&set.ca) {
            self.pending = None;
            self.serving = Some(set.clone());
            return Rotation::Serve(set);
        }
        self.pending = Some(set);
        Rotation::Pending
    }

    /// The CA a pending set waits to be trusted for.
    pub(crate) fn pending_ca(&self) -> Option<&str> {
        self.pending.as_ref().map(|p| p.ca.as_str())
    }

    /// The set served, if any.
    pub(crate) fn serving(&self) -> Option<&CertificateSet> {
        self.serving.as_ref()
    }

    /// The fingerprint of the CA whose certificate this replica serves.
    pub(crate) fn serving_fingerprint(&self) -> Option<String> {
        self.serving.as_ref().map(|s| super::record::fingerprint(&s.ca))
    }

    /// Whether the bundle holds the CA with this fingerprint.
    pub(crate) fn knows(&self, fingerprint: &str) -> bool {
        self.trusted
            .iter()
            .any(|ca| super::record::fingerprint(ca) == fingerprint)
    }

    /// Drops every CA that no live replica serves a certificate of (`live`: their
    /// fingerprints), except the one this replica serves and the one it waits to serve.
    pub(crate) fn prune(&mut self, live: &[String]) {
        let keep = |ca: &String| {
            live.contains(&super::record::fingerprint(ca))
                || self.serving.as_ref().is_some_and(|s| same_ca(&s.ca, ca))
                || self.pending.as_ref().is_some_and(|p| same_ca(&p.ca, ca))
        };
        let kept: Vec<String> = self.trusted.iter().filter(|ca| keep(ca)).cloned().collect();
        self.trusted = kept;
    }

    /// The `caBundle`: every trusted CA, oldest first; `None` until the CRDs were read.
    pub(crate) fn bundle(&self) -> Option<String> {
        self.seeded.then(|| {
            self.trusted
                .iter()
                .map(|ca| format!("{}\n", ca.trim_end()))
                .collect()
        })
    }
}

/// The PEM certificates of a bundle, each with its `-----END` line.
pub fn pem_blocks(bundle: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current = String::new();
    for line in bundle.lines() {
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END ") {
            blocks.push(std::mem::take(&mut current));
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: u8, ca: u8) -> CertificateSet {
        CertificateSet {
            cert: format!("cert-{n}"),
            key: format!("key-{n}"),
            ca: pem(ca),
        }
    }

    fn pem(ca: u8) -> String {
        format!("-----BEGIN CERTIFICATE-----\nCA{ca}\n-----END CERTIFICATE-----\n")
    }

    /// CRDs pointed at the webhook, each trusting the given CAs.
    fn crds(trusting: &[&[u8]]) -> CrdBundles {
        CrdBundles {
            bundles: trusting
                .iter()
                .map(|cas| cas.iter().map(|&ca| pem(ca)).collect())
                .collect(),
        }
    }

    #[test]
    fn a_new_ca_is_trusted_before_its_certificate_is_served() {
        use crate::webhook::ca::record::fingerprint;
        let mut rotation = CaRotation::default();
        assert_eq!(rotation.bundle(), None, "unknown before the CRDs were read");
        assert_eq!(rotation.load(set(1, 1), &crds(&[])), Rotation::Serve(set(1, 1)));
        assert_eq!(rotation.bundle().as_deref(), Some(pem(1).as_str()));
        let one = crds(&[&[1], &[1]]);
        assert_eq!(rotation.load(set(1, 1), &one), Rotation::Unchanged);
        // Renewed by the same CA: served at once.
        assert_eq!(rotation.load(set(2, 1), &one), Rotation::Serve(set(2, 1)));
        // A new CA: appended to the bundle, the certificate waits.
        assert_eq!(rotation.load(set(3, 2), &one), Rotation::Pending);
        assert_eq!(rotation.bundle(), Some(pem(1) + &pem(2)));
        assert_eq!(rotation.pending_ca(), Some(pem(2).as_str()));
        // One CRD of two trusts it: still waiting.
        assert_eq!(
            rotation.load(set(3, 2), &crds(&[&[1, 2], &[1]])),
            Rotation::Pending
        );
        assert_eq!(
            rotation.load(set(3, 2), &crds(&[&[1, 2], &[1, 2]])),
            Rotation::Serve(set(3, 2))
        );
        assert_eq!(rotation.pending_ca(), None);
        // The old CA stays while a replica serves a certificate it signed...
        rotation.prune(&[fingerprint(&pem(1)), fingerprint(&pem(2))]);
        assert_eq!(
            rotation.bundle(),
            Some(pem(1) + &pem(2)),
            "the old CA stays for slower replicas"
        );
        // ...and goes once none does.
        rotation.prune(&[fingerprint(&pem(2))]);
        assert_eq!(rotation.bundle(), Some(pem(2)));
        assert!(rotation.knows(&fingerprint(&pem(2))) && !rotation.knows(&fingerprint(&pem(1))));
    }

    /// A replica restarted mid-rotation: its memory is empty, the Secret already holds the
    /// new CA's set, and the CRDs trust only the old CA, which other replicas still serve.
    /// It must neither serve the new certificate at once nor drop the old CA.
    #[test]
    fn a_restart_mid_rotation_keeps_the_old_ca_and_waits_to_serve_the_new() {
        use crate::webhook::ca::record::fingerprint;
        let mut restarted = CaRotation::default();
        assert_eq!(restarted.load(set(3, 2), &crds(&[&[1]])), Rotation::Pending);
        assert_eq!(restarted.serving(), None, "nothing served");
        assert_eq!(
            restarted.bundle(),
            Some(pem(1) + &pem(2)),
            "the CRDs' CA is kept, the new one appended"
        );
        // Another replica still serves CA-1's certificate.
        restarted.prune(&[fingerprint(&pem(1))]);
        assert_eq!(restarted.bundle(), Some(pem(1) + &pem(2)));
        // Once every CRD trusts CA-2, it serves it.
        assert_eq!(
            restarted.load(set(3, 2), &crds(&[&[1, 2]])),
            Rotation::Serve(set(3, 2))
        );
        assert_eq!(restarted.pending_ca(), None);
    }

    #[test]
    fn bundles_count_the_crds_that_trust_a_ca() {
        let read = crds(&[&[1, 2], &[2], &[]]);
        assert_eq!(read.trusting(&pem(2)), (2, 3));
        assert!(!read.all_trust(&pem(2)), "the third trusts nothing");
        assert_eq!(read.cas(), [pem(1), pem(2)]);
        assert!(crds(&[]).all_trust(&pem(9)), "no CRD to trust it");
    }
}
