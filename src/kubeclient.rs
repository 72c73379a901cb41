//! Building a kube `Client` from the usual sources: `--kubeconfig`, `--context`,
//! `KUBECONFIG`, `~/.kube/config` or the in-cluster service account.

use std::path::PathBuf;

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Where to find the cluster.
#[derive(Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use (default: the current context).
    #[arg(long, value_name = "NAME", env = "CRD_LIFECYCLE_CONTEXT", global = true)]
    pub context: Option<String>,
}

/// Failures building a client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot load the kubeconfig: {0}")]
    Config(#[from] kube::config::KubeconfigError),
    #[error("no cluster configuration found (kubeconfig or in-cluster): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("cannot create the client: {0}")]
    Client(#[from] kube::Error),
}

/// A client for the cluster the arguments name.
pub async fn client(args: &ClusterArgs) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        (None, Some(_)) => Config::from_kubeconfig(&options).await?,
        (None, None) => Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}
