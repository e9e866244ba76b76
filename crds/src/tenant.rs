//! Who a tenant is in the super cluster: its cluster key and its VirtualCluster, the one identity every
//! component uses, and the annotations that say which tenant a super-cluster object belongs to.
//!
//! Ownership is decided by annotations, never by parsing names: the namespace shortening rule of
//! [`crate::naming`] is not injective.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::{
    Error, VirtualCluster,
    meta::Tagged,
    naming::{self, cluster_key_of, super_namespace},
    wellknown::{
        ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_ROOT_NAMESPACE, ANNOTATION_UID,
        ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE, ANNOTATION_VC_UID,
    },
};

/// Whether a Secret (its metadata) is meant as the kubeconfig of the VirtualCluster `vc_name` of its
/// namespace: it carries [`crate::wellknown::LABEL_KUBECONFIG_FOR`] with that name. `Err` says what is
/// missing, naming the Secret (`namespace/name`), never its content.
pub fn kubeconfig_secret_meant_for(secret: &ObjectMeta, vc_name: &str) -> Result<(), String> {
    use crate::wellknown::LABEL_KUBECONFIG_FOR;
    let label = secret
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_KUBECONFIG_FOR));
    let name = format!(
        "{}/{}",
        secret.namespace.as_deref().unwrap_or_default(),
        secret.name.as_deref().unwrap_or_default()
    );
    match label {
        Some(value) if value == vc_name => Ok(()),
        Some(value) => Err(format!(
            "Secret {name} is meant for VirtualCluster {value:?}, not {vc_name:?} (label {LABEL_KUBECONFIG_FOR})"
        )),
        None => Err(format!(
            "Secret {name} is not meant for this VirtualCluster: whoever may write it must label it {LABEL_KUBECONFIG_FOR}={vc_name}"
        )),
    }
}

/// A tenant: the VirtualCluster it is and the cluster key derived from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TenantIdentity {
    /// [`crate::naming::cluster_key`]: the root namespace, and the prefix of the tenant's super namespaces.
    pub cluster_key: String,
    /// Name of the VirtualCluster.
    pub vc_name: String,
    /// Namespace of the VirtualCluster.
    pub vc_namespace: String,
    /// Uid of the VirtualCluster.
    pub vc_uid: String,
}

impl TenantIdentity {
    /// The identity of a VirtualCluster read from an apiserver; one without namespace or uid has none yet.
    pub fn of(vc: &VirtualCluster) -> Result<Self, Error> {
        let missing = || Error::MissingIdentity { name: vc.name_any() };
        Ok(Self {
            cluster_key: cluster_key_of(vc).ok_or_else(missing)?,
            vc_name: vc.name_any(),
            vc_namespace: vc.namespace().ok_or_else(missing)?,
            vc_uid: vc.uid().ok_or_else(missing)?,
        })
    }

    /// The root namespace holding the tenant's control plane and PKI.
    pub fn root_namespace(&self) -> &str {
        &self.cluster_key
    }

    /// The super namespace of a tenant namespace.
    pub fn super_namespace(&self, tenant_namespace: &str) -> String {
        super_namespace(&self.cluster_key, tenant_namespace)
    }

    /// `namespace/name` of the VirtualCluster, for logs and metric labels.
    pub fn vc_ref(&self) -> String {
        format!("{}/{}", self.vc_namespace, self.vc_name)
    }

    /// The annotations naming this tenant, on every object vc-manager creates for it.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        [
            (ANNOTATION_CLUSTER, self.cluster_key.as_str()),
            (ANNOTATION_VC_NAME, self.vc_name.as_str()),
            (ANNOTATION_VC_NAMESPACE, self.vc_namespace.as_str()),
            (ANNOTATION_VC_UID, self.vc_uid.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Annotations of the root namespace: [`Self::annotations`] plus `vcrootns: "true"`.
    pub fn root_namespace_annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = self.annotations();
        annotations.insert(ANNOTATION_ROOT_NAMESPACE.to_owned(), "true".to_owned());
        annotations
    }
}

/// Which tenant a super-cluster object belongs to: the one rule every component applies (the syncer to
/// what it owns and counts, vn-agent to the pods a tenant may reach, vc-dns to the names a tenant may
/// resolve, vc-manager to the namespaces it deletes with a tenant). It is read from the annotations the
/// syncer writes, never from names, and checked against where the object sits:
///
/// 1. annotation `tenancy.x-k8s.io/cluster` names the tenant: a cluster key, so a DNS label;
/// 2. annotation `tenancy.x-k8s.io/namespace` names its tenant namespace, a DNS label;
/// 3. the object sits in exactly the super namespace that tenant namespace of that tenant maps to
///    ([`crate::naming::super_namespace`]); a cluster-scoped object (the only such kind the syncer
///    annotates is the super namespace itself) must be named so, and a tenant's root namespace serves no
///    tenant namespace;
/// 4. annotation `tenancy.x-k8s.io/uid`, when not empty, is the uid of the tenant object it was made
///    from: [`Owner::copy_of`] requires it (a copy of one tenant object), [`Owner::of`] reports it (objects
///    the syncer makes for a whole namespace, such as shared token Secrets, carry none).
///
/// Each component checked a part of this before: the syncer and vc-manager the cluster annotation alone
/// (the syncer also the tenant namespace where it looked an object up), vn-agent all of 1 to 4 for pods,
/// vc-dns 1 and 2 with the mapping checked at lookup; now each applies all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner<'a> {
    /// The tenant's cluster key.
    pub cluster: &'a str,
    /// The tenant namespace the object is in (for a super namespace: the one it mirrors).
    pub tenant_namespace: &'a str,
    /// The uid of the tenant object it was made from, when it names one.
    pub tenant_uid: Option<&'a str>,
}

/// Why a super-cluster object belongs to no tenant ([`Owner::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disowned {
    /// No cluster annotation, or one that is no cluster key.
    NoCluster,
    /// No tenant-namespace annotation, or one that is no namespace name.
    NoTenantNamespace,
    /// A tenant's root namespace (its control plane), which mirrors no tenant namespace.
    RootNamespace,
    /// It does not sit in the super namespace its annotations map to.
    Elsewhere,
}

impl<'a> Owner<'a> {
    /// The tenant and tenant namespace of a super-cluster object, when the rule above holds.
    pub fn of(meta: &'a impl Tagged) -> Option<Self> {
        Self::check(meta).ok()
    }

    /// [`Self::of`], saying which part of the rule failed.
    pub fn check(meta: &'a impl Tagged) -> Result<Self, Disowned> {
        let present = |key| meta.annotation(key).filter(|v| naming::is_dns_label(v));
        let cluster = present(ANNOTATION_CLUSTER).ok_or(Disowned::NoCluster)?;
        let place = match meta.object_namespace() {
            Some(namespace) => namespace,
            None if meta.annotation(ANNOTATION_ROOT_NAMESPACE).is_some() => {
                return Err(Disowned::RootNamespace);
            }
            None => meta.object_name().unwrap_or_default(),
        };
        let tenant_namespace = present(ANNOTATION_NAMESPACE).ok_or(Disowned::NoTenantNamespace)?;
        if !naming::is_super_namespace(place, cluster, tenant_namespace) {
            return Err(Disowned::Elsewhere);
        }
        Ok(Self {
            cluster,
            tenant_namespace,
            tenant_uid: meta.annotation(ANNOTATION_UID).filter(|uid| !uid.is_empty()),
        })
    }

    /// Whether it belongs to the tenant with this cluster key.
    pub fn is(&self, cluster_key: &str) -> bool {
        self.cluster == cluster_key
    }

    /// Whether it serves tenant namespace `tenant_namespace` of the tenant `cluster_key`.
    pub fn serves(&self, cluster_key: &str, tenant_namespace: &str) -> bool {
        self.is(cluster_key) && self.tenant_namespace == tenant_namespace
    }

    /// Whether it is the copy of the tenant object with uid `tenant_uid` in `tenant_namespace` of the tenant
    /// `cluster_key`.
    pub fn copy_of(&self, cluster_key: &str, tenant_namespace: &str, tenant_uid: &str) -> bool {
        self.serves(cluster_key, tenant_namespace) && self.tenant_uid == Some(tenant_uid)
    }
}

/// The cluster key of the tenant a super object belongs to ([`Owner`]).
pub fn owner_cluster(meta: &impl Tagged) -> Option<&str> {
    Owner::of(meta).map(|owner| owner.cluster)
}

/// Whether a super object belongs to the tenant with this cluster key ([`Owner`]).
pub fn belongs_to(meta: &impl Tagged, cluster_key: &str) -> bool {
    Owner::of(meta).is_some_and(|owner| owner.is(cluster_key))
}

/// The labels of every object vc-manager creates for a tenant (`app.kubernetes.io/managed-by:
/// vc-manager`); `kubectl vc snapshot restore` puts them on the Secrets it restores. Deliberately not the
/// syncer's `vcname`/`vcnamespace` labels: those mark the syncer's tenant namespaces and objects.
pub fn managed_labels() -> BTreeMap<String, String> {
    use crate::wellknown::{LABEL_MANAGED_BY, MANAGED_BY_VC_MANAGER};
    [(LABEL_MANAGED_BY.to_owned(), MANAGED_BY_VC_MANAGER.to_owned())].into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kubeconfig_secret_must_be_labelled_for_the_virtual_cluster() {
        let secret = |label: Option<&str>| ObjectMeta {
            name: Some("kc".into()),
            namespace: Some("team".into()),
            labels: label.map(|l| [(crate::wellknown::LABEL_KUBECONFIG_FOR.to_owned(), l.to_owned())].into()),
            ..Default::default()
        };
        assert_eq!(
            kubeconfig_secret_meant_for(&secret(Some("alpha")), "alpha"),
            Ok(())
        );
        let other = kubeconfig_secret_meant_for(&secret(Some("beta")), "alpha").expect_err("another's");
        assert!(other.contains("team/kc") && other.contains("\"beta\""), "{other}");
        let unlabelled = kubeconfig_secret_meant_for(&secret(None), "alpha").expect_err("unlabelled");
        assert!(
            unlabelled.contains("tenancy.x-k8s.io/kubeconfig-for=alpha"),
            "{unlabelled}"
        );
        assert!(kubeconfig_secret_meant_for(&secret(Some("")), "alpha").is_err());
    }

    use super::*;

    fn vc() -> VirtualCluster {
        let mut vc = VirtualCluster::new("vc-1", Default::default());
        vc.metadata.namespace = Some("team".into());
        vc.metadata.uid = Some("uid-1".into());
        vc
    }

    #[test]
    fn identity_uses_the_shared_cluster_key() {
        let identity = TenantIdentity::of(&vc()).expect("identity");
        assert_eq!(
            identity.cluster_key,
            crate::naming::cluster_key("team", "uid-1", "vc-1")
        );
        assert_eq!(identity.root_namespace(), identity.cluster_key);
        assert_eq!(identity.vc_ref(), "team/vc-1");
        assert_eq!(
            identity.super_namespace("default"),
            format!("{}-default", identity.cluster_key)
        );
        let annotations = identity.root_namespace_annotations();
        assert_eq!(annotations[ANNOTATION_ROOT_NAMESPACE], "true");
        assert_eq!(annotations[ANNOTATION_VC_UID], "uid-1");
        assert_eq!(annotations[ANNOTATION_CLUSTER], identity.cluster_key);
        assert!(!identity.annotations().contains_key(ANNOTATION_ROOT_NAMESPACE));
    }

    #[test]
    fn a_virtual_cluster_without_namespace_or_uid_has_no_identity() {
        for strip in [
            (|vc: &mut VirtualCluster| vc.metadata.uid = None) as fn(&mut VirtualCluster),
            |vc| vc.metadata.namespace = None,
        ] {
            let mut vc = vc();
            strip(&mut vc);
            let error = TenantIdentity::of(&vc).expect_err("no identity");
            assert!(
                matches!(&error, Error::MissingIdentity { name } if name == "vc-1"),
                "{error:?}"
            );
            assert_eq!(error.to_string(), "VirtualCluster vc-1 has no namespace or uid");
        }
    }

    #[test]
    fn ownership_is_read_from_the_annotations_and_the_place() {
        let identity = TenantIdentity::of(&vc()).expect("identity");
        let mut annotations = identity.annotations();
        annotations.insert(ANNOTATION_NAMESPACE.to_owned(), "shop".to_owned());
        annotations.insert(ANNOTATION_UID.to_owned(), "pod-uid".to_owned());
        let meta = ObjectMeta {
            namespace: Some(identity.super_namespace("shop")),
            annotations: Some(annotations),
            ..Default::default()
        };
        assert_eq!(owner_cluster(&meta), Some(identity.cluster_key.as_str()));
        assert!(belongs_to(&meta, &identity.cluster_key));
        assert!(!belongs_to(&meta, "team-ffffff-vc-1"));
        assert!(!belongs_to(&ObjectMeta::default(), &identity.cluster_key));
        let owner = Owner::of(&meta).expect("owned");
        assert!(owner.copy_of(&identity.cluster_key, "shop", "pod-uid"));
        assert!(!owner.copy_of(&identity.cluster_key, "shop", "other-uid"));
        assert!(!owner.serves(&identity.cluster_key, "other"));
        // Vc-manager's own objects name the tenant but no tenant namespace: nobody's super object.
        let root = ObjectMeta {
            name: Some(identity.cluster_key.clone()),
            annotations: Some(identity.root_namespace_annotations()),
            ..Default::default()
        };
        assert_eq!(Owner::check(&root), Err(Disowned::RootNamespace));
        assert!(!belongs_to(&root, &identity.cluster_key));
    }

    /// The rule written plainly, with the allocating mapping: what [`Owner::check`] must agree with.
    fn expected(meta: &ObjectMeta) -> Result<(String, String, Option<String>), Disowned> {
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
        let label = |v: &Option<String>| v.clone().filter(|v| crate::naming::is_dns_label(v));
        let cluster = label(&annotation(ANNOTATION_CLUSTER)).ok_or(Disowned::NoCluster)?;
        if meta.namespace.is_none() && annotation(ANNOTATION_ROOT_NAMESPACE).is_some() {
            return Err(Disowned::RootNamespace);
        }
        let tenant_namespace = label(&annotation(ANNOTATION_NAMESPACE)).ok_or(Disowned::NoTenantNamespace)?;
        let place = meta.namespace.clone().or(meta.name.clone()).unwrap_or_default();
        if place != super_namespace(&cluster, &tenant_namespace) {
            return Err(Disowned::Elsewhere);
        }
        Ok((
            cluster,
            tenant_namespace,
            annotation(ANNOTATION_UID).filter(|u| !u.is_empty()),
        ))
    }

    fn check_against_the_plain_rule(meta: &ObjectMeta) -> bool {
        let found = Owner::check(meta);
        let plain = expected(meta);
        assert_eq!(
            found.map(|o| (
                o.cluster.to_owned(),
                o.tenant_namespace.to_owned(),
                o.tenant_uid.map(str::to_owned)
            )),
            plain,
            "{meta:?}"
        );
        if let Ok(owner) = found {
            // Whatever it owns sits where the owner's namespace maps to, and nowhere else.
            let place = meta
                .namespace
                .as_deref()
                .or(meta.name.as_deref())
                .unwrap_or_default();
            assert_eq!(super_namespace(owner.cluster, owner.tenant_namespace), place);
            assert!(owner.serves(owner.cluster, owner.tenant_namespace));
            assert_eq!(
                owner.copy_of(owner.cluster, owner.tenant_namespace, "u1"),
                owner.tenant_uid == Some("u1")
            );
        }
        found.is_ok()
    }

    fn super_object(namespace: Option<&str>, name: &str, annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: namespace.map(str::to_owned),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// Every combination of annotations and places, including tenants whose keys and namespaces collide
    /// once joined (`a` + `x-shop` and `a-x` + `shop`) and names that are shortened.
    #[test]
    fn the_owner_rule_holds_for_every_combination() {
        const A: &str = "team-0b5c7f-vc";
        const B: &str = "team-0b5c7f-vc-x";
        let long = "l".repeat(60);
        let clusters = [
            None,
            Some(""),
            Some(A),
            Some(B),
            Some("Team"),
            Some("a/b"),
            Some("-a"),
        ];
        let tenant_namespaces = [
            None,
            Some(""),
            Some("shop"),
            Some("x-shop"),
            Some("Shop"),
            Some(long.as_str()),
        ];
        let places: Vec<String> = [
            (A, "shop"),
            (B, "shop"),
            (A, "x-shop"),
            (A, long.as_str()),
            (B, long.as_str()),
        ]
        .iter()
        .map(|(c, n)| super_namespace(c, n))
        .chain([A.to_owned(), "default".to_owned()])
        .collect();
        let uids = [None, Some(""), Some("u1")];
        let mut owned = 0;
        let mut cases = 0;
        for cluster in clusters {
            for tenant_namespace in tenant_namespaces {
                for uid in uids {
                    for root in [false, true] {
                        let mut annotations = Vec::new();
                        annotations.extend(cluster.map(|c| (ANNOTATION_CLUSTER, c)));
                        annotations.extend(tenant_namespace.map(|n| (ANNOTATION_NAMESPACE, n)));
                        annotations.extend(uid.map(|u| (ANNOTATION_UID, u)));
                        if root {
                            annotations.push((ANNOTATION_ROOT_NAMESPACE, "true"));
                        }
                        for place in &places {
                            // Namespaced, and the super namespace itself.
                            for meta in [
                                super_object(Some(place), "web", &annotations),
                                super_object(None, place, &annotations),
                            ] {
                                cases += 1;
                                owned += usize::from(check_against_the_plain_rule(&meta));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 7 * 6 * 3 * 2 * 7 * 2);
        assert!(owned > 0 && owned < cases, "{owned} of {cases}");
        // The collision: one super namespace, two claims; the annotations decide, and only one of them.
        let shared = super_namespace(A, "x-shop");
        assert_eq!(shared, super_namespace(B, "shop"));
        let a = super_object(
            Some(&shared),
            "web",
            &[(ANNOTATION_CLUSTER, A), (ANNOTATION_NAMESPACE, "x-shop")],
        );
        let b = super_object(
            Some(&shared),
            "web",
            &[(ANNOTATION_CLUSTER, B), (ANNOTATION_NAMESPACE, "shop")],
        );
        let wrong = super_object(
            Some(&shared),
            "web",
            &[(ANNOTATION_CLUSTER, A), (ANNOTATION_NAMESPACE, "shop")],
        );
        assert!(Owner::of(&a).is_some_and(|o| o.serves(A, "x-shop")));
        assert!(Owner::of(&b).is_some_and(|o| o.serves(B, "shop")));
        assert_eq!(Owner::check(&wrong), Err(Disowned::Elsewhere));
    }

    /// Names made of the characters names are and are not made of, half of them DNS labels.
    fn name() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::prop_oneof![
            "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?",
            "[ab0x.A/-]{0,9}",
            "[a-z]{55,70}",
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        /// Generated objects: wherever they sit and whatever they claim, the rule agrees with its plain
        /// statement, and an object it gives to a tenant sits in that tenant's super namespace and is no
        /// other tenant's.
        #[test]
        fn the_owner_rule_holds_for_generated_objects(
            cluster in name(),
            tenant_namespace in name(),
            other_cluster in name(),
            elsewhere in name(),
            mapped in proptest::bool::ANY,
            namespaced in proptest::bool::ANY,
            root in proptest::bool::ANY,
            uid in proptest::option::of("[a-z0-9-]{0,8}"),
        ) {
            // Half the objects sit where their annotations map to, the rest anywhere.
            let place = match mapped {
                true => super_namespace(&cluster, &tenant_namespace),
                false => elsewhere,
            };
            let mut annotations = vec![
                (ANNOTATION_CLUSTER, cluster.as_str()),
                (ANNOTATION_NAMESPACE, tenant_namespace.as_str()),
            ];
            annotations.extend(uid.as_deref().map(|u| (ANNOTATION_UID, u)));
            if root {
                annotations.push((ANNOTATION_ROOT_NAMESPACE, "true"));
            }
            let meta = match namespaced {
                true => super_object(Some(&place), "web", &annotations),
                false => super_object(None, &place, &annotations),
            };
            let owned = check_against_the_plain_rule(&meta);
            proptest::prop_assert_eq!(belongs_to(&meta, &cluster), owned);
            if other_cluster != cluster {
                proptest::prop_assert!(!belongs_to(&meta, &other_cluster));
            }
            // What a tenant writes where it maps to is that tenant's, once its names are names (a root
            // namespace serves none).
            let root_namespace = root && !namespaced;
            let names = naming::is_dns_label(&cluster) && naming::is_dns_label(&tenant_namespace);
            if mapped && names && !root_namespace {
                proptest::prop_assert!(owned, "{:?}", meta);
            }
        }
    }
}
