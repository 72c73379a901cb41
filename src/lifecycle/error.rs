//! Errors of the lifecycle engine: every violation, each naming its field path.

pub use crate::field_errors::{FieldError, FieldErrors};

/// Failures of the lifecycle engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The policy cannot be applied as written (or not to this CRD).
    #[error("invalid policy ({count} problem{plural}):\n{0}", count = .0.len(), plural = if .0.len() == 1 { "" } else { "s" })]
    InvalidPolicy(FieldErrors),
}

impl From<FieldErrors> for Error {
    fn from(errors: FieldErrors) -> Self {
        Error::InvalidPolicy(errors)
    }
}

impl Error {
    /// Short stable label, for metrics and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::InvalidPolicy(_) => "InvalidPolicy",
        }
    }
}
