//! Container images built from files on this machine, once per test process.
//!
//! No registry is reachable here, so the images pods use are made from local binaries: a busybox image from
//! Debian's busybox-static (under the name users type, `busybox`), a pause image, a kubectl image, and the
//! control-plane images a ClusterVersion names (etcd, kube-apiserver, kube-controller-manager) from the
//! harness's binaries, tagged with the versions those binaries report; tests add images of programs built
//! with the workspace ([`ImageStore::add_program`]). Each image is an OCI manifest, a
//! config and uncompressed layer tarballs, served by the [`registry`](super::registry) that every node's
//! containerd uses as its mirror, so `imagePullPolicy: Always` works as on a real cluster.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use sha2::{Digest, Sha256};

use super::host::find_tool;
use crate::{Binary, Error, Result, WorkDir, locate};

/// The sandbox (pause) image every node's containerd uses.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// The image `kubectl run x --image=busybox` resolves to.
pub const BUSYBOX_IMAGE: &str = "docker.io/library/busybox:latest";

/// OCI media types.
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

/// A blob on disk.
#[derive(Clone, Debug)]
pub struct Blob {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Where it is.
    pub path: PathBuf,
}

/// One built image.
#[derive(Clone, Debug)]
pub struct Image {
    /// Full references it is known by (`registry.k8s.io/kube-apiserver:v1.33.3`).
    pub names: Vec<String>,
    /// The manifest JSON.
    pub manifest: Vec<u8>,
    /// The manifest's digest.
    pub digest: String,
}

/// Every image of the run and their blobs.
#[derive(Debug)]
pub struct ImageStore {
    /// The images.
    pub images: Vec<Image>,
    /// Blobs (configs and layers) by digest.
    pub blobs: BTreeMap<String, Blob>,
    /// Versions of the control-plane images that were built, by component.
    pub versions: ControlPlaneImages,
    /// The busybox layer every image but the distroless ones starts with.
    base: Blob,
    /// The distroless images' base layer, made with the first of them.
    distroless: Option<Blob>,
    _dir: WorkDir,
}

/// The control-plane images built from the harness's binaries (each `None` when its binary is missing).
#[derive(Clone, Debug, Default)]
pub struct ControlPlaneImages {
    /// `registry.k8s.io/etcd:<version>-0`.
    pub etcd: Option<String>,
    /// `registry.k8s.io/kube-apiserver:<version>`.
    pub kube_apiserver: Option<String>,
    /// `registry.k8s.io/kube-apiserver:<version>-e2e-rebuild`: the same binary in another image, to upgrade
    /// to.
    pub kube_apiserver_rebuild: Option<String>,
    /// `registry.k8s.io/kube-controller-manager:<version>`.
    pub kube_controller_manager: Option<String>,
    /// `registry.k8s.io/kubectl:<version>`.
    pub kubectl: Option<String>,
}

/// An image of files from this machine on top of the busybox layer, with its own paths, links, folders and
/// command: for programs built outside the workspace (the conformance suite's agnhost), where
/// [`ImageStore::add_program`] fits workspace binaries.
#[derive(Clone, Debug, Default)]
pub struct LocalImage {
    /// Full references it is known by.
    pub names: Vec<String>,
    /// Files: (source on this machine, path in the image).
    pub files: Vec<(PathBuf, String)>,
    /// Symbolic links: (path in the image, target).
    pub links: Vec<(String, String)>,
    /// Empty folders.
    pub dirs: Vec<String>,
    /// Small files: (path in the image, contents); they replace the busybox layer's of the same path.
    pub texts: Vec<(String, String)>,
    /// The image's entrypoint.
    pub entrypoint: Vec<String>,
    /// The image's command.
    pub cmd: Vec<String>,
}

/// An image the way the Dockerfile makes the components' (distroless/static, non-root): no shell, the
/// files under `/etc` a program expects (the non-root user 65532, CA certificates), `/tmp`, and one program
/// at `/usr/local/bin`, its entrypoint, with the shared libraries it links when it is not static. It runs
/// as user 65532.
#[derive(Clone, Debug)]
pub struct DistrolessImage {
    /// Full references it is known by.
    pub names: Vec<String>,
    /// The program.
    pub program: PathBuf,
    /// Small files: (path in the image, contents), e.g. a marker that makes a second tag of the same
    /// program another image.
    pub texts: Vec<(String, String)>,
}

/// The non-root user of the distroless images (and of the chart's pods).
pub const NONROOT_UID: u32 = 65532;

/// What goes into a layer.
#[derive(Default)]
struct LayerSpec {
    /// Files: (source on this machine, path in the image).
    files: Vec<(PathBuf, String)>,
    /// Symbolic links: (path in the image, target).
    links: Vec<(String, String)>,
    /// Empty folders.
    dirs: Vec<String>,
    /// Small files: (path in the image, contents).
    texts: Vec<(String, String)>,
}

struct ImageSpec {
    names: Vec<String>,
    layer: LayerSpec,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    /// `User` of the image's config (`None`: root).
    user: Option<String>,
}

impl ImageStore {
    /// Builds every image whose parts are on this machine. busybox-static is required.
    pub fn build() -> Result<Self> {
        let dir = WorkDir::new("images")?;
        let busybox = find_busybox()?;
        let mut blobs = BTreeMap::new();
        let base = write_layer(&dir, &mut blobs, "busybox", &busybox_layer(&busybox)?)?;
        let mut store = Self {
            images: Vec::new(),
            blobs,
            versions: ControlPlaneImages::default(),
            base: base.clone(),
            distroless: None,
            _dir: dir,
        };

        let mut specs = vec![
            ImageSpec {
                names: vec![PAUSE_IMAGE.to_owned()],
                layer: LayerSpec::default(),
                // A sandbox only holds namespaces; containerd stops it with SIGKILL.
                entrypoint: vec!["/bin/sleep".into(), "2147483647".into()],
                cmd: Vec::new(),
                user: None,
            },
            ImageSpec {
                names: vec![
                    BUSYBOX_IMAGE.to_owned(),
                    format!("docker.io/library/busybox:{}", busybox_version(&busybox)),
                ],
                layer: LayerSpec::default(),
                entrypoint: Vec::new(),
                cmd: vec!["sh".into()],
                user: None,
            },
        ];
        if let Some((spec, version)) = binary_image(Binary::Etcd, "etcd", |v| format!("{v}-0"))? {
            store.versions.etcd = Some(version);
            specs.push(spec);
        }
        for (binary, repository) in [
            (Binary::KubeApiserver, "kube-apiserver"),
            (Binary::KubeControllerManager, "kube-controller-manager"),
            (Binary::Kubectl, "kubectl"),
        ] {
            if let Some((spec, name)) = binary_image(binary, repository, str::to_owned)? {
                match binary {
                    Binary::KubeApiserver => {
                        // A second build of the same binary under its own tag, for upgrade tests: a
                        // ClusterVersion that switches to it rolls the apiserver like a new release would.
                        let rebuilt = format!("{name}-e2e-rebuild");
                        let mut variant = ImageSpec {
                            names: vec![rebuilt.clone()],
                            layer: LayerSpec {
                                files: spec.layer.files.clone(),
                                dirs: spec.layer.dirs.clone(),
                                ..LayerSpec::default()
                            },
                            entrypoint: spec.entrypoint.clone(),
                            cmd: spec.cmd.clone(),
                            user: None,
                        };
                        variant
                            .layer
                            .texts
                            .push(("/etc/e2e-image".into(), format!("{rebuilt}\n")));
                        specs.push(variant);
                        store.versions.kube_apiserver_rebuild = Some(rebuilt);
                        store.versions.kube_apiserver = Some(name);
                    }
                    Binary::KubeControllerManager => store.versions.kube_controller_manager = Some(name),
                    _ => store.versions.kubectl = Some(name),
                }
                specs.push(spec);
            }
        }
        for spec in specs {
            let own = match spec.layer.files.is_empty() && spec.layer.links.is_empty() {
                true => None,
                false => Some(store.write_layer(&spec.names[0], &spec.layer)?),
            };
            let layers: Vec<Blob> = std::iter::once(base.clone()).chain(own).collect();
            store.add_image(spec, &layers)?;
        }
        Ok(store)
    }

    /// Adds an image of a program built on this machine (a binary of the workspace, which links glibc
    /// dynamically): the busybox layer, then the program at `/usr/local/bin/<its file name>` with the
    /// shared libraries and the loader `ldd` lists, as the entrypoint. Known as `reference` (a full name
    /// with tag); a reference that is already there keeps its image.
    pub fn add_program(&mut self, reference: &str, program: &Path) -> Result<()> {
        if self.image(reference).is_some() {
            return Ok(());
        }
        let file_name = program
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| Error::Io {
                context: format!("the image {reference}"),
                source: std::io::Error::other(format!("{} names no file", program.display())),
            })?;
        let destination = format!("/usr/local/bin/{file_name}");
        let mut files = vec![(program.to_owned(), destination.clone())];
        files.extend(shared_libraries(program).into_iter().map(|lib| {
            let dest = lib.display().to_string();
            (lib, dest)
        }));
        files.sort_by(|a, b| a.1.cmp(&b.1));
        files.dedup_by(|a, b| a.1 == b.1);
        let spec = ImageSpec {
            names: vec![reference.to_owned()],
            layer: LayerSpec {
                files,
                ..LayerSpec::default()
            },
            entrypoint: vec![destination],
            cmd: Vec::new(),
            user: None,
        };
        let own = self.write_layer(reference, &spec.layer)?;
        let layers = [self.base.clone(), own];
        self.add_image(spec, &layers)
    }

    /// Adds a [`LocalImage`]; names already served keep their image.
    pub fn add_local(&mut self, image: LocalImage) -> Result<()> {
        let names: Vec<String> = image
            .names
            .into_iter()
            .filter(|name| self.image(name).is_none())
            .collect();
        let Some(first) = names.first().cloned() else {
            return Ok(());
        };
        let spec = ImageSpec {
            names,
            layer: LayerSpec {
                files: image.files,
                links: image.links,
                dirs: image.dirs,
                texts: image.texts,
            },
            entrypoint: image.entrypoint,
            cmd: image.cmd,
            user: None,
        };
        let own = self.write_layer(&first, &spec.layer)?;
        let layers = [self.base.clone(), own];
        self.add_image(spec, &layers)
    }

    /// Adds a [`DistrolessImage`]; names already served keep their image. Returns the new image's size
    /// (the sum of its layers), `None` when every name was served already.
    pub fn add_distroless(&mut self, image: DistrolessImage) -> Result<Option<u64>> {
        let names: Vec<String> = image
            .names
            .into_iter()
            .filter(|name| self.image(name).is_none())
            .collect();
        let Some(first) = names.first().cloned() else {
            return Ok(None);
        };
        let file_name = image
            .program
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| Error::Io {
                context: format!("the image {first}"),
                source: std::io::Error::other(format!("{} names no file", image.program.display())),
            })?;
        let destination = format!("/usr/local/bin/{file_name}");
        let mut files = vec![(image.program.clone(), destination.clone())];
        files.extend(shared_libraries(&image.program).into_iter().map(|lib| {
            let dest = lib.display().to_string();
            (lib, dest)
        }));
        files.sort_by(|a, b| a.1.cmp(&b.1));
        files.dedup_by(|a, b| a.1 == b.1);
        let base = match &self.distroless {
            Some(base) => base.clone(),
            None => {
                let base = self.write_layer("distroless", &distroless_layer())?;
                self.distroless = Some(base.clone());
                base
            }
        };
        let spec = ImageSpec {
            names,
            layer: LayerSpec {
                files,
                texts: image.texts,
                ..LayerSpec::default()
            },
            entrypoint: vec![destination],
            cmd: Vec::new(),
            user: Some(format!("{NONROOT_UID}:{NONROOT_UID}")),
        };
        let own = self.write_layer(&first, &spec.layer)?;
        let size = base.size + own.size;
        self.add_image(spec, &[base, own])?;
        Ok(Some(size))
    }

    /// Serves the image known by `existing` under `name` too; false when there is no such image.
    pub fn alias(&mut self, existing: &str, name: &str) -> bool {
        if self.image(name).is_some() {
            return true;
        }
        match self
            .images
            .iter_mut()
            .find(|i| i.names.iter().any(|n| n == existing))
        {
            Some(image) => {
                image.names.push(name.to_owned());
                true
            }
            None => false,
        }
    }

    /// The image known by `reference` (a full name with tag).
    pub fn image(&self, reference: &str) -> Option<&Image> {
        self.images
            .iter()
            .find(|i| i.names.iter().any(|n| n == reference))
    }

    /// The image whose manifest has `digest`.
    pub fn image_by_digest(&self, digest: &str) -> Option<&Image> {
        self.images.iter().find(|i| i.digest == digest)
    }

    fn write_layer(&mut self, purpose: &str, spec: &LayerSpec) -> Result<Blob> {
        write_layer(&self._dir, &mut self.blobs, purpose, spec)
    }

    fn write_blob(&mut self, bytes: &[u8]) -> Result<Blob> {
        let digest = sha256(bytes);
        let path = self._dir.join(&digest.replace(':', "-"));
        std::fs::write(&path, bytes).map_err(Error::io(format!("writing {}", path.display())))?;
        let blob = Blob {
            digest,
            size: bytes.len() as u64,
            path,
        };
        self.blobs.insert(blob.digest.clone(), blob.clone());
        Ok(blob)
    }

    fn add_image(&mut self, spec: ImageSpec, layers: &[Blob]) -> Result<()> {
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Entrypoint": if spec.entrypoint.is_empty() { serde_json::Value::Null } else { spec.entrypoint.clone().into() },
                "Cmd": if spec.cmd.is_empty() { serde_json::Value::Null } else { spec.cmd.clone().into() },
                "User": spec.user.clone().unwrap_or_default(),
                "WorkingDir": "/",
            },
            "rootfs": {
                "type": "layers",
                // Uncompressed layers: the diff ID is the layer's digest.
                "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>(),
            },
            "history": [{ "created_by": "virtualcluster-rs e2e harness, from files on the machine" }],
        });
        let config = self.write_blob(&serde_json::to_vec(&config).expect("JSON"))?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": { "mediaType": CONFIG_TYPE, "digest": config.digest, "size": config.size },
            "layers": layers.iter().map(|l| serde_json::json!({
                "mediaType": LAYER_TYPE, "digest": l.digest, "size": l.size,
            })).collect::<Vec<_>>(),
        });
        let manifest = serde_json::to_vec(&manifest).expect("JSON");
        self.images.push(Image {
            names: spec.names,
            digest: sha256(&manifest),
            manifest,
        });
        Ok(())
    }
}

/// Writes a layer tarball into `dir` and records it in `blobs`.
fn write_layer(
    dir: &WorkDir,
    blobs: &mut BTreeMap<String, Blob>,
    purpose: &str,
    spec: &LayerSpec,
) -> Result<Blob> {
    let path = dir.join(&format!("layer-{}.tar", purpose.replace(['/', ':'], "_")));
    let file = std::fs::File::create(&path).map_err(Error::io(format!("creating {}", path.display())))?;
    let mut writer = HashingWriter::new(file);
    {
        let mut tar = tar::Builder::new(&mut writer);
        tar.follow_symlinks(true);
        let mut dirs: Vec<String> = spec.dirs.clone();
        for path in spec
            .files
            .iter()
            .map(|(_, d)| d)
            .chain(spec.links.iter().map(|(l, _)| l))
            .chain(spec.texts.iter().map(|(p, _)| p))
        {
            let mut parent = Path::new(path).parent();
            while let Some(p) = parent.filter(|p| p.as_os_str() != "/" && !p.as_os_str().is_empty()) {
                dirs.push(p.display().to_string());
                parent = p.parent();
            }
        }
        dirs.sort();
        dirs.dedup();
        let io = |what: &str| Error::io(format!("writing {what} into layer {purpose}"));
        for dir in &dirs {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(if dir == "/tmp" { 0o1777 } else { 0o755 });
            header.set_size(0);
            header.set_mtime(0);
            tar.append_data(&mut header, dir.trim_start_matches('/'), std::io::empty())
                .map_err(io(dir))?;
        }
        for (source, dest) in &spec.files {
            let mut file = std::fs::File::open(source).map_err(io(dest))?;
            let meta = file.metadata().map_err(io(dest))?;
            let mut header = tar::Header::new_gnu();
            header.set_size(meta.len());
            header.set_mode(0o755);
            header.set_mtime(0);
            tar.append_data(&mut header, dest.trim_start_matches('/'), &mut file)
                .map_err(io(dest))?;
        }
        for (path, contents) in &spec.texts {
            let mut header = tar::Header::new_gnu();
            header.set_size(contents.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            tar.append_data(&mut header, path.trim_start_matches('/'), contents.as_bytes())
                .map_err(io(path))?;
        }
        for (link, target) in &spec.links {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            header.set_mode(0o777);
            header.set_mtime(0);
            tar.append_link(&mut header, link.trim_start_matches('/'), target)
                .map_err(io(link))?;
        }
        tar.finish().map_err(io("the end"))?;
    }
    let (digest, size) = writer
        .finish()
        .map_err(Error::io(format!("writing {}", path.display())))?;
    let blob = Blob { digest, size, path };
    blobs.insert(blob.digest.clone(), blob.clone());
    Ok(blob)
}

/// Debian's busybox-static.
pub fn find_busybox() -> Result<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .filter(|p| is_static(p))
        .ok_or_else(|| Error::MissingPart {
            part: "a static busybox (/bin/busybox)".into(),
            hint: "apt-get install busybox-static".into(),
        })
}

fn is_static(binary: &Path) -> bool {
    shared_libraries(binary).is_empty()
}

fn busybox_version(busybox: &Path) -> String {
    Command::new(busybox)
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let version = text.split_whitespace().nth(1)?.trim_start_matches('v').to_owned();
            Some(version.split(['-', ' ']).next()?.to_owned())
        })
        .unwrap_or_else(|| "local".to_owned())
}

/// busybox with a link for each applet, and the files programs expect.
fn busybox_layer(busybox: &Path) -> Result<LayerSpec> {
    let output = Command::new(busybox)
        .arg("--list-full")
        .output()
        .map_err(Error::io("listing busybox applets"))?;
    let mut links: Vec<(String, String)> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.is_empty() && *l != "bin/busybox")
        .map(|l| (format!("/{l}"), "/bin/busybox".to_owned()))
        .collect();
    links.sort();
    links.dedup();
    Ok(LayerSpec {
        files: vec![(busybox.to_owned(), "/bin/busybox".into())],
        links,
        dirs: vec!["/tmp".into(), "/etc".into(), "/root".into(), "/var".into()],
        texts: vec![
            (
                "/etc/passwd".into(),
                "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".into(),
            ),
            ("/etc/group".into(), "root:x:0:\nnobody:x:65534:\n".into()),
        ],
    })
}

/// The base of the distroless images, like `gcr.io/distroless/static:nonroot`: users root and nonroot
/// (65532), CA certificates from this machine when it has them, `/tmp` and the non-root user's home.
fn distroless_layer() -> LayerSpec {
    let mut texts = vec![
        (
            "/etc/passwd".to_owned(),
            format!(
                "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
                 nonroot:x:{NONROOT_UID}:{NONROOT_UID}:nonroot:/home/nonroot:/sbin/nologin\n"
            ),
        ),
        (
            "/etc/group".to_owned(),
            format!("root:x:0:\nnobody:x:65534:\nnonroot:x:{NONROOT_UID}:\n"),
        ),
        ("/etc/nsswitch.conf".to_owned(), "hosts: files dns\n".to_owned()),
    ];
    if let Ok(certificates) = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt") {
        texts.push(("/etc/ssl/certs/ca-certificates.crt".to_owned(), certificates));
    }
    LayerSpec {
        dirs: vec!["/tmp".into(), "/home/nonroot".into(), "/root".into()],
        texts,
        ..LayerSpec::default()
    }
}

/// An image of one harness binary at `/usr/local/bin`, with the shared libraries it needs, tagged with
/// the version it reports. `None` when the binary is missing.
fn binary_image(
    binary: Binary,
    repository: &str,
    tag: impl Fn(&str) -> String,
) -> Result<Option<(ImageSpec, String)>> {
    let Ok(path) = locate(binary) else {
        return Ok(None);
    };
    let Some(version) = binary_version(&path) else {
        return Ok(None);
    };
    let name = format!("registry.k8s.io/{repository}:{}", tag(&version));
    let mut files = vec![(path.clone(), format!("/usr/local/bin/{}", binary.file_name()))];
    // No etcdctl beside etcd: registry.k8s.io/etcd images (distroless since 3.5.7) have neither it nor a
    // shell, so templates must not probe with them (vc-manager rewrites the original project's probes).
    files.extend(shared_libraries(&path).into_iter().map(|lib| {
        let dest = lib.display().to_string();
        (lib, dest)
    }));
    files.sort_by(|a, b| a.1.cmp(&b.1));
    files.dedup_by(|a, b| a.1 == b.1);
    Ok(Some((
        ImageSpec {
            names: vec![name.clone()],
            layer: LayerSpec {
                files,
                dirs: vec!["/var/lib".into()],
                ..LayerSpec::default()
            },
            entrypoint: Vec::new(),
            cmd: vec![binary.file_name().to_owned()],
            user: None,
        },
        name,
    )))
}

/// The version a binary prints (`Kubernetes v1.33.3` → `v1.33.3`, `etcd Version: 3.4.23` → `3.4.23`).
pub fn binary_version(binary: &Path) -> Option<String> {
    let arg = if binary.ends_with("kubectl") {
        "version"
    } else {
        "--version"
    };
    let mut command = Command::new(binary);
    command.arg(arg);
    if binary.ends_with("kubectl") {
        command.arg("--client");
    }
    let output = command.output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    parse_version(&text)
}

fn parse_version(text: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("etcd Version:") {
            return Some(rest.trim().to_owned());
        }
        if let Some(rest) = line.strip_prefix("Kubernetes ") {
            return Some(rest.trim().to_owned());
        }
        if let Some(rest) = line.strip_prefix("Client Version:") {
            let rest = rest.trim();
            // kubectl before 1.28 prints `version.Info{Major:"1", ..., GitVersion:"v1.25.9", ...}`.
            return match rest.split_once("GitVersion:\"") {
                Some((_, tail)) => tail.split('"').next().map(str::to_owned),
                None => Some(rest.to_owned()),
            };
        }
    }
    None
}

/// Shared libraries `ldd` lists for a dynamically linked binary (none for a static one).
fn shared_libraries(binary: &Path) -> Vec<PathBuf> {
    let Some(ldd) = find_tool("ldd") else {
        return Vec::new();
    };
    let Ok(output) = Command::new(ldd).arg(binary).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Writes through to a file while hashing and counting.
struct HashingWriter {
    file: std::io::BufWriter<std::fs::File>,
    hasher: Sha256,
    size: u64,
}

impl HashingWriter {
    fn new(file: std::fs::File) -> Self {
        Self {
            file: std::io::BufWriter::new(file),
            hasher: Sha256::new(),
            size: 0,
        }
    }

    fn finish(mut self) -> std::io::Result<(String, u64)> {
        self.file.flush()?;
        Ok((
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.size,
        ))
    }
}

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.file.write(buf)?;
        self.hasher.update(&buf[..written]);
        self.size += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_each_binary_s_output() {
        assert_eq!(parse_version("Kubernetes v1.33.3\n").as_deref(), Some("v1.33.3"));
        assert_eq!(
            parse_version("etcd Version: 3.4.23\nGit SHA: Not provided\n").as_deref(),
            Some("3.4.23")
        );
        assert_eq!(
            parse_version(
                "Client Version: version.Info{Major:\"1\", Minor:\"25\", GitVersion:\"v1.25.9\", GitCommit:\"x\"}\nKustomize Version: v4.5.7\n"
            )
            .as_deref(),
            Some("v1.25.9")
        );
        assert_eq!(parse_version("etcd Version: 3.4.23\n").as_deref(), Some("3.4.23"));
        assert_eq!(
            parse_version("Client Version: v1.25.9\nKustomize Version: v4.5.7\n").as_deref(),
            Some("v1.25.9")
        );
        assert_eq!(parse_version("something else"), None);
    }
}
