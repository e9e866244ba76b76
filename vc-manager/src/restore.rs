//! A VirtualCluster being restored from a snapshot (`kubectl vc snapshot restore`): which parts of its
//! control plane vc-manager holds back, read from its [`ANNOTATION_RESTORE`] annotation. The restore
//! writes the snapshot's certificate authorities and keys while only the root namespace exists (so vc-manager
//! keeps them instead of generating new ones), then the snapshot's etcd keys while etcd runs alone (so the
//! apiserver never starts on an empty etcd and writes its defaults over them).

use crds::{
    VirtualCluster,
    wellknown::{ANNOTATION_RESTORE, RESTORE_STAGE_ETCD, RESTORE_STAGE_PKI},
};

use crate::component::Component;

/// How far a restore has got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreStage {
    /// Waiting for the snapshot's certificate authorities and service-account key: only the root
    /// namespace is made.
    Pki,
    /// Waiting for the snapshot's etcd keys: everything up to etcd is made, the apiserver and
    /// controller-manager are not.
    Etcd,
}

/// Reason of the phase while a restore holds the control plane.
pub const REASON_RESTORING: &str = "RestoringSnapshot";

impl RestoreStage {
    /// The stage a VirtualCluster's annotation names. Any other value holds nothing: a mistyped
    /// annotation must not keep a tenant down.
    pub fn of(vc: &VirtualCluster) -> Option<Self> {
        let value = vc.metadata.annotations.as_ref()?.get(ANNOTATION_RESTORE)?;
        match value.as_str() {
            RESTORE_STAGE_PKI => Some(Self::Pki),
            RESTORE_STAGE_ETCD => Some(Self::Etcd),
            _ => None,
        }
    }

    /// Whether a component not created yet must wait (components that exist are never held back, so the
    /// annotation cannot stop a running tenant).
    pub fn holds(self, component: Component) -> bool {
        match self {
            Self::Pki => true,
            Self::Etcd => component != Component::Etcd,
        }
    }

    /// The phase message while held, naming the root namespace.
    pub fn message(self, root_namespace: &str) -> String {
        match self {
            Self::Pki => format!(
                "waiting for the snapshot's certificate authorities and service-account key in {root_namespace} (kubectl vc snapshot restore; remove annotation {ANNOTATION_RESTORE} to provision new ones)"
            ),
            Self::Etcd => format!(
                "etcd alone is provisioned; the apiserver waits for the snapshot's keys (kubectl vc snapshot restore; remove annotation {ANNOTATION_RESTORE} to start with what etcd holds)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(value: Option<&str>) -> VirtualCluster {
        let mut vc = VirtualCluster::new("vc-1", Default::default());
        vc.metadata.annotations = value.map(|v| {
            [(ANNOTATION_RESTORE.to_owned(), v.to_owned())]
                .into_iter()
                .collect()
        });
        vc
    }

    #[test]
    fn the_annotation_names_the_stage_and_anything_else_holds_nothing() {
        assert_eq!(RestoreStage::of(&annotated(Some("pki"))), Some(RestoreStage::Pki));
        assert_eq!(
            RestoreStage::of(&annotated(Some("etcd"))),
            Some(RestoreStage::Etcd)
        );
        assert_eq!(RestoreStage::of(&annotated(Some("ETCD"))), None);
        assert_eq!(RestoreStage::of(&annotated(None)), None);
    }

    #[test]
    fn etcd_runs_alone_while_the_keys_go_in() {
        assert!(!RestoreStage::Etcd.holds(Component::Etcd));
        assert!(RestoreStage::Etcd.holds(Component::ApiServer));
        assert!(RestoreStage::Etcd.holds(Component::ControllerManager));
        assert!(Component::ALL.iter().all(|c| RestoreStage::Pki.holds(*c)));
    }
}
