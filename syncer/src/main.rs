//! The syncer binary: flags, then [`syncer::run`] on the shared runtime.

use anyhow::Context as _;
use clap::Parser;
use syncer::{Args, LEASE_NAME, SyncerConfig};
use vc_runtime::Runtime;

// `pub`: the e2e package runs this same `main` as a process of its own (e2e/src/bin/syncer_process.rs).
#[tokio::main]
pub async fn main() -> anyhow::Result<()> {
    vc_runtime::clients::identify("syncer");
    let args = Args::parse();
    let super_http2 = args.super_http2;
    let config = SyncerConfig::try_from(args.syncer).map_err(anyhow::Error::msg)?;
    // Sharded replicas are all active; each holds its own Leases instead of one for the whole process.
    let election = match config.shards {
        Some(_) => None,
        None => args.leader.leader_election(),
    };
    let mut builder = Runtime::builder();
    if super_http2 {
        builder = builder.with_client(
            vc_runtime::clients::super_cluster_multiplexed()
                .await
                .context("connecting to the super cluster")?,
        );
    }
    let runtime = builder
        .with_log(args.log_format)
        .with_admin(args.admin_address)
        .with_leader_election(LEASE_NAME, election)
        .build()
        .await
        .context("connecting to the super cluster")?;
    syncer::run(runtime, config).await.context("syncer")
}
