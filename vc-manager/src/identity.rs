//! Who a super-cluster object belongs to: the tenant's identity ([`crds::TenantIdentity`]) written as the
//! original project's annotations, vc-manager's own label, and the annotations read back to map watch
//! events to VirtualClusters.

pub use crds::TenantIdentity;
use crds::{
    VirtualCluster,
    wellknown::{ANNOTATION_VC_NAME, ANNOTATION_VC_NAMESPACE, LABEL_MANAGED_BY},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;

/// Value of `app.kubernetes.io/managed-by` on everything vc-manager creates.
pub use crds::wellknown::MANAGED_BY_VC_MANAGER as MANAGED_BY;

/// The label selector of objects vc-manager creates.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// Labels on every object vc-manager creates. Deliberately not the syncer's `vcname`/`vcnamespace` labels:
/// those mark the syncer's tenant namespaces and objects.
pub use crds::tenant::managed_labels;

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
    use crate::fixtures::{VC_NAME, VC_NAMESPACE, native_vc};

    #[test]
    fn vc_manager_labels_its_objects_as_its_own_not_as_the_syncers() {
        assert_eq!(managed_labels()[LABEL_MANAGED_BY], "vc-manager");
        assert!(!managed_labels().contains_key(crds::wellknown::LABEL_VC_NAME));
    }

    #[test]
    fn objects_map_back_to_their_virtual_cluster() {
        let identity = TenantIdentity::of(&native_vc()).expect("identity");
        let meta = ObjectMeta {
            annotations: Some(identity.annotations()),
            ..Default::default()
        };
        assert_eq!(
            owner_of(&meta),
            Some(ObjectRef::new(VC_NAME).within(VC_NAMESPACE))
        );
        assert_eq!(owner_of(&ObjectMeta::default()), None);
    }
}
