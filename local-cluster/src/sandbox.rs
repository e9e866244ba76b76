//! The local sandbox: the whole product on one machine.
//!
//! A real super cluster (etcd, kube-apiserver, kube-controller-manager) on loopback with simulated nodes and
//! kubelets, this project's CRDs, and vc-manager, the syncer and vn-agent running in this process. Tenants
//! are real tenant masters (kube-apiserver + kube-controller-manager each) adopted through VirtualClusters:
//! vc-manager checks them and issues their kubelet-client certificates, the syncer copies their pods into
//! the super cluster and the vNodes back, and vn-agent carries `kubectl logs/exec/port-forward` to the
//! simulated kubelet. Native VirtualClusters (`clusterVersionName`) are provisioned too; their control-plane
//! pods run on the simulated nodes, so they reach Running without serving anything.
//!
//! Everything stops and every folder is removed when the [`Sandbox`] is dropped.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use crds::{
    ClusterPhase, VirtualCluster, VirtualClusterSpec,
    wellknown::{CONDITION_TENANT_SYNCED, SECRET_ADOPTED_CLIENT_CA, SECRET_KUBELET_CLIENT},
};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::{Secret, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
};
use tokio::{sync::oneshot, task::JoinHandle};
use vc_runtime::admin::Health;

use crate::{
    Binary, Error, Result, WorkDir,
    apply::apply_object,
    client_from_kubeconfig_file, free_port, multiplexed_client_from_kubeconfig_file,
    pki::{CertificateAuthority, CertifiedKey, Usage},
    tenancy::{Tenancy, TenancyOptions, VC_NAMESPACE},
    token_kubeconfig_yaml, wait,
};

/// Binaries the sandbox runs.
pub const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];

/// How long a tenant may take from its first process to Running and synced.
pub(crate) const TENANT_PATIENCE: Duration = Duration::from_secs(120);

/// Which nodes the super cluster has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// Real nodes when every part they need is on the machine, else simulated ones.
    Auto,
    /// Real nodes (kubelet, containerd, kube-proxy): pods really run. Fails when a part is missing.
    Real,
    /// Simulated nodes: pods are marked Running and nothing runs.
    Simulated,
}

/// How to build a [`Sandbox`].
#[derive(Clone, Debug)]
pub struct SandboxOptions {
    /// Tenants to create at start (adopted VirtualClusters in namespace `default`).
    pub tenants: Vec<String>,
    /// Native tenants to create at start (provisioned by vc-manager from the sandbox's ClusterVersion;
    /// their control planes run only on real nodes).
    pub native_tenants: Vec<String>,
    /// Super nodes.
    pub nodes: usize,
    /// Real or simulated nodes.
    pub node_kind: NodeKind,
    /// Where the kubeconfigs are written (default: a temporary folder removed at the end). The folder is
    /// created when missing; files in it are overwritten.
    pub dir: Option<PathBuf>,
    /// Objects applied to the super cluster before the components start (for example the Helm chart's
    /// ServiceAccounts and RBAC).
    pub setup: Vec<DynamicObject>,
    /// Run the components as these ServiceAccounts instead of as cluster-admin.
    pub accounts: Option<ComponentAccounts>,
    /// vc-manager's `--max-certificate-lifetime-seconds`: how long tenants' leaf certificates live.
    pub max_certificate_lifetime: Option<Duration>,
    /// The syncer's `--vnode-mode`: which super nodes tenants see.
    pub vnode_mode: syncer::engine::config::VNodeMode,
    /// The syncer's `--pod-security-enforce`: the Pod Security level of tenants' super namespaces
    /// (`None`: the syncer's default, `baseline`).
    pub pod_security_enforce: Option<PodSecurityLevel>,
}

/// A Pod Security level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PodSecurityLevel {
    /// Anything goes (what a cluster without Pod Security admission allows).
    Privileged,
    /// Known privilege escalations refused.
    Baseline,
    /// Hardening best practices.
    Restricted,
}

impl PodSecurityLevel {
    /// The level as Pod Security labels and the chart's values spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Privileged => "privileged",
            Self::Baseline => "baseline",
            Self::Restricted => "restricted",
        }
    }
}

impl Default for SandboxOptions {
    fn default() -> Self {
        Self {
            tenants: vec!["tenant-0".to_owned()],
            native_tenants: Vec::new(),
            nodes: 2,
            node_kind: NodeKind::Simulated,
            dir: None,
            setup: Vec::new(),
            accounts: None,
            max_certificate_lifetime: None,
            vnode_mode: syncer::engine::config::VNodeMode::Pods,
            pod_security_enforce: None,
        }
    }
}

/// ServiceAccounts of the super cluster the components run as, so that their RBAC is what is tested.
#[derive(Clone, Debug)]
pub struct ComponentAccounts {
    /// Namespace of the ServiceAccounts.
    pub namespace: String,
    /// vc-manager's.
    pub vc_manager: String,
    /// The syncer's.
    pub syncer: String,
    /// vn-agent's.
    pub vn_agent: String,
    /// vc-dns's.
    pub dns: String,
    /// Name of the kubelet-client CA bundle (in `namespace`) the roles grant vc-manager and vn-agent.
    pub ca_bundle: String,
    /// The ClusterRole of vn-agent's rights on tenant pods that the syncer binds in each tenant super
    /// namespace, if the roles have one.
    pub vn_agent_tenant_pods: Option<String>,
}

/// The super-cluster clients of the three components.
struct ComponentClients {
    vc_manager: Client,
    syncer: Client,
    vn_agent: Client,
    dns: Client,
}

impl ComponentClients {
    /// Cluster-admin for all three, or a token of each component's ServiceAccount.
    async fn new(tenancy: &Tenancy, accounts: Option<&ComponentAccounts>, dir: &WorkDir) -> Result<Self> {
        // The sandbox's syncer reaches the super cluster over one HTTP/2 connection (`--super-http2`), so the
        // suite covers that client; tests that start a syncer themselves use kube's, the binary's default.
        let Some(accounts) = accounts else {
            let admin = tenancy.super_client();
            return Ok(Self {
                vc_manager: admin.clone(),
                syncer: multiplexed_client_from_kubeconfig_file(
                    tenancy.super_cluster.apiserver().kubeconfig_path(),
                )
                .await?,
                vn_agent: admin.clone(),
                dns: admin,
            });
        };
        let as_account = |name: String, http2: bool| async move {
            let api: Api<ServiceAccount> = Api::namespaced(tenancy.super_client(), &accounts.namespace);
            let request = TokenRequest {
                spec: TokenRequestSpec {
                    audiences: Vec::new(),
                    expiration_seconds: Some(TOKEN_SECONDS),
                    ..Default::default()
                },
                ..Default::default()
            };
            let token = api
                .create_token_request(&name, &PostParams::default(), &request)
                .await
                .map_err(Error::kube(format!(
                    "requesting a token of ServiceAccount {}/{name}",
                    accounts.namespace
                )))?
                .status
                .map(|status| status.token)
                .unwrap_or_default();
            let apiserver = tenancy.super_cluster.apiserver();
            let kubeconfig = token_kubeconfig_yaml(&name, apiserver.url(), apiserver.ca().cert_pem(), &token);
            let path = dir.write(&format!("{name}.kubeconfig"), kubeconfig)?;
            match http2 {
                true => multiplexed_client_from_kubeconfig_file(&path).await,
                false => client_from_kubeconfig_file(&path).await,
            }
        };
        Ok(Self {
            vc_manager: as_account(accounts.vc_manager.clone(), false).await?,
            syncer: as_account(accounts.syncer.clone(), true).await?,
            vn_agent: as_account(accounts.vn_agent.clone(), false).await?,
            dns: as_account(accounts.dns.clone(), false).await?,
        })
    }
}

/// Lifetime of the components' ServiceAccount tokens: longer than any sandbox session.
const TOKEN_SECONDS: i64 = 7 * 24 * 3600;

/// vc-manager running in this process.
struct ManagerTask {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<vc_manager::Result<()>>,
}

impl Drop for ManagerTask {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// PKI of vn-agent: its serving certificate (trusted by the tenant apiservers) and the client
/// certificate it presents to the simulated kubelet.
struct AgentPki {
    serving_ca: CertificateAuthority,
    client_ca: CertificateAuthority,
}

/// Where the sandbox's files are.
/// Where the kubeconfigs go: a temporary folder, or one the user chose (kept).
pub(crate) enum Files {
    Temporary(WorkDir),
    Chosen(PathBuf),
}

impl Files {
    /// A chosen folder (created when missing), or a temporary one.
    pub(crate) fn new(dir: Option<&Path>) -> Result<Self> {
        match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
                Ok(Self::Chosen(dir.to_path_buf()))
            }
            None => Ok(Self::Temporary(WorkDir::new("sandbox")?)),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        match self {
            Self::Temporary(dir) => dir.path(),
            Self::Chosen(path) => path,
        }
    }

    pub(crate) fn write(&self, name: &str, contents: &str) -> Result<PathBuf> {
        let path = self.path().join(name);
        std::fs::write(&path, contents).map_err(Error::io(format!("writing {}", path.display())))?;
        Ok(path)
    }
}

/// The host's address towards the real nodes ([`crate::realnodes::host::HOST_IP`]).
fn host_ip() -> Result<std::net::IpAddr> {
    crate::realnodes::host::HOST_IP.parse().map_err(|e| Error::Io {
        context: "the host's address towards the nodes".into(),
        source: std::io::Error::other(e),
    })
}

/// Namespace and name of the super cluster's Service in front of vc-dns, which the syncer points tenant
/// pods at.
pub const DNS_SERVICE_NAMESPACE: &str = "default";
/// See [`DNS_SERVICE_NAMESPACE`].
pub const DNS_SERVICE_NAME: &str = "vc-dns";

/// vc-dns running in this process, behind Service `default/vc-dns`, with a stand-in upstream on loopback
/// (no query leaves the machine; public names do not exist). On real nodes it listens on the host's
/// address towards the nodes and the Service's endpoint is that address, so pods on every node reach it
/// through kube-proxy with their own source address, as in a cluster.
struct TenantDns {
    dns: vc_dns::Dns,
    _upstream: crate::dns::FakeUpstream,
}

impl TenantDns {
    async fn start(tenancy: &Tenancy, client: Client, real_nodes: bool) -> Result<Self> {
        let upstream = crate::dns::FakeUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), &[]).await?;
        let mut settings = vc_dns::Settings::local(vec![upstream.address()]);
        if real_nodes {
            settings.listen_address = SocketAddr::new(host_ip()?, crate::free_port()?);
        }
        let component = |source: vc_dns::Error| Error::Component {
            component: "vc-dns",
            source: Box::new(source),
        };
        let dns = vc_dns::Dns::start(settings, client, vc_dns::Metrics::default())
            .await
            .map_err(component)?;
        tokio::time::timeout(TENANT_PATIENCE, dns.wait_ready())
            .await
            .map_err(|_| Error::Io {
                context: "vc-dns's watches listing".into(),
                source: std::io::Error::other("timed out"),
            })?
            .map_err(component)?;
        let port = dns.local_addr().port();
        let mut objects = vec![serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": DNS_SERVICE_NAME, "namespace": DNS_SERVICE_NAMESPACE},
            "spec": {"ports": [
                {"name": "dns", "port": 53, "targetPort": port, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "targetPort": port, "protocol": "TCP"}
            ]}
        })];
        if real_nodes {
            objects.push(serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{DNS_SERVICE_NAME}-host"), "namespace": DNS_SERVICE_NAMESPACE,
                    "labels": {"kubernetes.io/service-name": DNS_SERVICE_NAME,
                        "endpointslice.kubernetes.io/managed-by": "vc-sandbox"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [dns.local_addr().ip().to_string()], "conditions": {"ready": true}}],
                "ports": [
                    {"name": "dns", "port": port, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": port, "protocol": "TCP"}
                ]
            }));
        }
        for object in objects {
            let object: DynamicObject = serde_json::from_value(object).map_err(|e| Error::Io {
                context: "the vc-dns Service".into(),
                source: std::io::Error::other(e),
            })?;
            apply_object(&tenancy.super_client(), object, DNS_SERVICE_NAMESPACE).await?;
        }
        Ok(Self {
            dns,
            _upstream: upstream,
        })
    }
}

/// The running sandbox. Fields drop in order: components first, then the clusters, then the files.
pub struct Sandbox {
    syncer: syncer::Syncer,
    dns: TenantDns,
    manager: ManagerTask,
    /// One vn-agent per real node, or one for every simulated node.
    agents: Vec<vn_agent::Agent>,
    tenancy: Tenancy,
    /// vn-agent's certificates: always temporary.
    _private: WorkDir,
    files: Files,
    super_kubeconfig: PathBuf,
    tenant_kubeconfigs: BTreeMap<String, PathBuf>,
    vc_manager_admin: SocketAddr,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("super_kubeconfig", &self.super_kubeconfig)
            .field("tenants", &self.tenant_kubeconfigs)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Starts the super cluster, the three components, and the tenants in `options`; returns once every
    /// tenant is Running and synced.
    pub async fn start(options: SandboxOptions) -> Result<Self> {
        let files = Files::new(options.dir.as_deref())?;
        let private = WorkDir::new("sandbox-pki")?;
        let pki = AgentPki {
            serving_ca: CertificateAuthority::new("vn-agent serving CA")?,
            client_ca: CertificateAuthority::new("vn-agent client CA")?,
        };
        let real_nodes = match options.node_kind {
            NodeKind::Real => true,
            NodeKind::Simulated => false,
            NodeKind::Auto => crate::realnodes::missing_parts().is_empty(),
        };
        let tenancy = Tenancy::start(TenancyOptions {
            tenants: 0,
            nodes: options.nodes,
            tenant_kubelet_ca: Some(pki.serving_ca.cert_pem().to_owned()),
            kubelet_client_cas: vec![pki.client_ca.cert_pem().to_owned()],
            real_nodes,
            kubelet_api_users: vec![VN_AGENT_USER.to_owned()],
            ..TenancyOptions::default()
        })
        .await?;
        tenancy.nodes.wait_ready(&tenancy.super_client()).await?;
        let super_kubeconfig = files.write(
            "super.kubeconfig",
            &tenancy.super_cluster.apiserver().admin_kubeconfig(),
        )?;
        for object in &options.setup {
            apply_object(&tenancy.super_client(), object.clone(), "default").await?;
        }
        let clients = ComponentClients::new(&tenancy, options.accounts.as_ref(), &private).await?;

        let ca_bundle = match &options.accounts {
            Some(accounts) => vc_manager::ca_bundle::BundleRef {
                namespace: accounts.namespace.clone(),
                name: accounts.ca_bundle.clone(),
            },
            None => vc_manager::ca_bundle::BundleRef {
                namespace: CA_BUNDLE_NAMESPACE.to_owned(),
                name: CA_BUNDLE_NAME.to_owned(),
            },
        };
        let (agents, vn_agent_port) =
            start_vn_agents(&tenancy, clients.vn_agent, &pki, &private, &ca_bundle).await?;
        let (manager, vc_manager_admin) = start_vc_manager(
            clients.vc_manager,
            real_nodes,
            options.max_certificate_lifetime,
            ca_bundle,
        )
        .await?;
        let dns = TenantDns::start(&tenancy, clients.dns, real_nodes).await?;
        // The sandbox's syncer by its flags, as the chart runs it (the journal off: a sandbox restarts at will).
        let mut flags = vec![
            format!("--tenant-dns-service={DNS_SERVICE_NAMESPACE}/{DNS_SERVICE_NAME}"),
            format!("--vn-agent-port={vn_agent_port}"),
            "--vnode-grace-seconds=30".to_owned(),
            "--patrol-interval-seconds=15".to_owned(),
            "--tenant-health-period-seconds=2".to_owned(),
            "--downward-workers=8".to_owned(),
            "--upward-workers=8".to_owned(),
            format!("--vnode-mode={}", options.vnode_mode),
            "--attach-journal=false".to_owned(),
        ];
        if let Some(level) = options.pod_security_enforce {
            flags.push(format!("--pod-security-enforce={}", level.as_str()));
        }
        if let Some(accounts) = &options.accounts
            && let Some(role) = &accounts.vn_agent_tenant_pods
        {
            flags.push(format!(
                "--vn-agent-service-account={}/{}",
                accounts.namespace, accounts.vn_agent
            ));
            flags.push(format!("--vn-agent-cluster-role={role}"));
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let config = syncer::SyncerConfig::from_flags(&flags).map_err(|error| Error::Component {
            component: "syncer",
            source: error.into(),
        })?;
        let syncer = syncer::Syncer::start(
            clients.syncer,
            config,
            Arc::new(syncer::Metrics::default()),
            Health::new(),
        )
        .await
        .map_err(|source| Error::Component {
            component: "syncer",
            source: Box::new(source),
        })?;

        let mut sandbox = Self {
            syncer,
            dns,
            manager,
            agents,
            tenancy,
            _private: private,
            files,
            super_kubeconfig,
            tenant_kubeconfigs: BTreeMap::new(),
            vc_manager_admin,
        };
        for name in &options.tenants {
            sandbox.add_tenant(name, VirtualClusterSpec::default()).await?;
        }
        if real_nodes {
            // Native tenants need real nodes; the ClusterVersion is there for them either way.
            sandbox.apply_cluster_version().await?;
        }
        for name in &options.native_tenants {
            sandbox.add_native_tenant(name).await?;
        }
        Ok(sandbox)
    }

    /// Where vc-dns answers (UDP and TCP), for clients on this machine.
    pub fn dns_address(&self) -> SocketAddr {
        self.dns.dns.local_addr()
    }

    /// Applies [`CLUSTER_VERSION`]: the `examples/` ClusterVersion (ClusterIP apiserver) with the images
    /// the real nodes' registry serves, built from the harness's binaries.
    pub async fn apply_cluster_version(&self) -> Result<()> {
        let text = cluster_version_yaml()?;
        let object: DynamicObject = serde_saphyr::from_str(&text).map_err(|source| Error::Kubeconfig {
            context: "parsing the sandbox ClusterVersion".into(),
            source: Box::new(source),
        })?;
        apply_object(&self.super_client(), object, "default").await?;
        Ok(())
    }

    /// Writes native tenant `name`'s admin kubeconfig as its Secret now holds it (renewed certificates
    /// included), pointed at the apiserver Service's cluster IP; returns its path.
    pub async fn refresh_native_kubeconfig(&mut self, name: &str) -> Result<PathBuf> {
        let api: Api<VirtualCluster> = Api::namespaced(self.super_client(), VC_NAMESPACE);
        let vc = api
            .get(name)
            .await
            .map_err(Error::kube(format!("reading VirtualCluster {name}")))?;
        let key = crds::naming::cluster_key_of(&vc).ok_or_else(|| Error::Kubeconfig {
            context: format!("VirtualCluster {name} has no uid"),
            source: "created without uid".into(),
        })?;
        let kubeconfig = native_kubeconfig(&self.super_client(), &key).await?;
        self.files.write(&format!("{name}.kubeconfig"), &kubeconfig)
    }

    /// Creates native VirtualCluster `default/<name>` from [`CLUSTER_VERSION`], waits until vc-manager
    /// reports it Running (its apiserver answers) and the syncer synced it, and writes its admin
    /// kubeconfig, pointed at the apiserver Service's cluster IP, which this machine reaches through
    /// kube-proxy. Returns the kubeconfig's path.
    pub async fn add_native_tenant(&mut self, name: &str) -> Result<PathBuf> {
        self.add_native_tenant_from(name, CLUSTER_VERSION).await
    }

    /// [`Sandbox::add_native_tenant`] from ClusterVersion `cluster_version` (applied beforehand).
    pub async fn add_native_tenant_from(&mut self, name: &str, cluster_version: &str) -> Result<PathBuf> {
        let spec = VirtualClusterSpec {
            cluster_version_name: Some(cluster_version.to_owned()),
            ..VirtualClusterSpec::default()
        };
        let api: Api<VirtualCluster> = Api::namespaced(self.super_client(), VC_NAMESPACE);
        api.patch(
            name,
            &kube::api::PatchParams::apply("vc-sandbox").force(),
            &kube::api::Patch::Apply(&VirtualCluster::new(name, spec)),
        )
        .await
        .map_err(Error::kube(format!("applying VirtualCluster {name}")))?;
        self.wait_tenant_ready_for(name, NATIVE_PATIENCE).await?;
        let path = self.refresh_native_kubeconfig(name).await?;
        // Usable means pods can be created: the tenant's controller-manager has made the default
        // namespace's service account.
        let tenant = client_from_kubeconfig_file(&path).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(tenant, "default");
        wait::until_true(
            TENANT_PATIENCE,
            &format!("the default service account of native tenant {name}"),
            || {
                let accounts = accounts.clone();
                async move { matches!(accounts.get_opt("default").await, Ok(Some(_))) }
            },
        )
        .await?;
        self.tenant_kubeconfigs.insert(name.to_owned(), path.clone());
        Ok(path)
    }

    /// Starts a tenant master, adopts it as VirtualCluster `default/<name>` with `spec`, hands it the
    /// kubelet-client certificate vc-manager issued and hands its client CA to `kubectl vc` (as the
    /// platform guide tells an operator to), and waits until it is Running and synced. Returns the path
    /// of its admin kubeconfig.
    pub async fn add_tenant(&mut self, name: &str, spec: VirtualClusterSpec) -> Result<PathBuf> {
        self.tenancy.add_tenant(name, spec).await?;
        let super_client = self.super_client();
        hand_over_kubelet_client(&super_client, self.tenancy.tenant_mut(name)).await?;
        self.wait_tenant_ready(name).await?;
        let kubeconfig = self
            .tenancy
            .tenant(name)
            .control_plane
            .apiserver()
            .admin_kubeconfig();
        let path = self.files.write(&format!("{name}.kubeconfig"), &kubeconfig)?;
        self.tenant_kubeconfigs.insert(name.to_owned(), path.clone());
        Ok(path)
    }

    /// Waits until VirtualCluster `default/<name>` is Running and the syncer reports it synced.
    async fn wait_tenant_ready(&self, name: &str) -> Result<()> {
        wait_tenant_ready(&self.super_client(), name, TENANT_PATIENCE).await
    }

    async fn wait_tenant_ready_for(&self, name: &str, patience: Duration) -> Result<()> {
        wait_tenant_ready(&self.super_client(), name, patience).await
    }

    /// A cluster-admin client of the super cluster.
    pub fn super_client(&self) -> Client {
        self.tenancy.super_client()
    }

    /// The super cluster's admin kubeconfig file.
    pub fn super_kubeconfig(&self) -> &Path {
        &self.super_kubeconfig
    }

    /// Admin kubeconfig files of the tenants, by name.
    pub fn tenant_kubeconfigs(&self) -> &BTreeMap<String, PathBuf> {
        &self.tenant_kubeconfigs
    }

    /// The folder holding the kubeconfigs.
    pub fn dir(&self) -> &Path {
        self.files.path()
    }

    /// The clusters and simulated nodes.
    pub fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    /// vn-agent's kubelet-API address (the first node's, with real nodes).
    pub fn vn_agent_address(&self) -> SocketAddr {
        self.agents[0].local_addr()
    }

    /// Whether the nodes are real.
    pub fn has_real_nodes(&self) -> bool {
        self.tenancy.nodes.real().is_some()
    }

    /// vc-manager's `/metrics`, `/healthz` and `/readyz` address.
    pub fn vc_manager_admin(&self) -> SocketAddr {
        self.vc_manager_admin
    }

    /// The syncer, for its metrics and tenants.
    pub fn syncer(&self) -> &syncer::Syncer {
        &self.syncer
    }

    /// Stops the components, then the clusters, and removes the temporary files.
    pub async fn shutdown(self) {
        let Self {
            mut syncer,
            manager,
            agents,
            tenancy,
            _private,
            files,
            ..
        } = self;
        syncer.stop();
        drop(manager);
        for agent in agents {
            if let Err(error) = agent.shutdown().await {
                tracing::warn!(%error, "vn-agent did not shut down cleanly");
            }
        }
        drop(tenancy);
        drop(_private);
        drop(files);
    }
}

/// What the platform guide tells an operator to do for an adopted tenant: restart its apiserver with the
/// kubelet-client certificate vc-manager issued (its identity towards vn-agent), and hand its client CA over
/// to `kubectl vc` (Secret [`SECRET_ADOPTED_CLIENT_CA`] in the tenant's root namespace), so that `kubectl vc
/// kubeconfig --user` can mint per-user certificates.
pub(crate) async fn hand_over_kubelet_client(
    super_client: &Client,
    tenant: &mut crate::tenancy::TenantMaster,
) -> Result<()> {
    let name = tenant.name.clone();
    let secrets: Api<Secret> = Api::namespaced(super_client.clone(), &tenant.cluster_key);
    let secret = wait::until(
        TENANT_PATIENCE,
        &format!("vc-manager's {SECRET_KUBELET_CLIENT} Secret for tenant {name}"),
        || {
            let secrets = secrets.clone();
            async move { secrets.get_opt(SECRET_KUBELET_CLIENT).await.ok().flatten() }
        },
    )
    .await?;
    let certificate = CertifiedKey {
        cert_pem: secret_text(&secret, "tls.crt")?,
        key_pem: secret_text(&secret, "tls.key")?,
    };
    tenant
        .control_plane
        .apiserver_mut()
        .restart_with_kubelet_client(&certificate)
        .await?;
    let client_ca = tenant.control_plane.apiserver().ca();
    let handover = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(SECRET_ADOPTED_CLIENT_CA.to_owned()),
            namespace: Some(tenant.cluster_key.clone()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        string_data: Some(
            [
                ("tls.crt".to_owned(), client_ca.cert_pem().to_owned()),
                ("tls.key".to_owned(), client_ca.key_pem().to_owned()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &handover)
        .await
        .map_err(Error::kube(format!(
            "handing over the client CA of tenant {name}"
        )))?;
    Ok(())
}

/// Waits until VirtualCluster `default/<name>` is Running and the syncer reports it synced.
pub(crate) async fn wait_tenant_ready(client: &Client, name: &str, patience: Duration) -> Result<()> {
    let api: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    wait::until(
        patience,
        &format!("VirtualCluster {name} Running and {CONDITION_TENANT_SYNCED}"),
        || {
            let api = api.clone();
            async move {
                let vc = api.get_opt(name).await.ok().flatten()?;
                let synced = vc
                    .status
                    .as_ref()?
                    .conditions
                    .iter()
                    .any(|c| c.type_ == CONDITION_TENANT_SYNCED && c.status == "True");
                (vc.phase() == Some(ClusterPhase::Running) && synced).then_some(())
            }
        },
    )
    .await
}

fn secret_text(secret: &Secret, key: &str) -> Result<String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .ok_or_else(|| Error::Kubeconfig {
            context: format!("Secret {SECRET_KUBELET_CLIENT} has no key {key}"),
            source: "missing key".into(),
        })?;
    String::from_utf8(bytes.0.clone()).map_err(|source| Error::Kubeconfig {
        context: format!("Secret {SECRET_KUBELET_CLIENT} key {key}"),
        source: Box::new(source),
    })
}

/// The common name of vn-agent's client certificate, which real kubelets authorize through RBAC.
const VN_AGENT_USER: &str = "vn-agent";

/// vn-agent in the kubelet backend mode: one serving every simulated node on a free loopback port, or one
/// per real node answering on that node's address, all on the same port, as the chart's DaemonSet runs
/// it: each listens on a port of the host's address towards the nodes, and its node forwards the vNode's
/// port there ([`crate::RealNodes::forward_to_host`]).
async fn start_vn_agents(
    tenancy: &Tenancy,
    super_client: Client,
    pki: &AgentPki,
    files: &WorkDir,
    ca_bundle: &vc_manager::ca_bundle::BundleRef,
) -> Result<(Vec<vn_agent::Agent>, u16)> {
    use vn_agent::settings::NodeScope;
    // The port vNodes name: on real nodes the one each node forwards to its agent on the host.
    let mut advertised = None;
    let mut names: Vec<String> = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let targets: Vec<(String, String, NodeScope)> = match tenancy.nodes.real() {
        Some(real) => {
            let port = free_port()?;
            advertised = Some(port);
            let mut targets = Vec::new();
            for node in real.nodes() {
                names.push(node.ip());
                names.push(node.name().to_owned());
                let listen = SocketAddr::new(host_ip()?, free_port()?);
                real.forward_to_host(node.index(), port, listen)?;
                targets.push((
                    listen.to_string(),
                    format!("https://{}:{}", node.ip(), crate::realnodes::KUBELET_PORT),
                    NodeScope::Named(vec![node.name().to_owned()]),
                ));
            }
            targets
        }
        None => {
            let kubelet = tenancy.nodes.kubelet().ok_or_else(|| Error::Component {
                component: "vn-agent",
                source: "the node simulator serves no kubelet API".into(),
            })?;
            vec![("127.0.0.1:0".to_owned(), kubelet.url().to_owned(), NodeScope::All)]
        }
    };
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let serving = pki.serving_ca.issue("vn-agent", &[], &name_refs, Usage::Server)?;
    let client = pki.client_ca.issue(VN_AGENT_USER, &[], &[], Usage::Client)?;
    let mut agents = Vec::new();
    for (listen, kubelet_url, scope) in targets {
        agents.push(
            start_vn_agent(
                tenancy,
                super_client.clone(),
                &serving,
                &client,
                files,
                &listen,
                &kubelet_url,
                scope,
                ca_bundle,
            )
            .await?,
        );
    }
    let port = match advertised {
        Some(port) => port,
        None => agents
            .first()
            .map(|a| a.local_addr().port())
            .ok_or_else(|| Error::Component {
                component: "vn-agent",
                source: "no agent started".into(),
            })?,
    };
    Ok((agents, port))
}

#[allow(clippy::too_many_arguments)]
async fn start_vn_agent(
    tenancy: &Tenancy,
    super_client: Client,
    serving: &CertifiedKey,
    client: &CertifiedKey,
    files: &WorkDir,
    listen: &str,
    kubelet_url: &str,
    nodes: vn_agent::settings::NodeScope,
    ca_bundle: &vc_manager::ca_bundle::BundleRef,
) -> Result<vn_agent::Agent> {
    use vn_agent::settings::{
        BackendSettings, KubeletServerCa, KubeletSettings, ServingCertificate, Settings,
    };
    let component_error = |source: Box<dyn std::error::Error + Send + Sync>| Error::Component {
        component: "vn-agent",
        source,
    };
    let url = kubelet_url.parse().map_err(|e| component_error(Box::new(e)))?;
    let settings = Settings {
        listen_address: listen.parse().map_err(|e| component_error(Box::new(e)))?,
        serving_certificate: ServingCertificate::Files {
            cert: files.write("vn-agent.crt", &serving.cert_pem)?,
            key: files.write("vn-agent.key", &serving.key_pem)?,
        },
        nodes,
        backend: BackendSettings::Kubelet(KubeletSettings {
            url,
            client_certificate: files.write("vn-agent-client.crt", &client.cert_pem)?,
            client_key: files.write("vn-agent-client.key", &client.key_pem)?,
            server_ca: KubeletServerCa::File(files.write(
                "kubelet-ca.crt",
                tenancy.super_cluster.apiserver().ca().cert_pem(),
            )?),
        }),
        shutdown_grace_period: Duration::from_secs(5),
        limits: Default::default(),
        ca_bundle: vn_agent::settings::CaBundle {
            namespace: ca_bundle.namespace.clone(),
            name: ca_bundle.name.clone(),
        },
    };
    let mut registry = vn_agent::metrics::Registry::default();
    let metrics = vn_agent::Metrics::register(&mut registry);
    let agent = vn_agent::Agent::start(settings, super_client, metrics)
        .await
        .map_err(|source| component_error(Box::new(source)))?;
    tokio::time::timeout(Duration::from_secs(30), agent.wait_ready())
        .await
        .map_err(|_| Error::Timeout {
            what: "vn-agent's caches".into(),
            seconds: 30.0,
        })?
        .map_err(|source| component_error(Box::new(source)))?;
    Ok(agent)
}

/// Name of the sandbox's ClusterVersion for native tenants.
pub const CLUSTER_VERSION: &str = "cv-sandbox";

/// How long a native tenant may take to boot on real nodes (images pulled, etcd, apiserver, controller-
/// manager started one after the other).
pub(crate) const NATIVE_PATIENCE: Duration = Duration::from_secs(300);

/// The `examples/` ClusterIP ClusterVersion, renamed, with the control-plane images the real nodes'
/// registry serves (built from the harness's binaries and tagged with their versions).
pub fn cluster_version_yaml() -> Result<String> {
    with_local_images(
        &include_str!("../../examples/clusterversion-clusterip.yaml")
            .replace("name: cv-v1-33-clusterip", &format!("name: {CLUSTER_VERSION}")),
    )
}

/// A ClusterVersion's YAML with its etcd, kube-apiserver and kube-controller-manager images replaced by
/// the ones built here from the harness's binaries.
pub fn with_local_images(yaml: &str) -> Result<String> {
    let images = crate::RealNodes::control_plane_images()?;
    let mut text = yaml.to_owned();
    for (prefix, built) in [
        ("registry.k8s.io/etcd:", &images.etcd),
        ("registry.k8s.io/kube-apiserver:", &images.kube_apiserver),
        (
            "registry.k8s.io/kube-controller-manager:",
            &images.kube_controller_manager,
        ),
    ] {
        let built = built.as_ref().ok_or_else(|| Error::MissingPart {
            part: format!("an image {prefix}<version> (its binary is missing)"),
            hint: "put the Kubernetes binaries in $KUBEBUILDER_ASSETS or /usr/local/kubebuilder/bin".into(),
        })?;
        text = replace_image(&text, prefix, built);
    }
    Ok(text)
}

/// Replaces every `image: <prefix><tag>` with `image: <built>`.
fn replace_image(text: &str, prefix: &str, built: &str) -> String {
    text.lines()
        .map(|line| match line.trim_start().strip_prefix("image: ") {
            Some(image) if image.starts_with(prefix) => {
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}image: {built}")
            }
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// A native tenant's admin kubeconfig (vc-manager's Secret) with its server replaced by the apiserver
/// Service's cluster IP, which is in the apiserver's certificate and reachable from this machine.
pub(crate) async fn native_kubeconfig(client: &Client, root_namespace: &str) -> Result<String> {
    use crds::wellknown::SECRET_ADMIN_KUBECONFIG;
    let secret = Api::<Secret>::namespaced(client.clone(), root_namespace)
        .get(SECRET_ADMIN_KUBECONFIG)
        .await
        .map_err(Error::kube(format!(
            "reading {root_namespace}/{SECRET_ADMIN_KUBECONFIG}"
        )))?;
    let kubeconfig = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_ADMIN_KUBECONFIG))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| Error::Kubeconfig {
            context: format!("Secret {root_namespace}/{SECRET_ADMIN_KUBECONFIG}"),
            source: "no admin-kubeconfig key".into(),
        })?;
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .map(str::to_owned)
        .ok_or_else(|| Error::Kubeconfig {
            context: format!("Secret {root_namespace}/{SECRET_ADMIN_KUBECONFIG}"),
            source: "no server".into(),
        })?;
    let reachable = vc_runtime::clients::cluster_ip_url(client, &server, root_namespace)
        .await
        .map_err(|source| Error::Kubeconfig {
            context: format!("finding the cluster IP of {server}"),
            source: Box::new(source),
        })?;
    Ok(kubeconfig.replace(&format!("server: {server}"), &format!("server: {reachable}")))
}

/// Namespace of the kubelet-client CA bundle vc-manager keeps and vn-agent reads, unless the components
/// run as a chart's accounts (then the chart's namespace and name).
pub const CA_BUNDLE_NAMESPACE: &str = "default";
/// Name of that bundle.
pub const CA_BUNDLE_NAME: &str = crds::kubelet_client::DEFAULT_CA_BUNDLE;

/// vc-manager with quick adopt checks and retries, and its admin endpoint on a free loopback port.
async fn start_vc_manager(
    client: Client,
    real_nodes: bool,
    max_certificate_lifetime: Option<Duration>,
    ca_bundle: vc_manager::ca_bundle::BundleRef,
) -> Result<(ManagerTask, SocketAddr)> {
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()?)
        .parse()
        .expect("a socket address");
    let mut settings = vc_manager::Settings {
        adopt_check_interval: Duration::from_secs(5),
        backoff_max: Duration::from_secs(10),
        deletion_poll_interval: Duration::from_millis(500),
        // On simulated nodes the control plane's pods are marked running and nothing serves.
        native_readiness: match real_nodes {
            true => vc_manager::NativeReadiness::ApiserverAnswers,
            false => vc_manager::NativeReadiness::StatefulSetsReady,
        },
        max_certificate_lifetime,
        kubelet_client_ca_bundle: Some(ca_bundle),
        ..vc_manager::Settings::default()
    };
    settings.tenant_timeouts.connect = Duration::from_secs(2);
    let manager = vc_manager::Manager::new(client, settings).with_admin_endpoint(admin);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(Box::pin(manager.run(async move {
        let _ = stopped.await;
    })));
    Ok((
        ManagerTask {
            stop: Some(stop),
            task,
        },
        admin,
    ))
}
