//! Who a super-cluster object belongs to, and the metadata that says so.
//!
//! Every object the syncer writes carries the original project's labels and annotations (see
//! `docs/architecture.md`). Ownership is decided by annotations, never by parsing names: the namespace
//! shortening rule is not injective.

use std::collections::BTreeMap;

pub use crds::TenantIdentity;
use crds::wellknown::{
    ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_OWNER_REFERENCES, ANNOTATION_UID,
    ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE, ANNOTATION_VC_UID, LABEL_CLUSTER, LABEL_VC_NAME,
    LABEL_VC_NAMESPACE,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::tags::Tagged;
use sha2::{Digest, Sha256};

/// Annotation on super objects: a hash of everything the syncer applied, so that an object already in sync
/// is recognised (also after a restart) without comparing fields the apiserver defaults.
pub const ANNOTATION_SYNC_HASH: &str = "tenancy.x-k8s.io/sync-hash";

/// Key prefixes a tenant may not set on super objects: they carry identity.
const RESERVED_PREFIXES: &[&str] = &["tenancy.x-k8s.io/", "transparency.tenancy.x-k8s.io/"];

/// Label and annotation prefixes the platform owns: never copied down from a tenant, whatever the flags
/// and VirtualClusters add. Each names something a super-cluster controller acts on with the super
/// cluster's authority: ingress and load-balancer controllers (configuration snippets run in a shared
/// proxy, annotations pick addresses, subnets and certificates), DNS controllers (records in the
/// platform's zones), the scheduler's namespace node selectors and default tolerations, and Pod Security
/// admission.
pub const DEFAULT_OPAQUE_PREFIXES: &[&str] = &[
    "nginx.ingress.kubernetes.io/",
    "ingress.kubernetes.io/",
    "alb.ingress.kubernetes.io/",
    "traefik.ingress.kubernetes.io/",
    "haproxy.org/",
    "konghq.com/",
    "projectcontour.io/",
    "service.beta.kubernetes.io/",
    "service.kubernetes.io/",
    "cloud.google.com/",
    "networking.gke.io/",
    "metallb.universe.tf/",
    "metallb.io/",
    "external-dns.alpha.kubernetes.io/",
    "scheduler.alpha.kubernetes.io/",
    "pod-security.kubernetes.io/",
];

/// Values of `app.kubernetes.io/managed-by` that claim an object for our components; a tenant's object
/// claiming one would look like ours to whoever selects on it.
const OUR_MANAGERS: &[&str] = &[
    crds::wellknown::FIELD_MANAGER_SYNCER,
    crds::wellknown::FIELD_MANAGER_VC_MANAGER,
    "vn-agent",
    "virtualcluster",
];

/// Annotation on a super object: the tenant's labels and annotations left off it because another field
/// manager of the super cluster owns them (`label:KEY` and `annotation:KEY`, comma-separated). The
/// syncer never forces them, and counts the object in sync without them until the tenant object changes.
pub const ANNOTATION_WITHHELD: &str = "tenancy.x-k8s.io/withheld-keys";

/// Namespace labels that configure Pod Security admission.
const POD_SECURITY_PREFIX: &str = "pod-security.kubernetes.io/";

/// Annotations never copied down: large, and meaningless in the super cluster.
const DROPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// Labels never copied down. A tenant apiserver marks its own `kubernetes` Endpoints `skip-mirror` because
/// it writes their EndpointSlices itself; in the super cluster nothing would, and kube-proxy, which reads
/// only EndpointSlices, would have no endpoint for the tenant's apiserver.
const DROPPED_LABELS: &[&str] = &["endpointslice.kubernetes.io/skip-mirror"];

fn has_prefix(key: &str, prefixes: &[String]) -> bool {
    prefixes
        .iter()
        .any(|p| !p.is_empty() && key.starts_with(p.as_str()))
}

fn is_reserved(key: &str) -> bool {
    RESERVED_PREFIXES
        .iter()
        .chain(DEFAULT_OPAQUE_PREFIXES)
        .any(|p| key.starts_with(p))
}

/// Whether a tenant label claims the object for one of our components.
fn claims_our_component(key: &str, value: &str) -> bool {
    key == crds::wellknown::LABEL_MANAGED_BY && OUR_MANAGERS.contains(&value)
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
        .filter(|(k, v)| keep(k) && !DROPPED_LABELS.contains(&k.as_str()) && !claims_our_component(k, v))
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
        labels.remove(crds::wellknown::LABEL_NAMESPACE_NAME);
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

/// The cluster key of the tenant a super object belongs to (as `crds::tenant::owner_cluster`, from either
/// kind of metadata).
pub fn owner_cluster(meta: &impl Tagged) -> Option<&str> {
    meta.annotation(ANNOTATION_CLUSTER)
}

/// Whether a super object belongs to the tenant with this cluster key.
pub fn belongs_to(meta: &impl Tagged, cluster_key: &str) -> bool {
    owner_cluster(meta) == Some(cluster_key)
}

/// The uid of the tenant object a super object was made from.
pub fn tenant_uid(meta: &impl Tagged) -> Option<&str> {
    meta.annotation(ANNOTATION_UID)
}

/// The tenant namespace of a super object (for a super namespace: the tenant namespace it mirrors).
pub fn tenant_namespace(meta: &impl Tagged) -> Option<&str> {
    meta.annotation(ANNOTATION_NAMESPACE)
}

/// The sync hash recorded on a super object.
pub fn recorded_hash(meta: &impl Tagged) -> Option<&str> {
    meta.annotation(ANNOTATION_SYNC_HASH)
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

/// Whether every label and annotation of `desired` is on `actual` with the same value, except those
/// `actual` records as withheld ([`ANNOTATION_WITHHELD`]). Extra keys on `actual` (added by super-cluster
/// controllers) are fine; keys the tenant removed change the sync hash.
pub fn metadata_covers(desired: &ObjectMeta, actual: &impl Tagged) -> bool {
    let withheld = withheld_keys(actual);
    let is_withheld = |kind: &str, key: &str| withheld.contains(&format!("{kind}:{key}"));
    desired
        .each_label()
        .all(|(k, v)| actual.label(&k) == Some(v) || is_withheld("label", &k))
        && desired
            .each_annotation()
            .all(|(k, v)| actual.annotation(&k) == Some(v) || is_withheld("annotation", &k))
}

/// The keys a super object records as withheld, as `label:KEY` and `annotation:KEY`.
pub fn withheld_keys(meta: &impl Tagged) -> Vec<String> {
    meta.annotation(ANNOTATION_WITHHELD)
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The withheld-key form (`label:KEY` / `annotation:KEY`) of a field path of an apply conflict, when the
/// field is a label or annotation the tenant chose; `None` for any other field, identity keys included.
pub fn withholdable_key(field: &str) -> Option<String> {
    if let Some(key) = field.strip_prefix(".metadata.labels.") {
        return (!is_reserved(key)).then(|| format!("label:{key}"));
    }
    let key = field.strip_prefix(".metadata.annotations.")?;
    (!is_reserved(key)).then(|| format!("annotation:{key}"))
}

/// Takes the given labels and annotations (as `label:KEY` / `annotation:KEY`) off metadata to apply and
/// records them as withheld; the sync hash stays that of the full object, so the object counts as in sync
/// until the tenant changes it.
pub fn withhold(meta: &mut ObjectMeta, keys: &[String]) {
    for key in keys {
        if let Some(label) = key.strip_prefix("label:") {
            if let Some(labels) = meta.labels.as_mut() {
                labels.remove(label);
            }
        } else if let Some(annotation) = key.strip_prefix("annotation:")
            && let Some(annotations) = meta.annotations.as_mut()
        {
            annotations.remove(annotation);
        }
    }
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_WITHHELD.to_owned(), keys.join(","));
}

/// Labels and annotations of a super object that the tenant should see: those under its transparent
/// prefixes.
pub fn transparent_metadata(
    super_meta: &impl Tagged,
    prefixes: &[String],
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let picked = |k: &str| has_prefix(k, prefixes) && !is_reserved(k);
    let pick = |pairs: &mut dyn Iterator<Item = (std::borrow::Cow<'_, str>, &str)>| {
        pairs
            .filter(|(k, _)| picked(k))
            .map(|(k, v)| (k.into_owned(), v.to_owned()))
            .collect()
    };
    (
        pick(&mut super_meta.each_label()),
        pick(&mut super_meta.each_annotation()),
    )
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
    fn platform_owned_keys_are_never_copied_down() {
        let tenant = ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            labels: map(&[
                ("app.kubernetes.io/managed-by", "vc-manager"),
                ("team", "a"),
                ("pod-security.kubernetes.io/enforce", "privileged"),
            ]),
            annotations: map(&[
                ("nginx.ingress.kubernetes.io/configuration-snippet", "lua..."),
                ("service.beta.kubernetes.io/aws-load-balancer-internal", "true"),
                ("scheduler.alpha.kubernetes.io/node-selector", "pool=platform"),
                (
                    "external-dns.alpha.kubernetes.io/hostname",
                    "api.platform.example",
                ),
                ("note", "kept"),
            ]),
            ..Default::default()
        };
        let meta = super_metadata(&tenant, &identity(), &[], Some("ns".into()), false);
        let labels = meta.labels.expect("labels");
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert!(!labels.contains_key("app.kubernetes.io/managed-by"));
        assert!(!labels.contains_key("pod-security.kubernetes.io/enforce"));
        let annotations = meta.annotations.expect("annotations");
        assert_eq!(annotations.get("note").map(String::as_str), Some("kept"));
        for key in tenant
            .annotations
            .expect("annotations")
            .keys()
            .filter(|k| *k != "note")
        {
            assert!(!annotations.contains_key(key), "{key} copied down");
        }
        // Other managed-by values are the tenant's to set.
        let helm = ObjectMeta {
            labels: map(&[("app.kubernetes.io/managed-by", "Helm")]),
            ..tenant_meta()
        };
        let labels = super_metadata(&helm, &identity(), &[], None, false)
            .labels
            .expect("labels");
        assert_eq!(
            labels.get("app.kubernetes.io/managed-by").map(String::as_str),
            Some("Helm")
        );
    }

    fn tenant_meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        }
    }

    #[test]
    fn withheld_keys_count_as_covered_and_identity_keys_are_never_withheld() {
        assert_eq!(
            withholdable_key(".metadata.labels.team").as_deref(),
            Some("label:team")
        );
        assert_eq!(
            withholdable_key(".metadata.annotations.example.com/owner").as_deref(),
            Some("annotation:example.com/owner")
        );
        assert_eq!(
            withholdable_key(".metadata.annotations.tenancy.x-k8s.io/uid"),
            None
        );
        assert_eq!(withholdable_key(".spec.selector"), None);

        let desired = ObjectMeta {
            labels: map(&[("team", "tenant-value"), ("app", "web")]),
            ..Default::default()
        };
        let mut applied = desired.clone();
        withhold(&mut applied, &["label:team".to_owned()]);
        assert!(!applied.labels.as_ref().expect("labels").contains_key("team"));
        // The super object keeps the platform's value for the withheld key.
        let mut actual = applied.clone();
        actual
            .labels
            .as_mut()
            .expect("labels")
            .insert("team".into(), "platform-value".into());
        assert!(metadata_covers(&desired, &actual));
        actual
            .annotations
            .as_mut()
            .expect("annotations")
            .remove(ANNOTATION_WITHHELD);
        assert!(!metadata_covers(&desired, &actual));
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
