//! Writes the CRD YAML under `crds/yaml/`, or with `--check` fails when the committed files differ from what
//! the Rust types generate.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Generate the tenancy.x-k8s.io CRD YAML from the Rust types")]
struct Args {
    /// Compare instead of writing; exit non-zero when the committed YAML is stale.
    #[arg(long)]
    check: bool,
    /// Folder of the CRD YAML (default: the `yaml` folder of the crds crate).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = args
        .dir
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("yaml"));
    if args.check {
        let drifted = crds::generate::drifted(&dir).context("comparing CRD YAML")?;
        if !drifted.is_empty() {
            for path in &drifted {
                eprintln!("stale: {}", path.display());
            }
            bail!(
                "committed CRD YAML differs from the Rust types; run `cargo run -p crds --bin crdgen` and commit"
            );
        }
        println!("CRD YAML in {} is up to date", dir.display());
    } else {
        for path in crds::generate::write_all(&dir).context("writing CRD YAML")? {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
