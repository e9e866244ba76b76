//! Flags of what tenant pods become in the super cluster: their DNS, the platform's pod policy, the Pod
//! Security levels of their super namespaces and the hardening of their containers.

use crate::engine::config::values::{self, Blank};

/// Flags of tenant pods.
#[derive(Clone, Debug, clap::Args)]
pub struct PodFlags {
    /// `ndots` of the DNS config given to tenant pods.
    #[arg(long, default_value_t = 5)]
    pub dns_ndots: u32,
    /// The tenant DNS Service (`namespace/name`, vc-dns): tenant pods with `ClusterFirst` DNS get its
    /// cluster IP as their nameserver. Without it they get the super cluster IP of their tenant's own
    /// `kube-system/kube-dns` Service, when the tenant has one.
    #[arg(long, env = "TENANT_DNS_SERVICE", value_parser = values::namespaced_name)]
    pub tenant_dns_service: Option<Blank<crds::NamespacedName>>,
    /// Nameservers (IP addresses, at most 3) for tenant pods that opt out of the DNS rewrite
    /// (`tenancy.x-k8s.io/disable.dnsPolicyMutation`) but ask for cluster DNS: they get these, with their
    /// own `dnsConfig`, instead of the super cluster's DNS. Empty: the node's resolver (`dnsPolicy:
    /// Default`).
    #[arg(long, env = "POD_UPSTREAM_NAMESERVERS", value_delimiter = ',', value_parser = nameserver)]
    pub pod_upstream_nameservers: Vec<Option<std::net::IpAddr>>,
    /// The super cluster makes kubelets check a pod's right to a cached image (the
    /// `KubeletEnsureSecretPulledImages` feature, or the `AlwaysPullImages` admission plugin). `false` (the
    /// default): every tenant container is pulled with `imagePullPolicy: Always`, so that a tenant cannot
    /// run another tenant's private image from a node's cache.
    #[arg(long, env = "SUPER_ENFORCES_IMAGE_CREDENTIALS", default_value_t = false, action = clap::ArgAction::Set)]
    pub super_enforces_image_credentials: bool,
    /// The Pod Security levels of super namespaces.
    #[command(flatten)]
    pub security: PodSecurityFlags,
    /// What every tenant's pods may do.
    #[command(flatten)]
    pub policy: PlatformPodPolicy,
}

/// A pod's resolver reads at most this many nameservers.
pub const MAX_NAMESERVERS: usize = 3;

impl PodFlags {
    /// The nameservers of pods that opt out of the DNS rewrite.
    pub fn upstream_nameservers(&self) -> Result<Vec<String>, String> {
        let nameservers: Vec<String> =
            self.pod_upstream_nameservers.iter().flatten().map(|ip| ip.to_string()).collect();
        match nameservers.len() > MAX_NAMESERVERS {
            true => Err(format!(
                "--pod-upstream-nameservers: at most {MAX_NAMESERVERS} (a pod's resolver uses no more)"
            )),
            false => Ok(nameservers),
        }
    }

    /// The tenant DNS Service, when pods are pointed at it.
    pub fn tenant_dns(&self) -> Option<TenantDnsService> {
        Blank::of(self.tenant_dns_service.clone()).map(|s| TenantDnsService::new(&s.namespace, &s.name))
    }
}

fn nameserver(value: &str) -> Result<Option<std::net::IpAddr>, String> {
    match value.trim() {
        "" => Ok(None),
        address => address
            .parse()
            .map(Some)
            .map_err(|e| format!("{address:?} is not an IP address ({e})")),
    }
}

/// The tenant DNS Service (vc-dns) pods are pointed at, and its cluster IP once read.
#[derive(Clone, Debug)]
pub struct TenantDnsService {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// Its cluster IP and when it was read (re-read after a minute, so a recreated Service is followed).
    pub cached: std::sync::Arc<std::sync::Mutex<Option<(String, std::time::Instant)>>>,
}

impl TenantDnsService {
    /// The Service `namespace/name`, not yet read.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            cached: Default::default(),
        }
    }
}

impl PartialEq for TenantDnsService {
    fn eq(&self, other: &Self) -> bool {
        self.namespace == other.namespace && self.name == other.name
    }
}

/// Flags of the Pod Security labels of super namespaces.
#[derive(Clone, Debug, clap::Args)]
pub struct PodSecurityFlags {
    /// Pod Security level enforced on every super namespace of a tenant (label
    /// `pod-security.kubernetes.io/enforce`): privileged, baseline or restricted; empty leaves it unset.
    #[arg(long, env = "POD_SECURITY_ENFORCE", default_value = "baseline", value_parser = level)]
    pub pod_security_enforce: Blank<String>,
    /// Pod Security level that warns on every super namespace of a tenant; empty leaves it unset.
    #[arg(long, env = "POD_SECURITY_WARN", default_value = "restricted", value_parser = level)]
    pub pod_security_warn: Blank<String>,
    /// Pod Security level audited on every super namespace of a tenant; empty leaves it unset.
    #[arg(long, env = "POD_SECURITY_AUDIT", default_value = "", value_parser = level)]
    pub pod_security_audit: Blank<String>,
    /// Version of the Pod Security standards the levels refer to, e.g. `latest` or `v1.33`.
    #[arg(long, env = "POD_SECURITY_VERSION", default_value = "latest", value_parser = version)]
    pub pod_security_version: String,
}

impl PodSecurityFlags {
    /// The labels' values.
    pub fn labels(self) -> PodSecurityLabels {
        PodSecurityLabels {
            enforce: self.pod_security_enforce.0,
            warn: self.pod_security_warn.0,
            audit: self.pod_security_audit.0,
            version: self.pod_security_version,
        }
    }
}

fn level(value: &str) -> Result<Blank<String>, String> {
    match value.trim() {
        "" => Ok(Blank(None)),
        level @ ("privileged" | "baseline" | "restricted") => Ok(Blank(Some(level.to_owned()))),
        other => Err(format!("must be privileged, baseline, restricted or empty, got {other:?}")),
    }
}

fn version(value: &str) -> Result<String, String> {
    let version = value.trim();
    let valid = version == "latest"
        || version
            .strip_prefix("v1.")
            .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()));
    match valid {
        true => Ok(version.to_owned()),
        false => Err(format!("must be latest or v1.<minor>, got {version:?}")),
    }
}

/// The Pod Security labels of super namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSecurityLabels {
    /// `enforce` level, if set.
    pub enforce: Option<String>,
    /// `warn` level, if set.
    pub warn: Option<String>,
    /// `audit` level, if set.
    pub audit: Option<String>,
    /// Version of the standards.
    pub version: String,
}

/// Prefix of the Pod Security admission labels.
pub const POD_SECURITY_PREFIX: &str = "pod-security.kubernetes.io/";

impl PodSecurityLabels {
    /// The labels, each mode with its version.
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut labels = Vec::new();
        for (mode, level) in [
            ("enforce", &self.enforce),
            ("warn", &self.warn),
            ("audit", &self.audit),
        ] {
            if let Some(level) = level {
                labels.push((format!("{POD_SECURITY_PREFIX}{mode}"), level.clone()));
                labels.push((
                    format!("{POD_SECURITY_PREFIX}{mode}-version"),
                    self.version.clone(),
                ));
            }
        }
        labels
    }
}

/// What every tenant's pods may do, whatever their VirtualCluster says; and how far a VirtualCluster's
/// `podPolicy` may widen placement. The flags themselves: each list as given, empty entries dropped by
/// [`PlatformPodPolicy::tidy`].
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct PlatformPodPolicy {
    /// Taints every tenant's pods may tolerate: `key` (any value) or `key=value`. The default lists the
    /// node-condition taints the apiserver and DaemonSets tolerate.
    #[arg(long = "pod-allowed-taints", env = "POD_ALLOWED_TAINTS", value_delimiter = ',', default_values_t = default_allowed_taints(), value_parser = values::trimmed)]
    pub allowed_taints: Vec<String>,
    /// Taint keys a VirtualCluster's `podPolicy.allowedTaints` may add for its tenant (default none).
    #[arg(long = "pod-grantable-taints", env = "POD_GRANTABLE_TAINTS", value_delimiter = ',', value_parser = values::trimmed)]
    pub grantable_taints: Vec<String>,
    /// Node labels every tenant's pods may select on (node selector, node affinity): `key` (any value) or
    /// `key=value`. `kubernetes.io/hostname` also allows node affinity on the node's name.
    #[arg(long = "pod-allowed-node-labels", env = "POD_ALLOWED_NODE_LABELS", value_delimiter = ',', default_values_t = default_allowed_node_labels(), value_parser = values::trimmed)]
    pub allowed_node_labels: Vec<String>,
    /// Node label keys a VirtualCluster's `podPolicy.allowedNodeLabels` may add for its tenant (default
    /// none).
    #[arg(long = "pod-grantable-node-labels", env = "POD_GRANTABLE_NODE_LABELS", value_delimiter = ',', value_parser = values::trimmed)]
    pub grantable_node_labels: Vec<String>,
    /// Schedulers tenant pods may name in `schedulerName`.
    #[arg(
        long = "pod-allowed-schedulers",
        env = "POD_ALLOWED_SCHEDULERS",
        value_delimiter = ',',
        default_value = "default-scheduler",
        value_parser = values::trimmed
    )]
    pub allowed_schedulers: Vec<String>,
    /// Linux capabilities every tenant's containers may add (default: those Pod Security `baseline`
    /// allows). A VirtualCluster's `podPolicy.capabilities` adds more.
    #[arg(long = "pod-allowed-capabilities", env = "POD_ALLOWED_CAPABILITIES", value_delimiter = ',', default_values_t = default_allowed_capabilities(), value_parser = values::trimmed)]
    pub allowed_capabilities: Vec<String>,
    /// Volume types tenant pods may use (the Volume fields: `configMap`, `secret`, `emptyDir`, `nfs`, ...).
    /// `hostPath` is the pod policy's (`podPolicy.hostPath`) and `csi` takes its drivers from
    /// `--pod-allowed-csi-drivers`; `ephemeral` volumes are held to the rules of claims.
    #[arg(long = "pod-allowed-volume-types", env = "POD_ALLOWED_VOLUME_TYPES", value_delimiter = ',', default_values_t = default_allowed_volume_types(), value_parser = volume_type)]
    pub allowed_volume_types: Vec<String>,
    /// CSI drivers tenant pods may use in inline `csi` volumes (default none).
    #[arg(long = "pod-allowed-csi-drivers", env = "POD_ALLOWED_CSI_DRIVERS", value_delimiter = ',', value_parser = values::trimmed)]
    pub allowed_csi_drivers: Vec<String>,
    /// Let tenant containers keep `NET_RAW` (raw sockets: forged packets, ARP and ICMP tricks on the
    /// node's network), which container runtimes grant by default. `false` (the default) drops it from
    /// every tenant container that does not add it itself (which the capability policy judges).
    #[arg(long = "pod-allow-net-raw", env = "POD_ALLOW_NET_RAW", default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_net_raw: bool,
    /// RuntimeClasses a VirtualCluster's `spec.runtimeClassName` may force besides the published ones
    /// (default none). A forced class is used only when published or listed here, and its scheduling
    /// tolerations are judged like the pods' own.
    #[arg(long = "pod-forcible-runtime-classes", env = "POD_FORCIBLE_RUNTIME_CLASSES", value_delimiter = ',', value_parser = values::trimmed)]
    pub forcible_runtime_classes: Vec<String>,
}

impl PlatformPodPolicy {
    /// Without the empty entries a flag given empty (`--pod-allowed-capabilities=`) leaves.
    pub fn tidy(self) -> Self {
        Self {
            allowed_taints: values::listed(self.allowed_taints),
            grantable_taints: values::listed(self.grantable_taints),
            allowed_node_labels: values::listed(self.allowed_node_labels),
            grantable_node_labels: values::listed(self.grantable_node_labels),
            allowed_schedulers: values::listed(self.allowed_schedulers),
            allowed_capabilities: values::listed(self.allowed_capabilities),
            allowed_volume_types: values::listed(self.allowed_volume_types),
            allowed_csi_drivers: values::listed(self.allowed_csi_drivers),
            allow_net_raw: self.allow_net_raw,
            forcible_runtime_classes: values::listed(self.forcible_runtime_classes),
        }
    }
}

/// The flags' defaults, for the tests that widen or narrow one of them.
#[cfg(test)]
impl Default for PlatformPodPolicy {
    fn default() -> Self {
        values::defaults::<Self>().tidy()
    }
}

/// Taints of node conditions: the apiserver gives every pod tolerations of `not-ready` and `unreachable`,
/// and DaemonSet pods tolerate the rest.
fn default_allowed_taints() -> Vec<String> {
    [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/network-unavailable",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Well-known labels every node has, which vNodes show tenants.
fn default_allowed_node_labels() -> Vec<String> {
    [
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The volume types tenant pods may use by default: what a workload needs of its own objects and scratch
/// space, and claims (held to the platform's StorageClasses).
fn default_allowed_volume_types() -> Vec<String> {
    [
        "configMap",
        "secret",
        "projected",
        "downwardAPI",
        "emptyDir",
        "persistentVolumeClaim",
        "ephemeral",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The capabilities Pod Security `baseline` lets containers add.
fn default_allowed_capabilities() -> Vec<String> {
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A volume type tenant pods may be allowed by the platform's flag; empty is dropped by
/// [`PlatformPodPolicy::tidy`].
fn volume_type(value: &str) -> Result<String, String> {
    match value.trim() {
        "hostPath" => Err("hostPath is allowed per VirtualCluster (podPolicy.hostPath), not here".into()),
        "csi" => Err("csi volumes are allowed by driver (--pod-allowed-csi-drivers), not here".into()),
        type_ if !type_.is_empty() && !VOLUME_TYPES.contains(&type_) => Err(format!(
            "{type_:?} is not a volume type (one of {})",
            VOLUME_TYPES.join(", ")
        )),
        type_ => Ok(type_.to_owned()),
    }
}

/// Every volume type (the fields of a pod's Volume besides its name).
pub const VOLUME_TYPES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// What the config holds of these flags.
    struct Parsed {
        pod_security: PodSecurityLabels,
        pod_policy: PlatformPodPolicy,
        tenant_dns: Option<TenantDnsService>,
        pod_upstream_nameservers: Vec<String>,
    }

    fn parse(flags: &[&str]) -> Result<Parsed, String> {
        let flags = values::parse_without_env::<PodFlags>(flags)?;
        Ok(Parsed {
            pod_upstream_nameservers: flags.upstream_nameservers()?,
            tenant_dns: flags.tenant_dns(),
            pod_security: flags.security.labels(),
            pod_policy: flags.policy.tidy(),
        })
    }

    #[test]
    fn pod_security_and_pod_policy_flags_default_to_the_safe_levels() {
        let config = parse(&[]).expect("defaults");
        assert_eq!(
            config.pod_security,
            PodSecurityLabels {
                enforce: Some("baseline".into()),
                warn: Some("restricted".into()),
                audit: None,
                version: "latest".into(),
            }
        );
        assert_eq!(config.pod_policy.allowed_schedulers, ["default-scheduler"]);
        assert!(
            config.pod_policy.grantable_taints.is_empty()
                && config.pod_policy.grantable_node_labels.is_empty()
        );
        assert!(
            config
                .pod_policy
                .allowed_taints
                .iter()
                .all(|t| t.starts_with("node.kubernetes.io/"))
        );
        assert!(
            !config
                .pod_policy
                .allowed_capabilities
                .iter()
                .any(|c| c == "NET_RAW" || c == "SYS_ADMIN")
        );
        assert_eq!(
            config.pod_security.labels(),
            [
                ("pod-security.kubernetes.io/enforce", "baseline"),
                ("pod-security.kubernetes.io/enforce-version", "latest"),
                ("pod-security.kubernetes.io/warn", "restricted"),
                ("pod-security.kubernetes.io/warn-version", "latest"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );

        let config = parse(&[
            "--pod-security-enforce=restricted",
            "--pod-security-warn=",
            "--pod-security-version=v1.30",
            "--pod-allowed-capabilities=",
            "--pod-grantable-taints=dedicated,pool",
        ])
        .expect("set");
        assert_eq!(config.pod_security.enforce.as_deref(), Some("restricted"));
        assert_eq!(config.pod_security.warn, None);
        assert!(config.pod_policy.allowed_capabilities.is_empty());
        assert_eq!(config.pod_policy.grantable_taints, ["dedicated", "pool"]);

        for bad in ["--pod-security-enforce=none", "--pod-security-version=1.30"] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn tenant_dns_flags_name_a_service_and_upstream_addresses() {
        let config = parse(&[]).expect("defaults");
        assert_eq!(config.tenant_dns, None);
        assert!(config.pod_upstream_nameservers.is_empty());
        let config = parse(&[
            "--tenant-dns-service=vc-system/vc-dns",
            "--pod-upstream-nameservers=10.0.0.2, fd00::53",
        ])
        .expect("flags");
        assert_eq!(
            config.tenant_dns,
            Some(TenantDnsService::new("vc-system", "vc-dns"))
        );
        assert_eq!(config.pod_upstream_nameservers, ["10.0.0.2", "fd00::53"]);
        assert!(parse(&["--tenant-dns-service=vc-dns"]).is_err());
        assert!(parse(&["--pod-upstream-nameservers=dns.example"]).is_err());
        assert!(parse(&["--pod-upstream-nameservers=1.1.1.1,1.0.0.1,8.8.8.8,8.8.4.4"]).is_err());
    }
}
