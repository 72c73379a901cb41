//! The one pager (`migrate::Lister`) on its own: pages folded as they arrive, expired
//! continue tokens followed with the fresh one (samples 27, 28), a fresh start only when a
//! 410 carries none (bounded), transient failures and stalls retried.

use std::time::Duration;

use crd_lifecycle::migrate::{Collection, ListSettings, Listed, Lister, ObjectsDigest, RetryPolicy};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tokio::time::Instant;

use super::{CRD, ListFault, cluster};
use crate::apiserver::FakeApiserver;

fn list_settings(page_size: u32) -> ListSettings {
    ListSettings {
        page_size,
        retry: RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        request_timeout: Duration::from_millis(200),
        ..ListSettings::default()
    }
}

fn collection(fake: &FakeApiserver) -> Collection {
    let crd: CustomResourceDefinition = serde_json::from_value(fake.crd(CRD)).expect("crd");
    Collection::of_crd(&crd).expect("served")
}

/// The digest of every object and the largest page folded, listed with `settings`.
async fn digest(fake: &FakeApiserver, settings: ListSettings) -> Result<(String, usize, u64, u64), String> {
    let client = fake.client();
    let lister = Lister::new(&client, collection(fake), settings);
    let folded = lister
        .fold(
            || (ObjectsDigest::default(), 0usize),
            |(digest, largest), page| {
                *largest = (*largest).max(page.objects.len());
                page.objects.iter().for_each(|key| digest.add(key));
            },
        )
        .await
        .map_err(|error| error.to_string())?;
    Ok((
        folded.state.0.value(),
        folded.state.1,
        folded.expired_tokens,
        folded.fresh_starts,
    ))
}

#[tokio::test(start_paused = true)]
async fn pages_are_folded_as_they_arrive_across_compactions() {
    let fake = cluster(500);
    let (clean, largest, _, _) = digest(&fake, list_settings(10)).await.expect("lists");
    assert_eq!(largest, 10, "one page at a time");
    assert!(clean.starts_with("500-"), "{clean}");
    // An etcd compaction after every page: every token expires before it is used, and
    // each 410's fresh token goes on (never more than one in a row).
    fake.clear_requests();
    fake.lock().compact_every_pages = Some(1);
    let (again, _, expired, fresh_starts) = digest(&fake, list_settings(10)).await.expect("lists");
    assert_eq!(again, clean, "every object once");
    assert_eq!((expired, fresh_starts), (49, 0));
    assert_eq!(
        fake.metadata_lists().len(),
        99,
        "50 pages and 49 expired requests"
    );
}

#[tokio::test(start_paused = true)]
async fn a_410_without_a_fresh_token_starts_the_fold_again() {
    let fake = cluster(30);
    let (clean, _, _, _) = digest(&fake, list_settings(10)).await.expect("lists");
    fake.lock().expired_without_token = true;
    fake.after_next_list_page(|state| state.expire_continue_tokens());
    let (again, _, expired, fresh_starts) = digest(&fake, list_settings(10)).await.expect("lists");
    assert_eq!(again, clean, "what was folded before the restart is forgotten");
    assert_eq!((expired, fresh_starts), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn fresh_starts_are_bounded() {
    let fake = cluster(30);
    {
        let mut state = fake.lock();
        state.expired_without_token = true;
        state.compact_every_pages = Some(1);
    }
    let settings = ListSettings {
        max_fresh_starts: 3,
        ..list_settings(10)
    };
    let error = digest(&fake, settings).await.expect_err("gives up");
    assert!(error.contains("expired without a fresh one 4 times"), "{error}");
    assert_eq!(
        fake.metadata_lists()
            .iter()
            .filter(|r| !r.query.contains("continue="))
            .count(),
        4,
        "the first listing and three fresh starts"
    );
}

#[tokio::test(start_paused = true)]
async fn failed_and_stalled_pages_are_asked_for_again() {
    let fake = cluster(30);
    fake.after_next_list_page(|state| {
        state.list_faults.extend([
            ListFault::Status {
                code: 503,
                retry_after: None,
            },
            ListFault::Stall,
            ListFault::Status {
                code: 429,
                retry_after: Some(2),
            },
        ]);
    });
    let started = Instant::now();
    let (digest_value, _, _, _) = digest(&fake, list_settings(10)).await.expect("lists");
    assert!(digest_value.starts_with("30-"), "{digest_value}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "Retry-After honoured"
    );
    assert_eq!(fake.metadata_lists().len(), 6, "3 pages and 3 failed requests");
    // Failing for longer than the retry policy allows ends the listing with the answer.
    fake.after_next_list_page(|state| {
        state.list_faults.extend((0..4).map(|_| ListFault::Status {
            code: 503,
            retry_after: None,
        }));
    });
    let error = digest(&fake, list_settings(10)).await.expect_err("gives up");
    assert!(
        error.starts_with("listing widgets.example.com through v1 failed: 503"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn tokens_that_keep_expiring_end_the_listing() {
    // Every request takes longer than the compaction interval: each fresh token has
    // expired again by the time it is used, and no page is ever listed after the first.
    let fake = cluster(30);
    {
        let mut state = fake.lock();
        state.latency = Duration::from_millis(20);
        state.compact_every = Some(Duration::from_millis(10));
    }
    let settings = ListSettings {
        max_expired_in_a_row: 5,
        ..list_settings(10)
    };
    let error = digest(&fake, settings).await.expect_err("gives up");
    assert!(
        error.contains("the continue token expired 6 times in a row"),
        "{error}"
    );
    assert_eq!(
        fake.metadata_lists().len(),
        7,
        "the first page and 6 expired requests"
    );
}

#[tokio::test(start_paused = true)]
async fn pages_stream_from_a_checkpoint_and_hand_over_each_fresh_token() {
    use futures::StreamExt;
    let fake = cluster(30);
    let client = fake.client();
    let lister = Lister::new(&client, collection(&fake), list_settings(10));
    let first = match std::pin::pin!(lister.pages(None)).next().await {
        Some(Ok(Listed::Page(page))) => page,
        other => panic!("a page: {other:?}"),
    };
    let checkpoint = first.next.expect("more pages");
    // Resumed later, after a compaction: the 410's fresh token is handed over (a run
    // records it as its checkpoint), then the rest is listed.
    fake.lock().expire_continue_tokens();
    let mut listed = Vec::new();
    let mut rest = std::pin::pin!(lister.pages(Some(checkpoint)));
    while let Some(item) = rest.next().await {
        listed.push(match item.expect("lists") {
            Listed::Page(page) => format!("{} objects", page.objects.len()),
            Listed::Continued(token) => format!("continued with {token}"),
            Listed::Restarted => "restarted".to_owned(),
        });
    }
    assert_eq!(
        listed,
        ["continued with 1:ns0/w00027", "10 objects", "10 objects"]
    );
}
