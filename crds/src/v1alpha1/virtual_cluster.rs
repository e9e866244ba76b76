use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Condition};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::schema;

/// The desired state of a tenant: either a control plane provisioned from a ClusterVersion, or an existing
/// cluster adopted through its kubeconfig.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tenancy.x-k8s.io",
    version = "v1alpha1",
    kind = "VirtualCluster",
    namespaced,
    shortname = "vc",
    category = "tenancy",
    status = "VirtualClusterStatus",
    doc = "A tenant with its own Kubernetes control plane whose pods run on the shared super cluster.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "ClusterVersion", type_ = "string", json_path = ".spec.clusterVersionName"),
    printcolumn(name = "ClusterNamespace", type_ = "string", json_path = ".status.clusterNamespace"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message(
        "metadata.name must be a DNS label (lowercase letters, digits and '-', no dots): it becomes part of namespace names in the super cluster"
    ),
    validation = Rule::new("size(self.metadata.name) <= 63")
        .message("metadata.name must be at most 63 characters: it becomes part of namespace names in the super cluster"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.clusterVersionName) || has(self.kubeconfigSecretRef)").message(
        "one of spec.clusterVersionName (provision a tenant control plane) or spec.kubeconfigSecretRef (adopt an existing one) is required"
    ),
    validation = Rule::new("!(has(self.clusterVersionName) && has(self.kubeconfigSecretRef))").message(
        "spec.clusterVersionName and spec.kubeconfigSecretRef are mutually exclusive: set exactly one"
    ),
    validation = Rule::new("has(oldSelf.kubeconfigSecretRef) == has(self.kubeconfigSecretRef)").message(
        "a VirtualCluster cannot switch between a provisioned and an adopted control plane; create a new VirtualCluster instead"
    ),
)]
pub struct VirtualClusterSpec {
    /// DNS domain of the tenant cluster: pods resolve services as `<svc>.<ns>.svc.<clusterDomain>`, and the
    /// tenant apiserver certificate covers `kubernetes.default.svc.<clusterDomain>`.
    #[serde(default = "default_cluster_domain")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message(
        "must be a lowercase RFC 1123 DNS domain such as cluster.local"
    ))]
    pub cluster_domain: String,

    /// Name of the cluster-scoped ClusterVersion to provision the tenant control plane from. Changing it
    /// upgrades the control plane in place. Mutually exclusive with `kubeconfigSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub cluster_version_name: Option<String>,

    /// Lifetime of the tenant's certificates in days. Certificates are renewed before a fifth of it
    /// remains; the certificate authorities and the service-account key are kept.
    #[serde(default = "default_pki_expire_days")]
    #[schemars(range(min = 1, max = 36500))]
    pub pki_expire_days: i64,

    /// Label and annotation key prefixes set on super-cluster objects by super-cluster controllers that are
    /// copied back up to the tenant's objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub transparent_meta_prefixes: Vec<String>,

    /// Label and annotation key prefixes owned by the super cluster: never copied down from the tenant and
    /// never overwritten on super-cluster objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub opaque_meta_prefixes: Vec<String>,

    /// Service IP range of the tenant apiserver (`--service-cluster-ip-range`), e.g. `10.32.0.0/16`, or an
    /// IPv4 and an IPv6 range separated by a comma for dual stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    // A pattern rather than CEL's isCIDR(), which apiservers before 1.31 lack.
    #[x_kube(validation = Rule::new("self.matches('^([0-9]{1,3}(\\\\.[0-9]{1,3}){3}/[0-9]{1,2}|[0-9a-fA-F:]+/[0-9]{1,3})(,([0-9]{1,3}(\\\\.[0-9]{1,3}){3}/[0-9]{1,2}|[0-9a-fA-F:]+/[0-9]{1,3}))?$')").message(
        "must be a CIDR such as 10.32.0.0/16 (or an IPv4 and an IPv6 CIDR separated by a comma)"
    ))]
    pub service_cidr: Option<String>,

    /// Adopt an existing tenant control plane instead of provisioning one: the Secret (in this
    /// VirtualCluster's namespace) holding its admin kubeconfig. Mutually exclusive with
    /// `clusterVersionName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<KubeconfigSecretRef>,

    /// This tenant's share of the syncer's work queues relative to other tenants (1-100).
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: u32,

    /// Aggregate limits on everything this tenant runs in the super cluster. Pods that do not fit wait in
    /// the tenant with condition reason `TenantQuotaExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<TenantQuota>,

    /// Cap on the syncer's writes to the super cluster on behalf of this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,

    /// RuntimeClass forced onto every tenant pod in the super cluster, e.g. `kata` for sandboxed pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message(
        "must be a RuntimeClass name (a lowercase RFC 1123 subdomain)"
    ))]
    pub runtime_class_name: Option<String>,

    /// Host access and placement tenant pods may have in the super cluster beyond what the platform allows
    /// every tenant. Anything not allowed is refused. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_policy: Option<PodPolicy>,

    /// Pause the tenant: its pods stop running in the super cluster (their super pods are removed, nothing
    /// in the tenant is deleted) and a provisioned control plane scales to zero, keeping its volumes, PKI and
    /// Services. Set back to false (or remove) to resume: the same pods are recreated from the tenant's
    /// objects. Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,

    /// Scheduled snapshots of a provisioned tenant (its etcd at one revision and its PKI), taken by the
    /// platform's snapshot scheduler into its store and pruned to `retain`. Ignored for adopted tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<SnapshotSchedule>,

    /// DNS suffixes this tenant's Ingress hosts may use besides the one the platform assigns every tenant
    /// (the syncer's `--ingress-host-suffix`), e.g. `shop.apps.example.com`. Only suffixes under a domain
    /// the platform grants (`--ingress-grantable-host-suffixes`) that no older VirtualCluster holds count;
    /// the others are named in the `SpecLimited` condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253)))]
    #[x_kube(validation = Rule::new("self.all(s, s.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$'))").message(
        "each must be a lowercase DNS name of at least two labels, such as shop.apps.example.com"
    ))]
    pub ingress_host_suffixes: Vec<String>,
}

/// When the snapshot scheduler snapshots a tenant, and how many snapshots it keeps.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSchedule {
    /// Minutes between two snapshots (1-10080). The platform may set a longer minimum (the scheduler's
    /// `--min-interval`), which then applies instead.
    #[schemars(range(min = 1, max = 10080))]
    pub interval_minutes: u32,
    /// How many of this tenant's newest snapshots the store keeps (1-1000, default 7). The platform may
    /// cap it (the scheduler's `--max-retain`).
    #[serde(default = "default_retain")]
    #[schemars(range(min = 1, max = 1000))]
    pub retain: u32,
}

fn default_retain() -> u32 {
    7
}

fn default_cluster_domain() -> String {
    "cluster.local".to_owned()
}

fn default_pki_expire_days() -> i64 {
    365
}

fn default_weight() -> u32 {
    1
}

impl Default for VirtualClusterSpec {
    fn default() -> Self {
        Self {
            cluster_domain: default_cluster_domain(),
            cluster_version_name: None,
            pki_expire_days: default_pki_expire_days(),
            transparent_meta_prefixes: Vec::new(),
            opaque_meta_prefixes: Vec::new(),
            service_cidr: None,
            kubeconfig_secret_ref: None,
            weight: default_weight(),
            quota: None,
            rate_limit: None,
            runtime_class_name: None,
            pod_policy: None,
            paused: false,
            snapshots: None,
            ingress_host_suffixes: Vec::new(),
        }
    }
}

/// A key of a Secret in the VirtualCluster's own namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigSecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret's data holding the kubeconfig (default `value`, as Cluster API writes it).
    #[serde(default = "default_kubeconfig_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_kubeconfig_key() -> String {
    "value".to_owned()
}

/// Aggregate resource limits for a tenant in the super cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TenantQuota {
    /// Maximum number of tenant pods in the super cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub pods: Option<Quantity>,
    /// Maximum sum of CPU requests.
    #[serde(rename = "requests.cpu", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub requests_cpu: Option<Quantity>,
    /// Maximum sum of memory requests.
    #[serde(rename = "requests.memory", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub requests_memory: Option<Quantity>,
    /// Maximum sum of CPU limits.
    #[serde(rename = "limits.cpu", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub limits_cpu: Option<Quantity>,
    /// Maximum sum of memory limits.
    #[serde(rename = "limits.memory", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub limits_memory: Option<Quantity>,
    /// Maximum number of tenant Services in the super cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub services: Option<Quantity>,
    /// Maximum number of node ports the tenant's NodePort and LoadBalancer Services hold.
    #[serde(
        rename = "services.nodeports",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "schema::quantity")]
    pub services_node_ports: Option<Quantity>,
    /// Maximum number of tenant LoadBalancer Services.
    #[serde(
        rename = "services.loadbalancers",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "schema::quantity")]
    pub services_load_balancers: Option<Quantity>,
    /// Maximum number of tenant PersistentVolumeClaims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub persistentvolumeclaims: Option<Quantity>,
    /// Maximum sum of the storage the tenant's PersistentVolumeClaims request.
    #[serde(rename = "requests.storage", default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub requests_storage: Option<Quantity>,
}

/// A token bucket on the syncer's writes to the super cluster for one tenant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.burst) || self.burst >= self.qps").message("burst must be at least qps"))]
pub struct RateLimit {
    /// Sustained writes per second.
    #[schemars(range(min = 1, max = 100000))]
    pub qps: u32,
    /// Writes allowed at once after a quiet period (default: qps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub burst: Option<u32>,
}

impl RateLimit {
    /// The bucket size: `burst`, or `qps` when unset.
    pub fn effective_burst(&self) -> u32 {
        self.burst.unwrap_or(self.qps)
    }
}

/// Host access and placement that tenant pods may have beyond what the syncer allows every tenant. Every
/// field defaults to refused.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodPolicy {
    /// Allow `spec.hostNetwork: true`.
    #[serde(default)]
    pub host_network: bool,
    /// Allow `spec.hostPID: true`.
    #[serde(default, rename = "hostPID")]
    pub host_pid: bool,
    /// Allow `spec.hostIPC: true`.
    #[serde(default, rename = "hostIPC")]
    pub host_ipc: bool,
    /// Allow privileged containers.
    #[serde(default)]
    pub privileged: bool,
    /// Allow hostPath volumes.
    #[serde(default)]
    pub host_path: bool,
    /// Allow containers' `hostPort`s.
    #[serde(default, skip_serializing_if = "is_false")]
    pub host_ports: bool,
    /// Linux capabilities containers may add besides the syncer's `--pod-allowed-capabilities` (Pod
    /// Security `baseline` by default). The super namespaces' Pod Security level still applies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 64)))]
    pub capabilities: Vec<String>,
    /// Allow seccomp profile `Unconfined` and AppArmor profile `unconfined` (field or annotation).
    #[serde(default, skip_serializing_if = "is_false")]
    pub unconfined: bool,
    /// Allow seccomp and AppArmor profiles of type `Localhost` (files on the super node).
    #[serde(default, skip_serializing_if = "is_false")]
    pub localhost_profiles: bool,
    /// Taints this tenant's pods may tolerate besides the syncer's `--pod-allowed-taints`: `key` (any
    /// value and effect) or `key=value`. Only keys the syncer's `--pod-grantable-taints` lists count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 317)))]
    pub allowed_taints: Vec<String>,
    /// Node labels this tenant's pods may select on (node selector, node affinity) besides the syncer's
    /// `--pod-allowed-node-labels`: `key` (any value) or `key=value`. Only keys the syncer's
    /// `--pod-grantable-node-labels` lists count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 317)))]
    pub allowed_node_labels: Vec<String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The observed state of a VirtualCluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualClusterStatus {
    /// Lifecycle phase: Pending, Running, Updating, Paused or Error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,
    /// Namespace of the super cluster holding this tenant's control plane (its root namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_namespace: Option<String>,
    /// Human-readable explanation of the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Brief CamelCase reason for the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Standard conditions: PKIReady, EtcdReady, APIServerReady, ControllerManagerReady, Ready, and the
    /// syncer's TenantSynced and SpecLimited (what of the spec the platform's limits changed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How the control plane is run, `Provisioned` or `Adopted`: fixed by vc-manager when it first
    /// reconciles the VirtualCluster and never changed after. The original project's adopt annotations
    /// count only on a VirtualCluster whose mode is `Adopted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ControlPlaneMode>,
    /// What the tenant consumes in the super cluster, measured by the syncer (its own field manager,
    /// `vc-syncer-usage`) every `--usage-interval-seconds` and written when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TenantUsage>,
    /// The scheduled snapshots as the snapshot scheduler last wrote them (its own field manager,
    /// `vc-snapshots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<SnapshotStatus>,
    /// Set by the syncer (its own field manager, `vc-syncer-backoff`) when a syncer process stopped
    /// without a clean shutdown while it was attaching this tenant (a crash or an out-of-memory kill the
    /// tenant may have caused): the tenant is held back, or attached again in a smaller group, before any
    /// replica attaches it again. Removed once the tenant has stayed attached for the probation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_backoff: Option<AttachBackoff>,
}

/// Syncer stops counted against a tenant (see [`VirtualClusterStatus::attach_backoff`]).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AttachBackoff {
    /// Syncer processes that stopped in a row, without a clean shutdown, while attaching this tenant.
    #[serde(default)]
    pub stops: i64,
    /// How many tenants the last of them was attaching, this one included (1: this tenant alone).
    #[serde(default)]
    pub attached_with: i64,
    /// When this tenant entered the attach the last stop interrupted (the stopped process's clock): each
    /// stop is counted once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attach_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The syncer process that stopped last (`<replica>/<nonce>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The tenant is not attached before this time (absent: it is attached again at once, in a smaller
    /// group of tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// The last scheduled (or requested) snapshot of a tenant and the last failure.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The store the scheduler writes into, e.g. `pvc/vc-snapshots`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// When the last snapshot was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The last snapshot's folder in the store, `<namespace>/<name>-<UTC time>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<String>,
    /// The last snapshot's checksum (`sha256:` of its manifest), for `kubectl vc snapshot restore --checksum`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checksum: Option<String>,
    /// How many snapshots of this tenant the store holds after pruning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained: Option<i64>,
    /// When the last attempt failed; absent once a later snapshot succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

/// A tenant's consumption as the syncer last measured it: CPU and memory its pods use (the kubelets'
/// summary API), and what it holds (pods, claimed storage, load balancers, node ports). Figures the syncer
/// could not measure are absent.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantUsage {
    /// When the figures were measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// CPU used by the tenant's pods (sum of the kubelets' `usageNanoCores`), e.g. `1250m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory used by the tenant's pods (sum of the kubelets' `workingSetBytes`), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Pods the tenant has in the super cluster that are neither Succeeded nor Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<i64>,
    /// Of those, pods whose CPU and memory the kubelets reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_pods: Option<i64>,
    /// PersistentVolumeClaims (Pending or Bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claims: Option<i64>,
    /// Storage those claims request, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Quantity>,
    /// Services of type LoadBalancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancers: Option<i64>,
    /// Node ports allocated to the tenant's Services (one per port of a NodePort or LoadBalancer Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ports: Option<i64>,
    /// Requests per second the tenant apiserver served over the last interval (`apiserver_request_total`),
    /// for control planes vc-manager runs; e.g. `12500m` is 12.5 requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver_requests_per_second: Option<Quantity>,
}

/// How a tenant's control plane is run.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControlPlaneMode {
    /// vc-manager provisions it from a ClusterVersion.
    Provisioned,
    /// It exists already; vc-manager and the syncer use its admin kubeconfig.
    Adopted,
}

impl ControlPlaneMode {
    /// The mode as it appears in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioned => "Provisioned",
            Self::Adopted => "Adopted",
        }
    }
}

/// Lifecycle phase of a VirtualCluster.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClusterPhase {
    /// Being provisioned or checked; not all components are ready.
    Pending,
    /// Every component is ready.
    Running,
    /// A spec or ClusterVersion change is rolling out.
    Updating,
    /// The last attempt failed; it is retried with backoff.
    Error,
    /// `spec.paused` is set: no tenant pod runs, a provisioned control plane is scaled to zero.
    Paused,
}

impl ClusterPhase {
    /// The phase as it appears in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Updating => "Updating",
            Self::Error => "Error",
            Self::Paused => "Paused",
        }
    }
}

impl std::fmt::Display for ClusterPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl VirtualCluster {
    /// The current phase, if the status has one.
    pub fn phase(&self) -> Option<ClusterPhase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    /// How the control plane is run.
    ///
    /// - `spec.kubeconfigSecretRef` set: `Adopted` (the CRD forbids switching it on or off).
    /// - Otherwise the mode vc-manager fixed in `status.mode` at its first reconcile.
    /// - Before that: `Provisioned` when the status already shows a provisioned control plane (an
    ///   `EtcdReady` condition, written by vc-manager versions that did not record the mode), else
    ///   `Adopted` when one of the original project's adopt annotations names a kubeconfig, else
    ///   `Provisioned`.
    ///
    /// So the annotations choose the mode of a new VirtualCluster only; added to a provisioned one they
    /// change nothing ([`VirtualCluster::ignored_adopt_annotation`] names them).
    pub fn mode(&self) -> ControlPlaneMode {
        if self.spec.kubeconfig_secret_ref.is_some() {
            return ControlPlaneMode::Adopted;
        }
        let status = self.status.as_ref();
        if let Some(mode) = status.and_then(|s| s.mode) {
            return mode;
        }
        let provisioned_before = status.is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == crate::wellknown::CONDITION_ETCD_READY)
        });
        match self.annotation_adoption() {
            Some(_) if !provisioned_before => ControlPlaneMode::Adopted,
            _ => ControlPlaneMode::Provisioned,
        }
    }

    /// Where the admin kubeconfig of an adopted tenant lives, from `spec.kubeconfigSecretRef`, or from the
    /// original project's annotations when the VirtualCluster is in adopt mode ([`VirtualCluster::mode`]);
    /// `None` for a provisioned tenant.
    pub fn adoption(&self) -> Option<Adoption> {
        if let Some(r) = &self.spec.kubeconfig_secret_ref {
            return Some(Adoption::Secret(r.clone()));
        }
        match self.mode() {
            ControlPlaneMode::Adopted => self.annotation_adoption(),
            ControlPlaneMode::Provisioned => None,
        }
    }

    /// The kubeconfig the original project's annotations name, whether or not they count: the inline
    /// `tenancy.x-k8s.io/admin-kubeconfig` wins over `tenancy.x-k8s.io/secret.admin-kubeconfig`.
    pub fn annotation_adoption(&self) -> Option<Adoption> {
        use crate::wellknown::{ANNOTATION_ADMIN_KUBECONFIG, ANNOTATION_SECRET_ADMIN_KUBECONFIG};
        let annotations = self.metadata.annotations.as_ref()?;
        if let Some(inline) = annotations
            .get(ANNOTATION_ADMIN_KUBECONFIG)
            .filter(|v| !v.is_empty())
        {
            return Some(Adoption::InlineBase64(inline.clone()));
        }
        annotations
            .get(ANNOTATION_SECRET_ADMIN_KUBECONFIG)
            .filter(|v| !v.is_empty())
            .map(|name| {
                Adoption::Secret(KubeconfigSecretRef {
                    name: name.clone(),
                    key: default_kubeconfig_key(),
                })
            })
    }

    /// The original project's adopt annotation that is set but does not count, because the
    /// VirtualCluster is provisioned or names its kubeconfig in `spec.kubeconfigSecretRef`.
    pub fn ignored_adopt_annotation(&self) -> Option<&'static str> {
        use crate::wellknown::{ANNOTATION_ADMIN_KUBECONFIG, ANNOTATION_SECRET_ADMIN_KUBECONFIG};
        let counted = self.spec.kubeconfig_secret_ref.is_none() && self.mode() == ControlPlaneMode::Adopted;
        match self.annotation_adoption()? {
            _ if counted => None,
            Adoption::InlineBase64(_) => Some(ANNOTATION_ADMIN_KUBECONFIG),
            Adoption::Secret(_) => Some(ANNOTATION_SECRET_ADMIN_KUBECONFIG),
        }
    }
}

/// How an adopted tenant's admin kubeconfig is supplied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// A key of a Secret in the VirtualCluster's namespace.
    Secret(KubeconfigSecretRef),
    /// The original project's `tenancy.x-k8s.io/admin-kubeconfig` annotation: a base64-encoded kubeconfig.
    InlineBase64(String),
}
