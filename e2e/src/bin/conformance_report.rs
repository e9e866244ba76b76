//! Compares two runs of the upstream conformance suite, a plain cluster's and a tenant's, from ginkgo's JSON
//! reports (`--json-report`): pass counts of each, and every test that passes on the plain cluster but not
//! in the tenant, with the first line of its failure.
//!
//! ```sh
//! cargo run -p e2e --bin conformance_report -- PLAIN.json TENANT.json
//! cargo run -p e2e --bin conformance_report -- --focus-on-passed PLAIN.json   # a ginkgo --focus
//! ```
//!
//! The second form prints a `--focus` for ginkgo that runs exactly the tests that passed in a report, so a
//! tenant can be run on those alone (the tests that fail on the plain cluster spend most of a run's time
//! waiting for their timeouts).

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context, Result};
use clap::Parser;
use local_cluster::conformance::report::{focus_on_passed, only_plain_passes, outcomes, summary};

/// Pass counts of a plain cluster and a tenant, and what fails only in the tenant.
#[derive(Debug, Parser)]
#[command(name = "conformance_report")]
struct Args {
    /// Print a ginkgo `--focus` of the tests that passed in this report, and nothing else.
    #[arg(long, value_name = "REPORT", conflicts_with_all = ["plain", "tenant"])]
    focus_on_passed: Option<PathBuf>,
    /// ginkgo's JSON report of the run against the plain cluster.
    #[arg(required_unless_present = "focus_on_passed")]
    plain: Option<PathBuf>,
    /// ginkgo's JSON report of the run against the tenant.
    #[arg(required_unless_present = "focus_on_passed")]
    tenant: Option<PathBuf>,
}

fn main() -> Result<ExitCode> {
    let args = Args::parse();
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))
            .and_then(|text| outcomes(&text).with_context(|| format!("parsing {}", path.display())))
    };
    if let Some(report) = &args.focus_on_passed {
        println!("{}", focus_on_passed(&read(report)?));
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(plain), Some(tenant)) = (&args.plain, &args.tenant) else {
        anyhow::bail!("give PLAIN.json and TENANT.json, or --focus-on-passed REPORT");
    };
    let plain = read(plain)?;
    let tenant = read(tenant)?;
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
