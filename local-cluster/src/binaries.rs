use std::{
    io::Write,
    path::{Path, PathBuf},
};

use crate::{Error, Result};

/// A program the harness runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Binary {
    /// etcd (Debian's etcd-server package).
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

/// Folders searched, in order: `$KUBEBUILDER_ASSETS`, else `/usr/local/kubebuilder/bin`, then `PATH`, then
/// the cache `vc-sandbox --download` fills.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    match std::env::var_os("KUBEBUILDER_ASSETS").filter(|v| !v.is_empty()) {
        Some(assets) => dirs.push(PathBuf::from(assets)),
        None => dirs.push(PathBuf::from("/usr/local/kubebuilder/bin")),
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.extend(crate::download::default_cache_dir(
        crate::download::KUBERNETES_VERSION,
    ));
    dirs
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds a binary.
pub fn locate(binary: Binary) -> Result<PathBuf> {
    let dirs = search_dirs();
    dirs.iter()
        .map(|dir| dir.join(binary.file_name()))
        .find(|path| is_executable(path))
        .ok_or_else(|| Error::MissingBinary {
            binary: binary.file_name(),
            searched: describe_search(&dirs),
        })
}

fn describe_search(dirs: &[PathBuf]) -> String {
    let first = dirs.first().map(|d| d.display().to_string()).unwrap_or_default();
    let source = if std::env::var_os("KUBEBUILDER_ASSETS").is_some_and(|v| !v.is_empty()) {
        "$KUBEBUILDER_ASSETS"
    } else {
        "default"
    };
    let cache = crate::download::default_cache_dir(crate::download::KUBERNETES_VERSION)
        .map(|d| format!(", then {}", d.display()))
        .unwrap_or_default();
    format!("{first} ({source}) and PATH{cache}")
}

/// Checks that every binary a test needs is present. When one is missing, prints one line naming the test
/// and the binary and returns `false`: the caller returns early (a skip). The line is written straight to
/// the process's stderr so the test runner's output capture does not hide it.
pub fn require(test: &str, binaries: &[Binary]) -> bool {
    let missing: Vec<String> = binaries
        .iter()
        .filter_map(|b| locate(*b).err())
        .map(|e| e.to_string())
        .collect();
    if missing.is_empty() {
        crate::turns::take_turn();
        return true;
    }
    let line = format!("SKIPPED e2e test {test}: {}\n", missing.join("; "));
    let _ = std::io::stderr().write_all(line.as_bytes());
    false
}
