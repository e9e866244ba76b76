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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use serde::Serialize;

use crate::cache::meta::Tagged;
use sha2::{Digest, Sha256};

/// Annotation on super objects: a hash of everything the syncer applied, so that an object already in sync
/// is recognised (also after a restart) without comparing fields the apiserver defaults.
pub const ANNOTATION_SYNC_HASH: &str = "tenancy.x-k8s.io/sync-hash";

/// Key prefixes a tenant may not set on super objects: they carry identity.
const RESERVED_PREFIXES: &[&str] = &["tenancy.x-k8s.io/", "transparency.tenancy.x-k8s.io/"];

/// The syncer's own DNS domain: keys whose prefix is it or a subdomain of it (the identity keys, and the
/// encoded tenant labels of [`encoded_label`]) are only ever the syncer's.
const SYNCER_DOMAIN: &str = "tenancy.x-k8s.io";

/// Prefix domain of a tenant label that is copied encoded ([`encoded_label`]).
pub const ENCODED_LABEL_DOMAIN: &str = "label.tenancy.x-k8s.io";

/// Labels and annotations a tenant's objects carry into the super cluster as they are, besides keys
/// without a prefix (which Kubernetes' label convention leaves to the user; automation must use a prefix):
/// the recommended application labels, the labels Kubernetes' own controllers give the pods they make (a
/// tenant's Services and budgets select on them), and the legacy security-profile annotations the pod
/// policy judges. Entries ending in `/` are prefixes, others whole keys. The platform adds to it
/// (`--copied-meta-keys`); anything else is not copied as it is.
pub const COPIED_KEYS: &[&str] = &[
    "app.kubernetes.io/",
    "helm.sh/",
    "statefulset.kubernetes.io/",
    "apps.kubernetes.io/",
    "batch.kubernetes.io/",
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "service.alpha.kubernetes.io/tolerate-unready-endpoints",
];

/// Label and annotation keys the platform owns: never copied down as they are, whatever
/// `--copied-meta-keys` allows broadly; only an entry there naming the key or this very prefix (or one
/// under it) lets it through. Each names something a super-cluster controller acts on with the super
/// cluster's authority: ingress and load-balancer controllers (configuration snippets run in a shared
/// proxy, annotations pick addresses, subnets and certificates), certificate issuers and DNS controllers
/// (certificates and records in the platform's zones), the scheduler's namespace node selectors and
/// default tolerations, Pod Security admission, CNI plugins (other networks, chosen addresses, bandwidth),
/// service meshes and secret injectors (whose sidecars carry a super-cluster credential), cloud workload
/// identities, Secret replicators (which copy other namespaces' Secrets in), autoscalers and log shippers
/// (opt-outs), and policy engines.
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
    "cert-manager.io/",
    "acme.cert-manager.io/",
    "kubernetes.io/tls-acme",
    "kubernetes.io/ingress.class",
    "scheduler.alpha.kubernetes.io/",
    "pod-security.kubernetes.io/",
    "k8s.v1.cni.cncf.io/",
    "v1.multus-cni.io/",
    "cni.projectcalico.org/",
    "kubernetes.io/ingress-bandwidth",
    "kubernetes.io/egress-bandwidth",
    "sidecar.istio.io/",
    "proxy.istio.io/",
    "traffic.sidecar.istio.io/",
    "istio.io/",
    "istio-injection",
    "linkerd.io/",
    "config.linkerd.io/",
    "consul.hashicorp.com/",
    "vault.hashicorp.com/",
    "eks.amazonaws.com/",
    "iam.amazonaws.com/",
    "iam.gke.io/",
    "azure.workload.identity/",
    "aadpodidbinding",
    "replicator.v1.mittwald.de/",
    "reflector.v1.k8s.emberstack.com/",
    "kubed.appscode.com/",
    "cluster-autoscaler.kubernetes.io/",
    "karpenter.sh/",
    "fluentbit.io/",
    "co.elastic.logs/",
    "admission.gatekeeper.sh/",
    "policies.kyverno.io/",
    "kyverno.io/",
];

/// Values of `app.kubernetes.io/managed-by` that claim an object for our components; a tenant's object
/// claiming one would look like ours to whoever selects on it.
const OUR_MANAGERS: &[&str] = &[
    crds::wellknown::FIELD_MANAGER_SYNCER,
    crds::wellknown::FIELD_MANAGER_VC_MANAGER,
    "vn-agent",
    "virtualcluster",
];

pub use crds::wellknown::ANNOTATION_WITHHELD;

/// Namespace labels that configure Pod Security admission.
const POD_SECURITY_PREFIX: &str = "pod-security.kubernetes.io/";

/// Annotations never copied down: large, and meaningless in the super cluster.
const DROPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// Labels never copied down. A tenant apiserver marks its own `kubernetes` Endpoints `skip-mirror` because
/// it writes their EndpointSlices itself; in the super cluster nothing would, and kube-proxy, which reads
/// only EndpointSlices, would have no endpoint for the tenant's apiserver.
const DROPPED_LABELS: &[&str] = &["endpointslice.kubernetes.io/skip-mirror"];

/// Which of a tenant's labels and annotations reach the super cluster, and how: the platform's additions
/// to [`COPIED_KEYS`] and the prefixes it (and the VirtualCluster) keeps for the super cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaPolicy {
    /// Keys (or prefixes ending in `/`) of labels and annotations copied as they are, besides
    /// [`COPIED_KEYS`] and keys without a prefix (`--copied-meta-keys`).
    pub copied: Vec<String>,
    /// Keys (or prefixes ending in `/`) of namespace labels copied as they are
    /// (`--copied-namespace-label-keys`); every other namespace label is copied encoded.
    pub namespace_labels: Vec<String>,
    /// Prefixes owned by the super cluster: `--opaque-meta-prefixes` and the VirtualCluster's
    /// `opaqueMetaPrefixes`, never copied as they are.
    pub opaque: Vec<String>,
}

/// What a tenant's label or annotation key is, for [`fate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A label of a namespaced object (a pod's, a Service's, ...).
    Label,
    /// A label of a namespace: what admission webhooks, policy engines, meshes and NetworkPolicies of the
    /// platform select namespaces by.
    NamespaceLabel,
    /// An annotation of any object.
    Annotation,
}

/// What becomes of a tenant's label or annotation in the super cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Copied as it is.
    Copied,
    /// Copied under [`encoded_label`]'s key, which no platform controller selects on, so that the tenant's
    /// own selectors (mapped with [`selector_key`]) still find it (labels only).
    Encoded(String),
    /// Not copied (annotations, and keys in the syncer's own domain).
    Dropped,
}

/// Whether an allow-list entry (a key, or a prefix ending in `/`) covers `key`.
fn covers(entry: &str, key: &str) -> bool {
    match entry.ends_with('/') {
        true => key.starts_with(entry),
        false => key == entry,
    }
}

/// Whether a key is in the syncer's own domain ([`SYNCER_DOMAIN`] and its subdomains).
fn in_syncer_domain(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix == SYNCER_DOMAIN || prefix.ends_with(&format!(".{SYNCER_DOMAIN}")))
}

/// What becomes of a tenant's label or annotation `key` (the decision of docs/design.md, "Metadata"):
///
/// 1. keys in the syncer's domain (identity) are dropped;
/// 2. keys under the super cluster's prefixes (`--opaque-meta-prefixes`, `opaqueMetaPrefixes`) and the
///    platform-owned [`DEFAULT_OPAQUE_PREFIXES`] (unless the platform names that key or prefix in its
///    allow-list) are not copied as they are;
/// 3. the rest is copied as it is when the allow-list covers it: for namespace labels only the platform's
///    `--copied-namespace-label-keys`; for other labels and annotations keys without a prefix,
///    [`COPIED_KEYS`] and `--copied-meta-keys`.
///
/// Labels not copied as they are are copied encoded; annotations are dropped.
pub fn fate(key: &str, kind: KeyKind, policy: &MetaPolicy) -> Fate {
    if in_syncer_domain(key) || RESERVED_PREFIXES.iter().any(|p| key.starts_with(p)) {
        return Fate::Dropped;
    }
    let platform: &[String] = match kind {
        KeyKind::NamespaceLabel => &policy.namespace_labels,
        KeyKind::Label | KeyKind::Annotation => &policy.copied,
    };
    let opaque = policy
        .opaque
        .iter()
        .any(|p| !p.is_empty() && key.starts_with(p.as_str()));
    let platform_owned = DEFAULT_OPAQUE_PREFIXES.iter().any(|floor| {
        covers(floor, key)
            && !platform
                .iter()
                .any(|entry| entry.starts_with(floor) && covers(entry, key))
    });
    let allowed = !opaque
        && !platform_owned
        && (platform.iter().any(|entry| covers(entry, key))
            || (kind != KeyKind::NamespaceLabel
                && (!key.contains('/') || COPIED_KEYS.iter().any(|entry| covers(entry, key)))));
    match (allowed, kind) {
        (true, _) => Fate::Copied,
        (false, KeyKind::Annotation) => Fate::Dropped,
        (false, KeyKind::Label | KeyKind::NamespaceLabel) => Fate::Encoded(encoded_label(key)),
    }
}

/// The key a tenant label not copied as it is gets in the super cluster: its name under a prefix in
/// [`ENCODED_LABEL_DOMAIN`], `label.tenancy.x-k8s.io/<name>` for a key without a prefix and
/// `<prefix>.label.tenancy.x-k8s.io/<name>` for one with (16 hex digits of the prefix's SHA-256 instead
/// when that would be longer than a DNS subdomain may be). Tenants cannot set keys in that domain, so an
/// encoded label is always the syncer's copy of the tenant's, and no platform controller selects on it.
pub fn encoded_label(key: &str) -> String {
    match key.split_once('/') {
        None => format!("{ENCODED_LABEL_DOMAIN}/{key}"),
        Some((prefix, name)) if prefix.len() + 1 + ENCODED_LABEL_DOMAIN.len() <= 253 => {
            format!("{prefix}.{ENCODED_LABEL_DOMAIN}/{name}")
        }
        Some((prefix, name)) => format!(
            "{}.{ENCODED_LABEL_DOMAIN}/{name}",
            &hex::encode(Sha256::digest(prefix.as_bytes()))[..16]
        ),
    }
}

/// The key a tenant selector names, as the super objects it selects carry it: encoded when the label is
/// copied encoded, as it is otherwise (the syncer's own keys, `kubernetes.io/metadata.name` of
/// namespaces, and labels copied as they are). `namespaces`: the selector selects namespaces.
pub fn selector_key<'k>(key: &'k str, policy: &MetaPolicy, namespaces: bool) -> std::borrow::Cow<'k, str> {
    if namespaces && key == crds::wellknown::LABEL_NAMESPACE_NAME {
        return key.into();
    }
    let kind = match namespaces {
        true => KeyKind::NamespaceLabel,
        false => KeyKind::Label,
    };
    match fate(key, kind, policy) {
        Fate::Encoded(encoded) => encoded.into(),
        Fate::Copied | Fate::Dropped => key.into(),
    }
}

/// A tenant's label selector with its keys as [`selector_key`] maps them.
pub fn map_selector(selector: &LabelSelector, policy: &MetaPolicy, namespaces: bool) -> LabelSelector {
    LabelSelector {
        match_labels: selector
            .match_labels
            .as_ref()
            .map(|labels| map_labels(labels, policy, namespaces)),
        match_expressions: selector.match_expressions.as_ref().map(|expressions| {
            expressions
                .iter()
                .map(|e| LabelSelectorRequirement {
                    key: selector_key(&e.key, policy, namespaces).into_owned(),
                    ..e.clone()
                })
                .collect()
        }),
    }
}

/// A tenant's `key: value` selector (a Service's) with its keys as [`selector_key`] maps them.
pub fn map_labels(
    labels: &BTreeMap<String, String>,
    policy: &MetaPolicy,
    namespaces: bool,
) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| (selector_key(k, policy, namespaces).into_owned(), v.clone()))
        .collect()
}

/// Whether a tenant label claims the object for one of our components.
fn claims_our_component(key: &str, value: &str) -> bool {
    key == crds::wellknown::LABEL_MANAGED_BY && OUR_MANAGERS.contains(&value)
}

fn is_reserved(key: &str) -> bool {
    in_syncer_domain(key)
        || RESERVED_PREFIXES
            .iter()
            .chain(DEFAULT_OPAQUE_PREFIXES)
            .any(|p| key.starts_with(p))
}

fn has_prefix(key: &str, prefixes: &[String]) -> bool {
    prefixes
        .iter()
        .any(|p| !p.is_empty() && key.starts_with(p.as_str()))
}

/// The tenant's labels and annotations as the super copy carries them ([`fate`]).
fn copied_metadata(
    tenant: &ObjectMeta,
    policy: &MetaPolicy,
    labels_kind: KeyKind,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let labels = tenant
        .labels
        .iter()
        .flatten()
        .filter(|(k, v)| !DROPPED_LABELS.contains(&k.as_str()) && !claims_our_component(k, v))
        .filter_map(|(k, v)| match fate(k, labels_kind, policy) {
            Fate::Copied => Some((k.clone(), v.clone())),
            Fate::Encoded(encoded) => Some((encoded, v.clone())),
            Fate::Dropped => None,
        })
        .collect();
    let annotations = tenant
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| {
            !DROPPED_ANNOTATIONS.contains(&k.as_str()) && fate(k, KeyKind::Annotation, policy) == Fate::Copied
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (labels, annotations)
}

/// The metadata of the super copy of a tenant object: same name, mapped namespace, the tenant's labels and
/// annotations as [`fate`] decides, and the identity labels and annotations.
pub fn super_metadata(
    tenant: &ObjectMeta,
    identity: &TenantIdentity,
    policy: &MetaPolicy,
    super_namespace: Option<String>,
    cluster_label: bool,
) -> ObjectMeta {
    with_identity(
        tenant,
        identity,
        copied_metadata(tenant, policy, KeyKind::Label),
        super_namespace,
        cluster_label,
    )
}

fn with_identity(
    tenant: &ObjectMeta,
    identity: &TenantIdentity,
    (mut labels, mut annotations): (BTreeMap<String, String>, BTreeMap<String, String>),
    super_namespace: Option<String>,
    cluster_label: bool,
) -> ObjectMeta {
    labels.insert(LABEL_VC_NAME.to_owned(), identity.vc_name.clone());
    labels.insert(LABEL_VC_NAMESPACE.to_owned(), identity.vc_namespace.clone());
    if cluster_label {
        labels.insert(LABEL_CLUSTER.to_owned(), identity.cluster_key.clone());
    }
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

/// Metadata of a super namespace: like [`super_metadata`], with the namespace labels rules of [`fate`],
/// plus the VirtualCluster's uid.
pub fn super_namespace_metadata(
    tenant: &ObjectMeta,
    identity: &TenantIdentity,
    policy: &MetaPolicy,
) -> ObjectMeta {
    let (mut labels, annotations) = copied_metadata(tenant, policy, KeyKind::NamespaceLabel);
    // The apiserver sets this label to the namespace's own name; the tenant's value cannot stay.
    labels.remove(crds::wellknown::LABEL_NAMESPACE_NAME);
    // Pod Security admission reads these from the super namespace: a tenant must not relax it.
    labels.retain(|key, _| !key.starts_with(POD_SECURITY_PREFIX));
    let mut meta = with_identity(tenant, identity, (labels, annotations), None, true);
    meta.name = tenant.name.as_deref().map(|n| identity.super_namespace(n));
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(ANNOTATION_VC_UID.to_owned(), identity.vc_uid.clone());
    annotations.insert(
        ANNOTATION_NAMESPACE.to_owned(),
        tenant.name.clone().unwrap_or_default(),
    );
    meta
}

/// The cluster key of the tenant a super object belongs to, by the one ownership rule ([`crds::Owner`]),
/// from either kind of metadata.
pub fn owner_cluster(meta: &impl Tagged) -> Option<&str> {
    crds::tenant::owner_cluster(meta)
}

/// Whether a super object belongs to the tenant with this cluster key ([`crds::Owner`]).
pub fn belongs_to(meta: &impl Tagged, cluster_key: &str) -> bool {
    crds::tenant::belongs_to(meta, cluster_key)
}

/// The uid of the tenant object a super object was made from, as its annotation says. Whose the object is
/// is decided by [`owner_cluster`] / [`belongs_to`] first; this only reads the annotation (a per-pod token
/// Secret, found by name in its pod's super namespace, is matched to its pod by it).
pub fn tenant_uid(meta: &impl Tagged) -> Option<&str> {
    meta.annotation(ANNOTATION_UID)
}

/// The tenant namespace of a super object (for a super namespace: the tenant namespace it mirrors), as its
/// annotation says; read once [`owner_cluster`] / [`belongs_to`] has decided whose the object is.
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

// The objects the syncer alone keeps beside the tenants' copies in their super namespaces (vn-agent's
// RoleBindings, pods' token Secrets of earlier versions) say by annotations which tenant object each serves:
// the caches map their changes to the tenant's items.

/// The tenant and tenant namespace a vn-agent binding serves, by its annotations.
pub fn grants(meta: &ObjectMeta) -> Option<(&str, &str)> {
    let annotations = meta.annotations.as_ref()?;
    Some((
        annotations
            .get(crds::wellknown::ANNOTATION_GRANTS_CLUSTER)?
            .as_str(),
        annotations
            .get(crds::wellknown::ANNOTATION_GRANTS_NAMESPACE)?
            .as_str(),
    ))
}

/// The pod a token Secret serves.
pub fn pod_of_token_secret(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(crds::wellknown::ANNOTATION_TOKEN_FOR_POD)
        .map(String::as_str)
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
        let meta = super_metadata(
            &tenant,
            &identity(),
            &MetaPolicy::default(),
            Some("ns".into()),
            false,
        );
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
        let labels = super_metadata(&helm, &identity(), &MetaPolicy::default(), None, false)
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
        let meta = super_metadata(
            &tenant,
            &identity(),
            &MetaPolicy::default(),
            Some("ns".into()),
            false,
        );
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
            &MetaPolicy {
                opaque: vec!["super.example/".into()],
                ..Default::default()
            },
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
        let meta = super_namespace_metadata(&tenant, &identity(), &MetaPolicy::default());
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
        let labels = super_namespace_metadata(&tenant, &identity(), &MetaPolicy::default())
            .labels
            .expect("labels");
        assert!(!labels.contains_key("pod-security.kubernetes.io/enforce"));
        assert!(!labels.contains_key("kubernetes.io/metadata.name"));
        assert!(!labels.contains_key("team"));
        assert_eq!(
            labels.get("label.tenancy.x-k8s.io/team").map(String::as_str),
            Some("a")
        );
    }

    /// The allow-list of docs/design.md ("Metadata"), key by key.
    #[test]
    fn only_the_allow_list_is_copied_as_it_is() {
        use Fate::{Copied, Dropped};
        use KeyKind::{Annotation, Label, NamespaceLabel};
        let encoded = |key: &str| Fate::Encoded(encoded_label(key));
        let platform = MetaPolicy {
            copied: vec![
                "prometheus.io/".into(),
                "cert-manager.io/".into(),
                "kubernetes.io/".into(),
            ],
            namespace_labels: vec!["team".into(), "platform.example/".into()],
            opaque: vec!["billing.example/".into()],
        };
        let none = MetaPolicy::default();
        let table: &[(&str, KeyKind, &MetaPolicy, Fate)] = &[
            // The user's own keys (no prefix), the recommended and the workload controllers' labels.
            ("app", Label, &none, Copied),
            ("pod-template-hash", Label, &none, Copied),
            ("app.kubernetes.io/name", Label, &none, Copied),
            ("statefulset.kubernetes.io/pod-name", Label, &none, Copied),
            ("batch.kubernetes.io/job-name", Label, &none, Copied),
            ("note", Annotation, &none, Copied),
            (
                "container.apparmor.security.beta.kubernetes.io/web",
                Annotation,
                &none,
                Copied,
            ),
            // An operator's own labels: encoded, so the tenant's Services still select on them.
            ("strimzi.io/cluster", Label, &none, encoded("strimzi.io/cluster")),
            ("strimzi.io/cluster", Annotation, &none, Dropped),
            // What platform controllers act on.
            (
                "sidecar.istio.io/inject",
                Label,
                &none,
                encoded("sidecar.istio.io/inject"),
            ),
            ("sidecar.istio.io/inject", Annotation, &none, Dropped),
            ("linkerd.io/inject", Annotation, &none, Dropped),
            ("k8s.v1.cni.cncf.io/networks", Annotation, &none, Dropped),
            ("cni.projectcalico.org/ipAddrs", Annotation, &none, Dropped),
            (
                "replicator.v1.mittwald.de/replicate-from",
                Annotation,
                &none,
                Dropped,
            ),
            (
                "cluster-autoscaler.kubernetes.io/safe-to-evict",
                Annotation,
                &none,
                Dropped,
            ),
            ("fluentbit.io/exclude", Annotation, &none, Dropped),
            ("eks.amazonaws.com/role-arn", Annotation, &none, Dropped),
            ("aadpodidbinding", Label, &none, encoded("aadpodidbinding")),
            ("prometheus.io/scrape", Annotation, &none, Dropped),
            // Namespace labels: none as they are by default, the unprefixed ones included.
            (
                "istio-injection",
                NamespaceLabel,
                &none,
                encoded("istio-injection"),
            ),
            ("team", NamespaceLabel, &none, encoded("team")),
            (
                "app.kubernetes.io/name",
                NamespaceLabel,
                &none,
                encoded("app.kubernetes.io/name"),
            ),
            // The platform's allow-list.
            ("prometheus.io/scrape", Annotation, &platform, Copied),
            ("team", NamespaceLabel, &platform, Copied),
            ("platform.example/zone", NamespaceLabel, &platform, Copied),
            ("team", Label, &platform, Copied),
            // Naming the platform-owned prefix itself lets it through; a broader entry does not.
            ("cert-manager.io/cluster-issuer", Annotation, &platform, Copied),
            ("kubernetes.io/tls-acme", Annotation, &platform, Dropped),
            ("kubernetes.io/description", Annotation, &platform, Copied),
            // The platform's and the VirtualCluster's opaque prefixes beat the allow-list.
            (
                "billing.example/team",
                Label,
                &platform,
                encoded("billing.example/team"),
            ),
            // Identity, and the syncer's own domain.
            ("tenancy.x-k8s.io/cluster", Label, &platform, Dropped),
            (
                "transparency.tenancy.x-k8s.io/clusterIP",
                Annotation,
                &platform,
                Dropped,
            ),
            ("label.tenancy.x-k8s.io/app", Label, &platform, Dropped),
            ("x.label.tenancy.x-k8s.io/app", NamespaceLabel, &platform, Dropped),
        ];
        for (key, kind, policy, want) in table {
            assert_eq!(&fate(key, *kind, policy), want, "{key} ({kind:?})");
        }
        assert_eq!(encoded_label("team"), "label.tenancy.x-k8s.io/team");
        assert_eq!(
            encoded_label("strimzi.io/cluster"),
            "strimzi.io.label.tenancy.x-k8s.io/cluster"
        );
        let long = format!("{}.example/name", "a".repeat(240));
        let hashed = encoded_label(&long);
        assert!(hashed.ends_with(".label.tenancy.x-k8s.io/name"), "{hashed}");
        assert!(hashed.split_once('/').is_some_and(|(p, _)| p.len() <= 253));
    }

    #[test]
    fn selectors_name_the_keys_the_super_objects_carry() {
        let policy = MetaPolicy::default();
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "db", "cnpg.io/cluster": "main", "tenancy.x-k8s.io/cluster": "x"},
            "matchExpressions": [{"key": "cnpg.io/instanceRole", "operator": "In", "values": ["primary"]}]
        }))
        .expect("selector");
        let pods = map_selector(&selector, &policy, false);
        let labels = pods.match_labels.expect("labels");
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            [
                "app",
                "cnpg.io.label.tenancy.x-k8s.io/cluster",
                "tenancy.x-k8s.io/cluster"
            ]
        );
        assert_eq!(
            pods.match_expressions.expect("expressions")[0].key,
            "cnpg.io.label.tenancy.x-k8s.io/instanceRole"
        );
        // Namespaces: every tenant label is encoded but the apiserver's name label.
        let namespaces: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"team": "a", "kubernetes.io/metadata.name": "db"}
        }))
        .expect("selector");
        let labels = map_selector(&namespaces, &policy, true)
            .match_labels
            .expect("labels");
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            ["kubernetes.io/metadata.name", "label.tenancy.x-k8s.io/team"]
        );
        // What the copies carry matches what the selectors name.
        let tenant = ObjectMeta {
            name: Some("db-0".into()),
            namespace: Some("shop".into()),
            labels: map(&[("app", "db"), ("cnpg.io/cluster", "main")]),
            ..Default::default()
        };
        let copy = super_metadata(&tenant, &identity(), &policy, None, false)
            .labels
            .expect("labels");
        for (key, value) in map(&[("app", "db"), ("cnpg.io/cluster", "main")]).expect("map") {
            assert_eq!(
                copy.get(selector_key(&key, &policy, false).as_ref()),
                Some(&value),
                "{key}"
            );
        }
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
