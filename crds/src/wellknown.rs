//! Names that cross a process boundary: written by one component and read by another, by the platform's
//! people and tools, or by tenants (and the original VirtualCluster project's, which they keep). What a
//! component alone writes and reads back stays in that component.
//!
//! Label and annotation keys are the original project's, so super-cluster objects look the same to tooling
//! written for it.

// Labels on super-cluster objects synced from a tenant.
/// Label: name of the VirtualCluster a super object belongs to.
pub const LABEL_VC_NAME: &str = "tenancy.x-k8s.io/vcname";
/// Label: namespace of the VirtualCluster a super object belongs to.
pub const LABEL_VC_NAMESPACE: &str = "tenancy.x-k8s.io/vcnamespace";
/// Label on super pods (and annotation on every synced object): the tenant's cluster key.
pub const LABEL_CLUSTER: &str = "tenancy.x-k8s.io/cluster";
/// Label on tenant nodes that stand for a super node (vNodes).
pub const LABEL_VIRTUAL_NODE: &str = "tenancy.x-k8s.io/virtualnode";
/// Label on super StorageClasses and PriorityClasses that every tenant should see.
pub const LABEL_SUPER_PUBLIC: &str = "tenancy.x-k8s.io/super.public";
/// Label on a VirtualCluster: an extra DNS name for the tenant apiserver certificate.
pub const LABEL_EXTERNAL_APISERVER_DOMAIN: &str = "tenancy.x-k8s.io/external-apiserver-domain";
/// Label on super-cluster objects vc-manager creates for a tenant control plane (value `vc-manager`).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`] on a tenant control plane's objects.
pub const MANAGED_BY_VC_MANAGER: &str = "vc-manager";
/// Label on a tenant control plane's objects: which component (`etcd`, `apiserver`,
/// `controller-manager`). The Endpoints controller copies a Service's labels to its Endpoints.
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Value of [`LABEL_COMPONENT`] on the tenant apiserver's StatefulSet, pods and Service.
pub const COMPONENT_APISERVER: &str = "apiserver";

// Annotations on super-cluster objects synced from a tenant.
/// Annotation: the tenant's cluster key.
pub const ANNOTATION_CLUSTER: &str = "tenancy.x-k8s.io/cluster";
/// Annotation: uid of the tenant object a super object was made from.
pub const ANNOTATION_UID: &str = "tenancy.x-k8s.io/uid";
/// Annotation: the tenant namespace of a super object.
pub const ANNOTATION_NAMESPACE: &str = "tenancy.x-k8s.io/namespace";
/// Annotation: name of the owning VirtualCluster.
pub const ANNOTATION_VC_NAME: &str = "tenancy.x-k8s.io/vcname";
/// Annotation: namespace of the owning VirtualCluster.
pub const ANNOTATION_VC_NAMESPACE: &str = "tenancy.x-k8s.io/vcnamespace";
/// Annotation: uid of the owning VirtualCluster.
pub const ANNOTATION_VC_UID: &str = "tenancy.x-k8s.io/vcuid";
/// Annotation: the tenant object's ownerReferences, as JSON.
pub const ANNOTATION_OWNER_REFERENCES: &str = "tenancy.x-k8s.io/ownerReferences";
/// Annotation on a tenant's root namespace in the super cluster.
pub const ANNOTATION_ROOT_NAMESPACE: &str = "tenancy.x-k8s.io/vcrootns";
/// Annotation on a tenant Service: its ClusterIP in the super cluster.
pub const ANNOTATION_SUPER_CLUSTER_IP: &str = "transparency.tenancy.x-k8s.io/clusterIP";
/// Annotation on a super Service: its ClusterIP in the tenant.
pub const ANNOTATION_TENANT_CLUSTER_IP: &str = "tenancy.x-k8s.io/clusterIP";
/// Annotation on the super-cluster stub of a tenant ExternalName Service (a selector-less headless Service
/// that nothing in the super cluster follows): the validated target, which only vc-dns reads and serves to
/// the tenant's pods as the Service name's CNAME.
pub const ANNOTATION_EXTERNAL_NAME: &str = "tenancy.x-k8s.io/external-name";
/// Annotation on a super object: the tenant's labels and annotations left off it because another field
/// manager of the super cluster owns them (`label:KEY` and `annotation:KEY`, comma-separated). The
/// syncer never forces them, and counts the object in sync without them until the tenant object changes;
/// the platform reads it to see what a tenant asked for.
pub const ANNOTATION_WITHHELD: &str = "tenancy.x-k8s.io/withheld-keys";
/// Label on tenant objects the syncer creates from super objects (PersistentVolumes, StorageClasses,
/// PriorityClasses, CRDs), so it only ever touches its own; tenants see it.
pub const LABEL_SYNCED_FROM_SUPER: &str = "tenancy.x-k8s.io/synced-from-super";
/// A label no node carries: the super copy of a pod whose selection matches no vNode requires it, so the
/// super scheduler leaves the pod pending.
pub const LABEL_NO_MATCHING_VNODE: &str = "tenancy.x-k8s.io/no-matching-vnode";
/// Label on every Lease of the sharded syncer; its value is the Lease's role (`member`, `tenant`,
/// `duties`). The platform lists the syncer's Leases by it.
pub const LABEL_SYNCER_LEASE: &str = "tenancy.x-k8s.io/syncer-lease";
/// Annotation on a tenant pod: keep its DNS policy as is.
pub const ANNOTATION_DISABLE_DNS_MUTATION: &str = "tenancy.x-k8s.io/disable.dnsPolicyMutation";

// Objects the syncer alone keeps in a tenant's super namespaces, and what it reads of tenants, by name.
/// Label on the Secrets holding tenant pods' service-account tokens: they are cached apart, metadata only.
pub const LABEL_POD_TOKEN: &str = "tenancy.x-k8s.io/pod-token";
/// Annotation on a pod's token Secret: the pod it serves.
pub const ANNOTATION_TOKEN_FOR_POD: &str = "tenancy.x-k8s.io/token-for-pod";
/// Annotation on vn-agent's RoleBinding in a super namespace: the tenant (cluster key) it serves.
pub const ANNOTATION_GRANTS_CLUSTER: &str = "tenancy.x-k8s.io/grants-cluster";
/// Annotation on vn-agent's RoleBinding in a super namespace: the tenant namespace it serves.
pub const ANNOTATION_GRANTS_NAMESPACE: &str = "tenancy.x-k8s.io/grants-namespace";
/// The ConfigMap every namespace gets from the controller-manager: the cluster's CA. The super cluster
/// publishes its own under the same name, so the syncer never copies a tenant's.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

// Adopt mode, as the original project spelled it.
/// VirtualCluster annotation holding a base64-encoded admin kubeconfig.
pub const ANNOTATION_ADMIN_KUBECONFIG: &str = "tenancy.x-k8s.io/admin-kubeconfig";
/// VirtualCluster annotation naming a Secret (key `value`) with the admin kubeconfig.
pub const ANNOTATION_SECRET_ADMIN_KUBECONFIG: &str = "tenancy.x-k8s.io/secret.admin-kubeconfig";
/// Label a Secret must carry, with the VirtualCluster's name as its value, before an adopted
/// VirtualCluster of its namespace may use it as its kubeconfig (`spec.kubeconfigSecretRef`, or the
/// original project's Secret annotation). Whoever can edit VirtualClusters but not Secrets cannot point
/// one at a Secret that was not meant for it.
pub const LABEL_KUBECONFIG_FOR: &str = "tenancy.x-k8s.io/kubeconfig-for";
/// Reason of the refusal of a kubeconfig Secret not meant for the VirtualCluster naming it.
pub const REASON_KUBECONFIG_SECRET_REFUSED: &str = "KubeconfigSecretRefused";

/// VirtualCluster annotation, written by the syncer when it first attaches the tenant: the uid of the
/// tenant's `kube-system` namespace. A tenant apiserver whose `kube-system` has another uid is another
/// cluster (or the same one with its etcd wiped); the syncer then stops with `TenantIdentityChanged`
/// instead of deleting the super objects the earlier tenant made. Removing it accepts the new tenant.
pub const ANNOTATION_TENANT_IDENTITY: &str = "tenancy.x-k8s.io/tenant-kube-system-uid";

// Secrets in a tenant's root namespace that more than one component reads.
/// Admin kubeconfig of a provisioned tenant; the data key is the Secret name.
pub const SECRET_ADMIN_KUBECONFIG: &str = "admin-kubeconfig";
/// CA (`ca.crt`) and client certificate (`tls.crt`, `tls.key`) a tenant apiserver presents to vn-agent.
pub const SECRET_KUBELET_CLIENT: &str = "kubelet-client";
/// Optional, for adopted tenants: the adopted apiserver's client CA (`tls.crt`, `tls.key`), which an
/// operator stores so that `kubectl vc kubeconfig --user` can mint per-user certificates for it.
pub const SECRET_ADOPTED_CLIENT_CA: &str = "client-ca";
/// Key of the kubelet-client CA certificate in [`SECRET_KUBELET_CLIENT`].
pub const KUBELET_CLIENT_CA_KEY: &str = "ca.crt";

/// Default port of vn-agent, which vNodes advertise as their kubelet port.
pub const DEFAULT_VN_AGENT_PORT: u16 = 10550;

/// Label on the `kubelet-client` Secret in a tenant's root namespace, which vn-agent watches.
pub const LABEL_KUBELET_CLIENT: &str = "tenancy.x-k8s.io/kubelet-client";

// Restoring a snapshot (`kubectl vc snapshot restore`).
/// On a VirtualCluster being restored from a snapshot: how far the restore has got. vc-manager holds the
/// parts of the control plane the restore still has to feed: with [`RESTORE_STAGE_PKI`] it only creates the
/// root namespace (the snapshot's certificate authorities and service-account key go in before vc-manager
/// would generate new ones); with [`RESTORE_STAGE_ETCD`] it provisions everything up to etcd and holds the
/// apiserver and controller-manager until the snapshot's keys are in etcd. Without it, nothing is held.
pub const ANNOTATION_RESTORE: &str = "tenancy.x-k8s.io/restore-from-snapshot";
/// [`ANNOTATION_RESTORE`]: waiting for the snapshot's certificate authorities.
pub const RESTORE_STAGE_PKI: &str = "pki";
/// [`ANNOTATION_RESTORE`]: waiting for the snapshot's etcd keys.
pub const RESTORE_STAGE_ETCD: &str = "etcd";
/// Set on a VirtualCluster by `kubectl vc snapshot create NAME --to <store>`: `<store> <RFC 3339 time>`, a
/// snapshot the scheduler serving that store takes now (at most one a minute per tenant).
pub const ANNOTATION_SNAPSHOT_REQUESTED: &str = "tenancy.x-k8s.io/snapshot-requested";

// Finalizers.
/// On a VirtualCluster: vc-manager removes its root namespace and the syncer's tenant namespaces first.
pub const FINALIZER_VIRTUAL_CLUSTER: &str = "tenancy.x-k8s.io/virtualcluster";
/// On a ClusterVersion: it is not deleted while VirtualClusters use it.
pub const FINALIZER_CLUSTER_VERSION: &str = "tenancy.x-k8s.io/clusterversion-in-use";

// Server-side apply field managers, one per component.
/// vc-manager's field manager.
pub const FIELD_MANAGER_VC_MANAGER: &str = "vc-manager";
/// The syncer's field manager.
pub const FIELD_MANAGER_SYNCER: &str = "vc-syncer";
/// The syncer's field manager of `status.usage` (its own, so that the TenantSynced condition and the usage
/// figures, applied apart, never remove each other).
pub const FIELD_MANAGER_SYNCER_USAGE: &str = "vc-syncer-usage";
/// The snapshot scheduler's field manager of `status.snapshots`, and the controller its Events name.
pub const FIELD_MANAGER_SNAPSHOTS: &str = "vc-snapshots";
/// `kubectl vc`'s field manager (`create -f`, `snapshot restore`).
pub const FIELD_MANAGER_KUBECTL_VC: &str = "kubectl-vc";
/// The syncer's field manager of `status.attachBackoff` (its own, so that applying it never removes the
/// conditions, and applying it without the field removes it).
pub const FIELD_MANAGER_SYNCER_BACKOFF: &str = "vc-syncer-backoff";
/// Label on the syncer's attach journals (ConfigMaps in its namespace, one per replica).
pub const LABEL_SYNCER_JOURNAL: &str = "tenancy.x-k8s.io/syncer-journal";

// VirtualCluster condition types.
/// vc-manager: certificates and kubeconfigs are in place and valid.
pub const CONDITION_PKI_READY: &str = "PKIReady";
/// vc-manager: the etcd StatefulSet is ready.
pub const CONDITION_ETCD_READY: &str = "EtcdReady";
/// vc-manager: the apiserver StatefulSet is ready (adopt mode: the adopted apiserver answers).
pub const CONDITION_APISERVER_READY: &str = "APIServerReady";
/// vc-manager: the controller-manager StatefulSet is ready.
pub const CONDITION_CONTROLLER_MANAGER_READY: &str = "ControllerManagerReady";
/// vc-manager: the tenant control plane is usable.
pub const CONDITION_READY: &str = "Ready";
/// syncer: the tenant is attached and syncing (False with a reason when unreachable).
pub const CONDITION_TENANT_SYNCED: &str = "TenantSynced";
/// Condition: the tenant is paused (`spec.paused`); its transition time says since when, or since when it runs again.
pub const CONDITION_PAUSED: &str = "Paused";
/// The conditions vc-manager owns on a provisioned VirtualCluster, in the order a control plane comes up
/// (`kubectl vc describe` shows them so).
pub const NATIVE_CONDITIONS: [&str; 5] = [
    CONDITION_PKI_READY,
    CONDITION_ETCD_READY,
    CONDITION_APISERVER_READY,
    CONDITION_CONTROLLER_MANAGER_READY,
    CONDITION_READY,
];
/// The conditions vc-manager owns on an adopted VirtualCluster.
pub const ADOPTED_CONDITIONS: [&str; 3] = [CONDITION_PKI_READY, CONDITION_APISERVER_READY, CONDITION_READY];

/// Annotation on control-plane StatefulSets and Services: the ClusterVersion they were rendered from.
pub const ANNOTATION_CLUSTER_VERSION: &str = "tenancy.x-k8s.io/cluster-version";
/// Annotation on control-plane StatefulSets and Services: that ClusterVersion's `metadata.generation`.
pub const ANNOTATION_CLUSTER_VERSION_GENERATION: &str = "tenancy.x-k8s.io/cluster-version-generation";

/// Label the apiserver sets on every namespace to the namespace's own name.
pub const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
