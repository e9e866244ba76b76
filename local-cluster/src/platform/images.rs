//! The five component images, built from this workspace the way the Dockerfile builds them (static musl
//! binaries on a distroless, non-root root), and served to every real node under the names the chart asks
//! for: `<IMAGE_REGISTRY>/<component>:<tag>`.
//!
//! The release binaries are built once per process with the workspace's own cargo (`cargo build --release
//! --locked --target <arch>-unknown-linux-musl`), which reuses its target folder across runs. Where the
//! musl target or `musl-gcc` is missing, the glibc release build goes into the images with the shared
//! libraries it links, as [`DistrolessImage`] does for any program that is not static.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::{Error, RealNodes, Result, realnodes::images::DistrolessImage};

/// The registry the chart's `image.registry` names for the workspace's images: under
/// [`LOCAL_REGISTRY`], which every node mirrors to the harness's registry.
pub const IMAGE_REGISTRY: &str = "vc-e2e.local/virtualcluster-rs";

/// The components, each its Dockerfile target, binary and image repository.
pub const COMPONENTS: [&str; 5] = ["vc-manager", "syncer", "vn-agent", "vc-dns", "kubectl-vc"];

/// The tag the chart uses by default: its appVersion, the workspace's version.
pub const TAG: &str = env!("CARGO_PKG_VERSION");

/// A second tag of the same binaries, a different image (a marker file differs), to upgrade to.
pub fn upgrade_tag() -> String {
    format!("{TAG}-e2e-upgrade")
}

/// What [`ensure`] built.
#[derive(Clone, Debug)]
pub struct ComponentImages {
    /// `<IMAGE_REGISTRY>` as the chart's `image.registry`.
    pub registry: String,
    /// The default tag ([`TAG`]) and the upgrade tag ([`upgrade_tag`]).
    pub tags: [String; 2],
    /// Each image's size in bytes (its uncompressed layers), by component.
    pub sizes: BTreeMap<String, u64>,
    /// Whether the binaries are static (musl); otherwise glibc with its libraries in the image.
    pub static_binaries: bool,
    /// How long building the binaries took.
    pub build_time: Duration,
    /// The folder of the built binaries (`kubectl-vc` among them, for the platform team's commands).
    pub binaries: PathBuf,
}

/// Builds the component binaries and serves their images to every real node, once per process.
/// Blocking: call it from `spawn_blocking`.
pub fn ensure() -> Result<&'static ComponentImages> {
    static IMAGES: OnceLock<std::result::Result<ComponentImages, String>> = OnceLock::new();
    IMAGES
        .get_or_init(|| build().map_err(|e| crate::error_chain(&e)))
        .as_ref()
        .map_err(|message| Error::MissingPart {
            part: "the component images".into(),
            hint: message.clone(),
        })
}

fn build() -> Result<ComponentImages> {
    let started = Instant::now();
    let (folder, static_binaries) = build_binaries()?;
    let build_time = started.elapsed();
    let mut sizes = BTreeMap::new();
    for component in COMPONENTS {
        let program = folder.join(component);
        for tag in [TAG.to_owned(), upgrade_tag()] {
            let reference = format!("{IMAGE_REGISTRY}/{component}:{tag}");
            let size = RealNodes::add_distroless_image(DistrolessImage {
                names: vec![reference],
                program: program.clone(),
                texts: vec![(
                    "/etc/virtualcluster-rs-image".to_owned(),
                    format!("{component}:{tag}\n"),
                )],
            })?;
            if tag == TAG
                && let Some(size) = size
            {
                sizes.insert(component.to_owned(), size);
            }
        }
    }
    Ok(ComponentImages {
        registry: IMAGE_REGISTRY.to_owned(),
        tags: [TAG.to_owned(), upgrade_tag()],
        sizes,
        static_binaries,
        build_time,
        binaries: folder,
    })
}

/// Serves the component images under every reference in `references` that names one of the components'
/// repositories (`<any registry>/<component>:<tag>`, as a chart's values may spell them): the built image of
/// the upgrade tag when the reference's tag is it, else of [`TAG`]. Other references are left alone.
pub fn serve_as(references: &[String]) -> Result<()> {
    ensure()?;
    for reference in references {
        let Some((repository, tag)) = reference.rsplit_once(':') else {
            continue;
        };
        let Some(component) = COMPONENTS
            .iter()
            .find(|c| repository == **c || repository.ends_with(&format!("/{c}")))
        else {
            continue;
        };
        let built_tag = if tag == upgrade_tag() {
            upgrade_tag()
        } else {
            TAG.to_owned()
        };
        RealNodes::alias_image(&format!("{IMAGE_REGISTRY}/{component}:{built_tag}"), reference)?;
    }
    Ok(())
}

/// The workspace's root folder.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The musl target of this machine's architecture.
fn musl_target() -> String {
    format!("{}-unknown-linux-musl", std::env::consts::ARCH)
}

/// Whether this toolchain can build static musl binaries: the target's standard library is installed and
/// `musl-gcc` compiles ring's C.
fn musl_available(cargo: &Path) -> bool {
    let rustc = cargo.with_file_name("rustc");
    let rustc = if rustc.is_file() {
        rustc
    } else {
        PathBuf::from("rustc")
    };
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", &musl_target()])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let has_std = libdir.is_some_and(|dir| {
        std::fs::read_dir(dir).is_ok_and(|mut entries| {
            entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libstd-")))
        })
    });
    has_std && crate::realnodes::host::find_tool("musl-gcc").is_some()
}

/// Builds the five binaries in release mode; returns their folder and whether they are static.
fn build_binaries() -> Result<(PathBuf, bool)> {
    let cargo = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("cargo"));
    let workspace = workspace();
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let musl = musl_available(&cargo);
    let mut command = Command::new(&cargo);
    command
        .current_dir(&workspace)
        .args(["build", "--release", "--locked", "--quiet"])
        .env("CARGO_TARGET_DIR", &target_dir);
    for component in COMPONENTS {
        command.args(["--bin", component]);
    }
    let folder = if musl {
        let target = musl_target();
        // As the Dockerfile does: musl-gcc compiles ring's C, and the images carry no symbols.
        command
            .args(["--target", &target])
            .env(format!("CC_{}", target.replace('-', "_")), "musl-gcc")
            .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
        target_dir.join(target).join("release")
    } else {
        target_dir.join("release")
    };
    tracing::info!(musl, "building the component binaries for their images");
    let output = command
        .output()
        .map_err(Error::io(format!("starting {}", cargo.display())))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(Error::Command {
            context: "building the component binaries".into(),
            command: format!("{command:?}"),
            status: output.status.to_string(),
            stderr: stderr.lines().rev().take(20).collect::<Vec<_>>().join(" | "),
        });
    }
    Ok((folder, musl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::realnodes::LOCAL_REGISTRY;

    #[test]
    fn the_registry_is_the_local_one() {
        assert_eq!(IMAGE_REGISTRY, format!("{LOCAL_REGISTRY}/virtualcluster-rs"));
        assert_ne!(upgrade_tag(), TAG);
        assert!(musl_target().ends_with("-unknown-linux-musl"));
    }
}
