//! etcd from etcd-io's GitHub release: the tarball `etcd-<version>-linux-<arch>.tar.gz`, checked against the
//! release's `SHA256SUMS`, of which `etcd` and `etcdctl` are installed into the cache folder.
//!
//! Beside them a manifest, `.etcd-<version>-linux-<arch>.tar.gz.sha256` (in `sha256sum` format), records
//! the digests of the installed files, so that a later run knows them as verified without the network,
//! and replaces them when they were damaged.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    Arch, DEFAULT_TIMEOUT, DownloadError, Outcome, Progress, create_dir, etcd_dir,
    fetch::{Fetcher, copy_to_temp, file_sha256, install_executable, write_atomically},
    io_err, parse_sha256sums,
};

/// The pinned etcd release: the one kubeadm runs with Kubernetes v1.33.
pub const ETCD_VERSION: &str = "v3.5.21";

/// Where etcd-io's releases are downloaded from: `<base>/<version>/<file>`.
pub const ETCD_BASE_URL: &str = "https://github.com/etcd-io/etcd/releases/download";

/// The files installed from the tarball.
pub const ETCD_BINARIES: &[&str] = &["etcd", "etcdctl"];

/// A `SHA256SUMS` file longer than this is not one (etcd's lists a few dozen files).
const MAX_SUMS_BODY: usize = 64 * 1024;

/// Which etcd, from where, to where.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// The release site, without a trailing slash (default [`ETCD_BASE_URL`]).
    pub base_url: String,
    /// The release, e.g. `v3.5.21`.
    pub version: String,
    /// The architecture.
    pub arch: Arch,
    /// Where `etcd` and `etcdctl` are kept (created when missing).
    pub cache_dir: PathBuf,
    /// Longest wait for a connection plus response headers, and for each next piece of a body.
    pub timeout: Duration,
}

impl EtcdOptions {
    /// The pinned release for `arch` from GitHub into `<cache root>/etcd/<version>/bin`.
    pub fn pinned(arch: Arch) -> Result<Self, DownloadError> {
        let root = super::cache_root().ok_or(DownloadError::NoCacheDir)?;
        Ok(Self::pinned_into(etcd_dir(&root, ETCD_VERSION), arch))
    }

    /// The pinned release for `arch` from GitHub into `cache_dir`.
    pub fn pinned_into(cache_dir: impl Into<PathBuf>, arch: Arch) -> Self {
        Self {
            base_url: ETCD_BASE_URL.to_owned(),
            version: ETCD_VERSION.to_owned(),
            arch,
            cache_dir: cache_dir.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// `etcd-<version>-linux-<arch>.tar.gz`.
    pub fn tarball_name(&self) -> String {
        tarball_name(&self.version, self.arch)
    }

    /// `<base>/<version>/etcd-<version>-linux-<arch>.tar.gz`.
    pub fn tarball_url(&self) -> String {
        format!(
            "{}/{}/{}",
            self.base_url.trim_end_matches('/'),
            self.version,
            self.tarball_name()
        )
    }

    /// `<base>/<version>/SHA256SUMS`.
    pub fn sums_url(&self) -> String {
        format!(
            "{}/{}/SHA256SUMS",
            self.base_url.trim_end_matches('/'),
            self.version
        )
    }

    /// The manifest of what was installed from the tarball.
    pub fn manifest_path(&self) -> PathBuf {
        self.cache_dir.join(format!(".{}.sha256", self.tarball_name()))
    }
}

/// `etcd-<version>-linux-<arch>.tar.gz`.
pub fn tarball_name(version: &str, arch: Arch) -> String {
    format!("etcd-{version}-linux-{arch}.tar.gz")
}

/// Which wanted file a tarball member is: `<top>/<name>` (optionally `./`-prefixed) with `name` one of
/// `wanted`; `None` for every other member (documentation, other tools, anything in another folder).
pub fn member<'a>(entry_path: &str, top: &str, wanted: &[&'a str]) -> Option<&'a str> {
    let path = entry_path.strip_prefix("./").unwrap_or(entry_path);
    let name = path.strip_prefix(top)?.strip_prefix('/')?;
    wanted.iter().find(|w| **w == name).copied()
}

/// Whether every file the manifest at `manifest` lists for `names` is in `dir` with that digest.
pub(super) async fn manifest_holds(
    manifest: &Path,
    dir: &Path,
    names: &[&str],
) -> Result<bool, DownloadError> {
    let text = match tokio::fs::read_to_string(manifest).await {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(format!("reading {}", manifest.display()))(e)),
    };
    for name in names {
        let Ok(expected) = parse_sha256sums(&text, name) else {
            return Ok(false);
        };
        if file_sha256(&dir.join(name)).await?.as_deref() != Some(expected.as_str()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `<digest>  <name>` lines.
pub(super) fn manifest_text(entries: &[(String, String)]) -> String {
    entries
        .iter()
        .map(|(name, digest)| format!("{digest}  {name}\n"))
        .collect()
}

/// Installs etcd and etcdctl of `options` into its cache folder, unless they are there, verified, already.
pub async fn download_etcd(
    options: &EtcdOptions,
    progress: &mut impl FnMut(Progress<'_>),
) -> Result<Outcome, DownloadError> {
    let etcd_path = options.cache_dir.join("etcd");
    if manifest_holds(&options.manifest_path(), &options.cache_dir, ETCD_BINARIES).await? {
        return Ok(Outcome::Cached {
            binary: "etcd".to_owned(),
            path: etcd_path,
        });
    }
    let fetcher = Fetcher::new(options.timeout, options.base_url.starts_with("http://"))?;
    let tarball = options.tarball_name();
    let sums_url = options.sums_url();
    let sums = fetcher.text(&sums_url, MAX_SUMS_BODY, None).await?;
    let expected = parse_sha256sums(&sums, &tarball).map_err(|reason| DownloadError::BadChecksumFile {
        url: sums_url.clone(),
        reason,
    })?;
    create_dir(&options.cache_dir).await?;
    let url = options.tarball_url();
    progress(Progress::Downloading {
        binary: "etcd",
        url: &url,
    });
    let staged = fetcher.to_temp_file(&url, &options.cache_dir, &tarball).await?;
    if staged.sha256 != expected {
        return Err(DownloadError::ChecksumMismatch {
            binary: "etcd".to_owned(),
            url,
            expected,
            actual: staged.sha256,
        });
    }
    let bytes = staged.bytes;
    let dir = options.cache_dir.clone();
    let manifest = options.manifest_path();
    let top = tarball.trim_end_matches(".tar.gz").to_owned();
    tokio::task::spawn_blocking(move || extract(staged.file.path(), &tarball, &top, &dir, &manifest))
        .await
        .map_err(|e| DownloadError::Io {
            context: "extracting etcd".to_owned(),
            source: std::io::Error::other(e),
        })??;
    Ok(Outcome::Downloaded {
        binary: "etcd".to_owned(),
        path: etcd_path,
        bytes,
    })
}

/// Unpacks the wanted members of a verified tarball into temporary files, and only when all are there
/// installs them and writes the manifest.
fn extract(
    tarball_path: &Path,
    tarball: &str,
    top: &str,
    dir: &Path,
    manifest: &Path,
) -> Result<(), DownloadError> {
    let archive_err = |reason: String| DownloadError::Archive {
        archive: tarball.to_owned(),
        reason,
    };
    let file =
        std::fs::File::open(tarball_path).map_err(io_err(format!("opening {}", tarball_path.display())))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut staged: Vec<(&str, tempfile::NamedTempFile, String)> = Vec::new();
    let entries = archive
        .entries()
        .map_err(|e| archive_err(format!("not a gzipped tarball: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| archive_err(format!("reading it: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| archive_err(format!("a member's name: {e}")))?
            .to_string_lossy()
            .into_owned();
        let Some(name) = member(&path, top, ETCD_BINARIES) else {
            continue;
        };
        if !entry.header().entry_type().is_file() {
            return Err(archive_err(format!("{path} is not a regular file")));
        }
        if staged.iter().any(|(n, _, _)| *n == name) {
            return Err(archive_err(format!("{path} appears twice")));
        }
        let (temp, digest) = copy_to_temp(&mut entry, dir, name)?;
        staged.push((name, temp, digest));
    }
    let missing: Vec<&str> = ETCD_BINARIES
        .iter()
        .filter(|w| !staged.iter().any(|(n, _, _)| n == *w))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(archive_err(format!(
            "holds no {}",
            missing
                .iter()
                .map(|m| format!("{top}/{m}"))
                .collect::<Vec<_>>()
                .join(" or ")
        )));
    }
    // An old manifest must not vouch for a half-replaced set.
    match std::fs::remove_file(manifest) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(format!("removing {}", manifest.display()))(e)),
    }
    let mut entries = Vec::new();
    for (name, temp, digest) in staged {
        install_executable(temp, &dir.join(name))?;
        entries.push((name.to_owned(), digest));
    }
    write_atomically(manifest, &manifest_text(&entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_urls_per_arch() {
        let amd = EtcdOptions::pinned_into("/c", Arch::Amd64);
        assert_eq!(amd.tarball_name(), "etcd-v3.5.21-linux-amd64.tar.gz");
        assert_eq!(
            amd.tarball_url(),
            "https://github.com/etcd-io/etcd/releases/download/v3.5.21/etcd-v3.5.21-linux-amd64.tar.gz"
        );
        assert_eq!(
            amd.sums_url(),
            "https://github.com/etcd-io/etcd/releases/download/v3.5.21/SHA256SUMS"
        );
        assert_eq!(
            amd.manifest_path(),
            PathBuf::from("/c/.etcd-v3.5.21-linux-amd64.tar.gz.sha256")
        );
        let arm = EtcdOptions {
            base_url: "http://127.0.0.1:1/".to_owned(),
            ..EtcdOptions::pinned_into("/c", Arch::Arm64)
        };
        assert_eq!(
            arm.tarball_url(),
            "http://127.0.0.1:1/v3.5.21/etcd-v3.5.21-linux-arm64.tar.gz"
        );
    }

    #[test]
    fn member_selection() {
        let top = "etcd-v3.5.21-linux-amd64";
        let pick = |path: &str| member(path, top, ETCD_BINARIES);
        assert_eq!(pick("etcd-v3.5.21-linux-amd64/etcd"), Some("etcd"));
        assert_eq!(pick("./etcd-v3.5.21-linux-amd64/etcdctl"), Some("etcdctl"));
        for other in [
            "etcd-v3.5.21-linux-amd64/",
            "etcd-v3.5.21-linux-amd64/etcdutl",
            "etcd-v3.5.21-linux-amd64/README.md",
            "etcd-v3.5.21-linux-amd64/Documentation/etcd",
            "etcd-v3.5.21-linux-arm64/etcd",
            "etcd-v3.5.21-linux-amd64-extra/etcd",
            "etcd",
            "../etcd-v3.5.21-linux-amd64/etcd",
            "etcd-v3.5.21-linux-amd64/../etcd",
        ] {
            assert_eq!(pick(other), None, "{other}");
        }
    }

    #[test]
    fn manifest_is_sha256sum_format() {
        let digest = "ab".repeat(32);
        let text = manifest_text(&[("etcd".to_owned(), digest.clone())]);
        assert_eq!(text, format!("{digest}  etcd\n"));
        assert_eq!(parse_sha256sums(&text, "etcd"), Ok(digest));
    }
}
