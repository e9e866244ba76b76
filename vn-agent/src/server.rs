//! The HTTPS listener: TLS handshakes, one HTTP/1.1 or HTTP/2 connection per client with upgrades, and
//! graceful shutdown.

use std::{convert::Infallible, sync::Arc, time::Duration};

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::proxy::{self, Context, Peer};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts connections until `shutdown`, then lets open requests and streams run on for `grace` before
/// cutting them.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let connections = TaskTracker::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        let (stream, addr) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Capped before the handshake: a connection that never finishes one holds a slot for the handshake
        // timeout at most, and one source cannot hold them all.
        let slot = match ctx.gate.connection(addr.ip()) {
            Ok(slot) => slot,
            Err(refused) => {
                ctx.metrics
                    .limited
                    .get_or_create(&crate::metrics::LimitLabels {
                        limit: refused.label(),
                    })
                    .inc();
                tracing::debug!(peer = %addr, limit = refused.label(), "connection refused: over the cap");
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ctx = ctx.clone();
        let builder = builder.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            // Held through the handshake, then by the peer: past the connection, by any stream upgraded
            // from it.
            let slot = slot;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::info!(peer = %addr, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::info!(peer = %addr, "TLS handshake timed out");
                    return;
                }
            };
            let chain = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|certs| certs.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default();
            let peer = Arc::new(Peer::new(addr, chain).holding(slot));
            let service = service_fn(move |request| {
                let ctx = ctx.clone();
                let peer = peer.clone();
                async move { Ok::<_, Infallible>(proxy::handle(ctx, peer, request).await) }
            });
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = shutdown.cancelled() => {
                    // Finish the request in progress, take no new one.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(peer = %addr, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.close();
    ctx.streams.close();
    let deadline = tokio::time::Instant::now() + grace;
    let finished = async {
        connections.wait().await;
        ctx.streams.wait().await;
    };
    if tokio::time::timeout_at(deadline, finished).await.is_err() {
        tracing::warn!(
            connections = connections.len(),
            streams = ctx.streams.len(),
            "shutdown grace period over; cutting open streams"
        );
        ctx.cut_streams.cancel();
        // Requests still in progress (a followed log) end with the process.
        let _ = tokio::time::timeout(Duration::from_secs(2), ctx.streams.wait()).await;
    }
}
