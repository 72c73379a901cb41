//! The controller that applies VersionPolicies to live CRDs (see the controller issue).
