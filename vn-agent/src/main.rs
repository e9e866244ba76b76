//! vn-agent binary: flags, then [`vn_agent::run`] on the shared runtime (admin endpoint, `/metrics` on its
//! own address when the flags say so, shutdown on SIGTERM).

use anyhow::Context as _;
use clap::Parser;
use vc_runtime::Runtime;
use vn_agent::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vc_runtime::clients::identify("vn-agent");
    let args = Args::parse();
    let settings = args.settings()?;
    let runtime = Runtime::builder()
        .with_log(args.log_format)
        .with_admin(args.admin_address)
        .with_metrics_address(args.metrics_address)
        .build()
        .await?;
    vn_agent::run(runtime, settings).await.context("vn-agent")
}
