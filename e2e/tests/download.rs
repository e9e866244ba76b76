//! `local_cluster::download` against a loopback HTTP server serving a small fake Kubernetes release: a few bytes per
//! "binary" and their `.sha256` files, some right and some wrong. Needs no Kubernetes binaries.

use std::{
    collections::HashMap,
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use local_cluster::download::{
    BINARIES, DownloadError, DownloadOptions, Outcome, Progress, download_missing, parse_sha256,
};
use sha2::{Digest, Sha256};

const VERSION: &str = "v1.33.3";
const ARCH: &str = "amd64";

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn release_path(binary: &str) -> String {
    format!("/release/{VERSION}/bin/linux/{ARCH}/{binary}")
}

/// One answer of the fake site.
#[derive(Clone)]
enum Answer {
    Body(Vec<u8>),
    Redirect(String),
    /// Headers only after this long.
    Slow(Duration),
}

#[derive(Default)]
struct Site {
    answers: Mutex<HashMap<String, Answer>>,
    /// Paths requested, in order.
    requests: Mutex<Vec<String>>,
}

impl Site {
    fn set(&self, path: impl Into<String>, answer: Answer) {
        self.answers.lock().unwrap().insert(path.into(), answer);
    }

    fn remove(&self, path: &str) {
        self.answers.lock().unwrap().remove(path);
    }

    /// Requests of binaries (not of checksums).
    fn binary_requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|p| !p.ends_with(".sha256"))
            .cloned()
            .collect()
    }

    fn requests_of(&self, binary: &str) -> usize {
        let path = release_path(binary);
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|p| **p == path || **p == format!("{path}.sha256"))
            .count()
    }
}

async fn serve(State(site): State<Arc<Site>>, uri: Uri) -> Response {
    let path = uri.path().to_owned();
    site.requests.lock().unwrap().push(path.clone());
    let answer = site.answers.lock().unwrap().get(&path).cloned();
    match answer {
        Some(Answer::Body(body)) => body.into_response(),
        Some(Answer::Redirect(to)) => (StatusCode::FOUND, [(header::LOCATION, to)]).into_response(),
        Some(Answer::Slow(delay)) => {
            tokio::time::sleep(delay).await;
            "late".into_response()
        }
        None => (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
    }
}

/// The fake release: for each binary a few bytes of its own and the right checksum, in the formats the
/// real site and `sha256sum` use. `kubectl` is served through a redirect to a "CDN" path, as dl.k8s.io
/// does.
struct FakeRelease {
    site: Arc<Site>,
    base_url: String,
    contents: HashMap<String, Vec<u8>>,
    _server: tokio::task::JoinHandle<()>,
}

impl FakeRelease {
    async fn start() -> Self {
        let site = Arc::new(Site::default());
        let mut contents = HashMap::new();
        for (i, binary) in BINARIES.iter().enumerate() {
            let body = format!("#!/bin/sh\necho fake {binary} {VERSION}\n").into_bytes();
            let digest = sha256_hex(&body);
            // Bare digest (as dl.k8s.io serves it) or `sha256sum` output with a file name.
            let checksum = if i % 2 == 0 {
                digest
            } else {
                format!("{digest}  {binary}\n")
            };
            site.set(
                format!("{}.sha256", release_path(binary)),
                Answer::Body(checksum.into_bytes()),
            );
            if *binary == "kubectl" {
                let cdn = format!("/cdn{}", release_path(binary));
                site.set(release_path(binary), Answer::Redirect(cdn.clone()));
                site.set(cdn, Answer::Body(body.clone()));
            } else {
                site.set(release_path(binary), Answer::Body(body.clone()));
            }
            contents.insert((*binary).to_owned(), body);
        }
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(serve).with_state(site.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            site,
            base_url: format!("http://{addr}"),
            contents,
            _server: server,
        }
    }

    fn options(&self, cache_dir: &Path) -> DownloadOptions {
        DownloadOptions {
            base_url: self.base_url.clone(),
            version: VERSION.to_owned(),
            arch: ARCH.to_owned(),
            cache_dir: cache_dir.to_owned(),
            binaries: BINARIES.iter().map(|b| (*b).to_owned()).collect(),
            timeout: Duration::from_secs(10),
        }
    }

    /// Serves a different body for `binary` while its checksum stays that of the original.
    fn tamper(&self, binary: &str, body: &[u8]) {
        self.site.set(release_path(binary), Answer::Body(body.to_vec()));
    }
}

/// Runs a download with nothing present elsewhere and no progress output.
async fn run(options: &DownloadOptions) -> Result<Vec<Outcome>, DownloadError> {
    download_missing(options, |_| false, |_| {}).await
}

/// Files in `dir` other than the final binaries (temporary files left behind).
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| !BINARIES.contains(&name.as_str()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn downloads_every_binary_verified_and_executable() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    // A folder that does not exist yet: it is created.
    let dir = cache.path().join("kubernetes").join(VERSION).join("bin");
    let options = release.options(&dir);

    let mut events = Vec::new();
    let outcomes = download_missing(
        &options,
        |_| false,
        |event| {
            events.push(match event {
                Progress::Downloading { binary, url } => format!("downloading {binary} from {url}"),
                Progress::Done(outcome) => outcome.to_string(),
            })
        },
    )
    .await
    .unwrap();

    assert_eq!(outcomes.len(), BINARIES.len());
    for (outcome, binary) in outcomes.iter().zip(BINARIES) {
        let path = dir.join(binary);
        let expected = &release.contents[*binary];
        assert_eq!(
            outcome,
            &Outcome::Downloaded {
                binary: (*binary).to_owned(),
                path: path.clone(),
                bytes: expected.len() as u64,
            }
        );
        assert_eq!(&std::fs::read(&path).unwrap(), expected, "{binary}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "{binary} mode {mode:o}");
    }
    assert_eq!(leftovers(&dir), Vec::<String>::new());
    // Two events per binary: the start and the outcome.
    assert_eq!(events.len(), 2 * BINARIES.len(), "{events:#?}");
    let kubectl_url = format!("{}{}", release.base_url, release_path("kubectl"));
    assert!(
        events.contains(&format!("downloading kubectl from {kubectl_url}")),
        "{events:#?}"
    );
    assert!(
        events.iter().any(|e| e.starts_with("kubelet: downloaded")),
        "{events:#?}"
    );
    // kubectl came through the redirect.
    assert!(
        release
            .site
            .binary_requests()
            .contains(&format!("/cdn{}", release_path("kubectl"))),
        "{:?}",
        release.site.binary_requests()
    );
}

#[tokio::test]
async fn a_second_run_downloads_nothing() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.options(cache.path());
    run(&options).await.unwrap();
    let fetched = release.site.binary_requests().len();

    let outcomes = run(&options).await.unwrap();
    for (outcome, binary) in outcomes.iter().zip(BINARIES) {
        assert_eq!(
            outcome,
            &Outcome::Cached {
                binary: (*binary).to_owned(),
                path: cache.path().join(binary),
            }
        );
    }
    assert_eq!(
        release.site.binary_requests().len(),
        fetched,
        "the second run fetched binaries: {:?}",
        release.site.binary_requests()
    );
}

#[tokio::test]
async fn a_wrong_checksum_is_refused_and_nothing_is_kept() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kube-scheduler".to_owned()];
    let evil = b"#!/bin/sh\necho not what was published\n";
    release.tamper("kube-scheduler", evil);
    let expected = sha256_hex(&release.contents["kube-scheduler"]);
    let actual = sha256_hex(evil);

    let err = run(&options).await.unwrap_err();
    let message = err.to_string();
    match &err {
        DownloadError::ChecksumMismatch {
            binary,
            url,
            expected: e,
            actual: a,
        } => {
            assert_eq!(binary, "kube-scheduler");
            assert_eq!(
                url,
                &format!("{}{}", release.base_url, release_path("kube-scheduler"))
            );
            assert_eq!(e, &expected);
            assert_eq!(a, &actual);
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    for part in ["kube-scheduler", expected.as_str(), actual.as_str()] {
        assert!(message.contains(part), "{part} missing from: {message}");
    }
    assert!(
        !cache.path().join("kube-scheduler").exists(),
        "an unverified file was kept"
    );
    assert_eq!(leftovers(cache.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_damaged_cached_binary_is_replaced() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubelet".to_owned()];
    let path = cache.path().join("kubelet");
    std::fs::write(&path, b"truncated").unwrap();

    let outcomes = run(&options).await.unwrap();
    assert!(
        matches!(&outcomes[..], [Outcome::Downloaded { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), release.contents["kubelet"]);
}

#[tokio::test]
async fn a_damaged_cached_binary_stays_put_when_the_download_is_wrong_too() {
    // Refusing a mismatch must not touch what is under the final name (the caller may be using it).
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubelet".to_owned()];
    let path = cache.path().join("kubelet");
    std::fs::write(&path, b"old").unwrap();
    release.tamper("kubelet", b"evil");

    let err = run(&options).await.unwrap_err();
    assert!(matches!(err, DownloadError::ChecksumMismatch { .. }), "{err:?}");
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    assert_eq!(leftovers(cache.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_missing_binary_is_a_clear_404() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.options(cache.path());
    release.site.remove(&release_path("kube-proxy"));

    let err = run(&options).await.unwrap_err();
    let url = format!("{}{}", release.base_url, release_path("kube-proxy"));
    match &err {
        DownloadError::Status { url: u, status } => {
            assert_eq!(u, &url);
            assert_eq!(status.as_u16(), 404);
        }
        other => panic!("expected a 404, got {other:?}"),
    }
    assert_eq!(err.to_string(), format!("GET {url}: HTTP 404 Not Found"));
    assert!(!cache.path().join("kube-proxy").exists());
    assert_eq!(leftovers(cache.path()), Vec::<String>::new());
    // Those before it were kept, verified.
    assert_eq!(
        std::fs::read(cache.path().join("kubelet")).unwrap(),
        release.contents["kubelet"]
    );
}

#[tokio::test]
async fn a_missing_checksum_is_a_clear_404_and_nothing_is_downloaded() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubectl".to_owned()];
    let checksum = format!("{}.sha256", release_path("kubectl"));
    release.site.remove(&checksum);

    let err = run(&options).await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Status { url, status } if url.ends_with(&checksum) && status.as_u16() == 404),
        "{err:?}"
    );
    assert_eq!(release.site.binary_requests(), Vec::<String>::new());
    assert!(!cache.path().join("kubectl").exists());
}

#[tokio::test]
async fn a_garbage_checksum_file_is_refused() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubectl".to_owned()];
    release.site.set(
        format!("{}.sha256", release_path("kubectl")),
        Answer::Body(b"<html>maintenance</html>".to_vec()),
    );

    let err = run(&options).await.unwrap_err();
    assert!(matches!(err, DownloadError::BadChecksumFile { .. }), "{err:?}");
    assert!(err.to_string().contains("kubectl.sha256"), "{err}");
    assert!(!cache.path().join("kubectl").exists());
}

#[tokio::test]
async fn binaries_the_caller_has_are_skipped() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.options(cache.path());

    let outcomes = download_missing(&options, |binary| binary == "kubelet" || binary == "etcd", |_| {})
        .await
        .unwrap();
    assert_eq!(
        outcomes.iter().find(|o| o.binary() == "kubelet"),
        Some(&Outcome::Present {
            binary: "kubelet".to_owned()
        })
    );
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Downloaded { .. }))
            .count(),
        BINARIES.len() - 1
    );
    assert_eq!(release.site.requests_of("kubelet"), 0, "kubelet was fetched");
    assert!(!cache.path().join("kubelet").exists());
}

#[tokio::test]
async fn a_silent_server_times_out() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kube-apiserver".to_owned()];
    options.timeout = Duration::from_millis(300);
    release.site.set(
        release_path("kube-apiserver"),
        Answer::Slow(Duration::from_secs(30)),
    );

    let err = run(&options).await.unwrap_err();
    assert!(matches!(err, DownloadError::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains("kube-apiserver"), "{err}");
    assert!(!cache.path().join("kube-apiserver").exists());
    assert_eq!(leftovers(cache.path()), Vec::<String>::new());
}

#[tokio::test]
async fn redirect_loops_end() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubectl".to_owned()];
    let path = release_path("kubectl");
    release.site.set(path.clone(), Answer::Redirect(path));

    let err = run(&options).await.unwrap_err();
    assert!(matches!(err, DownloadError::TooManyRedirects { .. }), "{err:?}");
}

#[tokio::test]
async fn odd_binary_names_are_refused_before_any_request() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubectl".to_owned(), "../kubectl".to_owned()];
    let err = run(&options).await.unwrap_err();
    assert!(matches!(err, DownloadError::InvalidBinaryName { .. }), "{err:?}");
    assert!(release.site.requests.lock().unwrap().is_empty());
}

#[test]
fn pinned_release_is_v1_33_3_from_dl_k8s_io() {
    let options = DownloadOptions::pinned_into("/cache");
    assert_eq!(
        options.binary_url("kube-apiserver"),
        "https://dl.k8s.io/release/v1.33.3/bin/linux/amd64/kube-apiserver"
    );
    assert_eq!(options.binaries, BINARIES);
    assert_eq!(
        parse_sha256("ABCDEF0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789  kubectl\n").unwrap(),
        "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
    );
}
