//! Long-lived tasks the process cannot do without (the metrics server, the webhook server,
//! its certificate refresher and policy watch, the traffic sampler): when one of them fails
//! or panics, the process says which and exits non-zero instead of running on half-working.

use std::future::Future;

use futures::future::{BoxFuture, FutureExt, select_all};
use tokio::task::JoinHandle;

/// A spawned essential task.
pub struct SupervisedTask {
    name: &'static str,
    handle: JoinHandle<Result<(), String>>,
}

impl SupervisedTask {
    /// Spawns `task`; its `Err` (or a panic) ends the process.
    pub fn spawn(
        name: &'static str,
        task: impl Future<Output = Result<(), String>> + Send + 'static,
    ) -> Self {
        Self {
            name,
            handle: tokio::spawn(task),
        }
    }
}

impl Drop for SupervisedTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Why an essential task stopped.
#[derive(Debug, thiserror::Error)]
#[error("{name} stopped: {reason}")]
pub struct TaskFailed {
    pub name: &'static str,
    pub reason: String,
}

/// The essential tasks of one process.
#[derive(Default)]
pub struct Supervisor {
    tasks: Vec<SupervisedTask>,
}

impl Supervisor {
    pub fn add(&mut self, task: SupervisedTask) {
        self.tasks.push(task);
    }

    pub fn extend(&mut self, tasks: impl IntoIterator<Item = SupervisedTask>) {
        self.tasks.extend(tasks);
    }

    /// Completes when a task fails or panics. A task that ends successfully (a server after
    /// a graceful shutdown) is not a failure; with no task left this never completes.
    pub fn first_failure(&mut self) -> BoxFuture<'_, TaskFailed> {
        async move {
            loop {
                if self.tasks.is_empty() {
                    return std::future::pending().await;
                }
                let handles = self.tasks.iter_mut().map(|t| &mut t.handle);
                let (result, index, _) = select_all(handles).await;
                let task = self.tasks.swap_remove(index);
                let reason = match result {
                    Ok(Ok(())) => continue,
                    Ok(Err(reason)) => reason,
                    Err(join) if join.is_panic() => format!("panicked: {join}"),
                    Err(join) => format!("was cancelled: {join}"),
                };
                return TaskFailed {
                    name: task.name,
                    reason,
                };
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_or_panicking_task_is_reported_a_finished_one_is_not() {
        let mut supervisor = Supervisor::default();
        supervisor.add(SupervisedTask::spawn("done", async { Ok(()) }));
        supervisor.add(SupervisedTask::spawn("runs", std::future::pending()));
        supervisor.add(SupervisedTask::spawn("metrics server", async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Err("cannot bind 0.0.0.0:8080: address in use".to_owned())
        }));
        let failed = supervisor.first_failure().await;
        assert_eq!(
            failed.to_string(),
            "metrics server stopped: cannot bind 0.0.0.0:8080: address in use"
        );

        let mut supervisor = Supervisor::default();
        supervisor.add(SupervisedTask::spawn("traffic sampler", async { panic!("boom") }));
        let failed = supervisor.first_failure().await;
        assert!(
            failed
                .to_string()
                .starts_with("traffic sampler stopped: panicked"),
            "{failed}"
        );

        let mut idle = Supervisor::default();
        idle.add(SupervisedTask::spawn("done", async { Ok(()) }));
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), idle.first_failure()).await;
        assert!(waited.is_err(), "a task that finished cleanly is no failure");
    }
}
