//! The one pager: lists every object of a CRD through one version, metadata only
//! (`PartialObjectMetadataList`, samples 09, 10), a page at a time, and hands each page to
//! the caller as it arrives, so that memory is bounded by the page size whatever the number
//! of objects. The objects digest, `audit` and the writers gate fold its pages
//! (`Lister::fold`); `Lister::pages` gives them as a stream from any continue token (a
//! checkpoint's), with each expired token's replacement, as a migration's run needs them
//! (`run.rs` still pages by itself).
//!
//! Every page request is bounded by the request timeout and retried while it fails
//! transiently (no answer, 429, 5xx; after the apiserver's `Retry-After` where it gives
//! one). A continue token older than the etcd compaction answers 410 with a fresh token that
//! goes on from where the list stopped (samples 27, 28): the listing follows it, because
//! starting over never finishes once one pass outlasts the compaction interval (five minutes
//! by default). Only a 410 without a fresh token starts the listing again from the first
//! page (no recorded apiserver answers so; bounded). Following the fresh token gives an
//! "inconsistent" list: every key after the last one listed is still listed, and objects
//! created or written meanwhile show as they are then.

use std::pin::pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use governor::DefaultDirectRateLimiter;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;

use super::Error;
use super::requests::{Answer, Page, Requester, retried};
use super::settings::{RetryPolicy, Settings};
use super::target::Target;

/// How a listing pages, retries and follows expired continue tokens.
#[derive(Clone, Debug)]
pub struct ListSettings {
    /// Objects per page.
    pub page_size: u32,
    /// How a page that failed transiently is asked for again.
    pub retry: RetryPolicy,
    /// Longest wait for one page; a page that takes longer is asked for again.
    pub request_timeout: Duration,
    /// List each object's `metadata.managedFields` too (`ObjectKey::managed_fields`).
    pub with_managed_fields: bool,
    /// How many times in a row the continue token may expire (each time followed with the
    /// fresh token) with no page listed in between.
    pub max_expired_in_a_row: usize,
    /// How often the listing may start again from the first page after a 410 that carries
    /// no fresh token.
    pub max_fresh_starts: usize,
}

impl Default for ListSettings {
    fn default() -> Self {
        ListSettings::from(&Settings::default())
    }
}

impl From<&Settings> for ListSettings {
    /// A run's paging, retries and bounds (without managedFields: a cleanup asks for them).
    fn from(settings: &Settings) -> Self {
        ListSettings {
            page_size: settings.page_size,
            retry: settings.retry.clone(),
            request_timeout: settings.request_timeout,
            with_managed_fields: false,
            max_expired_in_a_row: settings.max_expired_in_a_row,
            max_fresh_starts: settings.max_restarts.max(1) * 4,
        }
    }
}

/// What a lister reads: the objects of a CRD, through one of its versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collection {
    pub crd: String,
    pub group: String,
    pub version: String,
    pub plural: String,
}

impl Collection {
    /// The CRD's objects through its storage version when that is served, else through
    /// another served version (names, resourceVersions and managedFields read the same
    /// through any); an error when no version is served.
    pub fn of_crd(crd: &CustomResourceDefinition) -> Result<Collection, String> {
        let versions = &crd.spec.versions;
        let through = versions
            .iter()
            .find(|v| v.storage && v.served)
            .or_else(|| versions.iter().find(|v| v.served))
            .ok_or_else(|| "no version is served".to_owned())?;
        Ok(Collection {
            crd: crd.metadata.name.clone().unwrap_or_default(),
            group: crd.spec.group.clone(),
            version: through.name.clone(),
            plural: crd.spec.names.plural.clone(),
        })
    }

    /// `/apis/<group>/<version>/<plural>`: every object, across namespaces.
    fn path(&self) -> String {
        format!("/apis/{}/{}/{}", self.group, self.version, self.plural)
    }
}

impl From<&Target> for Collection {
    /// The run's objects, through the version its requests go through.
    fn from(target: &Target) -> Self {
        Collection {
            crd: target.crd.clone(),
            group: target.group.clone(),
            version: target.version.clone(),
            plural: target.plural.clone(),
        }
    }
}

/// What listing brings, in order.
#[derive(Debug)]
pub enum Listed {
    /// The next page; its `next` lists the page after it (`None`: this was the last).
    Page(Page),
    /// The continue token expired (410) and the listing goes on from where it stopped with
    /// this fresh token (samples 27, 28): a caller that checkpoints tokens records it.
    Continued(String),
    /// The token expired without a fresh one: the listing starts again from the first page,
    /// and what the caller gathered so far is to be forgotten.
    Restarted,
}

/// What a fold ended with: the caller's state and how the listing went.
#[derive(Debug)]
pub struct Folded<S> {
    pub state: S,
    /// Pages listed (those of abandoned passes included).
    pub pages: u64,
    /// Expired continue tokens followed with the fresh one.
    pub expired_tokens: u64,
    /// Times the listing started again from the first page.
    pub fresh_starts: u64,
}

/// Lists the objects of one collection (see the module's documentation).
pub struct Lister<'a> {
    requester: Requester<'a>,
    collection: Collection,
    settings: ListSettings,
}

/// Where a listing is between two pages.
struct Cursor {
    token: Option<String>,
    done: bool,
    expired_in_a_row: usize,
    fresh_starts: usize,
}

impl<'a> Lister<'a> {
    /// A lister without a rate limit.
    pub fn new(client: &'a Client, collection: Collection, settings: ListSettings) -> Self {
        Lister {
            requester: Requester::unthrottled(client, settings.request_timeout),
            collection,
            settings,
        }
    }

    /// Its page requests wait for `limiter` too (a run's `qps`).
    pub fn throttled(mut self, limiter: Option<&'a DefaultDirectRateLimiter>) -> Self {
        self.requester.limiter = limiter;
        self
    }

    pub fn collection(&self) -> &Collection {
        &self.collection
    }

    /// The listing as a stream, from `start` (a continue token, e.g. a checkpoint's) or
    /// from the first page. A page is requested only when the stream is polled, and the
    /// request under way survives a dropped `next()` (safe in `select!`). The stream ends
    /// after the last page, or with one error: an answer that is not transient, transient
    /// failures beyond the retry policy, or expired tokens beyond the bounds.
    pub fn pages(&self, start: Option<String>) -> impl Stream<Item = Result<Listed, Error>> + '_ {
        let cursor = Cursor {
            token: start,
            done: false,
            expired_in_a_row: 0,
            fresh_starts: 0,
        };
        futures::stream::unfold(cursor, move |mut cursor| async move {
            if cursor.done {
                return None;
            }
            let item = self.next(&mut cursor).await;
            cursor.done |= item.is_err();
            Some((item, cursor))
        })
    }

    /// Folds every object's page into a state: `init` makes it (again, when the listing
    /// starts over), `on_page` adds one page. Only one page is held at a time.
    pub async fn fold<S>(
        &self,
        mut init: impl FnMut() -> S,
        mut on_page: impl FnMut(&mut S, Page),
    ) -> Result<Folded<S>, Error> {
        let mut folded = Folded {
            state: init(),
            pages: 0,
            expired_tokens: 0,
            fresh_starts: 0,
        };
        let mut pages = pin!(self.pages(None));
        while let Some(listed) = pages.next().await {
            match listed? {
                Listed::Page(page) => {
                    folded.pages += 1;
                    on_page(&mut folded.state, page);
                }
                Listed::Continued(_) => folded.expired_tokens += 1,
                Listed::Restarted => {
                    folded.fresh_starts += 1;
                    folded.state = init();
                }
            }
        }
        Ok(folded)
    }

    /// Lists the page at the cursor and moves it on.
    async fn next(&self, cursor: &mut Cursor) -> Result<Listed, Error> {
        let path = self.collection.path();
        let what = format!(
            "listing {} through {}",
            self.collection.crd, self.collection.version
        );
        let token = cursor.token.clone();
        let listed = retried(&self.settings.retry, &what, || {
            self.requester.list_page_at(
                &path,
                self.settings.page_size,
                token.as_deref(),
                self.settings.with_managed_fields,
            )
        })
        .await;
        match listed {
            Ok(page) => {
                cursor.expired_in_a_row = 0;
                cursor.token = page.next.clone();
                cursor.done = cursor.token.is_none();
                Ok(Listed::Page(page))
            }
            Err(Answer::Status {
                code: 410,
                continue_token: Some(fresh),
                ..
            }) => {
                cursor.expired_in_a_row += 1;
                if cursor.expired_in_a_row > self.settings.max_expired_in_a_row {
                    return Err(self.failed(format!(
                        "the continue token expired {} times in a row",
                        cursor.expired_in_a_row
                    )));
                }
                cursor.token = Some(fresh.clone());
                Ok(Listed::Continued(fresh))
            }
            Err(Answer::Status { code: 410, .. }) => {
                cursor.fresh_starts += 1;
                if cursor.fresh_starts > self.settings.max_fresh_starts {
                    return Err(self.failed(format!(
                        "the continue token expired without a fresh one {} times; gave up listing again from the start",
                        cursor.fresh_starts
                    )));
                }
                cursor.token = None;
                Ok(Listed::Restarted)
            }
            Err(answer) => Err(self.failed(answer.to_string())),
        }
    }

    fn failed(&self, message: String) -> Error {
        Error::List {
            crd: self.collection.crd.clone(),
            version: self.collection.version.clone(),
            message,
        }
    }
}
