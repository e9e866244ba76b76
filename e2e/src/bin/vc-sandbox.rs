//! `vc-sandbox`: virtualcluster-rs on one machine, for trying it out.
//!
//! Starts a real super cluster on loopback (etcd, kube-apiserver, kube-controller-manager from the e2e
//! harness's binaries) with simulated nodes, installs the CRDs, runs vc-manager, the syncer and vn-agent,
//! creates the tenants, and prints the kubeconfig of each. Ctrl-C tears everything down.
//!
//! ```sh
//! cargo run --release -p e2e --bin vc-sandbox -- [--tenants N | --tenant NAME ...] [--nodes N] [--dir PATH]
//! ```

use std::{path::PathBuf, process::ExitCode, time::Instant};

use clap::Parser;
use e2e::sandbox::{NEEDS, Sandbox, SandboxOptions};

/// virtualcluster-rs on one machine: a super cluster, the three components and tenants on loopback.
#[derive(Debug, Parser)]
#[command(name = "vc-sandbox", version)]
struct Args {
    /// How many tenants to create (named tenant-0, tenant-1, ...), unless --tenant names them.
    #[arg(long, default_value_t = 1)]
    tenants: usize,
    /// A tenant to create, by name (repeatable; overrides --tenants).
    #[arg(long = "tenant", value_name = "NAME")]
    tenant_names: Vec<String>,
    /// Simulated super nodes.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Write the kubeconfigs into this folder (kept after exit) instead of a temporary one.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Log format of the components (their level comes from RUST_LOG, default error).
    #[arg(long, value_enum, default_value_t = vc_runtime::logging::LogFormat::Text)]
    log_format: vc_runtime::logging::LogFormat,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The components' lines would bury what the sandbox prints, and starting and handing over tenant
    // apiservers makes expected connection errors; VirtualCluster conditions tell what matters.
    vc_runtime::logging::init_with_default(args.log_format, "error,kube_client=off");

    let missing: Vec<String> = NEEDS
        .iter()
        .filter_map(|binary| e2e::locate(*binary).err())
        .map(|error| error.to_string())
        .collect();
    if !missing.is_empty() {
        for line in &missing {
            eprintln!("vc-sandbox: {line}");
        }
        eprintln!(
            "vc-sandbox: put the Kubernetes server binaries in $KUBEBUILDER_ASSETS or /usr/local/kubebuilder/bin \
             (etcd also comes from Debian's etcd-server package); see the README"
        );
        return ExitCode::FAILURE;
    }

    let tenants = if args.tenant_names.is_empty() {
        (0..args.tenants).map(|i| format!("tenant-{i}")).collect()
    } else {
        args.tenant_names.clone()
    };
    let started = Instant::now();
    eprintln!(
        "vc-sandbox: starting a super cluster with {} simulated nodes and {} tenants...",
        args.nodes,
        tenants.len()
    );
    let sandbox = match Sandbox::start(SandboxOptions {
        tenants,
        nodes: args.nodes,
        dir: args.dir.clone(),
        ..SandboxOptions::default()
    })
    .await
    {
        Ok(sandbox) => sandbox,
        Err(error) => {
            eprintln!("vc-sandbox: {}", chain(&error));
            return ExitCode::FAILURE;
        }
    };
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
        println!("  kubectl run web --image=nginx");
        println!("  kubectl get pods -o wide     # Running on a vNode named after a super node");
        println!("  kubectl get nodes            # the vNode");
        println!("  kubectl logs web             # through vn-agent to the (simulated) kubelet");
    }
    println!("\nAs the platform team:");
    println!("  export KUBECONFIG={super_kubeconfig}");
    println!("  kubectl get virtualclusters -A");
    println!("  kubectl vc list -A           # with kubectl-vc on PATH (cargo build --release)");
    println!("  kubectl vc create -f examples/virtualcluster-native.yaml --wait");
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

/// An error and its causes on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
