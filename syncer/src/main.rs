//! The syncer binary: flags, logging, the admin endpoint and leader election around [`syncer::run`].

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use prometheus_client::registry::Registry;
use syncer::{Args, Metrics, SyncerConfig};
use vc_runtime::{admin::Health, leader::Leadership};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    vc_runtime::logging::init(args.log_format);
    let config = SyncerConfig::try_from(args.syncer).map_err(anyhow::Error::msg)?;
    let client = vc_runtime::clients::super_cluster()
        .await
        .context("connecting to the super cluster")?;

    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let health = Health::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admin = tokio::spawn(vc_runtime::admin::serve(
        args.admin_address,
        Arc::new(registry),
        health.clone(),
        {
            let mut stop = stop_rx.clone();
            async move {
                let _ = stop.wait_for(|s| *s).await;
            }
        },
    ));

    let mut leadership = match args.leader.leader_elect {
        true => Some(
            Leadership::acquire(
                client.clone(),
                &args.leader.lease_namespace,
                "vc-syncer",
                std::time::Duration::from_secs(args.leader.lease_duration_seconds),
            )
            .await
            .context("leader election")?,
        ),
        false => None,
    };
    let shutdown = async {
        match leadership.as_mut() {
            Some(leadership) => tokio::select! {
                _ = vc_runtime::shutdown::signal() => {}
                error = leadership.lost() => tracing::error!(error = &error as &dyn std::error::Error, "stopping: leadership lost"),
            },
            None => vc_runtime::shutdown::signal().await,
        }
    };
    let result = syncer::run(client, config, metrics, health, shutdown).await;
    let _ = stop_tx.send(true);
    let _ = admin.await;
    result.context("syncer")
}
