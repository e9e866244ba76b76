//! Downloads the Kubernetes binaries of one pinned release from the official release site, verified by
//! their published SHA-256 checksums (what `vc-sandbox --download` does).
//!
//! The release site's layout is `<base>/release/<version>/bin/linux/<arch>/<binary>`, with the binary's
//! SHA-256 at the same URL plus `.sha256` (the hex digest, possibly followed by whitespace and a file name).
//! `https://dl.k8s.io` answers with a redirect to a CDN; redirects are followed.
//!
//! For each wanted binary, [`download_missing`]:
//! 1. skips it when the caller already has it (its `present` function says so);
//! 2. fetches the published checksum;
//! 3. skips it when the cache folder already holds it with that checksum;
//! 4. otherwise streams it into a temporary file in the cache folder while hashing, compares the digest
//!    with the published one and only then makes it executable (0755) and renames it into place.
//!
//! A mismatch, an HTTP error, a timeout or an I/O error removes the temporary file: nothing unverified is
//! ever found under a binary's final name. A file under the final name whose checksum is wrong (damaged
//! after the fact) is replaced by a verified download.

use std::{
    fmt,
    io::Read as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt as _;

/// The pinned Kubernetes release.
pub const KUBERNETES_VERSION: &str = "v1.33.3";

/// The pinned architecture.
pub const ARCH: &str = "amd64";

/// The official release site.
pub const DEFAULT_BASE_URL: &str = "https://dl.k8s.io";

/// The binaries fetched by default: the control plane, kubectl and the node parts.
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

/// Redirects followed per request at most.
const MAX_REDIRECTS: usize = 5;

/// A `.sha256` file longer than this is not a checksum file.
const MAX_CHECKSUM_BODY: usize = 4096;

/// Errors of a download. Each names what was being fetched or written.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Neither `$XDG_CACHE_HOME` nor `$HOME` is set, so there is no default cache folder.
    #[error("no cache folder: neither $XDG_CACHE_HOME nor $HOME is set")]
    NoCacheDir,
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
    #[error("GET {url}: more than {MAX_REDIRECTS} redirects")]
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
    /// The checksum file holds no SHA-256 digest.
    #[error("checksum file {url}: {reason}")]
    BadChecksumFile {
        /// The URL of the checksum file.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The downloaded binary's digest differs from the published one; nothing was kept.
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
    /// The architecture, e.g. `amd64`.
    pub arch: String,
    /// Where the binaries are kept (created when missing).
    pub cache_dir: PathBuf,
    /// File names of the binaries wanted.
    pub binaries: Vec<String>,
    /// Longest wait for a connection plus response headers, and for each next piece of a body.
    pub timeout: Duration,
}

impl DownloadOptions {
    /// The pinned release ([`KUBERNETES_VERSION`], linux/[`ARCH`], every binary of [`BINARIES`]) from the
    /// official site into [`default_cache_dir`].
    pub fn pinned() -> Result<Self, DownloadError> {
        let cache_dir = default_cache_dir(KUBERNETES_VERSION).ok_or(DownloadError::NoCacheDir)?;
        Ok(Self::pinned_into(cache_dir))
    }

    /// The pinned release from the official site into `cache_dir`.
    pub fn pinned_into(cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            version: KUBERNETES_VERSION.to_owned(),
            arch: ARCH.to_owned(),
            cache_dir: cache_dir.into(),
            binaries: BINARIES.iter().map(|b| (*b).to_owned()).collect(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The URL of a binary; its checksum is at the same URL plus `.sha256`.
    pub fn binary_url(&self, binary: &str) -> String {
        binary_url(&self.base_url, &self.version, &self.arch, binary)
    }
}

/// `<base>/release/<version>/bin/linux/<arch>/<binary>`.
pub fn binary_url(base_url: &str, version: &str, arch: &str, binary: &str) -> String {
    format!(
        "{}/release/{version}/bin/linux/{arch}/{binary}",
        base_url.trim_end_matches('/')
    )
}

/// `$XDG_CACHE_HOME/virtualcluster-rs/kubernetes/<version>/bin`, else `~/.cache/...`; `None` when neither
/// variable is set (a relative `$XDG_CACHE_HOME` is ignored, as the XDG specification says).
pub fn default_cache_dir(version: &str) -> Option<PathBuf> {
    cache_dir_from(
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
        version,
    )
}

fn cache_dir_from(
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
    version: &str,
) -> Option<PathBuf> {
    let base = xdg_cache_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            home.filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(
        base.join("virtualcluster-rs")
            .join("kubernetes")
            .join(version)
            .join("bin"),
    )
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
        /// Its size.
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
                "{binary}: downloaded {:.1} MB to {} (checksum verified)",
                *bytes as f64 / 1e6,
                path.display()
            ),
        }
    }
}

/// Progress reported while [`download_missing`] runs.
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
            None => fetcher.insert(Fetcher::new(options)?),
        };
        tokio::fs::create_dir_all(&options.cache_dir)
            .await
            .map_err(io_err(format!("creating {}", options.cache_dir.display())))?;
        let outcome = fetch_one(fetcher, options, binary, &mut progress).await?;
        progress(Progress::Done(&outcome));
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

async fn fetch_one(
    fetcher: &Fetcher,
    options: &DownloadOptions,
    binary: &str,
    progress: &mut impl FnMut(Progress<'_>),
) -> Result<Outcome, DownloadError> {
    let url = options.binary_url(binary);
    let checksum_url = format!("{url}.sha256");
    let expected = fetcher.checksum(&checksum_url).await?;
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
    // Dropped (and so deleted) on every early return, also when this future is cancelled.
    let temp = tempfile::Builder::new()
        .prefix(&format!(".{binary}."))
        .suffix(".partial")
        .tempfile_in(&options.cache_dir)
        .map_err(io_err(format!(
            "creating a temporary file in {}",
            options.cache_dir.display()
        )))?;
    let file = temp
        .as_file()
        .try_clone()
        .map_err(io_err(format!("opening {}", temp.path().display())))?;
    let mut file = tokio::fs::File::from_std(file);
    let (actual, bytes) = fetcher.stream_to(&url, &mut file, temp.path()).await?;
    if actual != expected {
        drop(file);
        drop(temp);
        return Err(DownloadError::ChecksumMismatch {
            binary: binary.to_owned(),
            url,
            expected,
            actual,
        });
    }
    file.sync_all()
        .await
        .map_err(io_err(format!("writing {}", temp.path().display())))?;
    drop(file);
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(io_err(format!("making {} executable", temp.path().display())))?;
    }
    temp.persist(&path).map_err(|e| DownloadError::Io {
        context: format!("renaming the verified {binary} to {}", path.display()),
        source: e.error,
    })?;
    Ok(Outcome::Downloaded {
        binary: binary.to_owned(),
        path,
        bytes,
    })
}

/// The SHA-256 of a file, `None` when there is no such file.
async fn file_sha256(path: &Path) -> Result<Option<String>, DownloadError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(format!("opening {}", path.display()))(e)),
        };
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = file
                .read(&mut buf)
                .map_err(io_err(format!("reading {}", path.display())))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(Some(hex::encode(hasher.finalize())))
    })
    .await
    .map_err(|e| DownloadError::Io {
        context: "hashing a cached binary".to_owned(),
        source: std::io::Error::other(e),
    })?
}

/// An HTTP(S) client that follows redirects, with timeouts.
struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
}

impl Fetcher {
    fn new(options: &DownloadOptions) -> Result<Self, DownloadError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(builder) => builder,
            // Without system roots only plain http works (the tests' loopback site); an https base fails
            // here, clearly, rather than at the first handshake.
            Err(source) if options.base_url.starts_with("http://") => {
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| DownloadError::NoRootCertificates {
                        source: std::io::Error::other(e),
                    })?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                tracing::debug!(error = %source, "no system root certificates; https will fail");
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
            }
            Err(source) => return Err(DownloadError::NoRootCertificates { source }),
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(options.timeout));
        let connector = builder
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout: options.timeout,
        })
    }

    fn timeout_err(&self, url: &str) -> DownloadError {
        DownloadError::Timeout {
            url: url.to_owned(),
            seconds: self.timeout.as_secs_f64(),
        }
    }

    /// `GET url`, following redirects; returns a successful response.
    async fn get(&self, url: &str) -> Result<http::Response<hyper::body::Incoming>, DownloadError> {
        let mut current = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            let uri: http::Uri =
                current
                    .parse()
                    .map_err(|e: http::uri::InvalidUri| DownloadError::InvalidUrl {
                        url: current.clone(),
                        reason: e.to_string(),
                    })?;
            match uri.scheme_str() {
                Some("http" | "https") => {}
                other => {
                    return Err(DownloadError::InvalidUrl {
                        url: current,
                        reason: format!("unsupported scheme {other:?}"),
                    });
                }
            }
            let request = http::Request::get(uri.clone())
                .header(
                    http::header::USER_AGENT,
                    concat!("virtualcluster-rs-e2e/", env!("CARGO_PKG_VERSION")),
                )
                .body(Empty::new())
                .map_err(|e| DownloadError::Request {
                    url: current.clone(),
                    source: Box::new(e),
                })?;
            let response = tokio::time::timeout(self.timeout, self.client.request(request))
                .await
                .map_err(|_| self.timeout_err(&current))?
                .map_err(|e| DownloadError::Request {
                    url: current.clone(),
                    source: Box::new(e),
                })?;
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            if status.is_redirection()
                && let Some(location) = response.headers().get(http::header::LOCATION)
            {
                let location = location.to_str().map_err(|e| DownloadError::InvalidUrl {
                    url: current.clone(),
                    reason: format!("redirect with an unreadable Location: {e}"),
                })?;
                current = resolve(&uri, location).map_err(|reason| DownloadError::InvalidUrl {
                    url: location.to_owned(),
                    reason: format!("redirect from {current}: {reason}"),
                })?;
                continue;
            }
            return Err(DownloadError::Status { url: current, status });
        }
        Err(DownloadError::TooManyRedirects { url: url.to_owned() })
    }

    /// Fetches and parses a `.sha256` file.
    async fn checksum(&self, url: &str) -> Result<String, DownloadError> {
        let mut body = self.get(url).await?.into_body();
        let mut text = Vec::new();
        while let Some(frame) = tokio::time::timeout(self.timeout, body.frame())
            .await
            .map_err(|_| self.timeout_err(url))?
        {
            let frame = frame.map_err(|e| DownloadError::Request {
                url: url.to_owned(),
                source: Box::new(e),
            })?;
            if let Ok(data) = frame.into_data() {
                text.extend_from_slice(&data);
                if text.len() > MAX_CHECKSUM_BODY {
                    return Err(DownloadError::BadChecksumFile {
                        url: url.to_owned(),
                        reason: format!("longer than {MAX_CHECKSUM_BODY} bytes"),
                    });
                }
            }
        }
        let text = std::str::from_utf8(&text).map_err(|_| DownloadError::BadChecksumFile {
            url: url.to_owned(),
            reason: "not text".to_owned(),
        })?;
        parse_sha256(text).map_err(|reason| DownloadError::BadChecksumFile {
            url: url.to_owned(),
            reason,
        })
    }

    /// Streams `url` into `file`, hashing; returns the digest (lowercase hex) and the size.
    async fn stream_to(
        &self,
        url: &str,
        file: &mut tokio::fs::File,
        file_path: &Path,
    ) -> Result<(String, u64), DownloadError> {
        let mut body = self.get(url).await?.into_body();
        let mut hasher = Sha256::new();
        let mut bytes = 0u64;
        while let Some(frame) = tokio::time::timeout(self.timeout, body.frame())
            .await
            .map_err(|_| self.timeout_err(url))?
        {
            let frame = frame.map_err(|e| DownloadError::Request {
                url: url.to_owned(),
                source: Box::new(e),
            })?;
            if let Ok(data) = frame.into_data() {
                hasher.update(&data);
                bytes += data.len() as u64;
                file.write_all(&data)
                    .await
                    .map_err(io_err(format!("writing {}", file_path.display())))?;
            }
        }
        file.flush()
            .await
            .map_err(io_err(format!("writing {}", file_path.display())))?;
        Ok((hex::encode(hasher.finalize()), bytes))
    }
}

/// Resolves a redirect's `Location` against the URL that answered it: absolute URLs as they are,
/// `//host/path`, `/path` and relative paths against the base.
fn resolve(base: &http::Uri, location: &str) -> Result<String, String> {
    let scheme = base.scheme_str().ok_or("the base URL has no scheme")?;
    let authority = base.authority().ok_or("the base URL has no host")?;
    if location.contains("://") {
        return Ok(location.to_owned());
    }
    if let Some(rest) = location.strip_prefix("//") {
        return Ok(format!("{scheme}://{rest}"));
    }
    if location.starts_with('/') {
        return Ok(format!("{scheme}://{authority}{location}"));
    }
    if location.is_empty() {
        return Err("empty Location".to_owned());
    }
    let path = base.path();
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let dir = if dir.is_empty() { "/" } else { dir };
    Ok(format!("{scheme}://{authority}{dir}{location}"))
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
    fn urls() {
        assert_eq!(
            binary_url("https://dl.k8s.io/", "v1.33.3", "amd64", "kubelet"),
            "https://dl.k8s.io/release/v1.33.3/bin/linux/amd64/kubelet"
        );
    }

    #[test]
    fn redirect_locations() {
        let base: http::Uri = "https://dl.k8s.io/release/v1/bin/linux/amd64/kubectl"
            .parse()
            .unwrap();
        assert_eq!(
            resolve(&base, "https://cdn.dl.k8s.io/x").unwrap(),
            "https://cdn.dl.k8s.io/x"
        );
        assert_eq!(
            resolve(&base, "//cdn.example/x").unwrap(),
            "https://cdn.example/x"
        );
        assert_eq!(resolve(&base, "/y/z").unwrap(), "https://dl.k8s.io/y/z");
        assert_eq!(
            resolve(&base, "kubectl2").unwrap(),
            "https://dl.k8s.io/release/v1/bin/linux/amd64/kubectl2"
        );
    }

    #[test]
    fn cache_dir_prefers_xdg_then_home() {
        let dir = |xdg: Option<&str>, home: Option<&str>| {
            cache_dir_from(xdg.map(Into::into), home.map(Into::into), "v1.33.3")
        };
        assert_eq!(
            dir(Some("/xdg"), Some("/home/u")),
            Some(PathBuf::from("/xdg/virtualcluster-rs/kubernetes/v1.33.3/bin"))
        );
        assert_eq!(
            dir(None, Some("/home/u")),
            Some(PathBuf::from(
                "/home/u/.cache/virtualcluster-rs/kubernetes/v1.33.3/bin"
            ))
        );
        // A relative or empty XDG_CACHE_HOME is ignored.
        assert_eq!(
            dir(Some("rel"), Some("/home/u")),
            Some(PathBuf::from(
                "/home/u/.cache/virtualcluster-rs/kubernetes/v1.33.3/bin"
            ))
        );
        assert_eq!(
            dir(Some(""), Some("/home/u")),
            Some(PathBuf::from(
                "/home/u/.cache/virtualcluster-rs/kubernetes/v1.33.3/bin"
            ))
        );
        assert_eq!(dir(None, None), None);
        assert_eq!(dir(None, Some("")), None);
    }
}
