//! virtualcluster-rs on one machine: the harness of the e2e suite and benchmarks (`e2e/`), and of the
//! [`sandbox`] (`vc-sandbox`).
//!
//! It runs **real** control planes as local processes on loopback, the way envtest and
//! `kwokctl --runtime binary` do:
//!
//! - [`Etcd`]: one etcd process; several apiservers can share it through distinct `--etcd-prefix`es.
//! - [`ControlPlane`]: a kube-apiserver with PKI issued by vc-manager's [`pki`] module, RBAC on, service-account signing keys,
//!   and optionally kube-controller-manager and kube-scheduler; it hands back a kube [`kube::Client`] and an
//!   admin kubeconfig file.
//! - [`NodeSimulator`]: Ready nodes with heartbeats, pod binding and status (as kwok does), and a kubelet
//!   HTTPS API on loopback.
//!
//! Binaries are found in `$KUBEBUILDER_ASSETS`, else `/usr/local/kubebuilder/bin`, else `PATH`, else the
//! caches [`download`] fills. A test calls [`require`] first; when a binary is missing it prints one line
//! naming it and the test returns (or fails, with `E2E_REQUIRE_BINARIES=1`).
//!
//! Every process is killed and every temporary folder removed when its owner is dropped, also when a test
//! panics; processes also die with the test process (parent-death signal), and folders left by a killed
//! test run are swept at the next start.

mod apiserver;
pub mod apply;
pub mod bench;
mod binaries;
mod binary;
mod cluster;
mod components;
pub mod conformance;
pub mod cpus;
pub mod dns;
pub mod download;
mod error;
mod etcd;
pub mod http_client;
mod kubeconfig;
pub mod nodes;
pub mod pki;
pub mod platform;
mod ports;
mod process;
pub mod realnodes;
pub mod sandbox;
pub mod tenancy;
pub mod tenant_extensions;
pub mod turns;
pub mod wait;
mod workdir;

pub use apiserver::{ApiServer, ApiServerOptions, AuditEvent};
pub use binaries::{REQUIRE_ENV, cni_plugin_dir, find_helm, locate, real_node_apt_line, require, skip};
pub use binary::Binary;
pub use cluster::{ControlPlane, ControlPlaneOptions};
pub use components::{ControllerManager, Scheduler};
pub use error::{Error, Result, error_chain};
pub use etcd::Etcd;
pub use kubeconfig::{
    client_from_kubeconfig_file, kubeconfig_yaml, multiplexed_client_from_kubeconfig_file,
    token_kubeconfig_yaml,
};
pub use nodes::{NodeSimulator, NodeSimulatorOptions};
pub use ports::free_port;
pub use process::ManagedProcess;
pub use realnodes::{RealNodeOptions, RealNodes};
pub use workdir::{WorkDir, remove_own_folders};

/// Installs this project's CRDs into a cluster and waits until they are served.
pub async fn install_crds(client: &kube::Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};

    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds::generate::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&crd))
            .await
            .map_err(|source| Error::Kube {
                context: format!("applying CRD {name}"),
                source,
            })?;
        wait::until(
            std::time::Duration::from_secs(30),
            &format!("CRD {name} established"),
            || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let crd = api.get(&name).await.ok()?;
                    let established = crd
                        .status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True");
                    established.then_some(())
                }
            },
        )
        .await?;
    }
    Ok(())
}
