//! One run: the real controller (`controller::controller`: its watches, reconciles,
//! migrations, managedFields cleanup, the built-in engine) against the fake apiserver, on
//! tokio's paused clock and one thread, driven second by second by the seed's workload and
//! faults.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crd_lifecycle::clock::Clock;
use crd_lifecycle::controller::leader::LeaseSettings;
use crd_lifecycle::controller::{Probes, RunSettings, replica};
use crd_lifecycle::{check, migrate};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::apiserver::FakeApiserver;
use crate::invariants::{self, CRD, Findings};
use crate::webhook::{self, Certificates, Running, Settling};
use crate::workload::{Draw, Engine, Fault, MILESTONES, VERSIONS};

const EXAMPLE_CRD: &str = include_str!("../../examples/widgets/crd.yaml");

/// How long after the last fault (and the last milestone) the policy must have reached
/// its scheduled end: a failed migration waits 5 minutes before it is tried again, a
/// failed StorageVersionMigration's end up to a minute, a crash up to a lease.
pub const LIVENESS_BOUND: u64 = 900;

/// How long a run stays at its scheduled end: longer than a resync (120 s).
const REST: u64 = 130;

/// What one run found.
pub struct Outcome {
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub steps: u64,
    /// A digest of the trace: the same seed and faults give the same digest.
    pub digest: u64,
    /// Every request in order, with its instant (what the digest covers besides the trace).
    pub requests: Vec<String>,
    /// Faults applied, by kind.
    pub faults: Vec<&'static str>,
}

fn start() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().expect("instant")
}

fn at(seconds: u64) -> String {
    (start() + SignedDuration::from_secs(seconds as i64)).to_string()
}

fn policy(draw: &Draw, engine: Engine) -> Value {
    let m = |i: usize| json!({"at": at(draw.workload.milestones[i])});
    let deprecate = |i: usize, version: &str| json!({"at": at(draw.workload.milestones[i]), "warning": format!("example.com/{version} Widget is deprecated")});
    let engine = match engine {
        Engine::Internal => "Internal",
        Engine::Builtin => "StorageVersionMigration",
    };
    let mut policy = json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
           "metadata": {"name": "widgets", "uid": "uid-widgets", "creationTimestamp": "2025-12-01T00:00:00Z"},
           "spec": {"crdName": CRD,
                    "versions": [
                        {"name": "v1alpha1", "deprecate": deprecate(3, "v1alpha1"), "unserve": m(5), "remove": m(6)},
                        {"name": "v1beta1", "store": m(0), "deprecate": deprecate(4, "v1beta1"), "unserve": m(7), "remove": m(8)},
                        {"name": "v1", "introduce": m(1), "store": m(2)}],
                    "migration": {"enabled": true, "engine": engine, "concurrency": 2, "pageSize": 4, "qps": 0}}});
    // Converting through the operator's webhook points the CRD at it, with its caBundle.
    if draw.workload.webhook {
        policy["spec"]["conversion"] = webhook::conversion();
    }
    policy
}

/// One replica of the controller: started, killed, started again (and, after its lease was
/// lost, started again as its pod would be).
struct Process {
    fake: FakeApiserver,
    clock: Clock,
    /// Its actor in the fake, and its identity in the lease.
    actor: &'static str,
    /// Whether it elects a leader with the others.
    elected: bool,
    task: Option<tokio::task::JoinHandle<()>>,
    /// When a stopped replica starts again (the second).
    restart_at: Option<u64>,
    /// Whether it serves the conversion webhook.
    webhook: bool,
    /// The replicas running, with what each shows the outside (its probes).
    running: Running,
}

impl Process {
    fn start(&mut self) {
        let settings = RunSettings {
            metrics_address: "127.0.0.1:0".parse().expect("address"),
            lease: self.elected.then(|| {
                LeaseSettings::new("crd-lifecycle".into(), "crd-lifecycle".into(), self.actor.into())
            }),
            resync: Duration::from_secs(120),
            identity: self.actor.into(),
            parallel_migrations: 2,
            traffic_sample_interval: Duration::from_secs(60),
            webhook: self.webhook.then(|| webhook::settings(self.actor)),
            svm_pending_deadline: Duration::from_secs(120),
        };
        // A new process: new probes, nothing served, not Ready.
        let probes = Probes::new(&settings);
        self.running.started(self.actor, probes.clone());
        let running = replica(
            self.fake.client_as(self.actor),
            settings,
            self.clock.clone(),
            probes.clone(),
            std::future::pending(),
        );
        self.restart_at = None;
        let (registry, actor) = (self.running.clone(), self.actor);
        self.task = Some(tokio::spawn(async move {
            let _ = running.await;
            registry.exited(actor, &probes);
        }));
    }

    fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        // Killed: its pod is not Ready, its webhook serves nothing.
        self.running.killed(self.actor);
    }

    /// Whether it stopped on its own (a lost lease exits the process).
    fn exited(&self) -> bool {
        self.task
            .as_ref()
            .is_some_and(tokio::task::JoinHandle::is_finished)
    }
}

/// Runs `draw` with the faults whose index `keep` allows.
pub fn run(seed: u64, draw: &Draw, keep: &dyn Fn(usize) -> bool) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    // A local set for the actors whose futures are not `Send` (`check --fix`).
    tokio::task::LocalSet::new().block_on(&runtime, simulate(seed, draw, keep))
}

async fn simulate(seed: u64, draw: &Draw, keep: &dyn Fn(usize) -> bool) -> Outcome {
    // Retry jitter (backon draws from fastrand's thread-local generator) from the seed.
    fastrand::seed(seed);
    let workload = &draw.workload;
    let fake = FakeApiserver::new();
    let findings = Arc::new(Mutex::new(Findings::default()));
    // The conversion webhook's certificates, as the replicas show them (`webhook`).
    let running = Running::default();
    let certificates = Arc::new(Mutex::new(Certificates::new(workload.webhook)));
    let mut settling = Settling::default();
    let origin = tokio::time::Instant::now();
    let first_crd: Value = serde_saphyr::from_str(EXAMPLE_CRD).expect("the example CRD");
    {
        let mut state = fake.lock();
        state.set_clock(start());
        state.svm_served = workload.svm_served;
        state.fenced = workload.replicas > 1;
        state.checker = Some(webhook::checker(
            invariants::checker(findings.clone()),
            findings.clone(),
            certificates.clone(),
            running.clone(),
        ));
    }
    fake.create_crd(first_crd.clone());
    fake.add_objects(CRD, workload.objects, 2, "v1alpha1");
    fake.create_policy(policy(draw, workload.engine));
    note(&findings, origin, format!("seed {seed}: {workload:?}"));

    let skew = Arc::new(AtomicI64::new(workload.skew * 1000));
    let clock: Clock = {
        let skew = skew.clone();
        Arc::new(move || {
            start()
                + SignedDuration::try_from(origin.elapsed()).expect("a short run")
                + SignedDuration::from_millis(skew.load(Ordering::Relaxed))
        })
    };
    let mut processes: Vec<Process> = ["controller", "controller-b"][..workload.replicas]
        .iter()
        .map(|actor| Process {
            fake: fake.clone(),
            clock: clock.clone(),
            actor,
            elected: workload.replicas > 1,
            task: None,
            restart_at: None,
            webhook: workload.webhook,
            running: running.clone(),
        })
        .collect();
    for process in &mut processes {
        process.start();
    }
    let writer = fake.client_as("a user's client");

    let horizon = draw.horizon();
    let mut ends: Vec<(u64, Fault)> = Vec::new();
    // Someone else's failed migrations to delete: when they failed (a hook sets it), and
    // how many seconds after.
    let mut deletions: Vec<(Arc<AtomicU64>, u64)> = Vec::new();
    // When a `kubectl edit` of `SvmLateAfterPatch` happened: the svm controller picks up 2 s
    // later.
    let mut resumes: Vec<Arc<AtomicU64>> = Vec::new();
    let mut applied = Vec::new();
    let mut engine = workload.engine;
    let mut foreign = 0;
    let mut policy_deleted = false;
    let mut crd_deleted = false;
    let mut second = 0u64;
    let mut quiet_since = None;
    let mut at_rest_from: Option<tokio::time::Instant> = None;
    loop {
        set_now(&findings, origin);
        for (i, (when, fault)) in draw.faults.iter().enumerate() {
            if *when != second || !keep(i) {
                continue;
            }
            note(&findings, origin, format!("fault #{i}: {fault}"));
            applied.push(fault.kind());
            match fault {
                Fault::Crash { down } => {
                    // The leader, where replicas elect one.
                    let process = leader(&fake, &mut processes);
                    process.kill();
                    process.restart_at = Some(second + down);
                }
                Fault::SvmLateAfterPatch { lag, edit } => {
                    fake.lock().svm_paused = true;
                    let lag = *lag;
                    let crd_path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}");
                    if *edit {
                        // Once a migration of the controller's is Pending, `kubectl edit`
                        // moves the storage version; an apiserver lags `lag` requests behind
                        // the edit, and the svm controller picks up 2 s after the
                        // controller's watches deliver the edit (seed 924: it
                        // rewrote through that apiserver into the new storage version, and
                        // trimmed storedVersions over the objects it left in the old one).
                        let edited_at = Arc::new(AtomicU64::new(u64::MAX));
                        resumes.push(edited_at.clone());
                        fake.before_request(
                            |state, actor, _, _| {
                                invariants::is_replica(actor)
                                    && state.svm_paused
                                    && own_migration_unfinished(state)
                            },
                            0,
                            move |state| {
                                let storage = state.storage_version(CRD);
                                let other = state.crds.get(CRD).and_then(|crd| {
                                    crd["spec"]["versions"].as_array()?.iter().find_map(|v| {
                                        let name = v["name"].as_str()?;
                                        (v["served"] == true && Some(name) != storage.as_deref())
                                            .then(|| name.to_owned())
                                    })
                                });
                                if let Some(other) = other {
                                    state.switch_lag = lag;
                                    state.switch_storage(CRD, &other);
                                    state.step("kubectl edit (while the controller's migration is Pending)");
                                }
                                // Not before the controller can have acted on the edit:
                                // a migration started sooner is a race no client of Kubernetes'
                                // migrator can win (it has no settle of its own).
                                // (The time to see it, and a reconcile's few requests, however
                                // slow the apiserver answers.)
                                let seen = origin.elapsed().as_secs()
                                    + state.watch_delay.as_secs()
                                    + (state.request_latency * 6).as_secs();
                                edited_at.store(seen, Ordering::Relaxed);
                            },
                        );
                    } else {
                        // The patch that matters is one that may land a store while a
                        // migration of the controller's own is unfinished (within the skew
                        // bound of the store's instant); any other leaves the svm controller
                        // idle.
                        let stores = (workload.milestones[0], workload.milestones[2]);
                        fake.before_request(
                            move |state, actor, method, path| {
                                invariants::is_replica(actor)
                                    && method == "PATCH"
                                    && path == crd_path
                                    && own_migration_unfinished(state)
                                    && store_may_land(state, stores, origin.elapsed().as_secs())
                            },
                            0,
                            move |state| {
                                state.svm_paused = false;
                                state.switch_lag = lag;
                            },
                        );
                    }
                }
                Fault::PartitionLeader { lasting } => {
                    let holder = leader(&fake, &mut processes).actor;
                    fake.lock().leases_stall_for = Some(holder.to_owned());
                    ends.push((second + lasting, fault.clone()));
                }
                Fault::WatchDelay { delay, lasting } => {
                    fake.lock().watch_delay = Duration::from_secs(*delay);
                    ends.push((second + lasting, fault.clone()));
                }
                Fault::SwitchLag { requests } => fake.lock().switch_lag = *requests,
                Fault::ExpireWatches => fake.lock().expire_watch_history(),
                Fault::WatchStartsRefused { count } => {
                    // Refused as they start: the open ones end (an apiserver restart), so
                    // that every watch starts again into the refusals.
                    let mut state = fake.lock();
                    state.refuse_watch_starts = *count;
                    state.expire_watch_history();
                }
                Fault::ReapplyOldCrd => {
                    let mut state = fake.lock();
                    if let Some(mut crd) = state.crds.get(CRD).cloned() {
                        crd["spec"] = first_crd["spec"].clone();
                        let stored = crd["status"]["storedVersions"]
                            .as_array_mut()
                            .expect("storedVersions");
                        if !stored.iter().any(|v| v == "v1alpha1") {
                            stored.push(json!("v1alpha1"));
                        }
                        state.store_crd(crd, true);
                        state.step("gitops: re-applied the CRD as first applied");
                    }
                }
                Fault::FlipStorage { to } => {
                    let mut state = fake.lock();
                    let has = state
                        .crds
                        .get(CRD)
                        .map(|c| &c["spec"]["versions"])
                        .unwrap_or(&Value::Null)
                        .as_array()
                        .is_some_and(|vs| vs.iter().any(|v| v["name"] == *to && v["served"] == true));
                    if has {
                        state.switch_storage(CRD, to);
                        state.step("kubectl edit");
                    }
                }
                Fault::FlipDuringRun { after_pages, writes } => {
                    for _ in 1..*after_pages {
                        fake.after_next_list_page(|_| {});
                    }
                    let writes = *writes;
                    fake.after_next_list_page(move |state| {
                        let Some(crd) = state.crds.get(CRD) else { return };
                        let versions = crd["spec"]["versions"].as_array().cloned().unwrap_or_default();
                        let storage = state.storage_version(CRD);
                        let other = crd["status"]["storedVersions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|stored| {
                                stored.as_str() != storage.as_deref()
                                    && versions
                                        .iter()
                                        .any(|v| v["name"] == **stored && v["served"] == true)
                            })
                            .and_then(|v| v.as_str().map(str::to_owned));
                        if let Some(other) = other {
                            state.switch_storage(CRD, &other);
                            state.step("kubectl edit (during a run)");
                            state.write_objects(CRD, writes);
                            state.step("a user's client (during a run)");
                        }
                    });
                }
                Fault::ForeignFailureAtRead { after_reads } => {
                    foreign += 1;
                    let name = format!("someone-else-{foreign}");
                    let crd_path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}");
                    fake.before_request(
                        move |_, actor, method, path| {
                            invariants::is_replica(actor) && method == "GET" && path == crd_path
                        },
                        *after_reads,
                        move |state| foreign_migration_fails(state, &name),
                    );
                }
                Fault::ForeignFailureBeforeRun { runs, wait_ms } => {
                    foreign += 1;
                    let name = format!("someone-else-{foreign}");
                    let wait = Duration::from_millis(*wait_ms);
                    // A run reads its policy before it starts (`BackgroundJobs::fresh`); no
                    // reconcile does (they read the watch's cache). While a migration is
                    // due: a trim then leaves objects in a version no longer listed.
                    let policy_path = "/apis/crdlifecycle.io/v1alpha1/versionpolicies/widgets";
                    fake.before_request(
                        move |state, actor, method, path| {
                            invariants::is_replica(actor)
                                && method == "GET"
                                && path == policy_path
                                && migration_pending(state)
                        },
                        *runs,
                        move |state| {
                            foreign_migration_fails(state, &name);
                            state.this_answer_delay = wait;
                        },
                    );
                }
                Fault::ForeignMigration { fails } => {
                    foreign += 1;
                    let name = format!("someone-else-{foreign}");
                    if *fails {
                        fake.lock()
                            .svm_fail_by_name
                            .insert(name.clone(), "conversion webhook failed".into());
                    }
                    fake.create_svm(someone_elses_migration(&name));
                }
                Fault::DeletePolicy => {
                    if !policy_deleted {
                        fake.delete_policy("widgets");
                        fake.lock().step("kubectl delete versionpolicy");
                        policy_deleted = true;
                    }
                }
                Fault::MigrationsFail { lasting } => {
                    fake.lock().svm_fail = Some("conversion webhook failed".into());
                    ends.push((second + lasting, fault.clone()));
                }
                Fault::Skew { seconds } => skew.store(seconds * 1000, Ordering::Relaxed),
                Fault::FlipBackAfterRun { writes, ahead } => {
                    skew.store(ahead * 1000, Ordering::Relaxed);
                    foreign += 1;
                    let name = format!("someone-else-{foreign}");
                    let writes = *writes;
                    // The next request of a replica once a run of its own has succeeded (an
                    // internal run's status, or the built-in job's).
                    let ran = last_run_succeeded(&fake.lock());
                    fake.before_request(
                        move |state, actor, _, _| {
                            invariants::is_replica(actor)
                                && last_run_succeeded(state).is_some_and(|run| Some(&run) != ran.as_ref())
                        },
                        0,
                        move |state| flip_back_and_fail(state, writes, &name),
                    );
                }
                Fault::ForeignFailureDeleted { after } => {
                    foreign += 1;
                    let name = format!("someone-else-{foreign}");
                    let failed_at = Arc::new(AtomicU64::new(u64::MAX));
                    deletions.push((failed_at.clone(), *after));
                    let ran = last_run_succeeded(&fake.lock());
                    fake.before_request(
                        move |state, actor, _, _| {
                            invariants::is_replica(actor)
                                && last_run_succeeded(state).is_some_and(|run| Some(&run) != ran.as_ref())
                        },
                        0,
                        move |state| {
                            flip_back_and_fail(state, 2, &name);
                            failed_at.store(origin.elapsed().as_secs(), Ordering::Relaxed);
                        },
                    );
                }
                Fault::DeleteCrd => {
                    if !crd_deleted {
                        fake.lock().start_crd_deletion(CRD);
                        fake.lock().step("kubectl delete crd");
                        crd_deleted = true;
                        // The apiserver ends the deletion ~5 s later (the recording).
                        ends.push((second + 5, fault.clone()));
                    }
                }
                Fault::CheckFixThenApply { drop, lag } => {
                    // On this thread's local set: `check::run` is not `Send` (the CLI blocks on it).
                    tokio::task::spawn_local(check_fix_then_apply(
                        fake.clone(),
                        findings.clone(),
                        origin,
                        release_crd(&first_crd, *drop),
                        *lag,
                    ));
                }
                Fault::SlowAnswers { millis, lasting } => {
                    fake.lock().write_answer_delay = Duration::from_millis(*millis);
                    ends.push((second + lasting, fault.clone()));
                }
                Fault::SlowApiserver { millis, lasting } => {
                    fake.lock().request_latency = Duration::from_millis(*millis);
                    ends.push((second + lasting, fault.clone()));
                }
                Fault::DeleteWebhookSecret => {
                    // No finalizer holds a Secret: gone at once, its next GET a 404.
                    let mut state = fake.lock();
                    if state.secrets.remove(webhook::SECRET).is_some() {
                        state.step("kubectl delete secret");
                    }
                }
            }
        }
        // Faults that last end.
        ends.retain(|(until, fault)| {
            if *until > second {
                return true;
            }
            let mut state = fake.lock();
            match fault {
                Fault::WatchDelay { .. } => state.watch_delay = Duration::ZERO,
                Fault::MigrationsFail { .. } => state.svm_fail = None,
                Fault::SlowAnswers { .. } => state.write_answer_delay = Duration::ZERO,
                Fault::SlowApiserver { .. } => state.request_latency = Duration::ZERO,
                Fault::PartitionLeader { .. } => state.leases_stall_for = None,
                Fault::DeleteCrd => {
                    state.finish_crd_deletion(CRD);
                    state.step("kube-apiserver: the CRD's instances deleted, the CRD gone");
                }
                _ => {}
            }
            false
        });
        // (A replica down then cannot act on the edit either: the svm controller waits.)
        let all_up = processes.iter().all(|p| p.task.is_some() && !p.exited());
        resumes.retain(|edited_at| {
            let at = edited_at.load(Ordering::Relaxed);
            if at == u64::MAX {
                return true;
            }
            if !all_up {
                // 2 s after they are all up again.
                edited_at.store(second.max(at), Ordering::Relaxed);
                return true;
            }
            if second < at + 2 {
                return true;
            }
            fake.lock().svm_paused = false;
            false
        });
        // `kubectl delete storageversionmigration` of someone else's failed ones.
        deletions.retain(|(failed_at, after)| {
            let at = failed_at.load(Ordering::Relaxed);
            if at == u64::MAX || second < at.saturating_add(*after) {
                return true;
            }
            let mut state = fake.lock();
            state.svms.retain(|_, m| {
                m["metadata"]["labels"]["crdlifecycle.io/policy"].is_string()
                    || !m["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Failed" && c["status"] == "True")
            });
            state.step("someone deleted the failed StorageVersionMigrations");
            false
        });
        for process in &mut processes {
            // A replica that exited on its own (its lease lost) is started again, as its
            // pod would be.
            if process.exited() && process.restart_at.is_none() {
                process.task = None;
                process.restart_at = Some(second + 3);
                note(&findings, origin, format!("{} exited", process.actor));
            }
            if process.restart_at.is_some_and(|at| at <= second) {
                note(&findings, origin, format!("{} started again", process.actor));
                process.start();
            }
        }
        if workload.engine_switch_at == Some(second) && !policy_deleted {
            engine = match engine {
                Engine::Internal => Engine::Builtin,
                Engine::Builtin => Engine::Internal,
            };
            note(
                &findings,
                origin,
                format!("the policy's engine switched to {engine:?}"),
            );
            let spec = policy(draw, engine)["spec"].clone();
            fake.edit_policy("widgets", |p| p["spec"] = spec);
        }
        if workload.svm_served && second.is_multiple_of(2) {
            let mut state = fake.lock();
            state.svm_controller_tick();
        }
        if workload.write_every > 0 && second.is_multiple_of(workload.write_every) && second < horizon {
            // On its own task: a write answered late must not hold the driver's clock.
            tokio::spawn(write_one(
                writer.clone(),
                fake.clone(),
                findings.clone(),
                origin,
                seed,
                second,
            ));
        }
        if second == horizon {
            // Faults stop: what is still on ends, a stopped controller starts.
            let mut state = fake.lock();
            state.watch_delay = Duration::ZERO;
            state.switch_lag = 0;
            state.svm_fail = None;
            state.write_answer_delay = Duration::ZERO;
            state.request_latency = Duration::ZERO;
            state.refuse_watch_starts = 0;
            // A CRD's deletion under way ends (the apiserver's own work, not a fault).
            if ends.iter().any(|(_, fault)| matches!(fault, Fault::DeleteCrd)) {
                state.finish_crd_deletion(CRD);
                state.step("kube-apiserver: the CRD's instances deleted, the CRD gone");
            }
            drop(state);
            ends.clear();
            fake.clear_hooks();
            state_after_faults(&fake);
            for process in processes.iter_mut().filter(|p| p.restart_at.is_some()) {
                process.start();
            }
            note(&findings, origin, "faults stop".into());
        }
        // The webhook's invariants every second too: what a replica serves and whether it
        // is Ready change between the fake's steps.
        {
            let state = fake.lock();
            let mut f = findings.lock().unwrap_or_else(|p| p.into_inner());
            f.now = origin.elapsed().as_secs_f64();
            let mut certificates = certificates.lock().unwrap_or_else(|p| p.into_inner());
            certificates.check(&state, &running, &mut f);
            if second >= horizon {
                let replicas: Vec<&'static str> = processes.iter().map(|p| p.actor).collect();
                settling.second(
                    second,
                    horizon,
                    &state,
                    &running,
                    &replicas,
                    &mut f,
                    &mut certificates,
                );
            }
        }
        if second >= horizon {
            let excused = excused(&findings);
            // A deleted policy's end: released (its finalizer removed, so it is gone).
            let reached = if policy_deleted {
                fake.policy("widgets").is_null()
            } else if crd_deleted {
                crd_not_found(&fake)
            } else {
                invariants::scheduled_end_missed(&fake.lock(), &excused).is_none()
            };
            if reached && quiet_since.is_none() {
                quiet_since = Some(second);
                at_rest_from = Some(tokio::time::Instant::now());
            }
            // At rest for longer than a resync, to see that it stays there (and that the
            // policy still reads as valid and done).
            if quiet_since.is_some_and(|since| second >= since + REST) && (policy_deleted || crd_deleted) {
                // A deleted CRD's policy says so and stops: no request for its objects, and no
                // StorageVersionMigration created, once it said `CRDNotFound`.
                if crd_deleted && !policy_deleted {
                    let since = at_rest_from.unwrap_or_else(tokio::time::Instant::now);
                    if let Some(late) = fake.requests().iter().find(|r| {
                        r.at > since
                            && invariants::is_replica(r.actor)
                            && (r.path.starts_with("/apis/example.com/")
                                || (r.method == "POST" && r.path.ends_with("/storageversionmigrations")))
                    }) {
                        findings
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .violation_at_end(format!(
                                "after the policy said CRDNotFound: {} {}?{}",
                                late.method, late.path, late.query
                            ));
                    }
                }
                break;
            }
            if quiet_since.is_some_and(|since| second >= since + REST) {
                let conditions = fake.policy("widgets")["status"]["conditions"].clone();
                let ready = conditions
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if !ready {
                    let mut f = findings.lock().unwrap_or_else(|p| p.into_inner());
                    let line = format!(
                        "{:>8.3}s VIOLATION the policy reached its scheduled end but is not Ready: {conditions}",
                        f.now
                    );
                    f.trace.push(line.clone());
                    f.violations.push(line);
                }
                break;
            }
            if second >= horizon + LIVENESS_BOUND {
                let missed = if policy_deleted {
                    Some("the deleted policy was not released (it still exists)".to_owned())
                } else if crd_deleted {
                    Some("the CRD was deleted, and the policy does not say CRDNotFound".to_owned())
                } else {
                    invariants::scheduled_end_missed(&fake.lock(), &excused)
                };
                let policy_status = fake.policy("widgets")["status"]["conditions"].clone();
                // Someone else's failed migration too: the controller lists every version
                // again and migrates, so no person needs to act.
                if let Some(missed) = missed {
                    let mut f = findings.lock().unwrap_or_else(|p| p.into_inner());
                    let line = format!(
                        "{:>8.3}s VIOLATION liveness: {}s after the faults stopped the policy has not reached its \
                         scheduled end: {missed}; conditions {policy_status}",
                        f.now, LIVENESS_BOUND
                    );
                    f.trace.push(line.clone());
                    f.violations.push(line);
                }
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        second += 1;
    }
    set_now(&findings, origin);
    settling.end(
        &mut findings.lock().unwrap_or_else(|p| p.into_inner()),
        workload.webhook,
    );
    let outside = invariants::stored_outside(&fake.lock(), &excused(&findings));
    if let Some(outside) = outside {
        let mut f = findings.lock().unwrap_or_else(|p| p.into_inner());
        if policy_deleted {
            // Released with its policy: someone else's failed migration that trims after
            // that is no longer the controller's to answer for (its own trims are checked at
            // every step).
            f.note(format!("{outside} (after the policy was deleted)"));
        } else {
            f.violation_at_end(outside);
        }
    }
    // Stale views: a read with resourceVersion=0 may be answered from the watch cache, older
    // than a write already acknowledged (kube-apiserver v1.36.2: 404 of 14,000 lists and 277
    // of 13,000 GETs, never one without a resourceVersion:
    // tests/fixtures/apiserver/list-stale-resourceversion0-v1.36.txt,
    // crd-get-stale-resourceversion0-v1.36.txt). Every read of the controller and of `check
    // --fix` must be a quorum read: their staleness is the watches' (`WatchDelay`, 410s).
    if let Some(cached) = fake
        .requests()
        .iter()
        .find(|r| r.method == "GET" && r.query.split('&').any(|p| p == "resourceVersion=0"))
    {
        findings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .violation_at_end(format!(
                "a read the watch cache may answer stale: GET {}?{}",
                cached.path, cached.query
            ));
    }
    for process in &mut processes {
        process.kill();
    }
    // SIM_REQUESTS=1 (with SIM_SEED): every request the fake answered, with its second.
    if std::env::var("SIM_REQUESTS").is_ok() {
        for r in fake.requests() {
            let body = if r.method == "GET" {
                String::new()
            } else {
                r.body.to_string()
            };
            let body: String = body.chars().take(300).collect();
            println!(
                "  {:>8.3}s {} {}?{} {body}",
                (r.at - origin).as_secs_f64(),
                r.method,
                r.path,
                r.query
            );
        }
    }
    let steps = fake.lock().steps;
    // Everything the fake holds refers to itself through its checker: break the cycle.
    fake.lock().checker = None;
    let findings = std::mem::take(&mut *findings.lock().unwrap_or_else(|p| p.into_inner()));
    // The trace and every request in order, with its instant: a replay must match both.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    findings.trace.hash(&mut hasher);
    let requests: Vec<String> = fake
        .requests()
        .into_iter()
        .map(|r| {
            // kube-runtime names an Event after the wall clock (`<object>.<nanoseconds>`),
            // the one thing a replay cannot repeat: leave the suffix out.
            let path = match r.path.split_once("/events/") {
                Some((events, name)) => format!("{events}/events/{}", name.split('.').next().unwrap_or(name)),
                None => r.path.clone(),
            };
            format!(
                "{:.3}s {} {path}?{}",
                (r.at - origin).as_secs_f64(),
                r.method,
                r.query
            )
        })
        .collect();
    requests.hash(&mut hasher);
    Outcome {
        violations: findings.violations,
        trace: findings.trace,
        steps,
        digest: hasher.finish(),
        requests,
        faults: applied,
    }
}

impl Findings {
    fn violation_at_end(&mut self, what: String) {
        let line = format!("{:>8.3}s VIOLATION at the end: {what}", self.now);
        self.trace.push(line.clone());
        self.violations.push(line);
    }
}

fn excused(findings: &Mutex<Findings>) -> std::collections::BTreeSet<String> {
    findings.lock().unwrap_or_else(|p| p.into_inner()).excused.clone()
}

fn set_now(findings: &Mutex<Findings>, origin: tokio::time::Instant) {
    findings.lock().unwrap_or_else(|p| p.into_inner()).now = origin.elapsed().as_secs_f64();
}

fn note(findings: &Mutex<Findings>, origin: tokio::time::Instant, line: String) {
    let mut f = findings.lock().unwrap_or_else(|p| p.into_inner());
    f.now = origin.elapsed().as_secs_f64();
    f.note(line);
}

/// A user's client writes one object through a version the CRD has: an update (stored in
/// the storage version of the apiserver answering) or a server-side apply (which also
/// leaves a managedFields entry naming the version). Refusals (an unserved version) are
/// what such a client gets; they are ignored.
async fn write_one(
    client: kube::Client,
    fake: FakeApiserver,
    findings: Arc<Mutex<Findings>>,
    origin: tokio::time::Instant,
    seed: u64,
    second: u64,
) {
    let keys = fake.object_keys(CRD);
    if keys.is_empty() {
        return;
    }
    let mut rng = crate::workload::Rng::new(seed.wrapping_mul(31).wrapping_add(second));
    let (namespace, name) = rng.pick(&keys).clone();
    let version = *rng.pick(&VERSIONS);
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", version, "Widget"),
        "widgets",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &resource);
    let (how, answer) = if rng.chance(50) {
        let patch = json!({"spec": {"size": second}});
        (
            "update",
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        )
    } else {
        let patch = json!({"apiVersion": format!("example.com/{version}"), "kind": "Widget", "spec": {"size": second}});
        (
            "server-side apply",
            api.patch(
                &name,
                &PatchParams::apply("writer").force(),
                &Patch::Apply(&patch),
            )
            .await,
        )
    };
    if answer.is_ok() {
        let stored = fake
            .lock()
            .objects
            .get(&(CRD.to_owned(), namespace.clone(), name.clone()))
            .map(|o| o.encoded_as.clone())
            .unwrap_or_default();
        note(
            &findings,
            origin,
            format!("a user's client: {how} of {namespace}/{name} through {version}, stored as {stored}"),
        );
    }
}

/// Whether the policy says its CRD does not exist (`Blocked`, reason `CRDNotFound`): the
/// end of a run whose CRD was deleted.
fn crd_not_found(fake: &FakeApiserver) -> bool {
    fake.policy("widgets")["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Blocked" && c["status"] == "True" && c["reason"] == "CRDNotFound")
}

/// A release's CRD: the example's without its first `drop` versions, v1 served and the
/// storage version (what a chart's next release ships).
fn release_crd(first_crd: &Value, drop: usize) -> Value {
    let mut crd = first_crd.clone();
    let versions: Vec<Value> = first_crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| !VERSIONS[..drop].iter().any(|dropped| v["name"] == *dropped))
        .map(|v| {
            let mut v = v.clone();
            let v1 = v["name"] == "v1";
            v["storage"] = json!(v1);
            if v1 {
                v["served"] = json!(true);
            }
            v
        })
        .collect();
    crd["spec"]["versions"] = Value::Array(versions);
    crd
}

/// Where `check --fix` reports: into the trace.
struct CheckNotes {
    findings: Arc<Mutex<Findings>>,
    origin: tokio::time::Instant,
}

impl check::FixObserver for CheckNotes {
    fn migrator(&self, _crd: &str) -> Box<dyn migrate::Observer> {
        Box::new(migrate::Quiet)
    }

    fn note(&self, _crd: &str, line: &str) {
        note(
            &self.findings,
            self.origin,
            format!("{}: {line}", invariants::CHECK_FIX),
        );
    }
}

/// A release upgrade in a pipeline: `crd-lifecycle check --fix release.yaml`, and only if it
/// exits 0, the release's CRD applied (a merge patch of its versions, as `kubectl apply`
/// sends one; the apiserver refuses it if a stored version goes). The check counts no
/// writer (`--writers-window 0s`): the simulation's writers are the release's own clients.
async fn check_fix_then_apply(
    fake: FakeApiserver,
    findings: Arc<Mutex<Findings>>,
    origin: tokio::time::Instant,
    release: Value,
    lag: u32,
) {
    let Ok(crd) = serde_json::from_value(release.clone()) else {
        return;
    };
    let incoming = check::Incoming {
        crds: vec![check::IncomingCrd {
            origin: "release.yaml".into(),
            crd,
        }],
        skipped: 0,
    };
    let settings = check::CheckSettings {
        read: check::ReadSettings {
            page_size: 4,
            max_named: 5,
            request_timeout: Duration::from_secs(10),
        },
        concurrency: 1,
        writers_window: Duration::ZERO,
        replaced_managers: Vec::new(),
    };
    let observer = CheckNotes {
        findings: findings.clone(),
        origin,
    };
    let fix = check::FixSettings {
        migrate: migrate::Settings {
            page_size: 4,
            ..migrate::Settings::default()
        },
        observer: &observer,
    };
    let client = fake.client_as(invariants::CHECK_FIX);
    let report = check::run(&client, None, &incoming, &settings, Some(&fix)).await;
    let exit = check::Report::new(1, 0, vec![report.clone()]).exit_code();
    let findings_seen: Vec<String> = report
        .crds
        .iter()
        .flat_map(|c| c.findings.iter().map(|f| format!("{:?} {}", f.severity, f.kind)))
        .collect();
    note(
        &findings,
        origin,
        format!(
            "{}: exit {exit} ({})",
            invariants::CHECK_FIX,
            findings_seen.join(", ")
        ),
    );
    if exit != 0 {
        return;
    }
    let api: Api<CustomResourceDefinition> = Api::all(fake.client_as("helm upgrade"));
    let patch = json!({"spec": {"versions": release["spec"]["versions"]}});
    // This change only lags (as `SwitchLag` makes every later one).
    let lagging_before = {
        let mut state = fake.lock();
        let before = state.switch_lag;
        state.switch_lag = before.max(lag);
        before
    };
    let answer = api
        .patch(CRD, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    fake.lock().switch_lag = lagging_before;
    note(
        &findings,
        origin,
        format!(
            "helm upgrade: the release's CRD {}",
            match answer {
                Ok(_) => "applied".to_owned(),
                Err(error) => format!("refused: {error}"),
            }
        ),
    );
}

#[allow(dead_code)]
fn milestone_name(i: usize) -> &'static str {
    MILESTONES[i]
}

/// The replica holding the lease, else the first.
fn leader<'a>(fake: &FakeApiserver, processes: &'a mut [Process]) -> &'a mut Process {
    let holder = fake
        .lock()
        .leases
        .values()
        .find_map(|lease| lease["spec"]["holderIdentity"].as_str().map(str::to_owned));
    let index = processes
        .iter()
        .position(|p| Some(p.actor) == holder.as_deref())
        .unwrap_or(0);
    &mut processes[index]
}

/// What no fault leaves on once the faults stop.
fn state_after_faults(fake: &FakeApiserver) {
    let mut state = fake.lock();
    state.leases_stall_for = None;
    state.svm_paused = false;
}

/// Someone else's StorageVersionMigration of the CRD fails at once, and Kubernetes processes
/// its end (trims `storedVersions`: tests/fixtures/svm-failed-trims-stored-versions.txt).
fn foreign_migration_fails(state: &mut crate::apiserver::State, name: &str) {
    // No StorageVersionMigration where the API is not served.
    if !state.svm_served {
        return;
    }
    state
        .svm_fail_by_name
        .insert(name.to_owned(), "conversion webhook failed".into());
    state.create_svm(someone_elses_migration(name));
    // Running, failed, its end processed (storedVersions trimmed).
    for _ in 0..3 {
        state.svm_advance(name);
    }
}

/// Whether `status.storedVersions` lists a version besides the storage version (a migration
/// is due).
fn migration_pending(state: &crate::apiserver::State) -> bool {
    let Some(crd) = state.crds.get(CRD) else {
        return false;
    };
    let storage = state.storage_version(CRD);
    crd["status"]["storedVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|stored| stored.as_str() != storage.as_deref())
}

/// The `finishedAt` of the policy's last migration run, if it succeeded.
fn last_run_succeeded(state: &crate::apiserver::State) -> Option<String> {
    let run = &state.policies.get("widgets")?["status"]["migration"];
    (run["phase"] == "Succeeded").then(|| run["finishedAt"].as_str().unwrap_or_default().to_owned())
}

/// `FlipBackAfterRun`'s writers: the storage version back to another served version and
/// forth again with objects written in between, then someone else's migration fails.
fn flip_back_and_fail(state: &mut crate::apiserver::State, writes: usize, name: &str) {
    let Some(storage) = state.storage_version(CRD) else {
        return;
    };
    let other = state.crds[CRD]["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == true && v["name"] != storage.as_str())
        .find_map(|v| v["name"].as_str().map(str::to_owned));
    if let Some(other) = other {
        state.switch_storage(CRD, &other);
        state.step("kubectl edit (after a run)");
        state.write_objects(CRD, writes);
        state.step("a user's client (after a run)");
        state.switch_storage(CRD, &storage);
        state.step("kubectl edit (after a run, back)");
    }
    foreign_migration_fails(state, name);
}

/// Whether a StorageVersionMigration the controller created is neither Succeeded nor Failed.
fn own_migration_unfinished(state: &crate::apiserver::State) -> bool {
    state.svms.values().any(|m| {
        m["metadata"]["labels"]["crdlifecycle.io/policy"].is_string()
            && !m["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| (c["type"] == "Succeeded" || c["type"] == "Failed") && c["status"] == "True")
    })
}

/// Whether the controller's next CRD patch may move the storage version at `second`
/// (`stores`: the seconds of the v1beta1 and v1 stores): a store due within the controller's
/// clock skew (up to 30 s) and not landed yet, or a storage version someone else moved
/// (`kubectl edit`, a re-applied CRD) that the controller puts back to its schedule's.
fn store_may_land(state: &crate::apiserver::State, stores: (u64, u64), second: u64) -> bool {
    let storage = state.storage_version(CRD);
    let due = |at: u64| second + 30 >= at;
    let scheduled = |at: u64| match at {
        at if at < stores.0 => "v1alpha1",
        at if at < stores.1 => "v1beta1",
        _ => "v1",
    };
    let moved =
        |storage: &str| storage != scheduled(second.saturating_sub(30)) && storage != scheduled(second + 30);
    match storage.as_deref() {
        Some("v1alpha1") => due(stores.0) || due(stores.1),
        Some("v1beta1") => due(stores.1) || moved("v1beta1"),
        Some("v1") => moved("v1"),
        _ => false,
    }
}

/// Someone else's StorageVersionMigration of the CRD's resource, as they would create it.
fn someone_elses_migration(name: &str) -> Value {
    json!({
        "apiVersion": "storagemigration.k8s.io/v1beta1", "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": "example.com", "resource": "widgets"}}})
}
