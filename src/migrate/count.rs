//! How many objects a CRD has, without listing them all.

use kube::Client;

use super::crd_reads::read_target;
use super::requests::{self, Answer, Requester};
use super::{Error, Settings, Target};

/// How many objects the CRD has (one list of a single object, whose
/// `remainingItemCount` gives the rest, sample 30, retried while it fails transiently);
/// `None` when the apiserver does not say.
pub async fn count_objects(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
) -> Result<Option<u64>, Error> {
    let requester = Requester::unthrottled(client, settings.request_timeout);
    let target = read_target(client, crd_name, None, settings).await?;
    requests::retried(
        &settings.retry,
        &format!("counting the objects of {crd_name}"),
        || requester.count(&target),
    )
    .await
    .map_err(|answer| listing_failed(&target, &answer))
}

fn listing_failed(target: &Target, answer: &Answer) -> Error {
    Error::List {
        crd: target.crd.clone(),
        version: target.version.clone(),
        message: answer.to_string(),
    }
}
