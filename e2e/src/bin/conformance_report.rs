//! Compares two runs of the upstream conformance suite, a plain cluster's and a tenant's, from ginkgo's JSON
//! reports (`--json-report`): pass counts of each, and every test that passes on the plain cluster but not
//! in the tenant, with the first line of its failure.
//!
//! ```sh
//! cargo run -p e2e --bin conformance_report -- PLAIN.json TENANT.json
//! ```

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context, Result};
use clap::Parser;
use local_cluster::conformance::report::{only_plain_passes, outcomes, summary};

/// Pass counts of a plain cluster and a tenant, and what fails only in the tenant.
#[derive(Debug, Parser)]
#[command(name = "conformance_report")]
struct Args {
    /// ginkgo's JSON report of the run against the plain cluster.
    plain: PathBuf,
    /// ginkgo's JSON report of the run against the tenant.
    tenant: PathBuf,
}

fn main() -> Result<ExitCode> {
    let args = Args::parse();
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))
            .and_then(|text| outcomes(&text).with_context(|| format!("parsing {}", path.display())))
    };
    let plain = read(&args.plain)?;
    let tenant = read(&args.tenant)?;
    println!("{}", summary("plain cluster", &plain));
    println!("{}", summary("tenant", &tenant));
    let regressions = only_plain_passes(&plain, &tenant);
    println!(
        "\n{} tests pass on the plain cluster and not in the tenant",
        regressions.len()
    );
    for (name, outcome) in &regressions {
        match outcome {
            Some(outcome) => println!("- {name}\n    {}: {}", outcome.state, outcome.failure),
            None => println!("- {name}\n    not run in the tenant"),
        }
    }
    Ok(if regressions.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
