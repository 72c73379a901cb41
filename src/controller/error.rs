//! Failures of the controller layer.

/// Why a reconcile failed (and will be retried with backoff). Conditions the controller
/// reports on the policy (invalid policy, missing CRD, conflicts, ...) are not errors: they
/// are written to status and the reconcile succeeds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the apiserver failed.
    #[error("apiserver request failed: {0}")]
    Kube(#[source] kube::Error),

    /// The CRD kept changing under us: every guarded patch attempt found it modified.
    #[error("CRD {crd} was modified concurrently {attempts} times in a row; will retry")]
    ConcurrentModification { crd: String, attempts: usize },

    /// A value could not be serialized (a bug, reported rather than panicking).
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// The object has no name (the apiserver always sets one).
    #[error("object has no metadata.name")]
    MissingName,
}

impl Error {
    /// Short stable label, for metrics (`error` label) and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::ConcurrentModification { .. } => "concurrent_modification",
            Error::Serialize { .. } => "serialize",
            Error::MissingName => "missing_name",
        }
    }
}

impl From<kube::Error> for Error {
    fn from(error: kube::Error) -> Self {
        Error::Kube(error)
    }
}

/// The HTTP status code of an apiserver error response, if that is what `error` is.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}
