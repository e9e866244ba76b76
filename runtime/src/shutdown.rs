//! Waiting for the signals that end a component.

/// Resolves on SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C).
pub async fn signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops this process");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = terminate => tracing::info!("SIGTERM received, shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received, shutting down"),
    }
}
