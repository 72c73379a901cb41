//! Problems with a policy, each located by its field path: the one error shape the engine
//! (`lifecycle`) and the declarative conversion (`conversion`) share. A leaf: it imports
//! nothing of the crate.

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
    pub fn into_result<T>(self, value: T) -> Result<T, FieldErrors> {
        if self.is_empty() { Ok(value) } else { Err(self) }
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
