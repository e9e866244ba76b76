//! vc-dns binary: flags, logging, the admin endpoint, the DNS server, and shutdown on SIGTERM.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use prometheus_client::registry::Registry;
use vc_dns::{Args, Dns, Metrics};
use vc_runtime::{admin, clients, logging, shutdown};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    logging::init(args.log_format);
    let settings = args.settings()?;
    let client = clients::super_cluster().await?;

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = admin::Health::new();
    let admin_stop = tokio_util::sync::CancellationToken::new();
    let admin_task = tokio::spawn(admin::serve(
        args.admin_address,
        Arc::new(registry),
        health.clone(),
        admin_stop.clone().cancelled_owned(),
    ));

    let dns = Dns::start(settings, client, metrics)
        .await
        .context("starting vc-dns")?;
    let ready = async {
        match dns.wait_ready().await {
            Ok(()) => {
                tracing::info!("super-cluster watches listed; answering");
                health.set_ready(true);
                std::future::pending::<()>().await;
            }
            Err(error) => tracing::error!(error = &error as &dyn std::error::Error, "watches never listed"),
        }
    };
    let stopped = async {
        while !dns.is_finished() {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        _ = shutdown::signal() => {}
        _ = stopped => {
            health.set_dead();
            anyhow::bail!("the DNS server stopped on its own");
        }
        _ = ready => {
            health.set_dead();
            anyhow::bail!("the watches stopped before they listed");
        }
    }
    health.set_ready(false);
    dns.shutdown().await.context("shutting down")?;
    admin_stop.cancel();
    admin_task.await.context("admin endpoint")??;
    tracing::info!("vc-dns stopped");
    Ok(())
}
