//! The reconcile's requests to the apiserver, and the labels its failures are counted by: a
//! leaf, so that the metrics (which document the labels) and every step's error name them
//! without importing each other.

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
}

/// The HTTP status code of an apiserver error response, if that is what `error` is.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The `error` labels of the failures that are not a request's (`controller::Error::label`).
pub const OTHER_FAILURE_LABELS: [&str; 3] = ["concurrent_modification", "serialize", "missing_name"];
