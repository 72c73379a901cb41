//! What one seed draws: the workload (the policy's timeline, the engine, the objects and their
//! writers) and the fault schedule. Drawn once, before the run, from the seed alone: the same
//! seed draws the same run, and the shrinker replays a seed with some faults left out.

use std::fmt;

/// The crate's seeded generator (`schema::Rng`, SplitMix64: the same numbers on every
/// machine), over the unsigned ranges a draw needs.
pub struct Rng(crd_lifecycle::schema::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(crd_lifecycle::schema::Rng::new(seed ^ 0x9E37_79B9_7F4A_7C15))
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        self.0.between(low as i64, high as i64) as u64
    }

    /// True with probability `percent` in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.0.chance(percent)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        self.0.pick(items)
    }
}

/// The versions of the simulated CRD, oldest first.
pub const VERSIONS: [&str; 3] = ["v1alpha1", "v1beta1", "v1"];

/// The policy's milestones, in seconds after the start: v1beta1 store, v1 introduce, v1
/// store, v1alpha1 deprecate, v1beta1 deprecate, v1alpha1 unserve, v1alpha1 remove, v1beta1
/// unserve, v1beta1 remove (the bundled example's order).
pub const MILESTONES: [&str; 9] = [
    "v1beta1.store",
    "v1.introduce",
    "v1.store",
    "v1alpha1.deprecate",
    "v1beta1.deprecate",
    "v1alpha1.unserve",
    "v1alpha1.remove",
    "v1beta1.unserve",
    "v1beta1.remove",
];

/// How the controller migrates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Internal,
    /// Kubernetes' StorageVersionMigration (the kube-controller-manager's svm controller).
    Builtin,
}

/// Everything a seed runs, but the faults.
#[derive(Clone, Debug)]
pub struct Workload {
    pub engine: Engine,
    /// Whether `storagemigration.k8s.io` is served (always with the built-in engine).
    pub svm_served: bool,
    /// Seconds after the start of each of `MILESTONES`, ascending.
    pub milestones: [u64; 9],
    /// Objects created before the start (stored as v1alpha1).
    pub objects: usize,
    /// Seconds between two writes of the writers (0: no writers).
    pub write_every: u64,
    /// The policy's engine is switched at this second (a user editing the policy).
    pub engine_switch_at: Option<u64>,
    /// Replicas of the controller: 2 elect a leader through a Lease.
    pub replicas: usize,
    /// The controller's clock against the apiserver's and the kube-controller-manager's from
    /// the start, in seconds (a node whose clock is off; `Skew` faults move it later).
    pub skew: i64,
    /// Whether the replicas serve the conversion webhook (its certificates in a Secret, the
    /// CA keeper writing the CRD's `caBundle`), and the policy converts through it.
    pub webhook: bool,
}

/// One fault, at its second.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The controller process is killed wherever it is and started again `down` seconds
    /// later with nothing in memory.
    Crash { down: u64 },
    /// Watches deliver every change `delay` seconds late, for `lasting` seconds (a loaded
    /// apiserver: what the controller keeps is that much behind).
    WatchDelay { delay: u64, lasting: u64 },
    /// The next `requests` requests for the CRD's objects and discovery are answered by an
    /// apiserver that has not acted on the CRD's last change of versions yet (HA).
    SwitchLag { requests: u32 },
    /// The apiserver restarts after a compaction: watches end and resume with a 410.
    ExpireWatches,
    /// A GitOps tool re-applies the CRD as it was first applied (storage back on
    /// v1alpha1, every version back).
    ReapplyOldCrd,
    /// `kubectl edit`: the storage version moved to another version the CRD still has.
    FlipStorage { to: &'static str },
    /// Sieve's intermediate state, triggered by the controller's own progress: right after
    /// the `after_pages`-th page a run lists from now, `kubectl edit` moves the storage
    /// version to another stored, served version and a client writes the first `writes`
    /// objects (stored there, maybe after their rewrite), before the controller moves it back.
    FlipDuringRun { after_pages: u32, writes: usize },
    /// Someone else's StorageVersionMigration of the CRD, which succeeds or fails.
    ForeignMigration { fails: bool },
    /// Someone else's StorageVersionMigration fails, and Kubernetes processes its end (trims
    /// `storedVersions`) just before the controller's `after_reads + 1`-th read of the CRD
    /// from now: between a decision and the run it starts, or inside a run.
    ForeignFailureAtRead { after_reads: u32 },
    /// Someone else's StorageVersionMigration fails, and Kubernetes processes its end (trims
    /// `storedVersions`) between a reconcile's decision to start a run and the run's start:
    /// at the read of its policy of the `runs + 1`-th run from now that starts while a
    /// migration is due, whose answer then takes `wait_ms` (a slow answer, or a run waiting
    /// for a free slot), so the run starts after the trim (finding 1's timing).
    ForeignFailureBeforeRun { runs: u32, wait_ms: u64 },
    /// The built-in migrator fails every migration for `lasting` seconds.
    MigrationsFail { lasting: u64 },
    /// The controller's clock moves `seconds` (ahead or behind) against the apiserver's.
    Skew { seconds: i64 },
    /// The kube-controller-manager's svm controller picks nothing up until just before the
    /// controller's next CRD patch, and an HA apiserver lags `lag` requests behind that
    /// patch: a StorageVersionMigration created for the storage version before runs after a
    /// switch, through an apiserver that still stores the old version (seed 378's finding).
    /// With `edit`, Sieve's intermediate state on top: once a migration of the controller's
    /// is Pending, `kubectl edit` moves the storage version to another served version (so
    /// that the next patch may be the controller putting it back; seed 924's class).
    SvmLateAfterPatch { lag: u32, edit: bool },
    /// The leader's lease requests hang for `lasting` seconds (cut off from the lease, not
    /// from the rest): it must stop writing before the lease it cannot renew expires and
    /// another replica takes over.
    PartitionLeader { lasting: u64 },
    /// Write answers come back `millis` late for `lasting` seconds (a crash in between
    /// wrote without learning it).
    SlowAnswers { millis: u64, lasting: u64 },
    /// The policy is deleted (`kubectl delete versionpolicy`): the controller releases the
    /// CRD wherever its lifecycle stands, and no trim or removal may follow that loses
    /// objects.
    DeletePolicy,
    /// Every request takes `millis` before the apiserver acts on it, for `lasting` seconds
    /// (other writers act between a read and the write decided on it).
    SlowApiserver { millis: u64, lasting: u64 },
    /// The controller's clock runs `ahead` seconds ahead of the control plane's from now;
    /// right after the controller's next migration succeeds, `kubectl edit` flips the
    /// storage version back to another served version and forth again, a client writes
    /// `writes` objects in between, and someone else's StorageVersionMigration fails (its end
    /// trims `storedVersions`): a failure that ended after the run, although the run's
    /// `startedAt` on the controller's clock is later (review finding F4).
    FlipBackAfterRun { writes: usize, ahead: i64 },
    /// Right after the controller's next migration succeeds, `kubectl edit` flips the
    /// storage version back and forth with two objects written in between, someone else's
    /// StorageVersionMigration fails (its end trims `storedVersions`), and `after` seconds
    /// later its owner deletes the failed migrations: the knowledge that a trim left objects
    /// behind goes with them, long before a removal is due (review).
    ForeignFailureDeleted { after: u64 },
    /// A release upgrade: `crd-lifecycle check --fix` against the release's CRD (the example
    /// without its first `drop` versions, storage on v1), and when it exits 0, the release's
    /// CRD is applied (a GitOps tool or `helm upgrade`), while the controller goes on; in an
    /// HA control plane, an apiserver that has not acted on the apply answers the next `lag`
    /// requests for the objects (clients still write through a dropped version).
    CheckFixThenApply { drop: usize, lag: u32 },
    /// The apiserver restarts after a compaction (watches end and resume with a 410), and
    /// API Priority and Fairness refuses the next `count` watch starts (429, as recorded).
    /// (It refuses lists the same way; the fake refuses only watch starts.)
    WatchStartsRefused { count: u32 },
    /// `kubectl delete crd` (its instances deleted, then the CRD gone, as recorded): the
    /// controller must say so and stop, whatever it was doing.
    DeleteCrd,
    /// `kubectl delete secret` of the webhook's certificates (and rotation record): the
    /// replica that reads it next makes a new CA, and a CA rotation starts.
    DeleteWebhookSecret,
}

impl Fault {
    /// The summary's kind of fault.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::WatchDelay { .. }
            | Fault::SwitchLag { .. }
            | Fault::SvmLateAfterPatch { .. }
            | Fault::ExpireWatches
            | Fault::WatchStartsRefused { .. }
            | Fault::SlowApiserver { .. } => "stale",
            Fault::Crash { .. } | Fault::SlowAnswers { .. } | Fault::PartitionLeader { .. } => "crash",
            Fault::ReapplyOldCrd
            | Fault::FlipStorage { .. }
            | Fault::FlipDuringRun { .. }
            | Fault::ForeignMigration { .. }
            | Fault::ForeignFailureAtRead { .. }
            | Fault::ForeignFailureBeforeRun { .. }
            | Fault::DeletePolicy
            | Fault::FlipBackAfterRun { .. }
            | Fault::ForeignFailureDeleted { .. }
            | Fault::CheckFixThenApply { .. }
            | Fault::DeleteCrd
            | Fault::DeleteWebhookSecret
            | Fault::MigrationsFail { .. } => "writer",
            Fault::Skew { .. } => "skew",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash { down } => write!(f, "crash the controller ({down}s down)"),
            Fault::WatchDelay { delay, lasting } => write!(f, "watches {delay}s late for {lasting}s"),
            Fault::SwitchLag { requests } => {
                write!(f, "a lagging apiserver answers the next {requests} requests")
            }
            Fault::ExpireWatches => write!(f, "apiserver restart after a compaction (watches 410)"),
            Fault::ReapplyOldCrd => write!(f, "GitOps re-applies the CRD as first applied"),
            Fault::FlipStorage { to } => write!(f, "kubectl edit: storage version {to}"),
            Fault::FlipDuringRun { after_pages, writes } => write!(
                f,
                "after list page {after_pages} of a run: kubectl edit flips the storage version, {writes} object(s) written"
            ),
            Fault::ForeignMigration { fails } => {
                write!(
                    f,
                    "another's StorageVersionMigration that {}",
                    if *fails { "fails" } else { "succeeds" }
                )
            }
            Fault::ForeignFailureAtRead { after_reads } => write!(
                f,
                "another's StorageVersionMigration fails, its end trims storedVersions before the controller's read {}",
                after_reads + 1
            ),
            Fault::ForeignFailureBeforeRun { runs, wait_ms } => write!(
                f,
                "another's StorageVersionMigration fails, its end trims storedVersions as the controller's run {} \
                 from now that starts while a migration is due reads its policy, answered {wait_ms}ms later",
                runs + 1
            ),
            Fault::DeletePolicy => write!(f, "kubectl delete versionpolicy widgets"),
            Fault::MigrationsFail { lasting } => {
                write!(f, "every StorageVersionMigration fails for {lasting}s")
            }
            Fault::Skew { seconds } => write!(f, "controller clock skew {seconds:+}s"),
            Fault::PartitionLeader { lasting } => {
                write!(f, "the leader cut off from its lease for {lasting}s")
            }
            Fault::SvmLateAfterPatch { lag, edit } => write!(
                f,
                "the svm controller idle until the controller's next CRD patch, an apiserver {lag} requests behind it{}",
                if *edit {
                    "; kubectl edit moves the storage version once the controller's migration is Pending"
                } else {
                    ""
                }
            ),
            Fault::SlowAnswers { millis, lasting } => {
                write!(f, "write answers {millis}ms late for {lasting}s")
            }
            Fault::SlowApiserver { millis, lasting } => {
                write!(f, "every request {millis}ms slow for {lasting}s")
            }
            Fault::ForeignFailureDeleted { after } => write!(
                f,
                "after its next migration: kubectl edit flips the storage version back and forth, 2 objects \
                 written, another's StorageVersionMigration fails, and {after}s later the failed ones are deleted"
            ),
            Fault::DeleteCrd => write!(f, "kubectl delete crd widgets.example.com"),
            Fault::DeleteWebhookSecret => write!(
                f,
                "kubectl delete secret {}/{} (the webhook's CA and certificate)",
                crate::webhook::NAMESPACE,
                crate::webhook::SECRET
            ),
            Fault::WatchStartsRefused { count } => {
                write!(
                    f,
                    "apiserver restart after a compaction, and API Priority and Fairness refuses the next {count} watch \
                     starts (429)"
                )
            }
            Fault::CheckFixThenApply { drop, lag } => write!(
                f,
                "crd-lifecycle check --fix of a release that drops {}, then its CRD applied if it exits 0 (an \
                 apiserver {lag} requests behind it)",
                VERSIONS[..*drop].join(" and ")
            ),
            Fault::FlipBackAfterRun { writes, ahead } => write!(
                f,
                "controller clock {ahead:+}s; after its next migration: kubectl edit flips the storage version back \
                 and forth, {writes} object(s) written, another's StorageVersionMigration fails"
            ),
        }
    }
}

/// A seed's draw.
#[derive(Clone, Debug)]
pub struct Draw {
    pub workload: Workload,
    /// (second, fault), in time order.
    pub faults: Vec<(u64, Fault)>,
}

impl Draw {
    /// The second after which no fault starts (the liveness bound counts from the end of
    /// the last one).
    pub fn horizon(&self) -> u64 {
        self.workload.milestones[8] + 30
    }
}

pub fn draw(seed: u64) -> Draw {
    let mut rng = Rng::new(seed);
    let engine = if rng.chance(50) {
        Engine::Builtin
    } else {
        Engine::Internal
    };
    let svm_served = engine == Engine::Builtin || rng.chance(60);
    // Milestones close together (the faults land between and during them), in the bundled
    // example's order, each after the one before (a valid policy: two stores at one instant
    // are not).
    let mut milestones = [0u64; 9];
    let mut at = rng.between(5, 30);
    for slot in &mut milestones {
        *slot = at;
        at += rng.between(1, 60);
    }
    let workload = Workload {
        engine,
        svm_served,
        milestones,
        objects: rng.between(1, 24) as usize,
        write_every: if rng.chance(70) { rng.between(1, 8) } else { 0 },
        engine_switch_at: (svm_served && rng.chance(30)).then(|| rng.between(0, milestones[6])),
        replicas: if rng.chance(40) { 2 } else { 1 },
        skew: if rng.chance(30) {
            rng.between(0, 20) as i64 - 10
        } else {
            0
        },
        // Drawn last (below).
        webhook: false,
    };
    let horizon = milestones[8] + 30;
    let count = rng.between(0, 12);
    let mut faults = Vec::new();
    for _ in 0..count {
        let at = rng.between(0, horizon);
        let fault = match rng.between(0, 18) {
            // Rarer than the others: it ends the lifecycle the other faults act on.
            18 if rng.chance(30) => Fault::DeletePolicy,
            18 if rng.chance(50) => Fault::FlipBackAfterRun {
                writes: rng.between(1, 4) as usize,
                ahead: rng.between(5, 30) as i64,
            },
            18 => Fault::ForeignFailureDeleted {
                after: rng.between(0, 60),
            },
            17 => Fault::ForeignFailureBeforeRun {
                runs: rng.between(0, 2) as u32,
                wait_ms: rng.between(0, 3000),
            },
            16 => Fault::SvmLateAfterPatch {
                lag: rng.between(1, 40) as u32,
                edit: rng.chance(50),
            },
            15 => Fault::PartitionLeader {
                lasting: rng.between(5, 40),
            },
            0 | 1 => Fault::Crash {
                down: rng.between(0, 20),
            },
            2 | 3 => Fault::WatchDelay {
                delay: rng.between(1, 30),
                lasting: rng.between(5, 120),
            },
            4 => Fault::SwitchLag {
                requests: rng.between(1, 40) as u32,
            },
            5 if rng.chance(50) => Fault::WatchStartsRefused {
                count: rng.between(1, 12) as u32,
            },
            5 => Fault::ExpireWatches,
            6 => Fault::ReapplyOldCrd,
            7 => {
                let to = *rng.pick(&VERSIONS);
                Fault::FlipStorage { to }
            }
            8 => Fault::ForeignMigration {
                fails: rng.chance(70),
            },
            9 => Fault::MigrationsFail {
                lasting: rng.between(5, 90),
            },
            10 => Fault::Skew {
                seconds: rng.between(0, 60) as i64 - 30,
            },
            14 => Fault::ForeignFailureAtRead {
                after_reads: rng.between(0, 8) as u32,
            },
            13 => Fault::FlipDuringRun {
                after_pages: rng.between(1, 4) as u32,
                writes: rng.between(1, 4) as usize,
            },
            12 if rng.chance(40) => Fault::CheckFixThenApply {
                drop: rng.between(1, 2) as usize,
                lag: rng.between(0, 30) as u32,
            },
            12 if rng.chance(25) => Fault::DeleteCrd,
            11 => Fault::SlowApiserver {
                millis: rng.between(10, 2000),
                lasting: rng.between(5, 90),
            },
            _ => Fault::SlowAnswers {
                millis: rng.between(10, 3000),
                lasting: rng.between(5, 60),
            },
        };
        // It acts at the end of a migration: set before the last store, or it never acts.
        let at = match fault {
            Fault::FlipBackAfterRun { .. }
            | Fault::ForeignFailureDeleted { .. }
            | Fault::SvmLateAfterPatch { edit: true, .. } => at % (milestones[2] + 1),
            _ => at,
        };
        faults.push((at, fault));
    }
    // The conversion webhook and its faults, drawn after everything else: the seeds without
    // it draw what they drew before the CA keeper was simulated.
    let mut workload = workload;
    workload.webhook = rng.chance(35);
    if workload.webhook {
        for _ in 0..rng.between(0, 2) {
            faults.push((rng.between(0, horizon), Fault::DeleteWebhookSecret));
        }
    }
    faults.sort_by_key(|(at, _)| *at);
    Draw { workload, faults }
}
