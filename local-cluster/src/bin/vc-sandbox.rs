//! `vc-sandbox`: virtualcluster-rs on one machine, for trying it out.
//!
//! Starts a real super cluster on loopback (etcd, kube-apiserver, kube-controller-manager from the
//! harness's binaries) with real nodes (kubelet, containerd, kube-proxy) when their parts are on the machine
//! and simulated ones otherwise, installs the CRDs, runs vc-manager, the syncer and vn-agent, creates the
//! tenants, adopted and native, and prints the kubeconfig of each. Ctrl-C tears everything down.
//!
//! ```sh
//! cargo run --release -p local-cluster --bin vc-sandbox -- [--tenants N | --tenant NAME ...] [--native NAME ...]
//!     [--nodes N] [--simulated-nodes] [--download] [--dir PATH]
//! ```

use std::{path::PathBuf, process::ExitCode, time::Instant};

use clap::Parser;
use local_cluster::{
    download::{DownloadOptions, Progress},
    realnodes,
    sandbox::{NEEDS, NodeKind, Sandbox, SandboxOptions},
};

/// virtualcluster-rs on one machine: a super cluster, the three components and tenants on loopback.
#[derive(Debug, Parser)]
#[command(name = "vc-sandbox", version)]
struct Args {
    /// How many adopted tenants to create (named tenant-0, tenant-1, ...), unless --tenant names them.
    #[arg(long, default_value_t = 1)]
    tenants: usize,
    /// An adopted tenant to create, by name (repeatable; overrides --tenants).
    #[arg(long = "tenant", value_name = "NAME")]
    tenant_names: Vec<String>,
    /// A native tenant to create, by name (repeatable): vc-manager provisions its etcd, apiserver and
    /// controller-manager as pods on the nodes (real nodes only).
    #[arg(long = "native", value_name = "NAME")]
    native: Vec<String>,
    /// Super nodes.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Simulated nodes even when real ones could run (pods are marked Running; nothing runs).
    #[arg(long)]
    simulated_nodes: bool,
    /// Which super nodes tenants see (the syncer's --vnode-mode, the chart's syncer.vnodeMode, same default):
    /// `pods` (only where their pods run: a tenant learns nothing of other nodes), `usable` (every node they
    /// may use, from the start, schedulable: what DaemonSets and conformance tests expect, at the cost of
    /// showing every tenant those nodes' names, addresses and capacity) or `selected:key=value[,...]`.
    #[arg(long, default_value = "pods")]
    vnode_mode: syncer::config::VNodeMode,
    /// The Pod Security level enforced on tenants' super namespaces (the syncer's
    /// --pod-security-enforce; default its own, baseline). `privileged` lets tenants' pods do what a
    /// cluster without Pod Security admission allows, as far as their VirtualCluster's podPolicy does.
    #[arg(long, value_enum)]
    pod_security_enforce: Option<local_cluster::sandbox::PodSecurityLevel>,
    /// Download the Kubernetes binaries that are missing, for the pinned release, from the official release
    /// site into a cache folder, each checked against its published SHA-256 checksum.
    #[arg(long)]
    download: bool,
    /// Write the kubeconfigs into this folder (kept after exit) instead of a temporary one.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Serve the images the upstream conformance suite pulls, as this `e2e.test` lists them (real nodes
    /// only; needs --agnhost): see e2e/conformance/README.md.
    #[arg(long, value_name = "E2E_TEST", requires = "agnhost")]
    conformance_images: Option<PathBuf>,
    /// agnhost built from the same Kubernetes source tree as the `e2e.test` of --conformance-images.
    #[arg(long, value_name = "PATH", requires = "conformance_images")]
    agnhost: Option<PathBuf>,
    /// Log format of the components (their level comes from RUST_LOG, default error).
    #[arg(long, value_enum, default_value_t = vc_runtime::logging::LogFormat::Text)]
    log_format: vc_runtime::logging::LogFormat,
}

/// Fetches the missing Kubernetes binaries into the download cache, which the harness searches last.
async fn download() -> Result<(), String> {
    let options = DownloadOptions::pinned().map_err(|e| local_cluster::error_chain(&e))?;
    eprintln!(
        "vc-sandbox: fetching missing Kubernetes {} binaries into {}",
        options.version,
        options.cache_dir.display()
    );
    let found = |name: &str| {
        let binary = match name {
            "kube-apiserver" => local_cluster::Binary::KubeApiserver,
            "kube-controller-manager" => local_cluster::Binary::KubeControllerManager,
            "kube-scheduler" => local_cluster::Binary::KubeScheduler,
            "kubectl" => local_cluster::Binary::Kubectl,
            "kubelet" => local_cluster::Binary::Kubelet,
            "kube-proxy" => local_cluster::Binary::KubeProxy,
            _ => return false,
        };
        local_cluster::locate(binary).is_ok()
    };
    local_cluster::download::download_missing(&options, found, |progress| match progress {
        Progress::Downloading { binary, url } => eprintln!("vc-sandbox: downloading {binary} from {url}"),
        Progress::Done(outcome) => eprintln!("vc-sandbox: {outcome}"),
    })
    .await
    .map(|_| ())
    .map_err(|e| local_cluster::error_chain(&e))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The components' lines would bury what the sandbox prints, and starting and handing over tenant
    // apiservers makes expected connection errors; VirtualCluster conditions tell what matters.
    vc_runtime::logging::init_with_default(args.log_format, "error,kube_client=off");

    if args.download
        && let Err(error) = download().await
    {
        eprintln!("vc-sandbox: download failed: {error}");
        return ExitCode::FAILURE;
    }

    let missing: Vec<String> = NEEDS
        .iter()
        .filter_map(|binary| local_cluster::locate(*binary).err())
        .map(|error| error.to_string())
        .collect();
    if !missing.is_empty() {
        for line in &missing {
            eprintln!("vc-sandbox: {line}");
        }
        eprintln!(
            "vc-sandbox: put the Kubernetes server binaries in $KUBEBUILDER_ASSETS or /usr/local/kubebuilder/bin \
             (etcd also comes from Debian's etcd-server package), or run with --download; see the README"
        );
        return ExitCode::FAILURE;
    }

    let tenants = if args.tenant_names.is_empty() {
        (0..args.tenants).map(|i| format!("tenant-{i}")).collect()
    } else {
        args.tenant_names.clone()
    };
    let node_kind = if args.simulated_nodes {
        NodeKind::Simulated
    } else {
        let missing = realnodes::missing_parts();
        if missing.is_empty() {
            NodeKind::Real
        } else {
            eprintln!(
                "vc-sandbox: simulated nodes (pods are marked Running, nothing runs): real nodes need {}",
                missing.join(", ")
            );
            NodeKind::Simulated
        }
    };
    if node_kind == NodeKind::Simulated && args.conformance_images.is_some() {
        eprintln!("vc-sandbox: --conformance-images needs real nodes (the suite runs containers)");
        return ExitCode::FAILURE;
    }
    if node_kind == NodeKind::Simulated && !args.native.is_empty() {
        eprintln!(
            "vc-sandbox: native tenants need real nodes (their control planes run as pods); \
             install what is missing above or drop --native"
        );
        return ExitCode::FAILURE;
    }
    let started = Instant::now();
    eprintln!(
        "vc-sandbox: starting a super cluster with {} {} nodes, {} adopted and {} native tenants...",
        args.nodes,
        if node_kind == NodeKind::Real {
            "real"
        } else {
            "simulated"
        },
        tenants.len(),
        args.native.len()
    );
    let sandbox = match Sandbox::start(SandboxOptions {
        tenants,
        native_tenants: args.native.clone(),
        nodes: args.nodes,
        node_kind,
        dir: args.dir.clone(),
        vnode_mode: args.vnode_mode.clone(),
        pod_security_enforce: args.pod_security_enforce,
        ..SandboxOptions::default()
    })
    .await
    {
        Ok(sandbox) => sandbox,
        Err(error) => {
            eprintln!("vc-sandbox: {}", local_cluster::error_chain(&error));
            return ExitCode::FAILURE;
        }
    };
    if let (Some(e2e_test), Some(agnhost)) = (args.conformance_images.clone(), args.agnhost.clone()) {
        let served = tokio::task::spawn_blocking(move || {
            local_cluster::conformance::serve_images(&e2e_test, &agnhost)
        })
        .await;
        match served {
            Ok(Ok(report)) => {
                for (reference, stand) in &report.served {
                    eprintln!("vc-sandbox: serving {reference} ({})", stand.describe());
                }
                for reference in &report.missing {
                    eprintln!("vc-sandbox: not serving {reference} (nothing on this machine makes it)");
                }
            }
            Ok(Err(error)) => {
                eprintln!("vc-sandbox: {}", local_cluster::error_chain(&error));
                sandbox.shutdown().await;
                return ExitCode::FAILURE;
            }
            Err(error) => {
                eprintln!("vc-sandbox: serving the conformance images: {error}");
                sandbox.shutdown().await;
                return ExitCode::FAILURE;
            }
        }
    }
    print_welcome(&sandbox, started);

    vc_runtime::shutdown::signal().await;
    eprintln!("vc-sandbox: stopping...");
    sandbox.shutdown().await;
    eprintln!("vc-sandbox: stopped; nothing left running");
    ExitCode::SUCCESS
}

fn print_welcome(sandbox: &Sandbox, started: Instant) {
    let super_kubeconfig = sandbox.super_kubeconfig().display().to_string();
    println!(
        "\nvirtualcluster-rs sandbox is up ({:.1} s)\n",
        started.elapsed().as_secs_f64()
    );
    println!("  super cluster (platform team):  {super_kubeconfig}");
    for (name, path) in sandbox.tenant_kubeconfigs() {
        println!("  tenant {name:<24} {}", path.display());
    }
    println!(
        "  vn-agent: https://{}   vc-manager metrics: http://{}/metrics",
        sandbox.vn_agent_address(),
        sandbox.vc_manager_admin()
    );
    if let Some((name, path)) = sandbox.tenant_kubeconfigs().iter().next() {
        let path = path.display();
        println!("\nAs tenant {name}:");
        println!("  export KUBECONFIG={path}");
        if sandbox.has_real_nodes() {
            println!("  kubectl run web --image=busybox -- sh -c 'echo hello; exec sleep 3600'");
            println!("  kubectl get pods -o wide     # Running on a vNode named after a real super node");
            println!("  kubectl logs web             # through vn-agent to the real kubelet");
            println!("  kubectl exec -it web -- sh   # a shell in the container");
        } else {
            println!("  kubectl run web --image=nginx");
            println!("  kubectl get pods -o wide     # Running on a vNode named after a super node");
            println!("  kubectl get nodes            # the vNode");
            println!("  kubectl logs web             # through vn-agent to the (simulated) kubelet");
        }
    }
    println!("\nAs the platform team:");
    println!("  export KUBECONFIG={super_kubeconfig}");
    println!("  kubectl get virtualclusters -A");
    println!(
        "  kubectl vc list -A           # with kubectl-vc on PATH (cargo build --release -p kubectl-vc)"
    );
    if sandbox.has_real_nodes() {
        println!(
            "  # a native tenant from the sandbox's ClusterVersion ({}; its images are built from your binaries):",
            local_cluster::sandbox::CLUSTER_VERSION
        );
        println!(
            "  kubectl apply -f - <<< '{{\"apiVersion\":\"tenancy.x-k8s.io/v1alpha1\",\"kind\":\"VirtualCluster\",\"metadata\":{{\"name\":\"mine\"}},\"spec\":{{\"clusterVersionName\":\"{}\"}}}}'",
            local_cluster::sandbox::CLUSTER_VERSION
        );
    } else {
        println!("  kubectl vc create -f examples/virtualcluster-native.yaml --wait");
    }
    println!(
        "\nFiles are in {}. Ctrl-C stops everything{}.",
        sandbox.dir().display(),
        if sandbox.dir().starts_with(std::env::temp_dir()) {
            " and removes them"
        } else {
            ""
        }
    );
}
