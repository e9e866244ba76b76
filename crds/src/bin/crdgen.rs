//! Writes the CRD YAML under `crds/yaml/` and into the Helm chart's `crds/` folder, or with `--check` fails
//! when a committed copy differs from what the Rust types generate.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Generate the tenancy.x-k8s.io CRD YAML from the Rust types")]
struct Args {
    /// Compare instead of writing; exit non-zero when any committed copy is stale.
    #[arg(long)]
    check: bool,
    /// Folder of the CRD YAML, repeatable (default: `crds/yaml` and `charts/virtualcluster/crds` of the
    /// workspace).
    #[arg(long)]
    dir: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dirs = if args.dir.is_empty() {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let workspace = manifest.parent().unwrap_or(manifest);
        crds::generate::OUTPUT_DIRS
            .iter()
            .map(|dir| workspace.join(dir))
            .collect()
    } else {
        args.dir
    };
    if args.check {
        let mut stale = Vec::new();
        for dir in &dirs {
            stale.extend(
                crds::generate::drifted(dir)
                    .with_context(|| format!("comparing CRD YAML in {}", dir.display()))?,
            );
        }
        if !stale.is_empty() {
            for path in &stale {
                eprintln!("stale: {}", path.display());
            }
            bail!(
                "committed CRD YAML differs from the Rust types; run `cargo run -p crds --bin crdgen` and commit"
            );
        }
        for dir in &dirs {
            println!("CRD YAML in {} is up to date", dir.display());
        }
    } else {
        for dir in &dirs {
            for path in crds::generate::write_all(dir)
                .with_context(|| format!("writing CRD YAML to {}", dir.display()))?
            {
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
