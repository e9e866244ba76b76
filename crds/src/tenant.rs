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
    naming::{cluster_key_of, super_namespace},
    wellknown::{
        ANNOTATION_CLUSTER, ANNOTATION_ROOT_NAMESPACE, ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE,
        ANNOTATION_VC_UID,
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

/// The cluster key a super object belongs to, from its `tenancy.x-k8s.io/cluster` annotation.
pub fn owner_cluster(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(ANNOTATION_CLUSTER)
        .map(String::as_str)
}

/// Whether a super object belongs to the tenant with this cluster key.
pub fn belongs_to(meta: &ObjectMeta, cluster_key: &str) -> bool {
    owner_cluster(meta) == Some(cluster_key)
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
    fn ownership_is_read_from_the_cluster_annotation() {
        let identity = TenantIdentity::of(&vc()).expect("identity");
        let meta = ObjectMeta {
            annotations: Some(identity.annotations()),
            ..Default::default()
        };
        assert_eq!(owner_cluster(&meta), Some(identity.cluster_key.as_str()));
        assert!(belongs_to(&meta, &identity.cluster_key));
        assert!(!belongs_to(&meta, "team-ffffff-vc-1"));
        assert!(!belongs_to(&ObjectMeta::default(), &identity.cluster_key));
    }
}
