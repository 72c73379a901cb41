//! Failures of a reconcile: the top error, wrapping each step's own, and the labels the
//! metrics keep apart.

use super::reconcile::apply::ApplyError;
use super::reconcile::read::ReadError;
use super::reconcile::release::ReleaseError;
use super::reconcile::report::ReportError;
use super::request::OTHER_FAILURE_LABELS;
use super::request::{Request, status_code};

/// Why a reconcile failed (and will be retried with backoff): the error of the step that
/// failed. Conditions the controller reports on the policy (invalid policy, missing CRD,
/// conflicts, ...) are not errors: they are written to status and the reconcile succeeds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The release step (the finalizer, releasing a deleted policy's CRD).
    #[error(transparent)]
    Release(#[from] ReleaseError),
    /// The read step.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The apply step.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// The report step (the status write).
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The object has no name (the apiserver always sets one).
    #[error("object has no metadata.name")]
    MissingName,
}

impl Error {
    /// The labels of the failures that are not a request's (`Request::label`).
    pub const OTHER_LABELS: [&'static str; 3] = OTHER_FAILURE_LABELS;

    /// Short stable label, for metrics (`error` label): the request that failed, or what
    /// else did.
    pub fn label(&self) -> &'static str {
        match self.request() {
            Some(request) => request.label(),
            None => match self {
                Error::Apply(ApplyError::ConcurrentModification { .. }) => Self::OTHER_LABELS[0],
                Error::MissingName => Self::OTHER_LABELS[2],
                _ => Self::OTHER_LABELS[1],
            },
        }
    }

    /// The apiserver request that failed, if a request did.
    pub fn request(&self) -> Option<Request> {
        match self {
            Error::Release(ReleaseError::PatchPolicy { .. }) => Some(Request::PatchPolicy),
            Error::Release(ReleaseError::PatchCrd { .. }) | Error::Apply(ApplyError::Patch { .. }) => {
                Some(Request::PatchCrd)
            }
            Error::Release(ReleaseError::Read(_)) | Error::Read(_) | Error::Apply(ApplyError::Read(_)) => {
                Some(Request::ReadCrd)
            }
            Error::Report(ReportError::WriteStatus { .. }) => Some(Request::WriteStatus),
            Error::Release(ReleaseError::Serialize(_))
            | Error::Apply(ApplyError::Serialize(_) | ApplyError::ConcurrentModification { .. })
            | Error::Report(ReportError::Serialize(_))
            | Error::MissingName => None,
        }
    }

    /// The apiserver's answer, when a request failed with one.
    pub fn api_status_code(&self) -> Option<u16> {
        let source = match self {
            Error::Release(release) => return release.api_status_code(),
            Error::Apply(ApplyError::Patch { source, .. })
            | Error::Report(ReportError::WriteStatus { source, .. }) => source,
            Error::Read(read) | Error::Apply(ApplyError::Read(read)) => &read.source,
            _ => return None,
        };
        status_code(source)
    }

    /// Whether the policy was deleted while it was being reconciled: its own status write
    /// or patch answered 404.
    pub fn policy_gone(&self) -> bool {
        matches!(self.request(), Some(Request::WriteStatus | Request::PatchPolicy))
            && self.api_status_code() == Some(404)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn not_found() -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code: 404,
                reason: "NotFound".to_owned(),
                ..kube::core::Status::default()
            }
            .boxed(),
        )
    }

    /// A failed CRD patch and a failed status write count apart, and the message says which.
    #[test]
    fn each_request_has_its_own_label_and_words() {
        let labels: BTreeSet<&str> = Request::ALL
            .iter()
            .map(|r| r.label())
            .chain(Error::OTHER_LABELS)
            .collect();
        assert_eq!(labels.len(), Request::ALL.len() + Error::OTHER_LABELS.len());
        let failed = Error::from(ReportError::WriteStatus {
            policy: "p".to_owned(),
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        });
        assert_eq!(failed.label(), "write_status");
        assert!(
            failed
                .to_string()
                .starts_with("writing the status of VersionPolicy p failed: "),
            "{failed}"
        );
        assert_eq!(failed.api_status_code(), None);
        assert!(!failed.policy_gone());
        let gone = Error::from(ReportError::WriteStatus {
            policy: "p".to_owned(),
            source: not_found(),
        });
        assert!(gone.policy_gone());
        let patch_crd_gone = Error::from(ApplyError::Patch {
            crd: "c".to_owned(),
            source: not_found(),
        });
        assert_eq!(patch_crd_gone.label(), "patch_crd");
        assert!(!patch_crd_gone.policy_gone());
        let conflict = Error::from(ApplyError::ConcurrentModification {
            crd: "c".to_owned(),
            attempts: 3,
        });
        assert_eq!(conflict.label(), "concurrent_modification");
    }
}
