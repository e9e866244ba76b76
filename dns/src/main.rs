//! vc-dns binary: flags, then [`vc_dns::run`] on the shared runtime (logging, the admin endpoint, the
//! super-cluster client, shutdown on SIGTERM).

use anyhow::Context as _;
use clap::Parser;
use vc_dns::Args;
use vc_runtime::Runtime;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vc_runtime::clients::identify("vc-dns");
    let args = Args::parse();
    let settings = args.settings()?;
    let runtime = Runtime::builder()
        .with_log(args.log_format)
        .with_admin(args.admin_address)
        .build()
        .await?;
    vc_dns::run(runtime, settings).await.context("vc-dns")
}
