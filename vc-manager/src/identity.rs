//! Who a super-cluster object belongs to: the tenant's cluster key and its VirtualCluster, written as the
//! original project's annotations and read back to map watch events to VirtualClusters.

use std::collections::BTreeMap;

use crds::{
    VirtualCluster,
    naming::cluster_key_of,
    wellknown::{
        ANNOTATION_CLUSTER, ANNOTATION_ROOT_NAMESPACE, ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE,
        ANNOTATION_VC_UID, LABEL_MANAGED_BY,
    },
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{ResourceExt, runtime::reflector::ObjectRef};

use crate::{Error, Result};

/// Value of `app.kubernetes.io/managed-by` on everything vc-manager creates.
pub use crds::wellknown::MANAGED_BY_VC_MANAGER as MANAGED_BY;

/// The label selector of objects vc-manager creates.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// A tenant's identity in the super cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantIdentity {
    /// The cluster key, which is also the root namespace.
    pub cluster_key: String,
    /// Name of the VirtualCluster.
    pub vc_name: String,
    /// Namespace of the VirtualCluster.
    pub vc_namespace: String,
    /// Uid of the VirtualCluster.
    pub vc_uid: String,
}

impl TenantIdentity {
    /// The identity of a VirtualCluster read from an apiserver (it has a namespace and uid).
    pub fn of(vc: &VirtualCluster) -> Result<Self> {
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

    /// `namespace/name` of the VirtualCluster.
    pub fn vc_display(&self) -> String {
        format!("{}/{}", self.vc_namespace, self.vc_name)
    }

    /// Annotations on every object vc-manager creates for this tenant.
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

    /// Annotations of the root namespace: the object annotations plus `vcrootns: "true"`.
    pub fn root_namespace_annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = self.annotations();
        annotations.insert(ANNOTATION_ROOT_NAMESPACE.to_owned(), "true".to_owned());
        annotations
    }

    /// Labels on every object vc-manager creates. Deliberately not the syncer's `vcname`/`vcnamespace`
    /// labels: those mark the syncer's tenant namespaces and objects.
    pub fn labels(&self) -> BTreeMap<String, String> {
        [(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned())].into()
    }
}

/// The VirtualCluster an object was created for, from its `vcname`/`vcnamespace` annotations.
pub fn owner_of(meta: &ObjectMeta) -> Option<ObjectRef<VirtualCluster>> {
    let annotations = meta.annotations.as_ref()?;
    let name = annotations.get(ANNOTATION_VC_NAME)?;
    let namespace = annotations.get(ANNOTATION_VC_NAMESPACE)?;
    Some(ObjectRef::new(name).within(namespace))
}

#[cfg(test)]
mod tests {
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
            crds::naming::cluster_key("team", "uid-1", "vc-1")
        );
        assert_eq!(identity.root_namespace(), identity.cluster_key);
        let annotations = identity.root_namespace_annotations();
        assert_eq!(annotations[ANNOTATION_ROOT_NAMESPACE], "true");
        assert_eq!(annotations[ANNOTATION_VC_UID], "uid-1");
        assert_eq!(annotations[ANNOTATION_CLUSTER], identity.cluster_key);
        assert_eq!(identity.labels()[LABEL_MANAGED_BY], "vc-manager");
        assert!(!identity.labels().contains_key(crds::wellknown::LABEL_VC_NAME));
    }

    #[test]
    fn objects_map_back_to_their_virtual_cluster() {
        let identity = TenantIdentity::of(&vc()).expect("identity");
        let meta = ObjectMeta {
            annotations: Some(identity.annotations()),
            ..Default::default()
        };
        assert_eq!(owner_of(&meta), Some(ObjectRef::new("vc-1").within("team")));
        assert_eq!(owner_of(&ObjectMeta::default()), None);
    }

    #[test]
    fn a_virtual_cluster_without_uid_has_no_identity() {
        let mut vc = vc();
        vc.metadata.uid = None;
        assert!(matches!(
            TenantIdentity::of(&vc),
            Err(Error::MissingIdentity { .. })
        ));
    }
}
