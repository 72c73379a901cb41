//! The conversion webhook: HTTPS `POST /convert/<policy>` answering `apiextensions.k8s.io/v1`
//! ConversionReviews with the policy's declarative conversion.

pub mod certs;
mod server;
pub mod standalone;

use std::sync::Arc;

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};

use crate::api::{ConversionSpec, VersionPolicy};
use crate::conversion::{Converter, object_name};

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

/// The controller's cache of VersionPolicies.
pub struct CachedPolicies(pub kube::runtime::reflector::Store<kube::core::DeserializeGuard<VersionPolicy>>);

impl PolicySource for CachedPolicies {
    fn conversion(&self, policy: &str) -> Option<ConversionSpec> {
        self.0
            .state()
            .iter()
            .filter_map(|guard| guard.0.as_ref().ok())
            .find(|p| p.metadata.name.as_deref() == Some(policy))
            .and_then(|p| p.spec.conversion.clone())
    }
}

/// Answers one ConversionReview body. Never panics: a body that is not a review gets an
/// `invalid` response, objects that cannot convert a Failed result naming the object.
/// Returns the HTTP status code and the review to send.
pub fn review(body: &[u8], policy: &str, policies: &Arc<dyn PolicySource>) -> (u16, ConversionReview) {
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => {
            let status = Status::failure(
                &format!("the body is not a ConversionReview: {error}"),
                "BadRequest",
            );
            return (400, ConversionResponse::invalid(status).into_review());
        }
    };
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(error) => {
            return (
                400,
                ConversionResponse::invalid(Status::failure(&error.to_string(), "BadRequest")).into_review(),
            );
        }
    };
    let response = ConversionResponse::for_request(request.clone());
    let failure = |message: String| {
        (
            200,
            response
                .clone()
                .failure(Status::failure(&message, "ConversionFailed"))
                .into_review(),
        )
    };
    let Some(spec) = policies.conversion(policy) else {
        return failure(format!(
            "VersionPolicy {policy} does not exist or has no spec.conversion"
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
    (200, response.success(converted).into_review())
}
