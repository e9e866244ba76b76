//! A super cluster with tenant masters registered as adopted VirtualClusters, and simulated or real nodes:
//! the setting of the syncer's tests and benchmarks and of the sandbox.

use std::sync::Arc;

use crds::{KubeconfigSecretRef, VirtualCluster, VirtualClusterSpec};
use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams},
};

use crate::{
    ControlPlane, ControlPlaneOptions, Error, Etcd, NodeSimulator, NodeSimulatorOptions, RealNodeOptions,
    RealNodes, Result, install_crds, nodes::KubeletApi,
};

/// Namespace of the super cluster holding the VirtualClusters and their kubeconfig Secrets.
pub const VC_NAMESPACE: &str = "default";

/// How to build a [`Tenancy`].
#[derive(Clone, Debug)]
pub struct TenancyOptions {
    /// Tenant masters to start.
    pub tenants: usize,
    /// Simulated super nodes.
    pub nodes: usize,
    /// Run a controller-manager in each tenant (service accounts, namespace deletion, ReplicaSets...).
    pub tenant_controller_managers: bool,
    /// Run a controller-manager in the super cluster (garbage collection, endpoints...).
    pub super_controller_manager: bool,
    /// Controllers of the tenants' controller-managers (default: the harness's tenant set).
    pub tenant_controllers: Option<String>,
    /// Extra flags for every apiserver (super and tenants).
    pub apiserver_args: Vec<String>,
    /// Keep the super apiserver's audit log of writes ([`crate::ApiServer::audit_events`]).
    pub super_audit: bool,
    /// CA (PEM) the tenant apiservers verify kubelet serving certificates against: vn-agent's, when
    /// vNodes lead to a real vn-agent (default: each apiserver's own CA).
    pub tenant_kubelet_ca: Option<String>,
    /// CAs (PEM) whose client certificates the simulated kubelet accepts besides the super cluster's
    /// (vn-agent's client CA in the kubelet backend mode).
    pub kubelet_client_cas: Vec<String>,
    /// Real nodes (kubelet, containerd, kube-proxy) instead of simulated ones; the super cluster then runs
    /// a scheduler.
    pub real_nodes: bool,
    /// With real nodes: users allowed the kubelet API (vn-agent's client certificate's common name).
    pub kubelet_api_users: Vec<String>,
    /// With real nodes: enforce the super cluster's NetworkPolicies on them
    /// ([`RealNodeOptions::network_policies`]).
    pub network_policies: bool,
    /// Applies the workspace's CRDs to the super cluster. Off where a Helm release owns them (the chart
    /// templates its CRDs, and Helm will not adopt objects another writer created).
    pub install_crds: bool,
    /// Simulated nodes give pods with this label loopback addresses (see
    /// [`NodeSimulatorOptions::loopback_ip_label`]).
    pub loopback_ip_label: Option<String>,
    /// Simulated nodes: where the kubelet API listens and the nodes' InternalIP (see
    /// [`NodeSimulatorOptions::kubelet_address`]; default 127.0.0.1).
    pub kubelet_address: Option<std::net::IpAddr>,
    /// Tenant masters store into an etcd of their own rather than the super cluster's (as in
    /// production, where they run elsewhere).
    pub separate_tenant_etcd: bool,
    /// Simulated nodes renew their leases this often (default a kubelet's 10 s).
    pub node_heartbeat: Option<std::time::Duration>,
    /// More flags for the super cluster's kube-controller-manager (e.g. node-monitor periods).
    pub super_controller_manager_args: Vec<String>,
    /// Simulated nodes run on this runtime (e.g. a [`crate::cpus::PinnedRuntime`]'s) rather than the
    /// caller's, so that their CPU can be placed and counted apart. [`Tenancy::start`] must then run on a
    /// multi-threaded runtime.
    pub nodes_runtime: Option<tokio::runtime::Handle>,
}

impl Default for TenancyOptions {
    fn default() -> Self {
        Self {
            tenants: 2,
            nodes: 2,
            tenant_controller_managers: true,
            super_controller_manager: true,
            tenant_controllers: None,
            apiserver_args: Vec::new(),
            super_audit: false,
            tenant_kubelet_ca: None,
            kubelet_client_cas: Vec::new(),
            real_nodes: false,
            kubelet_api_users: Vec::new(),
            network_policies: false,
            install_crds: true,
            loopback_ip_label: None,
            kubelet_address: None,
            separate_tenant_etcd: false,
            nodes_runtime: None,
            node_heartbeat: None,
            super_controller_manager_args: Vec::new(),
        }
    }
}

/// The super cluster's nodes: simulated, or real.
#[derive(Debug)]
pub enum SuperNodes {
    /// kwok-style nodes with a simulated kubelet API.
    Simulated(NodeSimulator),
    /// Kubelets with containerd.
    Real(Box<RealNodes>),
}

impl SuperNodes {
    /// The nodes' names.
    pub fn names(&self) -> Vec<String> {
        match self {
            Self::Simulated(simulator) => simulator.nodes().to_vec(),
            Self::Real(real) => real.names(),
        }
    }

    /// Waits until every node is Ready.
    pub async fn wait_ready(&self, client: &Client) -> Result<()> {
        match self {
            Self::Simulated(simulator) => simulator.wait_ready(client).await,
            Self::Real(real) => real.wait_ready(client).await,
        }
    }

    /// The simulator, when the nodes are simulated.
    pub fn simulated(&self) -> Option<&NodeSimulator> {
        match self {
            Self::Simulated(simulator) => Some(simulator),
            Self::Real(_) => None,
        }
    }

    /// The simulated kubelet API, when the nodes are simulated.
    pub fn kubelet(&self) -> Option<&KubeletApi> {
        match self {
            Self::Simulated(simulator) => simulator.kubelet(),
            Self::Real(_) => None,
        }
    }

    /// The real nodes, when they are real.
    pub fn real(&self) -> Option<&RealNodes> {
        match self {
            Self::Simulated(_) => None,
            Self::Real(real) => Some(real),
        }
    }
}

/// One tenant master and its VirtualCluster.
pub struct TenantMaster {
    /// VirtualCluster name (also the tenant apiserver's name and etcd prefix).
    pub name: String,
    /// The tenant's control plane.
    pub control_plane: ControlPlane,
    /// The VirtualCluster as created.
    pub virtual_cluster: VirtualCluster,
    /// Its cluster key.
    pub cluster_key: String,
}

impl TenantMaster {
    /// A cluster-admin client of the tenant.
    pub fn client(&self) -> Client {
        self.control_plane.client()
    }

    /// The super namespace of a tenant namespace.
    pub fn super_namespace(&self, namespace: &str) -> String {
        crds::naming::super_namespace(&self.cluster_key, namespace)
    }
}

/// A super cluster, tenant masters sharing its etcd (or on one of their own), and simulated nodes.
pub struct Tenancy {
    /// Tenants, in creation order (fields drop in order: tenants, nodes, super cluster, etcds).
    pub tenants: Vec<TenantMaster>,
    /// The super nodes.
    pub nodes: SuperNodes,
    /// The super cluster.
    pub super_cluster: ControlPlane,
    /// The super cluster's etcd (the tenants' too, without [`TenancyOptions::separate_tenant_etcd`]).
    pub etcd: Arc<Etcd>,
    /// The tenants' etcd, with [`TenancyOptions::separate_tenant_etcd`].
    pub tenant_etcd: Option<Arc<Etcd>>,
    options: TenancyOptions,
}

impl Tenancy {
    /// Starts everything; tenants are named `tenant-0`, `tenant-1`, ...
    pub async fn start(options: TenancyOptions) -> Result<Self> {
        let etcd = Arc::new(Etcd::start().await?);
        let mut super_options = match options.super_controller_manager {
            true => ControlPlaneOptions::super_cluster(),
            false => ControlPlaneOptions::bare("super"),
        };
        super_options
            .apiserver
            .extra_args
            .extend(options.apiserver_args.iter().cloned());
        super_options
            .controller_manager_args
            .extend(options.super_controller_manager_args.iter().cloned());
        if options.real_nodes {
            super_options = super_options.with_real_nodes();
        }
        super_options.apiserver.audit = options.super_audit;
        let super_cluster = ControlPlane::start_on(etcd.clone(), super_options).await?;
        if options.install_crds {
            install_crds(&super_cluster.client()).await?;
        }
        let nodes = match options.real_nodes {
            true => SuperNodes::Real(Box::new(
                RealNodes::start(
                    &super_cluster,
                    RealNodeOptions {
                        node_count: options.nodes,
                        extra_client_cas: options.kubelet_client_cas.clone(),
                        kubelet_api_users: options.kubelet_api_users.clone(),
                        network_policies: options.network_policies,
                        ..Default::default()
                    },
                )
                .await?,
            )),
            false => {
                let simulated = NodeSimulatorOptions {
                    node_count: options.nodes,
                    extra_client_cas: options.kubelet_client_cas.clone(),
                    loopback_ip_label: options.loopback_ip_label.clone(),
                    kubelet_address: options.kubelet_address,
                    heartbeat_interval: options
                        .node_heartbeat
                        .unwrap_or_else(|| NodeSimulatorOptions::default().heartbeat_interval),
                    ..Default::default()
                };
                let simulator = match &options.nodes_runtime {
                    None => NodeSimulator::start(&super_cluster, simulated).await?,
                    // Entered there, the simulation's tasks (and its client's) are spawned on that runtime.
                    Some(runtime) => tokio::task::block_in_place(|| {
                        runtime.block_on(async {
                            let client = crate::client_from_kubeconfig_file(
                                super_cluster.apiserver().kubeconfig_path(),
                            )
                            .await?;
                            NodeSimulator::start_with_client(&super_cluster, client, simulated).await
                        })
                    })?,
                };
                SuperNodes::Simulated(simulator)
            }
        };
        let tenant_etcd = match options.separate_tenant_etcd {
            true => Some(Arc::new(Etcd::start().await?)),
            false => None,
        };
        let mut tenancy = Self {
            tenants: Vec::new(),
            nodes,
            super_cluster,
            etcd,
            tenant_etcd,
            options,
        };
        for i in 0..tenancy.options.tenants {
            tenancy
                .add_tenant(&format!("tenant-{i}"), VirtualClusterSpec::default())
                .await?;
        }
        Ok(tenancy)
    }

    /// The super cluster's admin client.
    pub fn super_client(&self) -> Client {
        self.super_cluster.client()
    }

    /// Starts another tenant master and registers it as an adopted VirtualCluster with `spec` (its
    /// `kubeconfigSecretRef` is filled in).
    pub async fn add_tenant(&mut self, name: &str, spec: VirtualClusterSpec) -> Result<&TenantMaster> {
        let control_plane = self.start_master(name).await?;
        let virtual_cluster = self
            .register(name, &control_plane.apiserver().admin_kubeconfig(), spec)
            .await?;
        self.push_tenant(name, control_plane, virtual_cluster)
    }

    /// Starts a tenant master called `name` (apiserver and, unless turned off, controller-manager) on the
    /// tenants' etcd; with real nodes it serves on the host's address towards them too, for a syncer that
    /// runs as a pod. It is not registered: see [`Self::register`] and [`Self::push_tenant`].
    pub async fn start_master(&self, name: &str) -> Result<ControlPlane> {
        let mut options = match self.options.tenant_controller_managers {
            true => {
                let mut options = ControlPlaneOptions::tenant(name);
                if let Some(controllers) = &self.options.tenant_controllers {
                    options.controller_manager = Some(controllers.clone());
                }
                options
            }
            false => {
                let mut bare = ControlPlaneOptions::bare(name);
                bare.apiserver.service_cidr = "10.32.0.0/16".into();
                bare
            }
        };
        options
            .apiserver
            .extra_args
            .extend(self.options.apiserver_args.iter().cloned());
        options.apiserver.kubelet_ca = self.options.tenant_kubelet_ca.clone();
        options.apiserver.reachable_from_nodes = self.options.real_nodes;
        let etcd = self.tenant_etcd.as_ref().unwrap_or(&self.etcd).clone();
        ControlPlane::start_on(etcd, options).await
    }

    /// Keeps a tenant master registered as `virtual_cluster` (created with a uid) among the tenants.
    pub fn push_tenant(
        &mut self,
        name: &str,
        control_plane: ControlPlane,
        virtual_cluster: VirtualCluster,
    ) -> Result<&TenantMaster> {
        let cluster_key =
            crds::naming::cluster_key_of(&virtual_cluster).ok_or_else(|| Error::Kubeconfig {
                context: format!("VirtualCluster {name} has no uid"),
                source: "created without uid".into(),
            })?;
        self.tenants.push(TenantMaster {
            name: name.to_owned(),
            control_plane,
            virtual_cluster,
            cluster_key,
        });
        Ok(self.tenants.last().expect("just pushed"))
    }

    /// Writes `kubeconfig` into Secret `<name>-kubeconfig` and applies VirtualCluster `name` adopting it.
    pub async fn register(
        &self,
        name: &str,
        kubeconfig: &str,
        spec: VirtualClusterSpec,
    ) -> Result<VirtualCluster> {
        let client = self.super_client();
        let secret_name = format!("{name}-kubeconfig");
        self.write_kubeconfig(&secret_name, kubeconfig).await?;
        let spec = VirtualClusterSpec {
            cluster_version_name: None,
            kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                name: secret_name,
                key: "value".into(),
            }),
            ..spec
        };
        let vc = VirtualCluster::new(name, spec);
        let api: Api<VirtualCluster> = Api::namespaced(client, VC_NAMESPACE);
        api.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&vc))
            .await
            .map_err(Error::kube(format!("applying VirtualCluster {name}")))
    }

    /// Replaces the kubeconfig in Secret `secret_name` (key `value`), labelled as meant for the
    /// VirtualCluster it is named after (`<name>-kubeconfig`; `tenancy.x-k8s.io/kubeconfig-for`).
    pub async fn write_kubeconfig(&self, secret_name: &str, kubeconfig: &str) -> Result<()> {
        let meant_for = secret_name.strip_suffix("-kubeconfig").unwrap_or(secret_name);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.to_owned()),
                labels: Some(
                    [(
                        crds::wellknown::LABEL_KUBECONFIG_FOR.to_owned(),
                        meant_for.to_owned(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            data: Some([("value".to_owned(), ByteString(kubeconfig.as_bytes().to_vec()))].into()),
            ..Default::default()
        };
        let api: Api<Secret> = Api::namespaced(self.super_client(), VC_NAMESPACE);
        api.patch(
            secret_name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(Error::kube(format!("writing Secret {secret_name}")))?;
        Ok(())
    }

    /// The tenant called `name`.
    pub fn tenant(&self, name: &str) -> &TenantMaster {
        self.tenants
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tenant {name}"))
    }

    /// The tenant called `name`, to stop or restart it.
    pub fn tenant_mut(&mut self, name: &str) -> &mut TenantMaster {
        self.tenants
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tenant {name}"))
    }

    /// Names of the VirtualClusters, for logs.
    pub fn names(&self) -> Vec<String> {
        self.tenants
            .iter()
            .map(|t| t.virtual_cluster.name_any())
            .collect()
    }
}
