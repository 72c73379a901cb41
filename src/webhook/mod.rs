//! The conversion webhook: HTTPS `POST /convert/<policy>` answering `apiextensions.k8s.io/v1`
//! ConversionReviews with the policy's declarative conversion.

pub mod certs;
pub mod metrics;
mod server;
pub mod standalone;

use std::sync::Arc;

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;

use crate::api::{ConversionSpec, VersionPolicy};
use crate::conversion::{Converter, RecordedConversion, object_name};

pub use metrics::{ReviewResult, WebhookMetrics};
pub use server::{CertStore, router, serve};

/// Where the webhook finds the conversion of a policy.
pub trait PolicySource: Send + Sync {
    /// The policy's conversion, if the policy exists and has one.
    fn conversion(&self, policy: &str) -> Option<ConversionSpec>;
}

/// Policies given up front (the standalone `webhook --policy FILE`, and tests).
pub struct StaticPolicies(pub Vec<VersionPolicy>);

impl PolicySource for StaticPolicies {
    fn conversion(&self, policy: &str) -> Option<ConversionSpec> {
        self.0
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(policy))
            .and_then(|p| p.spec.conversion.clone())
    }
}

/// The controller's caches: VersionPolicies, and the metadata of CRDs, whose
/// `crdlifecycle.io/conversion` annotation records the conversion each relies on. The policy
/// comes first; once it is gone (deleted, or not yet seen), the CRD's record serves, so that
/// a CRD pointed at `/convert/<policy>` stays readable through every version.
pub struct CachedPolicies {
    pub policies: kube::runtime::reflector::Store<kube::core::DeserializeGuard<VersionPolicy>>,
    pub crds: kube::runtime::reflector::Store<PartialObjectMeta<CustomResourceDefinition>>,
}

impl PolicySource for CachedPolicies {
    fn conversion(&self, policy: &str) -> Option<ConversionSpec> {
        let from_policy = self
            .policies
            .state()
            .iter()
            .filter_map(|guard| guard.0.as_ref().ok())
            .find(|p| p.metadata.name.as_deref() == Some(policy))
            .and_then(|p| p.spec.conversion.clone());
        from_policy.or_else(|| {
            let crds = self.crds.state();
            recorded_conversion(crds.iter().map(|crd| &crd.metadata), policy)
        })
    }
}

impl CachedPolicies {
    /// Caches of the cluster's VersionPolicies and CRD metadata, and the future that keeps
    /// them filled (watches with backoff: an error such as a missing grant is retried, not
    /// spun on); the future never ends by itself.
    pub fn watch(client: kube::Client) -> (CachedPolicies, futures::future::BoxFuture<'static, ()>) {
        use futures::{FutureExt, StreamExt};
        use kube::runtime::{WatchStreamExt, reflector, watcher};
        let (policies, policy_writer) = reflector::store();
        let (crds, crd_writer) = reflector::store();
        let config = || watcher::Config::default().any_semantic();
        let policy_api: kube::Api<kube::core::DeserializeGuard<VersionPolicy>> =
            kube::Api::all(client.clone());
        // Metadata only: the annotations are all the webhook needs of a CRD.
        let crd_api: kube::Api<PartialObjectMeta<CustomResourceDefinition>> = kube::Api::all(client);
        let policy_stream = reflector(policy_writer, watcher(policy_api, config()).default_backoff());
        let crd_stream = reflector(crd_writer, watcher(crd_api, config()).default_backoff());
        let watches = futures::future::join(
            policy_stream.for_each(|event| log_watch_error("VersionPolicy", event)),
            crd_stream.for_each(|event| log_watch_error("CustomResourceDefinition", event)),
        )
        .map(|_| ())
        .boxed();
        (CachedPolicies { policies, crds }, watches)
    }

    /// Waits until both caches have their first full list.
    pub async fn wait_until_ready(&self) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
        self.policies.wait_until_ready().await?;
        self.crds.wait_until_ready().await
    }
}

async fn log_watch_error<T>(what: &'static str, event: Result<T, kube::runtime::watcher::Error>) {
    if let Err(error) = event {
        tracing::warn!(error = %error, "the conversion webhook's {what} watch failed; retrying");
    }
}

/// The conversion a CRD records for `policy` (see `CRD_CONVERSION_ANNOTATION`).
pub fn recorded_conversion<'a>(
    crds: impl IntoIterator<Item = &'a ObjectMeta>,
    policy: &str,
) -> Option<ConversionSpec> {
    crds.into_iter()
        .filter_map(|meta| RecordedConversion::from_annotations(meta.annotations.as_ref()))
        .find(|record| record.policy == policy)
        .map(|record| record.conversion)
}

/// One answered ConversionReview: what to send, and how it went (for the metrics).
pub struct Answer {
    /// The HTTP status code.
    pub code: u16,
    pub review: ConversionReview,
    pub result: ReviewResult,
    /// Whether the policy named in the path has a conversion (policy or CRD record).
    pub policy_known: bool,
}

/// Answers one ConversionReview body. Never panics: a body that is not a review gets an
/// `invalid` response, objects that cannot convert a Failed result naming the object.
/// Returns the HTTP status code and the review to send.
pub fn review(body: &[u8], policy: &str, policies: &Arc<dyn PolicySource>) -> (u16, ConversionReview) {
    let answer = answer(body, policy, policies);
    (answer.code, answer.review)
}

/// As [`review`], with how it went.
pub fn answer(body: &[u8], policy: &str, policies: &Arc<dyn PolicySource>) -> Answer {
    let spec = policies.conversion(policy);
    let policy_known = spec.is_some();
    let invalid = |message: String| Answer {
        code: 400,
        review: ConversionResponse::invalid(Status::failure(&message, "BadRequest")).into_review(),
        result: ReviewResult::invalid,
        policy_known,
    };
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => return invalid(format!("the body is not a ConversionReview: {error}")),
    };
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(error) => return invalid(error.to_string()),
    };
    let response = ConversionResponse::for_request(request.clone());
    let failure = |message: String| Answer {
        code: 200,
        review: response
            .clone()
            .failure(Status::failure(&message, "ConversionFailed"))
            .into_review(),
        result: ReviewResult::failure,
        policy_known,
    };
    let Some(spec) = spec else {
        return failure(format!(
            "VersionPolicy {policy} does not exist or has no spec.conversion, and no CustomResourceDefinition records a conversion for it"
        ));
    };
    let Some((_, version)) = request.desired_api_version.rsplit_once('/') else {
        return failure(format!(
            "desiredAPIVersion {:?} is not <group>/<version>",
            request.desired_api_version
        ));
    };
    let converter = match Converter::for_spec(&spec) {
        Ok(converter) => converter,
        Err(errors) => {
            return failure(format!(
                "VersionPolicy {policy} has an invalid spec.conversion: {errors}"
            ));
        }
    };
    let mut converted = Vec::with_capacity(request.objects.len());
    for object in &request.objects {
        match converter.convert(object, version) {
            Ok(object) => converted.push(object),
            Err(error) => {
                return failure(format!(
                    "cannot convert {} to {version}: {error}",
                    object_name(object)
                ));
            }
        }
    }
    Answer {
        code: 200,
        review: response.success(converted).into_review(),
        result: ReviewResult::success,
        policy_known,
    }
}
