//! Command-line interface (the binary's): `commands/` turns these into the library's
//! settings.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use jiff::Timestamp;

use crd_lifecycle::kubeclient::ClusterArgs;

/// Runs the life of CustomResourceDefinition versions as code.
#[derive(Parser, Debug)]
#[command(name = "crd-lifecycle", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log format of `run` and `migrate` (logs go to stderr; filter with RUST_LOG).
    #[arg(long, value_enum, env = "CRD_LIFECYCLE_LOG_FORMAT", default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Render a CRD as a VersionPolicy says it must be at an instant, offline.
    Plan(PlanArgs),
    /// Print the VersionPolicy CustomResourceDefinition (YAML).
    Crd,
    /// Run the controller against the current cluster.
    Run(RunArgs),
    /// Serve the declarative conversion webhook alone.
    Webhook(StandaloneWebhookArgs),
    /// Convert objects (YAML or JSON, several documents) with a policy's spec.conversion,
    /// offline.
    Convert(ConvertArgs),
    /// Audit the cluster's CRDs (or the named ones): versions, storedVersions, objects, the
    /// governing policy, and problems (exit 0 when none, 1 when any, 2 on error).
    Audit(AuditArgs),
    /// Print a VersionPolicy for a live CRD that changes nothing when applied.
    Adopt(AdoptArgs),
    /// Test a policy's conversion against its CRD's schemas: objects generated from each
    /// version's schema (and given examples) convert to every other version and back
    /// exactly, and fit every version's schema (exit 0 when all pass, 1 printing the
    /// smallest failing object, 2 on bad input).
    Test(TestArgs),
    /// Rewrite every object of a CRD into its storage version, then trim
    /// status.storedVersions (exit 0 only when trimmed, 1 on failures, 2 on bad arguments).
    Migrate(MigrateArgs),
    /// Repair objects whose metadata.managedFields still name a version the CRD no longer
    /// has (every server-side apply of them fails with 500 "request to convert CR to an
    /// invalid group/version"): rewrite those entries into the storage version (exit 0 when
    /// every object is clean, 1 on failures, 2 on bad arguments).
    RepairManagedFields(RepairArgs),
    /// Check incoming CRDs (a rendered chart, a release's manifests) against live clusters
    /// before an upgrade: what the apiserver would refuse, what would break clients or data,
    /// and what changes (exit 0 clean, 1 rejected or breaking, 2 could not check). `--fix`
    /// does exactly what unblocks them: migrates objects, trims storedVersions, cleans
    /// managedFields, moves a storage version back for a rollback.
    Check(CheckArgs),
    /// Print the ClusterRole the operator needs on a governed CRD's objects, labelled
    /// crdlifecycle.io/aggregate-to-migrator so that the operator's migrator role
    /// aggregates it (`| kubectl apply -f -`).
    Rbac(RbacArgs),
    /// Write the book's generated pages (docs/src): the command-line, VersionPolicy,
    /// metrics, conditions and Events references and the real-cluster benchmark page; and
    /// the manual pages (docs/man).
    #[command(hide = true)]
    Docgen(DocgenArgs),
}

/// Arguments of the hidden `crd-lifecycle docgen`.
#[derive(Args, Debug, Clone)]
pub struct DocgenArgs {
    /// The book's source folder: pages are written under its reference/ and internals/.
    #[arg(long, value_name = "DIR", default_value = "docs/src")]
    pub out: std::path::PathBuf,

    /// The folder the manual pages are written to (`crd-lifecycle.1`, one per subcommand).
    #[arg(long, value_name = "DIR", default_value = "docs/man")]
    pub man: std::path::PathBuf,

    /// The saved output of `scripts/bench-real.sh --save` the benchmark page is rendered from.
    #[arg(long, value_name = "FILE", default_value = "docs/bench/real.txt")]
    pub bench_results: std::path::PathBuf,
}

/// Arguments of `crd-lifecycle audit`.
#[derive(Args, Debug, Clone)]
pub struct AuditArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Audit only this CRD (repeatable); default: every CRD.
    #[arg(long, value_name = "NAME")]
    pub crd: Vec<String>,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = AuditOutput::Table)]
    pub output: AuditOutput,

    /// Objects per list page.
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub page_size: u32,

    /// CRDs audited at once.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub concurrency: usize,
}

/// Output formats of `audit`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditOutput {
    Table,
    Json,
    Markdown,
}

/// Arguments of `crd-lifecycle check`.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// The incoming manifests: files, directories (their .yaml, .yml and .json files) or `-`
    /// for stdin (repeatable); documents that are not CRDs are skipped.
    #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
    pub files: Vec<String>,

    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Check against this kubeconfig context (repeatable); default: the current context.
    #[arg(long, value_name = "NAME", conflicts_with = "all_contexts")]
    pub context: Vec<String>,

    /// Check against every context of the kubeconfig: one section per cluster, then a
    /// summary table of clusters × CRDs.
    #[arg(long)]
    pub all_contexts: bool,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = AuditOutput::Table)]
    pub output: AuditOutput,

    /// Do what unblocks the incoming CRDs, then check again: migrate objects into the
    /// storage version and trim storedVersions, remove managedFields entries naming versions
    /// they drop, move the storage version back for a rollback; also while writers go on
    /// (their writes are stored in the storage version). Refuses (exit 1) what it cannot do
    /// safely.
    #[arg(long)]
    pub fix: bool,

    /// A field manager that wrote through a version the incoming CRDs stop serving within
    /// this long is an active writer (breaking unless named by --replaced-manager; --fix
    /// migrates and trims regardless).
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_window)]
    pub writers_window: Duration,

    /// A field manager this release replaces, e.g. the old operator that writes its objects'
    /// status through the version the release drops until the upgrade (or rollback) replaces
    /// it: its recent writes are reported (ReplacedWriters), not breaking. Repeatable, or
    /// comma-separated.
    #[arg(
        long = "replaced-manager",
        value_name = "NAME",
        env = "CRD_LIFECYCLE_REPLACED_MANAGERS",
        value_delimiter = ',',
        value_parser = parse_manager
    )]
    pub replaced_managers: Vec<String>,

    /// Objects that fail the incoming schema named per CRD (all are counted).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub max_objects: usize,

    /// CRDs read at once.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub parallel_crds: u32,

    #[command(flatten)]
    pub pacing: PacingArgs,
}

/// Arguments of `crd-lifecycle adopt`.
#[derive(Args, Debug, Clone)]
pub struct AdoptArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// The live CRD, e.g. widgets.example.com.
    #[arg(value_name = "CRD_NAME")]
    pub crd: String,

    /// The policy's name (default: the CRD's plural).
    #[arg(long, value_name = "POLICY")]
    pub name: Option<String>,
}

/// Arguments of `crd-lifecycle test`.
#[derive(Args, Debug, Clone)]
pub struct TestArgs {
    /// The VersionPolicy whose spec.conversion to test (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub policy: String,

    /// The CustomResourceDefinition manifest with every version's schema.
    #[arg(long, value_name = "FILE")]
    pub crd: String,

    /// Objects generated from each version's schema.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub cases: usize,

    /// Seed of the generator: the same seed generates the same objects.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,

    /// A folder of example objects (YAML or JSON files) to test too.
    #[arg(long, value_name = "DIR")]
    pub objects: Option<String>,

    /// Write the conversions as a golden corpus (one `<version>.json` per version).
    #[arg(long, value_name = "DIR", conflicts_with = "golden")]
    pub record: Option<String>,

    /// Fail when the policy converts a recorded corpus differently.
    #[arg(long, value_name = "DIR")]
    pub golden: Option<String>,
}

/// Arguments of `crd-lifecycle rbac`.
#[derive(Args, Debug)]
pub struct RbacArgs {
    /// The governed CRD's name (`<plural>.<group>`), e.g. widgets.example.com.
    #[arg(
        value_name = "CRD",
        required_unless_present = "policy",
        conflicts_with = "policy"
    )]
    pub crd: Option<String>,

    /// A VersionPolicy file (`-` for stdin): its crdName, and its
    /// spec.migration.subresource (status adds patch on the status subresource).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<String>,

    /// Rewrites go through the status subresource (as `spec.migration.subresource: status`).
    #[arg(long, conflicts_with = "policy")]
    pub status_subresource: bool,
}

/// Arguments of `crd-lifecycle convert`.
#[derive(Args, Debug, Clone)]
pub struct ConvertArgs {
    /// The VersionPolicy whose spec.conversion to use (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub policy: String,

    /// The version to convert to, e.g. v1.
    #[arg(long, value_name = "VERSION")]
    pub to: String,

    /// Output format of the converted objects.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = ObjectFormat::Yaml)]
    pub output: ObjectFormat,

    /// The objects (YAML or JSON, several documents allowed); `-` or nothing for stdin.
    #[arg(value_name = "FILE", default_value = "-")]
    pub objects: String,

    /// The CRD (manifest): the conversion must cover its schemas, and every converted
    /// object must fit the target version's schema (nothing pruned or rejected).
    #[arg(long, value_name = "FILE")]
    pub crd: Option<String>,
}

/// Arguments of `crd-lifecycle migrate`.
#[derive(Args, Debug, Clone)]
pub struct MigrateArgs {
    /// The CustomResourceDefinition, e.g. widgets.example.com.
    #[arg(value_name = "CRD_NAME")]
    pub crd: String,

    #[command(flatten)]
    pub cluster: ClusterArgs,

    #[command(flatten)]
    pub pacing: PacingArgs,

    /// Conversion preflight: read every object through the storage version and report those
    /// that fail to convert; write nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Send the no-op rewrites to this subresource (`status`) instead of the main resource,
    /// for CRDs whose admission webhooks reject main-resource writes.
    #[arg(long, value_enum)]
    pub subresource: Option<RewriteThrough>,
}

/// Arguments of `crd-lifecycle repair-managed-fields`.
#[derive(Args, Debug, Clone)]
pub struct RepairArgs {
    /// The CustomResourceDefinition, e.g. widgets.example.com.
    #[arg(value_name = "CRD_NAME")]
    pub crd: String,

    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Count the objects that need a repair; write nothing.
    #[arg(long)]
    pub dry_run: bool,

    #[command(flatten)]
    pub pacing: PacingArgs,
}

/// How fast `migrate`, `repair-managed-fields` and `check` go, and how long they wait for an
/// answer.
#[derive(Args, Debug, Clone)]
pub struct PacingArgs {
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,

    /// Requests per second, lists included; 0 for no limit.
    #[arg(long, default_value_t = 0)]
    pub qps: u32,

    /// Objects per list request.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub page_size: u32,

    /// Longest wait for one request's answer, in seconds; a request that takes longer is
    /// retried.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub request_timeout: u64,
}

/// Where `migrate` sends its rewrites.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RewriteThrough {
    /// The `/status` subresource.
    Status,
}

/// Arguments of `crd-lifecycle run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Address of the /healthz, /readyz and /metrics endpoints.
    #[arg(
        long,
        value_name = "ADDR",
        env = "CRD_LIFECYCLE_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_addr: SocketAddr,

    /// Elect a leader with a Lease so that only one replica acts (turn off for a single
    /// local process).
    #[arg(long, env = "CRD_LIFECYCLE_LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "POD_NAMESPACE",
        default_value = "default"
    )]
    pub lease_namespace: String,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        value_name = "NAME",
        env = "CRD_LIFECYCLE_LEASE_NAME",
        default_value = "crd-lifecycle"
    )]
    pub lease_name: String,

    /// This replica's identity in the Lease and in Events (default: host name and process id).
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pub identity: Option<String>,

    /// Reconcile every policy at least this often, even with nothing scheduled (1s to 10m).
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_RESYNC", default_value = "10m", value_parser = parse_resync)]
    pub resync: Duration,

    /// Storage-version migrations (one per CRD) that may run at once.
    #[arg(long, value_name = "N", env = "CRD_LIFECYCLE_PARALLEL_MIGRATIONS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=32))]
    pub parallel_migrations: u32,

    /// With spec.migration.engine: StorageVersionMigration, how long a StorageVersionMigration
    /// may stay Pending (the kube-controller-manager's svm controller not picking it up)
    /// before the migration fails and the policy is Stalled (1m to 24h).
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_SVM_PENDING_DEADLINE", default_value = "10m",
          value_parser = parse_pending_deadline)]
    pub svm_pending_deadline: Duration,

    /// How often the apiserver's /metrics is sampled for traffic gates (1s to 10m).
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_TRAFFIC_SAMPLE_INTERVAL", default_value = "30s",
          value_parser = parse_resync)]
    pub traffic_sample_interval: Duration,

    #[command(flatten)]
    pub webhook: WebhookArgs,
}

/// The conversion webhook served by `run`.
#[derive(Args, Debug, Clone, Default)]
pub struct WebhookArgs {
    /// Serve the conversion webhook (HTTPS) on this port; policies with
    /// spec.conversion.webhook.enabled then get their CRD's spec.conversion pointed at it.
    #[arg(long, value_name = "PORT", env = "CRD_LIFECYCLE_WEBHOOK_PORT")]
    pub webhook_port: Option<u16>,

    /// How the apiserver reaches the webhook: a Service, NAMESPACE/NAME[:PORT] (port 443 by
    /// default).
    #[arg(
        long,
        value_name = "NAMESPACE/NAME[:PORT]",
        env = "CRD_LIFECYCLE_WEBHOOK_SERVICE",
        conflicts_with = "webhook_url"
    )]
    pub webhook_service: Option<String>,

    /// How the apiserver reaches the webhook: a base URL, e.g. `https://10.0.0.5:8443` (a
    /// controller running outside the cluster).
    #[arg(long, value_name = "URL", env = "CRD_LIFECYCLE_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Secret (in the lease namespace) holding the self-signed CA and serving certificate.
    #[arg(
        long,
        value_name = "NAME",
        env = "CRD_LIFECYCLE_WEBHOOK_SECRET",
        default_value = "crd-lifecycle-webhook-tls"
    )]
    pub webhook_secret: String,

    /// A serving certificate to use instead (PEM, e.g. from cert-manager); with
    /// --webhook-key-file and --webhook-ca-file. Checked for changes every 15 s.
    #[arg(long, value_name = "FILE", env = "CRD_LIFECYCLE_WEBHOOK_CERT_FILE", requires_all = ["webhook_key_file", "webhook_ca_file"])]
    pub webhook_cert_file: Option<String>,

    /// The serving certificate's key (PEM).
    #[arg(
        long,
        value_name = "FILE",
        env = "CRD_LIFECYCLE_WEBHOOK_KEY_FILE",
        requires = "webhook_cert_file"
    )]
    pub webhook_key_file: Option<String>,

    /// The CA that signed the serving certificate (PEM): the CRDs' caBundle.
    #[arg(
        long,
        value_name = "FILE",
        env = "CRD_LIFECYCLE_WEBHOOK_CA_FILE",
        requires = "webhook_cert_file"
    )]
    pub webhook_ca_file: Option<String>,

    /// Largest ConversionReview accepted (bytes); a larger one is answered with a Failed
    /// result that says so, which the apiserver shows to the client.
    #[arg(
        long,
        value_name = "BYTES",
        env = "CRD_LIFECYCLE_WEBHOOK_MAX_REVIEW_BYTES",
        default_value_t = crd_lifecycle::webhook::DEFAULT_MAX_REVIEW_BYTES
    )]
    pub webhook_max_review_bytes: usize,

    /// After SIGTERM, how long the webhook keeps serving while /readyz answers 503, so that
    /// the Service's endpoints drop the replica before it stops accepting (0s to 10m); its
    /// HTTP/1.1 answers say `Connection: close` meanwhile. Then it stops accepting, sends
    /// HTTP/2 GOAWAY, gives requests in flight up to 15 s and idle HTTP/1.1 connections
    /// --webhook-idle-grace: set the pod's terminationGracePeriodSeconds to at least the
    /// drain plus the idle grace plus 20 s.
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_WEBHOOK_DRAIN", default_value = "10s",
          value_parser = parse_drain)]
    pub webhook_drain: Duration,

    /// A webhook connection older than this is asked to close gracefully (HTTP/2 GOAWAY,
    /// HTTP/1.1 `Connection: close` on its next answer), so that the apiserver reconnects
    /// and its reviews spread over the replicas (1s to 24h; 0s: never).
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_WEBHOOK_MAX_CONNECTION_AGE",
          default_value = "5m", value_parser = parse_max_connection_age)]
    pub webhook_max_connection_age: Duration,

    /// An idle HTTP/1.1 webhook connection asked to close (past its age, or the webhook
    /// stopping) is left to its client for this long before the webhook closes it: longer
    /// than the client keeps idle connections (the apiserver: 90 s), so that it is never
    /// closed under a request just sent (0s to 10m).
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_WEBHOOK_IDLE_GRACE",
          default_value = "100s", value_parser = parse_drain)]
    pub webhook_idle_grace: Duration,
}

/// Arguments of `crd-lifecycle webhook`.
#[derive(Args, Debug, Clone)]
pub struct StandaloneWebhookArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Port of the HTTPS endpoint (`POST /convert/<policy>`).
    #[arg(
        long,
        value_name = "PORT",
        env = "CRD_LIFECYCLE_WEBHOOK_PORT",
        default_value_t = 8443
    )]
    pub port: u16,

    /// Serve these policies (repeatable) instead of the cluster's VersionPolicies.
    #[arg(long, value_name = "FILE")]
    pub policy: Vec<String>,

    /// The CRD (manifest) the policies convert: each policy's conversion must then cover
    /// every field that differs between its versions' schemas, or the webhook does not start.
    #[arg(long, value_name = "FILE", requires = "policy")]
    pub crd: Option<String>,

    /// Serving certificate (PEM); with --key-file. Without it a self-signed one is made
    /// for the --name values.
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub cert_file: Option<String>,

    /// The serving certificate's key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<String>,

    /// Names for the self-signed certificate (repeatable).
    #[arg(long, value_name = "DNS_OR_IP", default_values = ["localhost", "127.0.0.1"])]
    pub name: Vec<String>,

    /// Where to write the self-signed CA certificate (for the CRD's caBundle).
    #[arg(long, value_name = "FILE")]
    pub ca_out: Option<String>,

    /// Largest ConversionReview accepted (bytes); a larger one is answered with a Failed
    /// result that says so, which the apiserver shows to the client.
    #[arg(
        long,
        value_name = "BYTES",
        env = "CRD_LIFECYCLE_WEBHOOK_MAX_REVIEW_BYTES",
        default_value_t = crd_lifecycle::webhook::DEFAULT_MAX_REVIEW_BYTES
    )]
    pub max_review_bytes: usize,

    /// After SIGTERM, how long to keep serving while /readyz answers 503, so that the
    /// Service's endpoints drop the replica before it stops accepting (0s to 10m); HTTP/1.1
    /// answers say `Connection: close` meanwhile. Then it stops accepting, sends HTTP/2
    /// GOAWAY, gives requests in flight up to 15 s and idle HTTP/1.1 connections
    /// --idle-grace: set the pod's terminationGracePeriodSeconds to at least the drain plus
    /// the idle grace plus 20 s.
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_WEBHOOK_DRAIN", default_value = "10s",
          value_parser = parse_drain)]
    pub drain: Duration,

    /// A connection older than this is asked to close gracefully (HTTP/2 GOAWAY, HTTP/1.1
    /// `Connection: close` on its next answer), so that the apiserver reconnects and its
    /// reviews spread over the replicas (1s to 24h; 0s: never).
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_WEBHOOK_MAX_CONNECTION_AGE",
          default_value = "5m", value_parser = parse_max_connection_age)]
    pub max_connection_age: Duration,

    /// An idle HTTP/1.1 connection asked to close (past its age, or the webhook stopping)
    /// is left to its client for this long before the webhook closes it: longer than the
    /// client keeps idle connections (the apiserver: 90 s), so that it is never closed under
    /// a request just sent (0s to 10m).
    #[arg(long, value_name = "DURATION", env = "CRD_LIFECYCLE_WEBHOOK_IDLE_GRACE",
          default_value = "100s", value_parser = parse_drain)]
    pub idle_grace: Duration,
}

/// Arguments of `crd-lifecycle plan`.
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// The VersionPolicy manifest (YAML or JSON; `-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub policy: String,

    /// The CustomResourceDefinition manifest it governs (YAML or JSON; `-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub crd: String,

    /// The instant to render, RFC 3339 (e.g. 2026-03-15T00:00:00Z), or `now`.
    #[arg(long, value_name = "RFC3339|now", default_value = "now", value_parser = parse_instant)]
    pub at: Timestamp,

    /// Output: the CRD manifest as YAML or JSON, a readable timeline, or the lifecycle page
    /// (Markdown) for the CRD's users.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,

    /// The CRD's status.storedVersions to assume (comma-separated). By default every
    /// migration is assumed to complete the moment its storage switch happens.
    #[arg(long, value_name = "VERSIONS", value_delimiter = ',')]
    pub stored_versions: Option<Vec<String>>,
}

/// How objects are written.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFormat {
    Yaml,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Yaml,
    Json,
    Table,
    /// The lifecycle page for the CRD's users: versions and their dates, gates, field changes.
    Markdown,
}

/// Parses `now` or an RFC 3339 instant.
pub fn parse_instant(text: &str) -> Result<Timestamp, String> {
    if text == "now" {
        return Ok(Timestamp::now());
    }
    text.parse()
        .map_err(|e| format!("{text:?} is not an RFC 3339 instant such as 2026-03-15T00:00:00Z: {e}"))
}

/// Parses a writers window: a milestone-style duration (`24h`, `7d`), at least a second.
pub fn parse_window(text: &str) -> Result<Duration, String> {
    let duration = crd_lifecycle::lifecycle::parse_duration(text)?;
    match u64::try_from(duration.as_secs()) {
        Ok(seconds) if seconds >= 1 => Ok(Duration::from_secs(seconds)),
        _ => Err(format!("{text:?} must be at least 1s")),
    }
}

/// Parses a field manager's name: surrounding spaces dropped, not empty.
pub fn parse_manager(text: &str) -> Result<String, String> {
    let name = text.trim();
    if name.is_empty() {
        return Err("a field manager name must not be empty".to_owned());
    }
    Ok(name.to_owned())
}

/// Parses a resync period: a milestone-style duration between 1s and 10m.
pub fn parse_resync(text: &str) -> Result<Duration, String> {
    let duration = crd_lifecycle::lifecycle::parse_duration(text)?;
    let seconds = u64::try_from(duration.as_secs()).unwrap_or(0);
    if !(1..=600).contains(&seconds) {
        return Err(format!("{text:?} is outside 1s..10m"));
    }
    Ok(Duration::from_secs(seconds))
}

/// Parses the webhook's drain period: 0s to 10m.
pub fn parse_drain(text: &str) -> Result<Duration, String> {
    let seconds = whole_seconds(text)?;
    if seconds > 600 {
        return Err(format!("{text:?} is outside 0s..10m"));
    }
    Ok(Duration::from_secs(seconds))
}

/// Parses a maximum connection age: 1s to 24h, or 0s for none.
pub fn parse_max_connection_age(text: &str) -> Result<Duration, String> {
    let seconds = whole_seconds(text)?;
    if seconds > 86_400 {
        return Err(format!("{text:?} is over 24h (0s: connections never age out)"));
    }
    Ok(Duration::from_secs(seconds))
}

fn whole_seconds(text: &str) -> Result<u64, String> {
    let duration = crd_lifecycle::lifecycle::parse_duration(text)?;
    u64::try_from(duration.as_secs()).map_err(|_| format!("{text:?} is negative"))
}

/// Parses how long a StorageVersionMigration may stay Pending: a duration between 1m and 24h.
pub fn parse_pending_deadline(text: &str) -> Result<Duration, String> {
    let duration = crd_lifecycle::lifecycle::parse_duration(text)?;
    let seconds = u64::try_from(duration.as_secs()).unwrap_or(0);
    if !(60..=86_400).contains(&seconds) {
        return Err(format!("{text:?} is outside 1m..24h"));
    }
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn plan_parses_every_flag() {
        let cli = Cli::try_parse_from([
            "crd-lifecycle",
            "plan",
            "--policy",
            "p.yaml",
            "--crd",
            "-",
            "--at",
            "2026-03-15T00:00:00Z",
            "-o",
            "table",
            "--stored-versions",
            "v1alpha1,v1",
        ])
        .expect("valid arguments");
        let Command::Plan(args) = cli.command else {
            panic!("not plan")
        };
        assert_eq!(
            args.at,
            "2026-03-15T00:00:00Z".parse::<Timestamp>().expect("instant")
        );
        assert_eq!(args.output, OutputFormat::Table);
        assert_eq!(
            args.stored_versions,
            Some(vec!["v1alpha1".to_owned(), "v1".to_owned()])
        );
    }

    #[test]
    fn run_has_defaults_and_flags() {
        let cli = Cli::try_parse_from([
            "crd-lifecycle",
            "run",
            "--leader-election",
            "false",
            "--resync",
            "30s",
        ])
        .expect("valid arguments");
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert!(!args.leader_election);
        assert_eq!(args.resync, Duration::from_secs(30));
        assert_eq!(args.metrics_addr.port(), 8080);
        assert_eq!(args.svm_pending_deadline, Duration::from_secs(600));
        assert!(Cli::try_parse_from(["crd-lifecycle", "run", "--resync", "1h"]).is_err());
        assert!(Cli::try_parse_from(["crd-lifecycle", "run", "--svm-pending-deadline", "5s"]).is_err());
        assert_eq!(args.webhook.webhook_drain, Duration::from_secs(10));
        assert_eq!(args.webhook.webhook_max_connection_age, Duration::from_secs(300));
        assert_eq!(args.webhook.webhook_idle_grace, Duration::from_secs(100));
    }

    #[test]
    fn webhook_drain_and_connection_age_flags() {
        let cli = Cli::try_parse_from([
            "crd-lifecycle",
            "webhook",
            "--drain",
            "0s",
            "--max-connection-age",
            "0s",
            "--idle-grace",
            "30s",
        ])
        .expect("valid arguments");
        let Command::Webhook(args) = cli.command else {
            panic!("not webhook")
        };
        assert_eq!(args.drain, Duration::ZERO, "no drain");
        assert_eq!(
            args.max_connection_age,
            Duration::ZERO,
            "connections never age out"
        );
        assert_eq!(args.idle_grace, Duration::from_secs(30));
        for (flag, bad, message) in [
            ("--drain", "11m", "outside 0s..10m"),
            ("--idle-grace", "11m", "outside 0s..10m"),
            ("--max-connection-age", "2d", "over 24h"),
            ("--drain", "5", "invalid duration"),
        ] {
            let error = Cli::try_parse_from(["crd-lifecycle", "webhook", flag, bad]).expect_err("refused");
            assert!(error.to_string().contains(message), "{flag} {bad}: {error}");
        }
    }

    #[test]
    fn check_takes_replaced_managers_repeated_or_comma_separated() {
        let cli = Cli::try_parse_from([
            "crd-lifecycle",
            "check",
            "-f",
            "crds/",
            "--replaced-manager",
            "widgets-operator",
            "--replaced-manager",
            "old-sidecar, legacy",
        ])
        .expect("valid arguments");
        let Command::Check(args) = cli.command else {
            panic!("not check")
        };
        assert_eq!(
            args.replaced_managers,
            ["widgets-operator", "old-sidecar", "legacy"]
        );
        let error = Cli::try_parse_from(["crd-lifecycle", "check", "-f", "x", "--replaced-manager", "a,,b"])
            .expect_err("empty name");
        assert!(
            error.to_string().contains("--replaced-manager")
                && error.to_string().contains("must not be empty"),
            "{error}"
        );
    }

    #[test]
    fn rejects_a_bad_instant() {
        let error = Cli::try_parse_from([
            "crd-lifecycle",
            "plan",
            "--policy",
            "p",
            "--crd",
            "c",
            "--at",
            "tomorrow",
        ])
        .expect_err("bad instant");
        assert!(error.to_string().contains("not an RFC 3339 instant"), "{error}");
    }
}
