//! tenant-extensions: a tenant's own validating webhook and metrics.k8s.io API, run as a pod in a tenant by
//! the e2e tests ([`local_cluster::tenant_extensions`]).

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context;
use clap::Parser;

/// Serves the webhook and the aggregated metrics API over TLS; talks to the tenant apiserver in-cluster.
#[derive(Parser)]
struct Flags {
    /// Where to listen.
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Serving certificate (PEM).
    #[arg(long, default_value = "/etc/tenant-extensions/tls.crt")]
    tls_cert_file: PathBuf,
    /// Its private key (PEM).
    #[arg(long, default_value = "/etc/tenant-extensions/tls.key")]
    tls_key_file: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let tenant = kube::Client::try_default()
        .await
        .context("connecting to the tenant apiserver (in-cluster configuration)")?;
    let settings = local_cluster::tenant_extensions::Settings {
        listen: flags.listen,
        cert_file: flags.tls_cert_file,
        key_file: flags.tls_key_file,
    };
    local_cluster::tenant_extensions::serve(settings, tenant).await?;
    Ok(())
}
