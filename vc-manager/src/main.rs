//! The vc-manager binary: flags, then the library's [`vc_manager::Manager`] on the shared runtime.

use anyhow::Context as _;
use clap::Parser;
use vc_manager::{LEASE_NAME, Manager, args::Args};
use vc_runtime::Runtime;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vc_runtime::clients::identify("vc-manager");
    let args = Args::parse();
    let runtime = Runtime::builder()
        .with_log(args.log_format)
        .with_admin(args.admin_address)
        .with_leader_election(LEASE_NAME, args.leader_election())
        .build()
        .await
        .context("connecting to the super cluster")?;
    Manager::new(runtime.client(), args.settings())
        .run_in(runtime)
        .await
        .context("vc-manager stopped")
}
