//! The migrator's errors: what stops a run before it can report per-object results.

use std::time::Duration;

/// Failures that stop a run before it can report per-object results.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CustomResourceDefinition {0} not found")]
    CrdNotFound(String),
    #[error("cannot migrate {crd}: {reason}")]
    Unmigratable { crd: String, reason: String },
    #[error("listing {crd} through {version} failed: {message}")]
    List {
        crd: String,
        version: String,
        message: String,
    },
    #[error("the storage version of {crd} kept changing; gave up after {restarts} restarts")]
    TooManyRestarts { crd: String, restarts: usize },
    #[error("the apiserver was not yet {what} for {crd} after {waited:?} ({last})")]
    NotSettled {
        crd: String,
        what: String,
        waited: Duration,
        last: String,
    },
    #[error("apiserver request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    /// The caller may not do what the run needs (nothing was touched).
    #[error("{0}")]
    MissingPermission(String),
}

impl Error {
    /// Short stable label, for metrics and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::CrdNotFound(_) => "crd_not_found",
            Error::Unmigratable { .. } => "unmigratable",
            Error::List { .. } => "list",
            Error::TooManyRestarts { .. } => "too_many_restarts",
            Error::NotSettled { .. } => "not_settled",
            Error::Kube(_) => "kube",
            Error::Timeout { .. } => "timeout",
            Error::MissingPermission(_) => "missing_permission",
        }
    }

    /// Worth trying again: a timeout, a failed connection, 429 or 5xx.
    pub(super) fn is_transient(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Kube(kube::Error::Api(status)) => status.code == 429 || status.code >= 500,
            Error::Kube(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
            _ => false,
        }
    }
}
