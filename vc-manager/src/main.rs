//! The vc-manager binary: flags, logging, then the library's [`vc_manager::Manager`].

use anyhow::Context as _;
use clap::Parser;
use vc_manager::{Manager, args::Args};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    vc_runtime::logging::init(args.log_format);
    let client = vc_runtime::clients::super_cluster()
        .await
        .context("connecting to the super cluster")?;
    let mut manager = Manager::new(client, args.settings()).with_admin_endpoint(args.admin_address);
    if let Some(election) = args.leader_election() {
        manager = manager.with_leader_election(election);
    }
    manager
        .run(vc_runtime::shutdown::signal())
        .await
        .context("vc-manager stopped")?;
    Ok(())
}
