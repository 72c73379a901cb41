//! Controller replicas a scenario starts, stops and kills itself (`crd-lifecycle run` child
//! processes), for leader election and rollouts.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::control_plane::{DiesWithParent as _, sigterm};

/// One `crd-lifecycle run` process, restartable with the same arguments.
pub struct Replica {
    pub identity: String,
    args: Vec<String>,
    kubeconfig: Option<PathBuf>,
    pub log: PathBuf,
    child: Option<Child>,
    /// How often it was started.
    pub starts: u32,
    /// Where its current process's lines begin in the log.
    log_start: u64,
}

impl Replica {
    /// A replica with identity `identity` and `run`'s arguments `args` (not started yet).
    pub fn new(identity: &str, args: Vec<String>, kubeconfig: Option<PathBuf>, log: PathBuf) -> Replica {
        Replica {
            identity: identity.to_owned(),
            args,
            kubeconfig,
            log,
            child: None,
            starts: 0,
            log_start: 0,
        }
    }

    pub fn start(&mut self) -> Result<(), String> {
        self.log_start = std::fs::metadata(&self.log).map_or(0, |m| m.len());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
        command
            .dies_with_parent()
            .arg("run")
            .args(&self.args)
            .arg(format!("--identity={}", self.identity))
            .env("POD_NAMESPACE", "default")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(path) = &self.kubeconfig {
            command.env("KUBECONFIG", path);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start replica {}: {e}", self.identity))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// SIGKILL, as a crash or an OOM kill.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, as a rollout does; waits up to `grace`, then SIGKILL (as the kubelet does).
    /// Returns how it exited (`None` if it had to be killed).
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        sigterm(&child);
        let started = Instant::now();
        while started.elapsed() < grace {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// How it exited, if it did (by itself).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// What its current (or last) process logged.
    pub fn log_of_this_start(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let from = usize::try_from(self.log_start).unwrap_or(0).min(text.len());
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}
