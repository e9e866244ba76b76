//! Who a super-cluster object belongs to, and the metadata that says so.
//!
//! Every object the syncer writes carries the original project's labels and annotations (see
//! `docs/architecture.md`). Ownership is decided by annotations, never by parsing names: the namespace
//! shortening rule is not injective.

use std::collections::BTreeMap;

use crds::wellknown::{
    ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_OWNER_REFERENCES, ANNOTATION_UID,
    ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE, ANNOTATION_VC_UID, LABEL_CLUSTER, LABEL_VC_NAME,
    LABEL_VC_NAMESPACE,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Annotation on super objects: a hash of everything the syncer applied, so that an object already in sync
/// is recognised (also after a restart) without comparing fields the apiserver defaults.
pub const ANNOTATION_SYNC_HASH: &str = "tenancy.x-k8s.io/sync-hash";

/// Key prefixes a tenant may not set on super objects: they carry identity.
const RESERVED_PREFIXES: &[&str] = &["tenancy.x-k8s.io/", "transparency.tenancy.x-k8s.io/"];

/// Label every namespace carries with its own name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Namespace labels that configure Pod Security admission.
const POD_SECURITY_PREFIX: &str = "pod-security.kubernetes.io/";

/// Annotations never copied down: large, and meaningless in the super cluster.
const DROPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// Labels never copied down. A tenant apiserver marks its own `kubernetes` Endpoints `skip-mirror` because
/// it writes their EndpointSlices itself; in the super cluster nothing would, and kube-proxy, which reads
/// only EndpointSlices, would have no endpoint for the tenant's apiserver.
const DROPPED_LABELS: &[&str] = &["endpointslice.kubernetes.io/skip-mirror"];

/// The VirtualCluster a tenant object belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TenantIdentity {
    /// `crds::naming::cluster_key`.
    pub cluster_key: String,
    /// VirtualCluster name.
    pub vc_name: String,
    /// VirtualCluster namespace.
    pub vc_namespace: String,
    /// VirtualCluster uid.
    pub vc_uid: String,
}

impl TenantIdentity {
    /// The super namespace of a tenant namespace.
    pub fn super_namespace(&self, tenant_namespace: &str) -> String {
        crds::naming::super_namespace(&self.cluster_key, tenant_namespace)
    }

    /// `namespace/name` of the VirtualCluster, for logs and metric labels.
    pub fn vc_ref(&self) -> String {
        format!("{}/{}", self.vc_namespace, self.vc_name)
    }
}

fn has_prefix(key: &str, prefixes: &[String]) -> bool {
    prefixes
        .iter()
        .any(|p| !p.is_empty() && key.starts_with(p.as_str()))
}

fn is_reserved(key: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// The metadata of the super copy of a tenant object: same name, mapped namespace, the tenant's labels and
/// annotations except reserved and opaque ones, and the identity labels and annotations.
pub fn super_metadata(
    tenant: &ObjectMeta,
    identity: &TenantIdentity,
    opaque_prefixes: &[String],
    super_namespace: Option<String>,
    cluster_label: bool,
) -> ObjectMeta {
    let keep = |key: &String| !is_reserved(key) && !has_prefix(key, opaque_prefixes);
    let mut labels: BTreeMap<String, String> = tenant
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| keep(k) && !DROPPED_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(LABEL_VC_NAME.to_owned(), identity.vc_name.clone());
    labels.insert(LABEL_VC_NAMESPACE.to_owned(), identity.vc_namespace.clone());
    if cluster_label {
        labels.insert(LABEL_CLUSTER.to_owned(), identity.cluster_key.clone());
    }
    let mut annotations: BTreeMap<String, String> = tenant
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| keep(k) && !DROPPED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(ANNOTATION_CLUSTER.to_owned(), identity.cluster_key.clone());
    annotations.insert(ANNOTATION_UID.to_owned(), tenant.uid.clone().unwrap_or_default());
    annotations.insert(ANNOTATION_VC_NAME.to_owned(), identity.vc_name.clone());
    annotations.insert(ANNOTATION_VC_NAMESPACE.to_owned(), identity.vc_namespace.clone());
    if let Some(namespace) = &tenant.namespace {
        annotations.insert(ANNOTATION_NAMESPACE.to_owned(), namespace.clone());
    }
    if let Some(owners) = tenant.owner_references.as_ref().filter(|o| !o.is_empty()) {
        annotations.insert(
            ANNOTATION_OWNER_REFERENCES.to_owned(),
            serde_json::to_string(owners).unwrap_or_default(),
        );
    }
    ObjectMeta {
        name: tenant.name.clone(),
        namespace: super_namespace,
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    }
}

/// Metadata of a super namespace: like [`super_metadata`], plus the VirtualCluster's uid.
pub fn super_namespace_metadata(
    tenant: &ObjectMeta,
    identity: &TenantIdentity,
    opaque_prefixes: &[String],
) -> ObjectMeta {
    let mut meta = super_metadata(tenant, identity, opaque_prefixes, None, true);
    meta.name = tenant.name.as_deref().map(|n| identity.super_namespace(n));
    if let Some(labels) = meta.labels.as_mut() {
        // The apiserver sets this label to the namespace's own name; the tenant's value cannot stay.
        labels.remove(NAMESPACE_NAME_LABEL);
        // Pod Security admission reads these from the super namespace: a tenant must not relax it.
        labels.retain(|key, _| !key.starts_with(POD_SECURITY_PREFIX));
    }
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(ANNOTATION_VC_UID.to_owned(), identity.vc_uid.clone());
    annotations.insert(
        ANNOTATION_NAMESPACE.to_owned(),
        tenant.name.clone().unwrap_or_default(),
    );
    meta
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The cluster key a super object belongs to.
pub fn owner_cluster(meta: &ObjectMeta) -> Option<&str> {
    annotation(meta, ANNOTATION_CLUSTER)
}

/// The uid of the tenant object a super object was made from.
pub fn tenant_uid(meta: &ObjectMeta) -> Option<&str> {
    annotation(meta, ANNOTATION_UID)
}

/// The tenant namespace of a super object (for a super namespace: the tenant namespace it mirrors).
pub fn tenant_namespace(meta: &ObjectMeta) -> Option<&str> {
    annotation(meta, ANNOTATION_NAMESPACE)
}

/// The sync hash recorded on a super object.
pub fn recorded_hash(meta: &ObjectMeta) -> Option<&str> {
    annotation(meta, ANNOTATION_SYNC_HASH)
}

/// Whether a super object belongs to the tenant with this cluster key.
pub fn belongs_to(meta: &ObjectMeta, cluster_key: &str) -> bool {
    owner_cluster(meta) == Some(cluster_key)
}

/// Hash of an object to apply (without its hash annotation): 16 hex digits of SHA-256 over its JSON.
/// k8s-openapi serializes maps in key order, so equal objects hash equally across restarts.
pub fn sync_hash<T: Serialize>(object: &T) -> String {
    let json = serde_json::to_vec(object).unwrap_or_default();
    hex::encode(&Sha256::digest(&json)[..8])
}

/// Sets the sync hash annotation of an object to apply, computed over everything else in it.
pub fn stamp<T: Serialize>(object: &mut T, meta: impl Fn(&mut T) -> &mut ObjectMeta) -> String {
    meta(object)
        .annotations
        .get_or_insert_with(Default::default)
        .remove(ANNOTATION_SYNC_HASH);
    let hash = sync_hash(object);
    meta(object)
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_SYNC_HASH.to_owned(), hash.clone());
    hash
}

/// Whether every label and annotation of `desired` is on `actual` with the same value. Extra keys on
/// `actual` (added by super-cluster controllers) are fine; keys the tenant removed change the sync hash.
pub fn metadata_covers(desired: &ObjectMeta, actual: &ObjectMeta) -> bool {
    let covers = |want: &Option<BTreeMap<String, String>>, have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    covers(&desired.labels, &actual.labels) && covers(&desired.annotations, &actual.annotations)
}

/// Labels and annotations of a super object that the tenant should see: those under its transparent
/// prefixes.
pub fn transparent_metadata(
    super_meta: &ObjectMeta,
    prefixes: &[String],
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let pick = |map: &Option<BTreeMap<String, String>>| {
        map.iter()
            .flatten()
            .filter(|(k, _)| has_prefix(k, prefixes) && !is_reserved(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    (pick(&super_meta.labels), pick(&super_meta.annotations))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn identity() -> TenantIdentity {
        TenantIdentity {
            cluster_key: "default-abc123-team".into(),
            vc_name: "team".into(),
            vc_namespace: "default".into(),
            vc_uid: "vc-uid".into(),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn the_skip_mirror_label_stays_behind() {
        let tenant = ObjectMeta {
            name: Some("kubernetes".into()),
            namespace: Some("default".into()),
            labels: map(&[("endpointslice.kubernetes.io/skip-mirror", "true"), ("app", "x")]),
            ..Default::default()
        };
        let meta = super_metadata(&tenant, &identity(), &[], Some("ns".into()), false);
        let labels = meta.labels.expect("labels");
        assert!(!labels.contains_key("endpointslice.kubernetes.io/skip-mirror"));
        assert!(labels.contains_key("app"));
    }

    #[test]
    fn super_metadata_carries_identity_and_filters_keys() {
        let tenant = ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            uid: Some("pod-uid".into()),
            resource_version: Some("42".into()),
            labels: map(&[
                ("app", "web"),
                ("tenancy.x-k8s.io/cluster", "forged"),
                ("super.example/x", "1"),
            ]),
            annotations: map(&[
                ("note", "hi"),
                ("kubectl.kubernetes.io/last-applied-configuration", "{...}"),
                ("tenancy.x-k8s.io/uid", "forged"),
            ]),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web-1".into(),
                uid: "rs-uid".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let meta = super_metadata(
            &tenant,
            &identity(),
            &["super.example/".into()],
            Some("default-abc123-team-shop".into()),
            true,
        );
        assert_eq!(meta.name.as_deref(), Some("web"));
        assert_eq!(meta.namespace.as_deref(), Some("default-abc123-team-shop"));
        assert!(meta.uid.is_none() && meta.resource_version.is_none() && meta.owner_references.is_none());
        let labels = meta.labels.expect("labels");
        assert_eq!(labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(
            labels.get(LABEL_CLUSTER).map(String::as_str),
            Some("default-abc123-team")
        );
        assert!(!labels.contains_key("super.example/x"), "opaque prefix");
        assert_eq!(labels.get(LABEL_VC_NAME).map(String::as_str), Some("team"));
        let annotations = meta.annotations.expect("annotations");
        assert_eq!(
            annotations.get(ANNOTATION_UID).map(String::as_str),
            Some("pod-uid")
        );
        assert_eq!(
            annotations.get(ANNOTATION_NAMESPACE).map(String::as_str),
            Some("shop")
        );
        assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        assert!(annotations[ANNOTATION_OWNER_REFERENCES].contains("rs-uid"));
        assert_eq!(annotations.get("note").map(String::as_str), Some("hi"));
    }

    #[test]
    fn namespaces_map_and_record_the_tenant_namespace() {
        let tenant = ObjectMeta {
            name: Some("shop".into()),
            uid: Some("ns-uid".into()),
            ..Default::default()
        };
        let meta = super_namespace_metadata(&tenant, &identity(), &[]);
        assert_eq!(meta.name.as_deref(), Some("default-abc123-team-shop"));
        assert_eq!(tenant_namespace(&meta), Some("shop"));
        assert!(belongs_to(&meta, "default-abc123-team"));
        assert!(!belongs_to(&meta, "other"));
    }

    #[test]
    fn tenants_cannot_set_pod_security_labels_on_super_namespaces() {
        let tenant = ObjectMeta {
            name: Some("shop".into()),
            labels: map(&[
                ("pod-security.kubernetes.io/enforce", "privileged"),
                ("kubernetes.io/metadata.name", "shop"),
                ("team", "a"),
            ]),
            ..Default::default()
        };
        let labels = super_namespace_metadata(&tenant, &identity(), &[])
            .labels
            .expect("labels");
        assert!(!labels.contains_key("pod-security.kubernetes.io/enforce"));
        assert!(!labels.contains_key("kubernetes.io/metadata.name"));
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    }

    #[test]
    fn hash_is_stable_and_ignores_the_previous_hash() {
        let mut a = ObjectMeta {
            name: Some("x".into()),
            ..Default::default()
        };
        let first = stamp(&mut a, |m| m);
        let second = stamp(&mut a, |m| m);
        assert_eq!(first, second);
        assert_eq!(recorded_hash(&a), Some(first.as_str()));
        let mut b = ObjectMeta {
            name: Some("y".into()),
            ..Default::default()
        };
        assert_ne!(stamp(&mut b, |m| m), first);
    }

    #[test]
    fn covering_tolerates_extra_keys_but_not_changed_values() {
        let desired = ObjectMeta {
            labels: map(&[("a", "1")]),
            ..Default::default()
        };
        let extra = ObjectMeta {
            labels: map(&[("a", "1"), ("super", "x")]),
            ..Default::default()
        };
        let changed = ObjectMeta {
            labels: map(&[("a", "2")]),
            ..Default::default()
        };
        assert!(metadata_covers(&desired, &extra));
        assert!(!metadata_covers(&desired, &changed));
    }

    #[test]
    fn transparent_prefixes_select_what_goes_up() {
        let meta = ObjectMeta {
            labels: map(&[("topology.example/zone", "a"), ("app", "x")]),
            annotations: map(&[("topology.example/rack", "7"), ("tenancy.x-k8s.io/uid", "u")]),
            ..Default::default()
        };
        let (labels, annotations) =
            transparent_metadata(&meta, &["topology.example/".into(), "tenancy.x-k8s.io/".into()]);
        assert_eq!(labels.keys().collect::<Vec<_>>(), ["topology.example/zone"]);
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["topology.example/rack"]);
    }
}
