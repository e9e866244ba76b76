//! Structured logs through `tracing`.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the global subscriber. The filter comes from `RUST_LOG`, default `info` (kube's own chatter at
/// `warn`).
pub fn init(format: LogFormat) {
    init_with_default(
        format,
        "info,kube=warn,tower=warn,hyper=warn,hickory_server=warn,hickory_proto=warn,hickory_net=warn,hickory_resolver=warn",
    );
}

/// Installs the global subscriber with `default_filter` where `RUST_LOG` is unset.
pub fn init_with_default(format: LogFormat, default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let registry = tracing_subscriber::registry().with(filter);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => registry.with(fmt::layer()).try_init(),
        LogFormat::Json => registry.with(fmt::layer().json().flatten_event(true)).try_init(),
    };
}
