//! The programs the harness runs, by name: what [`crate::download`] fetches and [`crate::locate`]
//! finds.

/// A program the harness runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Binary {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    KubeApiserver,
    /// kube-controller-manager.
    KubeControllerManager,
    /// kube-scheduler.
    KubeScheduler,
    /// kubectl.
    Kubectl,
    /// kubelet (real nodes).
    Kubelet,
    /// kube-proxy (real nodes).
    KubeProxy,
}

impl Binary {
    /// Every binary, etcd first.
    pub const ALL: [Binary; 7] = [
        Binary::Etcd,
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
        Binary::Kubectl,
        Binary::Kubelet,
        Binary::KubeProxy,
    ];

    /// The executable's file name.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::KubeApiserver => "kube-apiserver",
            Self::KubeControllerManager => "kube-controller-manager",
            Self::KubeScheduler => "kube-scheduler",
            Self::Kubectl => "kubectl",
            Self::Kubelet => "kubelet",
            Self::KubeProxy => "kube-proxy",
        }
    }
}
