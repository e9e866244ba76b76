//! The admin HTTP endpoint: `/metrics` (OpenMetrics), `/healthz` (liveness) and `/readyz` (readiness).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::{encoding::text::encode, registry::Registry};

use crate::Error;

/// Liveness and readiness of a component, shared between its loops and the admin endpoint.
#[derive(Clone, Debug)]
pub struct Health {
    ready: Arc<AtomicBool>,
    alive: Arc<AtomicBool>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            ready: Arc::new(AtomicBool::new(false)),
            alive: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Health {
    /// Not ready, alive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the component ready (its caches are synced) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Marks the component broken beyond repair; `/healthz` then fails so the kubelet restarts it.
    pub fn set_dead(&self) {
        self.alive.store(false, Ordering::Relaxed);
    }

    /// Whether `/healthz` answers 200.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct AdminState {
    registry: Arc<Registry>,
    health: Health,
}

/// The admin routes.
pub fn router(registry: Arc<Registry>, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AdminState { registry, health })
}

/// The admin routes without `/metrics`, for a component that serves its metrics elsewhere.
pub fn health_router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AdminState {
            registry: Arc::new(Registry::default()),
            health,
        })
}

/// `/metrics` alone.
pub fn metrics_router(registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(AdminState {
            registry,
            health: Health::new(),
        })
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(error) => {
            tracing::error!(%error, "encoding metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain")],
                "encoding failed\n".into(),
            )
        }
    }
}

async fn healthz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.health.is_alive() {
        true => (StatusCode::OK, "ok\n"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "unhealthy\n"),
    }
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.health.is_ready() {
        true => (StatusCode::OK, "ok\n"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n"),
    }
}

/// Serves the admin routes on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Health,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    serve_routes(addr, router(registry, health), shutdown).await
}

/// Serves `routes` (from [`router`], [`health_router`] or [`metrics_router`]) on `addr` until `shutdown`
/// resolves.
pub async fn serve_routes(
    addr: SocketAddr,
    routes: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::AdminListen { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| Error::AdminListen { addr, source })?;
    tracing::info!(address = %local, "admin endpoint listening");
    axum::serve(listener, routes)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::AdminListen { addr, source })
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt;

    use super::*;

    async fn get(router: Router, path: &str) -> (StatusCode, String) {
        let response = router
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .expect("request"),
            )
            .await
            .expect("response");
        let status = response.status();
        let body = response.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readiness_follows_the_flag_and_metrics_are_encoded() {
        let mut registry = Registry::with_prefix("test");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things done", counter.clone());
        counter.inc();
        let health = Health::new();
        let router = router(Arc::new(registry), health.clone());

        assert_eq!(
            get(router.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        health.set_ready(true);
        assert_eq!(get(router.clone(), "/readyz").await.0, StatusCode::OK);
        assert_eq!(get(router.clone(), "/healthz").await.0, StatusCode::OK);
        health.set_dead();
        assert_eq!(
            get(router.clone(), "/healthz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );

        let (status, body) = get(router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("test_things_total 1"), "{body}");
    }

    /// Split, the health routes show no metrics and the metrics routes no health.
    #[tokio::test]
    async fn health_and_metrics_can_be_served_apart() {
        let mut registry = Registry::with_prefix("test");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things done", counter.clone());
        let health = Health::new();
        health.set_ready(true);
        let health_routes = health_router(health);
        assert_eq!(get(health_routes.clone(), "/readyz").await.0, StatusCode::OK);
        assert_eq!(get(health_routes, "/metrics").await.0, StatusCode::NOT_FOUND);
        let metrics_routes = metrics_router(Arc::new(registry));
        let (status, body) = get(metrics_routes.clone(), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("test_things_total 0"), "{body}");
        assert_eq!(get(metrics_routes, "/readyz").await.0, StatusCode::NOT_FOUND);
    }
}
