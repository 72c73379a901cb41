//! The conversion webhook's certificates in the simulation (issue 34). On the seeds that draw
//! it (`Workload::webhook`), every replica serves the webhook as `run` does
//! (`RunSettings::webhook`): it reads (or creates) the self-signed CA and serving certificate
//! in the Secret, records on the Secret what it serves, serves a certificate only once every
//! CRD pointed at the webhook trusts its CA, and the leader writes the CAs to the CRD's
//! `caBundle` (its reconcile, and the CA bundle keeper); the policy converts through the
//! webhook. Nobody connects to the webhook's port: what the simulation looks at is what each
//! replica shows the outside (`controller::Probes`: what its `/readyz` would answer, and the
//! certificate its TLS server presents), read without network I/O, and the fake's storage,
//! never what the controller believes:
//!
//! 1. a Ready replica serves a certificate whose CA (the `ca.crt` of the Secret that held the
//!    certificate) is in the `caBundle` of every CRD pointed at the webhook, as stored: else the
//!    apiserver's conversion calls sent to it fail TLS;
//! 2. the apiserver refuses no CRD write of a replica for its validation (`caBundle`, storage
//!    versions, deprecation warnings; a stored version dropped is `invariants::checker`'s);
//! 3. liveness: within [`SETTLE_BOUND`] of the faults' end every replica is Ready and every CRD
//!    pointed at the webhook trusts the CA each one serves, and it stays so.
//!
//! Keys come from real randomness: CAs are named in the trace by order of appearance (`CA#1`,
//! ...), never by their PEM or fingerprint, so that a seed's trace and requests replay exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crd_lifecycle::controller::Probes;
use crd_lifecycle::conversion::RecordedConversion;
use crd_lifecycle::webhook::WebhookSettings;
use crd_lifecycle::webhook::ca::{CertificateSource, RotationRecord, WebhookTarget};
use serde_json::{Value, json};

use crate::apiserver::{Checker, State};
use crate::invariants::{Findings, is_replica};

/// Where the replicas keep their certificates and record (`run`'s defaults: `--webhook-secret`
/// in the lease namespace).
pub const NAMESPACE: &str = "crd-lifecycle";
pub const SECRET: &str = "crd-lifecycle-webhook-tls";
/// The webhook's Service (`--webhook-service crd-lifecycle/crd-lifecycle-webhook`).
pub const SERVICE: &str = "crd-lifecycle-webhook";

/// How long a replica's entry in the rotation record stands: `run`'s with certificate files
/// (180 s), so that each replica writes its entry and reads the Secret every minute. With the
/// Secret `run` takes 3 h (a read an hour): a deleted Secret would show within a run only
/// through a restart, and no CA would ever leave the bundle.
pub const RECORD_TTL: Duration = Duration::from_secs(180);

/// How long after the faults stop every replica must be Ready, every CA it serves trusted by
/// every CRD pointed at the webhook: the other replica's next pass reads the Secret (every
/// [`RECORD_TTL`] / 3, 60 s), the leader's bundle reaches the CRD at once (a lease taken over
/// first: 15 s), and the waiting replica's next check of the CRDs follows within its backoff
/// (at most 30 s); with a margin.
pub const SETTLE_BOUND: u64 = 150;

/// The webhook of the replica `actor`, as `run --webhook-port 0 --webhook-service
/// crd-lifecycle/crd-lifecycle-webhook` sets it (on 127.0.0.1: nobody connects to it).
pub fn settings(actor: &str) -> WebhookSettings {
    WebhookSettings {
        address: ([127, 0, 0, 1], 0).into(),
        target: WebhookTarget::Service {
            namespace: NAMESPACE.into(),
            name: SERVICE.into(),
            port: 443,
        },
        certificates: CertificateSource::Secret {
            namespace: NAMESPACE.into(),
            name: SECRET.into(),
        },
        limits: Default::default(),
        record: Some(RotationRecord {
            namespace: NAMESPACE.into(),
            secret: SECRET.into(),
            replica: actor.into(),
            ttl: RECORD_TTL,
        }),
        connections: Default::default(),
    }
}

/// The policy's `spec.conversion`: through the operator's webhook, one step between each two
/// adjacent versions (the CRD's versions share one schema: nothing changes on the way).
pub fn conversion() -> Value {
    json!({"webhook": {"enabled": true},
           "changes": [{"from": "v1alpha1", "to": "v1beta1"}, {"from": "v1beta1", "to": "v1"}]})
}

/// The replicas running now, with what each shows the outside; a stopped one is absent (its
/// pod is not Ready, and serves nothing).
#[derive(Clone, Default)]
pub struct Running(Arc<Mutex<BTreeMap<&'static str, Probes>>>);

impl Running {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<&'static str, Probes>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn started(&self, actor: &'static str, probes: Probes) {
        self.lock().insert(actor, probes);
    }

    pub fn killed(&self, actor: &'static str) {
        self.lock().remove(actor);
    }

    /// The process started with `probes` ended on its own (unless started again since).
    pub fn exited(&self, actor: &'static str, probes: &Probes) {
        let mut running = self.lock();
        if running
            .get(actor)
            .is_some_and(|p| Arc::ptr_eq(&p.health, &probes.health))
        {
            running.remove(actor);
        }
    }

    fn all(&self) -> Vec<(&'static str, Probes)> {
        self.lock().iter().map(|(a, p)| (*a, p.clone())).collect()
    }
}

/// What a replica's webhook serves, by CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serves {
    Nothing,
    /// A certificate of the CA with this index (`Certificates::cas`).
    Ca(usize),
    /// A certificate no Secret ever held.
    Unknown,
}

/// The checks' memory: every certificate the Secret held, and what was last put in the trace.
#[derive(Default)]
pub struct Certificates {
    /// Whether the replicas serve the webhook in this run.
    webhook: bool,
    /// Every CA seen (normalised PEM), in order of appearance: `CA#1` is the first.
    cas: Vec<String>,
    /// Every serving certificate a Secret held (DER), with its CA (an index into `cas`).
    issued: Vec<(Vec<u8>, usize)>,
    /// The Secret's resourceVersion when last read (`None`: gone).
    secret_read: Option<Option<String>>,
    /// The CRDs pointed at the webhook, and what they were read from (each CRD's
    /// resourceVersion and the CRD each policy names).
    pointed: (String, Vec<(String, Vec<usize>)>),
    /// What the trace last said of the Secret, of each CRD's bundle, of each replica.
    secret: Option<String>,
    bundles: BTreeMap<String, String>,
    shown: BTreeMap<&'static str, (Result<(), String>, Serves)>,
    /// The violations of invariant 1 standing at the last check: each is reported as it
    /// starts, not at every step it lasts.
    standing: BTreeSet<String>,
    /// Validation refusals already looked at.
    refusals: usize,
}

/// A PEM certificate without its line breaks (the same certificate, however wrapped).
fn normalise(pem: &str) -> String {
    pem.split_whitespace().collect()
}

/// A refusal's message without the `caBundle` it quotes (base64 of PEMs from real
/// randomness: the trace must replay exactly).
fn without_bundle(refusal: &str) -> String {
    const QUOTED: &str = "caBundle: Invalid value: \"";
    match refusal.split_once(QUOTED) {
        Some((before, after)) => {
            let rest = after.split_once('"').map_or("", |(_, rest)| rest);
            format!("{before}{QUOTED}...\"{rest}")
        }
        None => refusal.to_owned(),
    }
}

fn decode(encoded: &Value) -> Option<String> {
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded.as_str()?).ok()?;
    String::from_utf8(bytes).ok()
}

/// Whether the webhook serves the CRD: a policy names it, or it records its conversion
/// (`webhook::ca::pointed_crds::candidates`); any other CRD gets every review refused, whatever CA it
/// trusts.
fn served_by_the_webhook(state: &State, name: &str, crd: &Value) -> bool {
    let annotations: Option<BTreeMap<String, String>> =
        serde_json::from_value(crd["metadata"]["annotations"].clone()).ok();
    state.policies.values().any(|p| p["spec"]["crdName"] == name)
        || RecordedConversion::from_annotations(annotations.as_ref()).is_some()
}

impl Certificates {
    pub fn new(webhook: bool) -> Certificates {
        Certificates {
            webhook,
            ..Certificates::default()
        }
    }

    /// The index of a CA (PEM), named now if it is new.
    fn ca(&mut self, pem: &str) -> usize {
        let pem = normalise(pem);
        match self.cas.iter().position(|known| *known == pem) {
            Some(i) => i,
            None => {
                self.cas.push(pem);
                self.cas.len() - 1
            }
        }
    }

    fn names(cas: &[usize]) -> String {
        let names: Vec<String> = cas.iter().map(|i| format!("CA#{}", i + 1)).collect();
        format!("[{}]", names.join(", "))
    }

    /// Learns the certificates the Secret holds; says in the trace when they change.
    fn learn_secret(&mut self, state: &State, findings: &mut Findings) {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let secret = state.secrets.get(SECRET);
        let read = secret.map(|s| {
            s["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        if self.secret_read.as_ref() == Some(&read) {
            return;
        }
        self.secret_read = Some(read);
        let data = secret.map(|s| &s["data"]);
        let pems = data.and_then(|d| Some((decode(&d["ca.crt"])?, decode(&d["tls.crt"])?)));
        let said = match (secret, pems) {
            (None, _) => "gone".to_owned(),
            (Some(_), None) => "without certificates (the rotation record alone)".to_owned(),
            (Some(_), Some((ca, cert))) => {
                let index = self.ca(&ca);
                if let Ok(der) = CertificateDer::from_pem_slice(cert.as_bytes())
                    && !self.issued.iter().any(|(known, _)| **known == *der)
                {
                    self.issued.push((der.to_vec(), index));
                }
                format!("holds CA#{} and a certificate it signed", index + 1)
            }
        };
        if self.secret.as_ref() != Some(&said) {
            findings.note(format!("Secret {NAMESPACE}/{SECRET} {said}"));
            self.secret = Some(said);
        }
    }

    /// Every CRD pointed at the webhook and served by it, with the CAs its `caBundle` holds.
    fn pointed(&mut self, state: &State) -> Vec<(String, Vec<usize>)> {
        let mut key = String::new();
        for (name, crd) in &state.crds {
            key += &format!("{name}@{} ", crd["metadata"]["resourceVersion"]);
        }
        for policy in state.policies.values() {
            key += &format!("<-{} ", policy["spec"]["crdName"]);
        }
        if self.pointed.0 == key {
            return self.pointed.1.clone();
        }
        let mut pointed = Vec::new();
        for (name, crd) in &state.crds {
            let conversion = &crd["spec"]["conversion"];
            let config = &conversion["webhook"]["clientConfig"];
            if conversion["strategy"] != "Webhook"
                || config["service"]["namespace"] != NAMESPACE
                || config["service"]["name"] != SERVICE
                || !served_by_the_webhook(state, name, crd)
            {
                continue;
            }
            let bundle = decode(&config["caBundle"]).unwrap_or_default();
            let cas = crd_lifecycle::webhook::ca::pem_blocks(&bundle)
                .iter()
                .map(|pem| self.ca(pem))
                .collect();
            pointed.push((name.clone(), cas));
        }
        self.pointed = (key, pointed.clone());
        pointed
    }

    /// What a replica shows: what its `/readyz` answers, and the CA of the certificate its
    /// webhook serves.
    fn shown(&self, probes: &Probes) -> (Result<(), String>, Serves) {
        let serves = match probes.certificate.served() {
            None => Serves::Nothing,
            Some(served) => self
                .issued
                .iter()
                .find(|(cert, _)| **cert == *served)
                .map_or(Serves::Unknown, |(_, ca)| Serves::Ca(*ca)),
        };
        (probes.health.readiness(), serves)
    }

    /// Why a replica showing (`ready`, `serves`) breaks the apiserver's TLS to it, if it
    /// does: a Ready replica's certificate must be of a CA every pointed CRD trusts.
    fn untrusted(actor: &str, serves: Serves, pointed: &[(String, Vec<usize>)]) -> Vec<String> {
        match serves {
            Serves::Nothing => vec![format!(
                "{actor} is Ready but its webhook serves no certificate: every TLS handshake fails"
            )],
            Serves::Unknown => vec![format!(
                "{actor} is Ready and serves a certificate no Secret held: no CRD can trust it"
            )],
            Serves::Ca(ca) => pointed
                .iter()
                .filter(|(_, cas)| !cas.contains(&ca))
                .map(|(crd, cas)| {
                    format!(
                        "{actor} is Ready and serves a certificate of CA#{}, which the caBundle of {crd} does not \
                         hold ({}): the apiserver's conversion calls sent to it fail TLS",
                        ca + 1,
                        Certificates::names(cas)
                    )
                })
                .collect(),
        }
    }

    /// Invariants 1 and 2, after a step (and every second of the run).
    pub fn check(&mut self, state: &State, running: &Running, findings: &mut Findings) {
        for (sender, refusal) in state.refused_crd_validations.iter().skip(self.refusals) {
            let refusal = without_bundle(refusal);
            if is_replica(sender) {
                findings.violation(format!("the apiserver refused {sender}'s CRD write: {refusal}"));
            } else {
                findings.note(format!("the apiserver refused {sender}'s CRD write: {refusal}"));
            }
        }
        self.refusals = state.refused_crd_validations.len();
        if !self.webhook {
            return;
        }
        self.learn_secret(state, findings);
        let pointed = self.pointed(state);
        for (crd, cas) in &pointed {
            let said = Certificates::names(cas);
            if self.bundles.get(crd) != Some(&said) {
                findings.note(format!("{crd}: caBundle {said}"));
                self.bundles.insert(crd.clone(), said);
            }
        }
        self.bundles
            .retain(|crd, _| pointed.iter().any(|(name, _)| name == crd));
        let mut standing = BTreeSet::new();
        let all = running.all();
        for (actor, probes) in &all {
            let shown = self.shown(probes);
            if shown.0.is_ok() {
                standing.extend(Certificates::untrusted(actor, shown.1, &pointed));
            }
            if self.shown.get(actor) != Some(&shown) {
                findings.note(format!(
                    "{actor}: {}, serves {}",
                    match &shown.0 {
                        Ok(()) => "Ready".to_owned(),
                        Err(why) => format!("not Ready ({why})"),
                    },
                    match shown.1 {
                        Serves::Nothing => "no certificate".to_owned(),
                        Serves::Ca(ca) => format!("a certificate of CA#{}", ca + 1),
                        Serves::Unknown => "a certificate no Secret held".to_owned(),
                    }
                ));
                self.shown.insert(actor, shown);
            }
        }
        self.shown.retain(|actor, _| all.iter().any(|(a, _)| a == actor));
        for violation in standing.difference(&self.standing) {
            findings.violation(violation.clone());
        }
        self.standing = standing;
    }

    /// Why the webhook is not settled yet (invariant 3), if it is not: a replica of
    /// `replicas` not running or not Ready, or serving a certificate of a CA some CRD pointed
    /// at the webhook does not trust.
    fn unsettled(&mut self, state: &State, running: &Running, replicas: &[&'static str]) -> Option<String> {
        let pointed = self.pointed(state);
        let all = running.all();
        for actor in replicas {
            let Some((_, probes)) = all.iter().find(|(a, _)| a == actor) else {
                return Some(format!("{actor} is not running"));
            };
            let (ready, serves) = self.shown(probes);
            if let Err(why) = ready {
                return Some(format!("{actor} is not Ready: {why}"));
            }
            if let Some(problem) = Certificates::untrusted(actor, serves, &pointed)
                .into_iter()
                .next()
            {
                return Some(problem);
            }
        }
        None
    }

    /// The CAs the CRDs pointed at the webhook trust that no replica serves (left for the
    /// trace: a CA leaves the bundle only once the record names every live replica).
    fn unserved(&mut self, state: &State, running: &Running) -> Vec<usize> {
        let pointed = self.pointed(state);
        let served: Vec<Serves> = running.all().iter().map(|(_, p)| self.shown(p).1).collect();
        let mut unserved: Vec<usize> = pointed
            .iter()
            .flat_map(|(_, cas)| cas.iter().copied())
            .filter(|ca| !served.contains(&Serves::Ca(*ca)))
            .collect();
        unserved.sort_unstable();
        unserved.dedup();
        unserved
    }
}

/// The checker the fake calls after every step: `inner` (`invariants::checker`), then
/// invariants 1 and 2.
pub fn checker(
    mut inner: Checker,
    findings: Arc<Mutex<Findings>>,
    certificates: Arc<Mutex<Certificates>>,
    running: Running,
) -> Checker {
    Box::new(move |state: &State| {
        let halt = inner(state);
        let mut findings = findings.lock().unwrap_or_else(|p| p.into_inner());
        certificates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(state, &running, &mut findings);
        halt
    })
}

/// Invariant 3, second by second once the faults stopped.
#[derive(Default)]
pub struct Settling {
    /// The second the webhook first settled after the faults stopped.
    since: Option<u64>,
    /// Whether a violation of it was reported (once per run).
    reported: bool,
}

impl Settling {
    /// Looks at second `second` (at or after `horizon`, when the faults stopped).
    #[allow(clippy::too_many_arguments)]
    pub fn second(
        &mut self,
        second: u64,
        horizon: u64,
        state: &State,
        running: &Running,
        replicas: &[&'static str],
        findings: &mut Findings,
        certificates: &mut Certificates,
    ) {
        if !certificates.webhook || self.reported {
            return;
        }
        match (certificates.unsettled(state, running, replicas), self.since) {
            (None, None) => {
                self.since = Some(second);
                let unserved = certificates.unserved(state, running);
                let left = if unserved.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (the caBundle also holds {}, which no replica serves)",
                        Certificates::names(&unserved)
                    )
                };
                findings.note(format!(
                    "the webhook settled {}s after the faults stopped: every replica Ready, every CA served trusted{left}",
                    second - horizon
                ));
            }
            (Some(problem), Some(since)) => {
                self.reported = true;
                findings.violation(format!(
                    "liveness: the webhook settled {}s after the faults stopped, then: {problem}",
                    since - horizon
                ));
            }
            (Some(problem), None) if second >= horizon + SETTLE_BOUND => {
                self.reported = true;
                findings.violation(format!(
                    "liveness: {SETTLE_BOUND}s after the faults stopped the webhook has not settled: {problem}"
                ));
            }
            _ => {}
        }
    }

    /// At the end of a run (at least `REST` after the faults stopped): it must have settled.
    pub fn end(&mut self, findings: &mut Findings, webhook: bool) {
        if webhook && self.since.is_none() && !self.reported {
            self.reported = true;
            findings.violation("liveness: the run ended and the webhook never settled".to_owned());
        }
    }
}
