//! The webhook's CA, kept trusted across rotations: every replica's serving certificate
//! (`refresher`), what each replica serves (`record`, on the webhook Secret), the CAs the
//! CRDs must trust (`rotation`, pure), which CRDs point at the webhook and what they trust
//! (`endpoint`, `pointed_crds`: never a list of the CRDs), and the leader's writes of the
//! bundle to them (`bundle_keeper`). A new CA reaches every CRD's `caBundle` before a
//! certificate it signed is served, and leaves only once no live replica serves one.
//!
//! The controller calls in here (its reconciles render `spec.conversion` through
//! [`WebhookEndpoint`], its leader runs the [`CaBundleKeeper`]); nothing here knows the
//! controller.

mod bundle_keeper;
mod endpoint;
mod pointed_crds;
mod record;
mod refresher;
mod rotation;

pub use bundle_keeper::{CA_BUNDLE_REFUSED, CaBundleKeeper, Synced};
pub use endpoint::{WebhookEndpoint, WebhookTarget};
pub use pointed_crds::WebhookCrds;
pub use record::{Live, RotationRecord, SINCE_ANNOTATION};
pub use refresher::{CertificateRefresher, CertificateSource, FILES_CHECKED_EVERY, SECRET_READ_EVERY};
pub use rotation::pem_blocks;

/// Why reading the CRDs pointed at the webhook failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the apiserver failed.
    #[error("apiserver request failed: {0}")]
    Kube(#[source] kube::Error),

    /// A watch this read relies on has not listed its objects yet.
    #[error("{what} are not listed yet")]
    NotListed { what: &'static str },
}

impl From<kube::Error> for Error {
    fn from(error: kube::Error) -> Self {
        Error::Kube(error)
    }
}
