//! `crd-lifecycle audit`: reads every CRD (or the named ones) and tells the truth about it:
//! its versions and `storedVersions`, how many objects it has, whether a VersionPolicy
//! governs it, and its problems (stale `storedVersions`, managedFields entries naming
//! versions that are not served, writers still on deprecated versions). Read-only: paged
//! metadata-only lists, a bounded number of CRDs at once.

mod findings;
mod render;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams};

pub use findings::{
    Collected, CrdAudit, Entry, ManagerWrites, Problem, VersionFlags, VersionWrites, Writer, Writes, audit,
};
pub use render::{AuditFormat, render};

use crate::api::VersionPolicy;
use crate::migrate::{Collection, ListSettings, Lister};

/// What to audit, and how.
#[derive(Clone, Debug)]
pub struct AuditSettings {
    /// CRD names; empty: every CRD.
    pub crds: Vec<String>,
    /// Objects per list page.
    pub page_size: u32,
    /// CRDs audited at once.
    pub concurrency: usize,
}

impl Default for AuditSettings {
    fn default() -> AuditSettings {
        AuditSettings {
            crds: Vec::new(),
            page_size: 500,
            concurrency: 4,
        }
    }
}

/// Why an audit could not run (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CustomResourceDefinition {0} not found")]
    NotFound(String),
    #[error("cannot read CustomResourceDefinitions: {0}")]
    Crds(#[source] kube::Error),
}

/// Audits the CRDs; a progress bar on stderr when it is a terminal.
pub async fn run(client: &Client, settings: &AuditSettings) -> Result<Vec<CrdAudit>, Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crds: Vec<CustomResourceDefinition> = if settings.crds.is_empty() {
        api.list(&ListParams::default()).await.map_err(Error::Crds)?.items
    } else {
        let mut found = Vec::new();
        for name in &settings.crds {
            match api.get_opt(name).await.map_err(Error::Crds)? {
                Some(crd) => found.push(crd),
                None => return Err(Error::NotFound(name.clone())),
            }
        }
        found
    };
    let policies = governing_policies(client).await;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(crds.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} auditing [{bar:30}] {pos}/{len} CRDs {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut audits: Vec<CrdAudit> = futures::stream::iter(crds)
        .map(|crd| {
            let policies = &policies;
            let bar = &bar;
            async move {
                let name = crd.metadata.name.clone().unwrap_or_default();
                let mut collected = collect(client, &crd, settings.page_size).await;
                collected.governed_by = policies.iter().find(|(_, c)| *c == name).map(|(p, _)| p.clone());
                if let Some(bar) = bar {
                    bar.set_message(name);
                    bar.inc(1);
                }
                audit(&collected)
            }
        })
        .buffer_unordered(settings.concurrency.max(1))
        .collect()
        .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    audits.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(audits)
}

/// (policy, crdName) of every VersionPolicy; none where the VersionPolicy CRD is not
/// installed or may not be read.
async fn governing_policies(client: &Client) -> Vec<(String, String)> {
    let api: Api<kube::core::DeserializeGuard<VersionPolicy>> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|guard| guard.0.ok())
            .map(|p| (p.metadata.name.unwrap_or_default(), p.spec.crd_name))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Reads one CRD's versions and its objects' writes (metadata-only pages through the
/// storage version).
async fn collect(client: &Client, crd: &CustomResourceDefinition, page_size: u32) -> Collected {
    let versions: Vec<VersionFlags> = crd
        .spec
        .versions
        .iter()
        .map(|v| VersionFlags {
            name: v.name.clone(),
            served: v.served,
            storage: v.storage,
            deprecated: v.deprecated.unwrap_or(false),
        })
        .collect();
    let mut collected = Collected {
        name: crd.metadata.name.clone().unwrap_or_default(),
        group: crd.spec.group.clone(),
        stored_versions: crd
            .status
            .as_ref()
            .and_then(|s| s.stored_versions.clone())
            .unwrap_or_default(),
        versions,
        ..Collected::default()
    };
    let settings = ListSettings {
        page_size,
        ..ListSettings::default()
    };
    match read_writes(client, crd, &settings, None).await {
        Ok(writes) => collected.writes = writes,
        Err(error) => collected.list_error = Some(error),
    }
    collected
}

/// The field managers' writes through each version of the CRD's group, from its objects'
/// managedFields: one paged metadata-only listing (`migrate::Lister`: retried, expired
/// continue tokens followed) through the storage version (or another served one), folded
/// a page at a time. `progress` counts the objects read so far.
pub async fn read_writes(
    client: &Client,
    crd: &CustomResourceDefinition,
    settings: &ListSettings,
    progress: Option<&AtomicU64>,
) -> Result<Writes, String> {
    let collection = Collection::of_crd(crd)?;
    let settings = ListSettings {
        with_managed_fields: true,
        ..settings.clone()
    };
    let group = crd.spec.group.as_str();
    let lister = Lister::new(client, collection, settings);
    let folded = lister
        .fold(Writes::default, |writes, page| {
            for object in &page.objects {
                writes.add(&Entry::of_group(group, &object.managed_fields));
            }
            if let Some(progress) = progress {
                progress.store(writes.objects, Ordering::Relaxed);
            }
        })
        .await
        .map_err(|error| error.to_string())?;
    Ok(folded.state)
}
