//! Errors of the lifecycle engine: every violation, each naming its field path.

use std::fmt;

/// One problem with a policy, located by its field path (e.g. `spec.versions[1].unserve.at`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldError {
    /// Where the problem is, as a path into the VersionPolicy object.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// All the problems found in one policy, in the order they were found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let error = FieldError::new(path, message);
        if !self.0.contains(&error) {
            self.0.push(error);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }

    /// `Ok(value)` when no problem was found, else every problem.
    pub fn into_result<T>(self, value: T) -> Result<T, Error> {
        if self.is_empty() {
            Ok(value)
        } else {
            Err(Error::InvalidPolicy(self))
        }
    }
}

impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {error}")?;
        }
        Ok(())
    }
}

/// Failures of the lifecycle engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The policy cannot be applied as written (or not to this CRD).
    #[error("invalid policy ({count} problem{plural}):\n{0}", count = .0.len(), plural = if .0.len() == 1 { "" } else { "s" })]
    InvalidPolicy(FieldErrors),
}

impl Error {
    /// Short stable label, for metrics and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::InvalidPolicy(_) => "InvalidPolicy",
        }
    }
}
