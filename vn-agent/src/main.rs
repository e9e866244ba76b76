//! vn-agent binary: flags, logging, the admin endpoint, the proxy, and shutdown on SIGTERM.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use prometheus_client::registry::Registry;
use vc_runtime::{admin, clients, logging, shutdown};
use vn_agent::{Agent, Args, Metrics};

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
    let registry = Arc::new(registry);
    let admin_task = if args.metrics_address == args.admin_address {
        tokio::spawn(admin::serve(
            args.admin_address,
            registry,
            health.clone(),
            admin_stop.clone().cancelled_owned(),
        ))
    } else {
        // Probes reach the health routes; the metrics, which name tenants, only the loopback (by default).
        let health_routes = admin::serve_routes(
            args.admin_address,
            admin::health_router(health.clone()),
            admin_stop.clone().cancelled_owned(),
        );
        let metrics_routes = admin::serve_routes(
            args.metrics_address,
            admin::metrics_router(registry),
            admin_stop.clone().cancelled_owned(),
        );
        tokio::spawn(async move { tokio::try_join!(health_routes, metrics_routes).map(|_| ()) })
    };

    let agent = Agent::start(settings, client, metrics)
        .await
        .context("starting vn-agent")?;
    let ready = async {
        match agent.wait_ready().await {
            Ok(()) => {
                health.set_ready(true);
                std::future::pending::<()>().await;
            }
            Err(error) => tracing::error!(error = &error as &dyn std::error::Error, "caches never synced"),
        }
    };
    tokio::select! {
        _ = shutdown::signal() => {}
        _ = agent.stopped() => {
            health.set_dead();
            anyhow::bail!("the proxy stopped on its own");
        }
        _ = ready => {
            health.set_dead();
            anyhow::bail!("the caches stopped before they synced");
        }
    }
    health.set_ready(false);
    agent.shutdown().await.context("shutting down")?;
    admin_stop.cancel();
    admin_task.await.context("admin endpoint")??;
    tracing::info!("vn-agent stopped");
    Ok(())
}
