//! Writes the CRD YAML under `crds/yaml/` and the Helm chart's CRD templates (`templates/crds/`), or with
//! `--check` fails when a committed copy differs from what the Rust types generate.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;
use crds::generate::Form;

#[derive(Parser)]
#[command(about = "Generate the tenancy.x-k8s.io CRD YAML from the Rust types")]
struct Args {
    /// Compare instead of writing; exit non-zero when any committed copy is stale.
    #[arg(long)]
    check: bool,
    /// Folder of plain CRD YAML, repeatable (default: `crds/yaml` of the workspace, and the chart's
    /// templates in `charts/virtualcluster/templates/crds`).
    #[arg(long)]
    dir: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dirs: Vec<(PathBuf, Form)> = if args.dir.is_empty() {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let workspace = manifest.parent().unwrap_or(manifest);
        crds::generate::OUTPUT_DIRS
            .iter()
            .map(|(dir, form)| (workspace.join(dir), *form))
            .collect()
    } else {
        args.dir.into_iter().map(|dir| (dir, Form::Plain)).collect()
    };
    if args.check {
        let mut stale = Vec::new();
        for (dir, form) in &dirs {
            stale.extend(
                crds::generate::drifted(dir, *form)
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
        for (dir, _) in &dirs {
            println!("CRD YAML in {} is up to date", dir.display());
        }
    } else {
        for (dir, form) in &dirs {
            for path in crds::generate::write_all(dir, *form)
                .with_context(|| format!("writing CRD YAML to {}", dir.display()))?
            {
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
