//! Failures of the controller layer.

/// Why a reconcile failed (and will be retried with backoff). Conditions the controller
/// reports on the policy (invalid policy, missing CRD, conflicts, ...) are not errors: they
/// are written to status and the reconcile succeeds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the apiserver failed.
    #[error("{} failed: {source}", request.describe())]
    Kube {
        /// Which request.
        request: Request,
        #[source]
        source: kube::Error,
    },

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
    /// The labels of the failures that are not a request's (`Request::label`).
    pub const OTHER_LABELS: [&'static str; 3] = ["concurrent_modification", "serialize", "missing_name"];

    /// Short stable label, for metrics (`error` label) and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube { request, .. } => request.label(),
            Error::ConcurrentModification { .. } => Self::OTHER_LABELS[0],
            Error::Serialize { .. } => Self::OTHER_LABELS[1],
            Error::MissingName => Self::OTHER_LABELS[2],
        }
    }

    /// The error of `request` failing with `source` (for `map_err`).
    pub fn of(request: Request) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Kube { request, source }
    }

    /// The apiserver's answer, when a request failed with one.
    pub fn api_status_code(&self) -> Option<u16> {
        match self {
            Error::Kube { source, .. } => status_code(source),
            _ => None,
        }
    }
}

/// The reconcile's requests to the apiserver, each its own `error` label of
/// `crd_lifecycle_reconcile_failures_total`: a failed CRD patch and a failed status write
/// are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A quorum read of the governed CRD.
    ReadCrd,
    /// A guarded patch of the governed CRD (a transition, a release).
    PatchCrd,
    /// A patch of the VersionPolicy itself (its finalizer).
    PatchPolicy,
    /// The server-side apply of the policy's status.
    WriteStatus,
}

impl Request {
    /// Every request, for the metric's documentation and tests.
    pub const ALL: [Request; 4] = [
        Request::ReadCrd,
        Request::PatchCrd,
        Request::PatchPolicy,
        Request::WriteStatus,
    ];

    /// Its `error` label value.
    pub fn label(self) -> &'static str {
        match self {
            Request::ReadCrd => "read_crd",
            Request::PatchCrd => "patch_crd",
            Request::PatchPolicy => "patch_policy",
            Request::WriteStatus => "write_status",
        }
    }

    /// What it is, in an error message.
    fn describe(self) -> &'static str {
        match self {
            Request::ReadCrd => "reading the CRD",
            Request::PatchCrd => "patching the CRD",
            Request::PatchPolicy => "patching the VersionPolicy",
            Request::WriteStatus => "writing the VersionPolicy's status",
        }
    }
}

/// The HTTP status code of an apiserver error response, if that is what `error` is.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A failed CRD patch and a failed status write count apart, and the message says which.
    #[test]
    fn each_request_has_its_own_label_and_words() {
        let labels: BTreeSet<&str> = Request::ALL
            .iter()
            .map(|r| r.label())
            .chain(Error::OTHER_LABELS)
            .collect();
        assert_eq!(labels.len(), Request::ALL.len() + Error::OTHER_LABELS.len());
        let failed = Error::of(Request::WriteStatus)(kube::Error::LinesCodecMaxLineLengthExceeded);
        assert_eq!(failed.label(), "write_status");
        assert!(
            failed
                .to_string()
                .starts_with("writing the VersionPolicy's status failed: "),
            "{failed}"
        );
        assert_eq!(failed.api_status_code(), None);
    }
}
