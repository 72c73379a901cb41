//! Whether a webhook replica should be sent reviews (`/readyz`): it knows the conversions,
//! serves a certificate the CRDs trust, and is not draining.

use std::sync::Mutex;

/// The readiness of one webhook replica; every part is set by the task that knows it.
#[derive(Debug)]
pub struct Readiness {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Why the policies (and the CRDs' recorded conversions) are not known yet, if so.
    policies: Option<String>,
    /// Why no certificate the CRDs trust is served yet, if so.
    certificate: Option<String>,
    /// Set at the shutdown signal, never cleared.
    draining: bool,
}

impl Default for Readiness {
    fn default() -> Readiness {
        Readiness {
            state: Mutex::new(State {
                policies: Some("the policies are not loaded yet".to_owned()),
                certificate: Some("no serving certificate yet".to_owned()),
                draining: false,
            }),
        }
    }
}

impl Readiness {
    /// A replica with its policies and certificate in place (the standalone webhook, whose
    /// certificate and policies are loaded before it serves).
    pub fn ready() -> Readiness {
        let readiness = Readiness::default();
        readiness.policies_loaded();
        readiness.certificate_served();
        readiness
    }

    /// The policies and the CRDs' recorded conversions are known.
    pub fn policies_loaded(&self) {
        crate::sync::lock(&self.state).policies = None;
    }

    /// A certificate whose CA every CRD pointed at the webhook trusts is served.
    pub fn certificate_served(&self) {
        crate::sync::lock(&self.state).certificate = None;
    }

    /// No certificate the CRDs trust is served, for `reason`.
    pub fn certificate_not_served(&self, reason: impl Into<String>) {
        crate::sync::lock(&self.state).certificate = Some(reason.into());
    }

    /// The shutdown signal came: not ready from now on, so that endpoints drop the replica
    /// while it still serves.
    pub fn begin_drain(&self) {
        crate::sync::lock(&self.state).draining = true;
    }

    pub fn is_draining(&self) -> bool {
        crate::sync::lock(&self.state).draining
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), String> {
        let state = crate::sync::lock(&self.state);
        if state.draining {
            return Err("draining: the process is shutting down".to_owned());
        }
        match (&state.certificate, &state.policies) {
            (Some(why), _) | (None, Some(why)) => Err(why.clone()),
            (None, None) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_policies_and_a_trusted_certificate_until_draining() {
        let readiness = Readiness::default();
        assert!(readiness.check().is_err());
        readiness.policies_loaded();
        assert_eq!(readiness.check(), Err("no serving certificate yet".to_owned()));
        readiness.certificate_not_served("waiting for every CRD to trust the new CA");
        assert_eq!(
            readiness.check(),
            Err("waiting for every CRD to trust the new CA".to_owned())
        );
        readiness.certificate_served();
        assert_eq!(readiness.check(), Ok(()));
        readiness.begin_drain();
        assert!(readiness.check().is_err_and(|why| why.starts_with("draining")));
        readiness.certificate_served();
        assert!(readiness.is_draining(), "draining is never undone");
        assert!(Readiness::ready().check().is_ok());
    }
}
