//! The conversion webhook: HTTPS `POST /convert/<policy>` answering `apiextensions.k8s.io/v1`
//! ConversionReviews with the policy's declarative conversion. `crd-lifecycle run` serves it
//! on every replica (`run`), its CA kept trusted by the CRDs across rotations (`ca`);
//! `crd-lifecycle webhook` serves it alone (`standalone`).

pub mod ca;
pub mod certs;
pub mod metrics;
mod readiness;
pub(crate) mod run;
mod server;
pub mod standalone;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;

use crate::api::{ConversionSpec, VersionPolicy};
use crate::conversion::{Budget, ConversionError, Converter, RecordedConversion, object_name};

pub use metrics::{ReviewResult, WebhookMetrics};
pub use readiness::Readiness;
pub use server::{
    CertStore, Connections, DEFAULT_DRAIN, DEFAULT_IN_FLIGHT_DEADLINE, DEFAULT_MAX_CONNECTION_AGE, Server,
    drain_after,
};

/// Converts the objects of a review: a policy's compiled conversion.
pub trait Convert: Send + Sync {
    /// Converts one object in place to `to_version`, spending from `budget`.
    fn convert_in_place(
        &self,
        object: &mut serde_json::Value,
        to_version: &str,
        budget: &mut Budget,
    ) -> Result<(), ConversionError>;
}

impl Convert for Converter {
    fn convert_in_place(
        &self,
        object: &mut serde_json::Value,
        to_version: &str,
        budget: &mut Budget,
    ) -> Result<(), ConversionError> {
        Converter::convert_in_place(self, object, to_version, budget)
    }
}

/// What the webhook knows of a policy's conversion.
#[derive(Clone)]
pub enum Lookup {
    /// The policy's conversion, compiled.
    Found(Arc<dyn Convert>),
    /// The policy's `spec.conversion` does not validate (the message says why).
    Invalid(String),
    /// No policy of that name has a conversion, and no CRD records one for it.
    Missing,
}

/// Where the webhook finds the conversion of a policy.
pub trait PolicySource: Send + Sync {
    /// The policy's compiled conversion.
    fn converter(&self, policy: &str) -> Lookup;
}

/// Compiled conversions by policy, compiled again only when a policy's conversion changes:
/// a review costs no parsing or compiling of expressions.
#[derive(Default)]
pub struct ConverterCache {
    entries: Mutex<HashMap<String, (ConversionSpec, Lookup)>>,
}

impl ConverterCache {
    /// The compiled form of `spec`, the conversion of `policy`.
    pub fn get(&self, policy: &str, spec: &ConversionSpec) -> Lookup {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cached, lookup)) = entries.get(policy)
            && cached == spec
        {
            return lookup.clone();
        }
        let lookup = match Converter::for_spec(spec) {
            Ok(converter) => Lookup::Found(Arc::new(converter)),
            Err(errors) => Lookup::Invalid(format!(
                "VersionPolicy {policy} has an invalid spec.conversion: {errors}"
            )),
        };
        entries.insert(policy.to_owned(), (spec.clone(), lookup.clone()));
        lookup
    }

    /// Forgets policies no longer known, so the cache does not grow with deleted ones.
    fn retain(&self, known: impl Fn(&str) -> bool) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|policy, _| known(policy));
    }
}

/// Policies given up front (the standalone `webhook --policy FILE`, and tests).
pub struct StaticPolicies {
    policies: Vec<VersionPolicy>,
    cache: ConverterCache,
}

impl StaticPolicies {
    pub fn new(policies: Vec<VersionPolicy>) -> StaticPolicies {
        StaticPolicies {
            policies,
            cache: ConverterCache::default(),
        }
    }
}

impl PolicySource for StaticPolicies {
    fn converter(&self, policy: &str) -> Lookup {
        self.policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(policy))
            .and_then(|p| p.spec.conversion.as_ref())
            .map_or(Lookup::Missing, |spec| self.cache.get(policy, spec))
    }
}

/// The controller's caches: VersionPolicies, and the metadata of CRDs, whose
/// `crdlifecycle.io/conversion` annotation records the conversion each relies on. The policy
/// comes first; once it is gone (deleted, or not yet seen), the CRD's record serves, so that
/// a CRD pointed at `/convert/<policy>` stays readable through every version.
pub struct CachedPolicies {
    pub policies: kube::runtime::reflector::Store<kube::core::DeserializeGuard<VersionPolicy>>,
    pub crds: kube::runtime::reflector::Store<PartialObjectMeta<CustomResourceDefinition>>,
    converters: ConverterCache,
    /// Whether each watch (policies, CRDs) has listed once; never, for caches filled by hand.
    listed: [crate::sync::Listed; 2],
}

impl PolicySource for CachedPolicies {
    fn converter(&self, policy: &str) -> Lookup {
        let key = kube::runtime::reflector::ObjectRef::new(policy);
        if let Some(guard) = self.policies.get(&key)
            && let Ok(found) = &guard.0
            && let Some(spec) = &found.spec.conversion
        {
            return self.converters.get(policy, spec);
        }
        let crds = self.crds.state();
        match recorded_conversion(crds.iter().map(|crd| &crd.metadata), policy) {
            Some(spec) => self.converters.get(policy, &spec),
            None => {
                // Neither the policy nor a record: forget what was compiled for it.
                self.converters.retain(|known| known != policy);
                Lookup::Missing
            }
        }
    }
}

impl CachedPolicies {
    /// The webhook's view of these caches.
    pub fn new(
        policies: kube::runtime::reflector::Store<kube::core::DeserializeGuard<VersionPolicy>>,
        crds: kube::runtime::reflector::Store<PartialObjectMeta<CustomResourceDefinition>>,
    ) -> CachedPolicies {
        CachedPolicies {
            policies,
            crds,
            converters: ConverterCache::default(),
            listed: [crate::sync::Listed::never(), crate::sync::Listed::never()],
        }
    }

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
        let (policies_listed, policy_lists) = crate::sync::Listed::new();
        let (crds_listed, crd_lists) = crate::sync::Listed::new();
        let policy_stream =
            reflector(policy_writer, watcher(policy_api, config()).default_backoff()).inspect(policy_lists);
        let crd_stream =
            reflector(crd_writer, watcher(crd_api, config()).default_backoff()).inspect(crd_lists);
        let watches = futures::future::join(
            policy_stream.for_each(|event| log_watch_error("VersionPolicy", event)),
            crd_stream.for_each(|event| log_watch_error("CustomResourceDefinition", event)),
        )
        .map(|_| ())
        .boxed();
        let cache = CachedPolicies {
            listed: [policies_listed, crds_listed],
            ..CachedPolicies::new(policies, crds)
        };
        (cache, watches)
    }

    /// Waits until both caches have their first full list: `false` when they never will
    /// (their watches are gone, or the caches were filled by hand). Any number of tasks may
    /// wait at once (see `sync::Listed`).
    pub async fn wait_until_ready(&self) -> bool {
        crate::sync::Listed::all(&self.listed).await
    }

    /// What `wait_until_ready` waits for, for a reader of these caches.
    pub(crate) fn listed(&self) -> [crate::sync::Listed; 2] {
        self.listed.clone()
    }
}

async fn log_watch_error<T>(what: &'static str, event: Result<T, kube::runtime::watcher::Error>) {
    match event {
        // A watch resumed from a resourceVersion etcd compacted away: routine, the watcher
        // lists again (finding 11: not worth a warning on every apiserver restart).
        Err(kube::runtime::watcher::Error::WatchError(status)) if status.code == 410 => {
            tracing::debug!(error = %status.message, "the conversion webhook's {what} watch expired (410); listing again");
        }
        Err(error) => {
            tracing::warn!(error = %error, "the conversion webhook's {what} watch failed; retrying")
        }
        Ok(_) => {}
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
    /// Whether an expression's cost or size limit failed it.
    pub over_limit: bool,
}

/// Answers one ConversionReview body with the default limits. Never panics: a body that is
/// not a review gets an `invalid` response, objects that cannot convert a Failed result
/// naming the object. Returns the HTTP status code and the review to send.
pub fn review(body: &[u8], policy: &str, policies: &Arc<dyn PolicySource>) -> (u16, ConversionReview) {
    let answer = answer(body, policy, policies.converter(policy), &Limits::default());
    (answer.code, answer.review)
}

/// As [`review`], for a looked-up conversion and given limits, with how it went.
pub fn answer(body: &[u8], policy: &str, lookup: Lookup, limits: &Limits) -> Answer {
    let policy_known = !matches!(lookup, Lookup::Missing);
    let invalid = |message: String| Answer {
        code: 400,
        review: ConversionResponse::invalid(Status::failure(&message, "BadRequest")).into_review(),
        result: ReviewResult::invalid,
        policy_known,
        over_limit: false,
    };
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => return invalid(format!("the body is not a ConversionReview: {error}")),
    };
    let mut request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(error) => return invalid(error.to_string()),
    };
    let objects = std::mem::take(&mut request.objects);
    let desired = std::mem::take(&mut request.desired_api_version);
    let response = ConversionResponse::for_request(request);
    let failure = |message: String, over_limit: bool| Answer {
        code: 200,
        review: response
            .clone()
            .failure(Status::failure(&message, "ConversionFailed"))
            .into_review(),
        result: ReviewResult::failure,
        policy_known,
        over_limit,
    };
    let converter = match lookup {
        Lookup::Found(converter) => converter,
        Lookup::Invalid(message) => return failure(message, false),
        Lookup::Missing => {
            return failure(
                format!(
                    "VersionPolicy {policy} does not exist or has no spec.conversion, and no CustomResourceDefinition records a conversion for it"
                ),
                false,
            );
        }
    };
    let Some((_, version)) = desired.rsplit_once('/') else {
        return failure(
            format!("desiredAPIVersion {desired:?} is not <group>/<version>"),
            false,
        );
    };
    let mut budget = Budget::new(limits.review_cost, limits.call_cost);
    let mut converted = objects;
    for object in &mut converted {
        if let Err(error) = converter.convert_in_place(object, version, &mut budget) {
            // Conversion never touches metadata's name and namespace.
            return failure(
                format!("cannot convert {} to {version}: {error}", object_name(object)),
                error.is_over_limit(),
            );
        }
    }
    Answer {
        code: 200,
        review: response.success(converted).into_review(),
        result: ReviewResult::success,
        policy_known,
        over_limit: false,
    }
}

/// What one review may cost the webhook.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body accepted (bytes); a larger review gets a Failed result that
    /// says so.
    pub max_review_bytes: usize,
    /// Cost units one expression evaluation may use.
    pub call_cost: u64,
    /// Cost units all evaluations of one review may use together.
    pub review_cost: u64,
}

/// Default `max_review_bytes`: the apiserver refuses request bodies over 3 MiB and etcd
/// values over 1.5 MiB by default, and sends one object per review when listing, so this
/// is five times the largest object a cluster stores, with room for raised limits.
pub const DEFAULT_MAX_REVIEW_BYTES: usize = 16 << 20;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_review_bytes: DEFAULT_MAX_REVIEW_BYTES,
            call_cost: crate::conversion::cel::PER_CALL_COST_LIMIT,
            review_cost: crate::conversion::cel::PER_REVIEW_COST_LIMIT,
        }
    }
}

/// Where the conversion webhook of `crd-lifecycle run` listens, how the apiserver reaches it, and its
/// certificates.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    pub address: std::net::SocketAddr,
    pub target: ca::WebhookTarget,
    pub certificates: ca::CertificateSource,
    /// What one review may cost.
    pub limits: Limits,
    /// Where each replica records what it serves (so that a CA stays trusted while a
    /// replica serves a certificate it signed, across restarts).
    pub record: Option<ca::RotationRecord>,
    /// How connections age, and the drain after SIGTERM.
    pub connections: Connections,
}

/// The answer to a review whose body is over `max_review_bytes`: a Failed result (which the
/// apiserver shows to the client) with the request's uid, read from the start of the body.
pub fn too_large(prefix: &[u8], size: Option<usize>, limit: usize) -> ConversionReview {
    let uid = uid_of(prefix).unwrap_or_default();
    let size = size.map_or_else(|| "more than that".to_owned(), |n| format!("{n} bytes"));
    let message = format!(
        "the ConversionReview is too large for the crd-lifecycle conversion webhook: {size}, over its limit of {limit} bytes (--max-review-bytes)"
    );
    let mut response = ConversionResponse::invalid(Status::failure(&message, "RequestEntityTooLarge"));
    response.uid = uid;
    response.into_review()
}

/// The `request.uid` of a review from the start of its body: the apiserver writes `uid`
/// before `objects` (the Go struct's field order, apiserver-samples/18).
fn uid_of(prefix: &[u8]) -> Option<String> {
    let at = prefix.windows(5).position(|w| w == b"\"uid\"")? + 5;
    let rest = &prefix[at..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let rest = &rest[colon + 1..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let mut strings = serde_json::Deserializer::from_slice(&rest[start..]).into_iter::<String>();
    strings.next()?.ok()
}
