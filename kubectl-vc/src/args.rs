//! The command line of `kubectl vc`.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

use crate::duration;

/// `kubectl vc`: create, inspect and hand out access to VirtualClusters.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "kubectl-vc",
    bin_name = "kubectl vc",
    version,
    about = "Create VirtualClusters, watch them come up, and hand out tenant kubeconfigs",
    propagate_version = true
)]
pub struct Args {
    /// Connection and namespace flags, accepted before or after the command.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags of every command.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct Global {
    /// Path of the super cluster's kubeconfig (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of the VirtualCluster (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NS")]
    pub namespace: Option<String>,
}

/// The commands.
#[derive(Subcommand, Clone, Debug)]
pub enum Command {
    /// Apply the VirtualClusters (and ClusterVersions) of a file; with --wait, follow them until Running.
    Create(CreateArgs),
    /// Print a kubeconfig for a tenant: its admin, or a user with a freshly minted certificate (--user).
    Kubeconfig(KubeconfigArgs),
    /// List VirtualClusters with phase, version, age, tenant namespaces and pods.
    #[command(alias = "ls", alias = "get")]
    List(ListArgs),
    /// Show a VirtualCluster: spec, conditions, events, super namespaces and usage against quota.
    Describe(DescribeArgs),
    /// Show what VirtualClusters consume, as the syncer measured it: CPU, memory, pods, storage, load
    /// balancers, node ports, apiserver requests per second.
    Top(TopArgs),
    /// Delete a VirtualCluster; with --wait, until vc-manager has removed everything it made.
    Delete(DeleteArgs),
    /// Pause a VirtualCluster: its pods stop running in the super cluster and a provisioned control plane
    /// scales to zero; nothing in the tenant is deleted. With --wait, until it is paused.
    Pause(PauseArgs),
    /// Resume a paused VirtualCluster: its control plane and pods come back; with --wait, until Running.
    Resume(PauseArgs),
    /// Write a context for a tenant into a kubeconfig file, port-forwarding to its apiserver when it is not
    /// reachable from here (then staying in the foreground until Ctrl-C).
    Connect(ConnectArgs),
    /// Snapshots of native VirtualClusters (etcd keys, PKI, spec) in a folder, and restores from them.
    Snapshot(SnapshotArgs),
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish).
    Completion(CompletionArgs),
    /// Remove the platform without stranding VirtualClusters: `prepare` before `helm uninstall` (refuse,
    /// delete or orphan the VirtualClusters), `release` after it (vc-manager's finalizers). The chart runs
    /// both as hooks of helm uninstall.
    Uninstall(UninstallArgs),
}

impl Command {
    /// The `-o` of the command, if it has one and it was given.
    pub fn output(&self) -> Option<Format> {
        match self {
            Self::Create(a) => a.output.output,
            Self::Kubeconfig(a) => a.output.output,
            Self::List(a) => a.output.output,
            Self::Describe(a) => a.output.output,
            Self::Top(a) => a.output.output,
            Self::Delete(a) => a.output.output,
            Self::Pause(a) | Self::Resume(a) => a.output.output,
            Self::Connect(a) => a.output.output,
            Self::Snapshot(a) => match &a.command {
                SnapshotCommand::Create(c) => c.output.output,
                SnapshotCommand::Restore(r) => r.output.output,
                SnapshotCommand::List(l) => l.output.output,
                SnapshotCommand::Prune(p) => p.output.output,
                SnapshotCommand::Schedule(_) => None,
            },
            Self::Completion(_) | Self::Uninstall(_) => None,
        }
    }
}

/// `-o json|yaml`, the same on every command that prints something: the objects (or the result document)
/// the command produced, on stdout, instead of text; progress lines are then never shown.
#[derive(clap::Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutputFlag {
    /// Print the result as JSON or YAML instead of text (and no progress).
    #[arg(short = 'o', long = "output", value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
}

/// `create`.
#[derive(clap::Args, Clone, Debug)]
pub struct CreateArgs {
    /// YAML file with VirtualCluster and ClusterVersion documents (`-` reads stdin).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
    /// Wait until every VirtualCluster of the file is Running, printing each phase and condition change.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits (e.g. 90s, 10m, 1h).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub timeout: Duration,
    /// Output: the applied objects (after --wait, as last seen).
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `kubeconfig`.
#[derive(clap::Args, Clone, Debug)]
pub struct KubeconfigArgs {
    /// The VirtualCluster.
    pub name: String,
    /// The apiserver address to write (default: a load-balancer or node-port address of the tenant
    /// apiserver Service, else its in-cluster address).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The name to verify the apiserver certificate against, when the server address is not in it
    /// (default: decided from the certificate).
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Mint a client certificate for this user (common name), signed by the tenant CA, instead of printing
    /// the admin kubeconfig. Native VirtualClusters only.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// A group of the user (organization of the certificate); repeatable.
    #[arg(long = "group", value_name = "GROUP", requires = "user")]
    pub groups: Vec<String>,
    /// Lifetime of the user's certificate (e.g. 90m, 24h, 7d; default 24h).
    #[arg(long, value_name = "DURATION", requires = "user", value_parser = duration::parse)]
    pub ttl: Option<Duration>,
    /// Output: the kubeconfig, as YAML unless `-o json`.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `list`.
#[derive(clap::Args, Clone, Debug)]
pub struct ListArgs {
    /// List VirtualClusters of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output: the VirtualCluster objects (a `List`) instead of a table.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `describe`.
#[derive(clap::Args, Clone, Debug)]
pub struct DescribeArgs {
    /// The VirtualCluster.
    pub name: String,
    /// Output: one document with the VirtualCluster, its super namespaces, usage and events.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `top`.
#[derive(clap::Args, Clone, Debug)]
pub struct TopArgs {
    /// The VirtualCluster (default: every one of the namespace).
    pub name: Option<String>,
    /// VirtualClusters of every namespace.
    #[arg(short = 'A', long, conflicts_with = "name")]
    pub all_namespaces: bool,
    /// Output: each VirtualCluster's namespace, name and `status.usage`.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `delete`.
#[derive(clap::Args, Clone, Debug)]
pub struct DeleteArgs {
    /// The VirtualCluster.
    pub name: String,
    /// Wait until it is gone (vc-manager's finalizer has deleted its namespaces).
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub timeout: Duration,
    /// Succeed when the VirtualCluster does not exist.
    #[arg(long)]
    pub ignore_not_found: bool,
    /// Output: the object as the delete returned it (a `Status` when it was removed at once).
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `pause` and `resume`.
#[derive(clap::Args, Clone, Debug)]
pub struct PauseArgs {
    /// The VirtualCluster.
    pub name: String,
    /// Wait until it is paused (its control plane at zero and the syncer done), or Running again.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub timeout: Duration,
    /// Output: the VirtualCluster as patched (after --wait, as last seen).
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `connect`.
#[derive(clap::Args, Clone, Debug)]
pub struct ConnectArgs {
    /// The VirtualCluster.
    pub name: String,
    /// Name of the context to write (default `<namespace>-<name>`); its cluster gets the same name, its
    /// user `<context>-admin`.
    #[arg(long, value_name = "NAME")]
    pub context_name: Option<String>,
    /// The kubeconfig file to write the context into (default: --kubeconfig, else the first file of
    /// $KUBECONFIG, else ~/.kube/config).
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub write_kubeconfig: Option<PathBuf>,
    /// Also make the new context the current context.
    #[arg(long)]
    pub switch: bool,
    /// When to port-forward to the tenant apiserver pod: auto (when its address does not answer from
    /// here), always, never.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = PortForward::Auto)]
    pub port_forward: PortForward,
    /// Local port of the port-forward (default: the port this context had, if free, else any free port).
    #[arg(long, value_name = "PORT")]
    pub local_port: Option<u16>,
    /// Replace entries of the same names that were written for something else.
    #[arg(long)]
    pub overwrite: bool,
    /// Output: a document saying what was written (and where the port-forward listens).
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `--port-forward`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortForward {
    /// Only when the apiserver's address does not answer from here.
    Auto,
    /// Always (staying in the foreground until Ctrl-C).
    Always,
    /// Never (the context gets the apiserver's address even when it does not answer from here).
    Never,
}

/// `snapshot`.
#[derive(clap::Args, Clone, Debug)]
pub struct SnapshotArgs {
    /// What to do with snapshots.
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

/// `snapshot create`, `restore` and `list`.
#[derive(Subcommand, Clone, Debug)]
pub enum SnapshotCommand {
    /// Take a snapshot of a native VirtualCluster: every etcd key at one revision, its PKI Secrets, its
    /// VirtualCluster and ClusterVersion, and a manifest with checksums, in a new folder under --to.
    Create(SnapshotCreateArgs),
    /// Create a VirtualCluster from a snapshot folder, after checking every checksum: same objects,
    /// certificate authorities and service-account keys.
    Restore(SnapshotRestoreArgs),
    /// List the snapshots in a folder.
    #[command(alias = "ls")]
    List(SnapshotListArgs),
    /// Remove all but the newest --keep snapshots of each VirtualCluster from a folder.
    Prune(SnapshotPruneArgs),
    /// Run the platform's snapshot scheduler (the chart's `snapshots` Deployment): snapshot every native
    /// VirtualCluster with `spec.snapshots` into --to on its schedule, and when `snapshot create --to
    /// <store>` asks, keep each tenant's newest `retain`, and report in its status and Events. Runs until
    /// stopped.
    Schedule(SnapshotScheduleArgs),
}

/// `snapshot schedule`.
#[derive(clap::Args, Clone, Debug)]
pub struct SnapshotScheduleArgs {
    /// The store's folder (in the chart, the mounted claim); snapshots go under `<namespace>/`.
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub to: PathBuf,
    /// What status and `snapshot create --to` call this store, e.g. `pvc/vc-snapshots`.
    #[arg(long, value_name = "NAME")]
    pub store_name: String,
    /// The shortest interval between two scheduled snapshots of a tenant, whatever its spec asks.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = duration::parse)]
    pub min_interval: Duration,
    /// The shortest time between a tenant's last snapshot and one `snapshot create --to` asks for.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = duration::parse)]
    pub min_request_gap: Duration,
    /// The most snapshots kept of a tenant, whatever its spec asks.
    #[arg(long, value_name = "N", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_retain: u32,
    /// How often the VirtualClusters are looked at.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = duration::parse)]
    pub poll: Duration,
    /// A snapshot that takes longer fails (and its half-written folder is removed), so one stuck tenant
    /// never stops the others.
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = duration::parse)]
    pub snapshot_timeout: Duration,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:8080; default: nothing served).
    /// /healthz fails when the scheduler has made no progress for longer than a snapshot may take.
    #[arg(long, value_name = "ADDRESS")]
    pub admin_address: Option<std::net::SocketAddr>,
    /// Hold a Lease in this namespace while scheduling (`vc-snapshots-<store>`), so that a second scheduler
    /// of the same store waits instead of writing too (default: no Lease).
    #[arg(long, value_name = "NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Seconds the Lease is held without renewal.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 15,
        requires = "lease_namespace"
    )]
    pub lease_duration_seconds: u64,
}

/// `snapshot create`.
#[derive(clap::Args, Clone, Debug)]
pub struct SnapshotCreateArgs {
    /// The VirtualCluster.
    pub name: String,
    /// The folder to write the snapshot into (as a new folder `<name>-<UTC time>`); created if missing.
    /// `pvc/<claim>`: the platform's snapshot scheduler serving that store takes it (write `./pvc/...` for
    /// a folder of that name).
    #[arg(long, value_name = "DIR|pvc/CLAIM", value_hint = clap::ValueHint::DirPath)]
    pub to: PathBuf,
    /// With `--to pvc/<claim>`: how long to wait for the scheduler's snapshot.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub timeout: Duration,
    /// Output: the snapshot's path, checksum and manifest.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `snapshot restore`.
#[derive(clap::Args, Clone, Debug)]
pub struct SnapshotRestoreArgs {
    /// The VirtualCluster to create (must not exist).
    pub name: String,
    /// The snapshot folder (as `snapshot create` printed it).
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub from: PathBuf,
    /// The checksum `snapshot create` printed (sha256:...): refuse a snapshot whose manifest differs.
    #[arg(long, value_name = "SHA256")]
    pub checksum: Option<String>,
    /// Wait until the restored VirtualCluster is Running.
    #[arg(long)]
    pub wait: bool,
    /// How long the restore waits for vc-manager (and --wait for Running).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration::parse)]
    pub timeout: Duration,
    /// Output: what was restored.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `snapshot list`.
#[derive(clap::Args, Clone, Debug)]
pub struct SnapshotListArgs {
    /// The folder holding snapshots.
    #[arg(value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub dir: PathBuf,
    /// Output: each snapshot's path, checksum and manifest.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `snapshot prune`.
#[derive(clap::Args, Clone, Debug)]
pub struct SnapshotPruneArgs {
    /// The folder holding snapshots.
    #[arg(value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub dir: PathBuf,
    /// How many snapshots of each VirtualCluster to keep (the newest by creation time; at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub keep: u32,
    /// Output: the snapshots removed.
    #[command(flatten)]
    pub output: OutputFlag,
}

/// `uninstall`.
#[derive(clap::Args, Clone, Debug)]
pub struct UninstallArgs {
    /// Which step.
    #[command(subcommand)]
    pub command: UninstallCommand,
}

/// `uninstall prepare` and `release`.
#[derive(Subcommand, Clone, Debug)]
pub enum UninstallCommand {
    /// Before removing the platform: refuse while VirtualClusters exist (naming them), delete them all and
    /// wait until they are gone, or leave them running unmanaged (--virtual-clusters).
    Prepare(UninstallPrepareArgs),
    /// After removing the platform's controllers: remove vc-manager's finalizers from every VirtualCluster
    /// and ClusterVersion, so that deleting them (or their CRDs) never hangs.
    Release(UninstallReleaseArgs),
}

/// What `uninstall prepare` does with VirtualClusters that exist.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VirtualClustersOnUninstall {
    /// Fail, naming them; nothing is removed.
    Refuse,
    /// Delete every one and wait until vc-manager and the syncer have removed what they made.
    Delete,
    /// Leave them; their control planes and pods keep running, unmanaged.
    Orphan,
}

/// `uninstall prepare`.
#[derive(clap::Args, Clone, Debug)]
pub struct UninstallPrepareArgs {
    /// What to do with the VirtualClusters that exist.
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = VirtualClustersOnUninstall::Refuse)]
    pub virtual_clusters: VirtualClustersOnUninstall,
    /// How long `delete` waits for them to go.
    #[arg(long, value_name = "DURATION", default_value = "4m", value_parser = duration::parse)]
    pub timeout: Duration,
}

/// `uninstall release`.
#[derive(clap::Args, Clone, Debug)]
pub struct UninstallReleaseArgs {
    /// Namespace of vc-manager's pods, whose end is waited for first (with --controllers-selector).
    #[arg(long, value_name = "NAMESPACE", requires = "controllers_selector")]
    pub controllers_namespace: Option<String>,
    /// Label selector of vc-manager's pods, e.g. app.kubernetes.io/instance=vc,app.kubernetes.io/component=vc-manager.
    #[arg(long, value_name = "SELECTOR", requires = "controllers_namespace")]
    pub controllers_selector: Option<String>,
    /// How long to wait for those pods to stop.
    #[arg(long, value_name = "DURATION", default_value = "4m", value_parser = duration::parse)]
    pub timeout: Duration,
}

/// `completion`.
#[derive(clap::Args, Clone, Debug)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Output formats of `-o`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// YAML.
    Yaml,
    /// JSON.
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("kubectl-vc").chain(line.split_whitespace()))
    }

    #[test]
    fn the_cli_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere() {
        let args = parse("list -n team --context prod -A").expect("parses");
        assert_eq!(args.global.namespace.as_deref(), Some("team"));
        assert_eq!(args.global.context.as_deref(), Some("prod"));
        assert!(matches!(
            args.command,
            Command::List(ListArgs {
                all_namespaces: true,
                output: OutputFlag { output: None }
            })
        ));
        let args = parse("--kubeconfig /k describe vc-1").expect("parses");
        assert_eq!(args.global.kubeconfig, Some(PathBuf::from("/k")));
    }

    #[test]
    fn create_and_delete_wait_ten_minutes_by_default() {
        let Command::Create(create) = parse("create -f vc.yaml --wait").expect("parses").command else {
            panic!("create");
        };
        assert!(create.wait);
        assert_eq!(create.timeout, Duration::from_secs(600));
        let Command::Delete(delete) = parse("delete vc-1 --wait --timeout 90s").expect("parses").command
        else {
            panic!("delete");
        };
        assert_eq!(delete.timeout, Duration::from_secs(90));
        assert!(parse("create -f x --timeout 10").is_err());
    }

    #[test]
    fn pause_and_resume_take_a_name_wait_and_output() {
        let Command::Pause(pause) = parse("pause vc-1 --wait -o yaml -n team")
            .expect("parses")
            .command
        else {
            panic!("pause");
        };
        assert_eq!(pause.name, "vc-1");
        assert!(pause.wait);
        assert_eq!(pause.output.output, Some(Format::Yaml));
        assert_eq!(pause.timeout, Duration::from_secs(600));
        let Command::Resume(resume) = parse("resume vc-1 --timeout 2m").expect("parses").command else {
            panic!("resume");
        };
        assert!(!resume.wait);
        assert_eq!(resume.timeout, Duration::from_secs(120));
        assert!(parse("pause").is_err());
    }

    #[test]
    fn snapshots_need_a_folder() {
        let Command::Snapshot(SnapshotArgs {
            command: SnapshotCommand::Create(create),
        }) = parse("snapshot create vc-1 --to /backups -o json")
            .expect("parses")
            .command
        else {
            panic!("snapshot create");
        };
        assert_eq!(create.to, PathBuf::from("/backups"));
        assert_eq!(create.output.output, Some(Format::Json));
        assert!(parse("snapshot create vc-1").is_err());
        let Command::Snapshot(SnapshotArgs {
            command: SnapshotCommand::Restore(restore),
        }) = parse("snapshot restore vc-2 --from /b/vc-1-x --checksum sha256:ab --wait")
            .expect("parses")
            .command
        else {
            panic!("snapshot restore");
        };
        assert_eq!(restore.checksum.as_deref(), Some("sha256:ab"));
        assert!(restore.wait);
        assert!(parse("snapshot restore vc-2").is_err());
        assert!(parse("snapshot ls /b").is_ok());
        assert!(parse("snapshot prune /b --keep 3").is_ok());
        assert!(parse("snapshot prune /b --keep 0").is_err());
        assert!(parse("snapshot prune /b").is_err());
    }

    #[test]
    fn user_flags_need_a_user() {
        let Command::Kubeconfig(kc) = parse("kubeconfig vc-1 --user alice --group dev --group ops --ttl 7d")
            .expect("parses")
            .command
        else {
            panic!("kubeconfig");
        };
        assert_eq!(kc.user.as_deref(), Some("alice"));
        assert_eq!(kc.groups, ["dev", "ops"]);
        assert_eq!(kc.ttl, Some(Duration::from_secs(7 * 86_400)));
        assert!(parse("kubeconfig vc-1 --group dev").is_err());
        assert!(parse("kubeconfig vc-1 --ttl 1h").is_err());
        assert!(parse("kubeconfig vc-1 -o xml").is_err());
    }
}
