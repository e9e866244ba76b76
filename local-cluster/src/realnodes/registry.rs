//! A read-only image registry on loopback that serves the [`ImageStore`], the mirror of every registry in
//! the nodes' containerd configuration.
//!
//! It implements the pull side of the OCI distribution API: `GET`/`HEAD` of `/v2/`, of manifests by tag or
//! digest, and of blobs. containerd asks a mirror for `/v2/<repository>/manifests/<tag>?ns=<registry>`, so
//! the registry host comes from the `ns` parameter. It runs on a thread of its own for the life of the test
//! process: each test's runtime ends with the test, and the images are made once per run.

use std::{
    net::SocketAddr,
    path::Path as FilePath,
    sync::{Arc, OnceLock, RwLock},
};

use axum::{
    Router,
    body::Body,
    extract::{Path, Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

use super::images::{ImageStore, MANIFEST_TYPE};
use crate::{Error, Result};

/// The registry and the images it serves.
#[derive(Debug)]
pub struct Registry {
    address: SocketAddr,
    store: Arc<RwLock<ImageStore>>,
}

impl Registry {
    /// The process's registry, building the images and starting the server on first use.
    pub fn shared() -> Result<&'static Registry> {
        static REGISTRY: OnceLock<std::result::Result<Registry, String>> = OnceLock::new();
        REGISTRY
            .get_or_init(|| Self::start().map_err(|e| crate::error_chain(&e)))
            .as_ref()
            .map_err(|message| Error::MissingPart {
                part: "the test images and their registry".into(),
                hint: message.clone(),
            })
    }

    fn start() -> Result<Self> {
        let store = Arc::new(RwLock::new(ImageStore::build()?));
        // Every address: the nodes' containerds pull from the host's address towards them
        // (host::HOST_IP), which exists only while real nodes run; the registry lives as long as the
        // process.
        let listener = std::net::TcpListener::bind("0.0.0.0:0").map_err(Error::io("binding the registry"))?;
        listener
            .set_nonblocking(true)
            .map_err(Error::io("configuring the registry's socket"))?;
        let address = listener
            .local_addr()
            .map_err(Error::io("reading the registry's address"))?;
        let app = Router::new()
            .route("/v2/", get(|| async { axum::Json(serde_json::json!({})) }))
            .route("/v2/{*path}", get(serve))
            .with_state(store.clone());
        std::thread::Builder::new()
            .name("e2e-registry".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the registry");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("registry listener");
                    if let Err(error) = axum::serve(listener, app).await {
                        tracing::error!(%error, "the e2e registry stopped");
                    }
                });
            })
            .map_err(Error::io("starting the registry thread"))?;
        Ok(Self { address, store })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.address.port())
    }

    /// `http://<host address>:<port>`: where the nodes pull from.
    pub fn node_url(&self) -> String {
        format!("http://{}:{}", super::host::HOST_IP, self.address.port())
    }

    /// The control-plane images that were built.
    pub fn versions(&self) -> super::ControlPlaneImages {
        read(&self.store).versions.clone()
    }

    /// Builds and serves an image of a program built on this machine ([`ImageStore::add_program`]).
    pub fn add_program(&self, reference: &str, program: &FilePath) -> Result<()> {
        self.store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add_program(reference, program)
    }

    /// Builds and serves a [`LocalImage`](super::images::LocalImage).
    pub fn add_local(&self, image: super::images::LocalImage) -> Result<()> {
        self.store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add_local(image)
    }

    /// Builds and serves a [`DistrolessImage`](super::images::DistrolessImage); its size, `None` when it
    /// was served already.
    pub fn add_distroless(&self, image: super::images::DistrolessImage) -> Result<Option<u64>> {
        self.store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add_distroless(image)
    }

    /// Serves the image `existing` under `name` too ([`ImageStore::alias`]).
    pub fn alias(&self, existing: &str, name: &str) -> bool {
        self.store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .alias(existing, name)
    }
}

/// The store, also after a panic elsewhere (it is only ever added to).
fn read(store: &RwLock<ImageStore>) -> std::sync::RwLockReadGuard<'_, ImageStore> {
    store.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(serde::Deserialize)]
struct Namespace {
    ns: Option<String>,
}

async fn serve(
    State(store): State<Arc<RwLock<ImageStore>>>,
    Path(path): Path<String>,
    Query(namespace): Query<Namespace>,
) -> Response {
    if let Some((repository, reference)) = path.rsplit_once("/manifests/") {
        let store = read(&store);
        let image = match reference.starts_with("sha256:") {
            true => store.image_by_digest(reference),
            false => {
                let full = match &namespace.ns {
                    Some(ns) => format!("{ns}/{repository}:{reference}"),
                    None => format!("{repository}:{reference}"),
                };
                store.image(&full)
            }
        };
        return match image {
            Some(image) => {
                let mut headers = HeaderMap::new();
                headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(MANIFEST_TYPE));
                if let Ok(digest) = HeaderValue::from_str(&image.digest) {
                    headers.insert("docker-content-digest", digest);
                }
                (headers, image.manifest.clone()).into_response()
            }
            None => not_found("MANIFEST_UNKNOWN", &path),
        };
    }
    if let Some((_, digest)) = path.rsplit_once("/blobs/") {
        let Some(blob) = read(&store).blobs.get(digest).cloned() else {
            return not_found("BLOB_UNKNOWN", &path);
        };
        let Ok(file) = tokio::fs::File::open(&blob.path).await else {
            return not_found("BLOB_UNKNOWN", &path);
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(blob.size));
        if let Ok(digest) = HeaderValue::from_str(&blob.digest) {
            headers.insert("docker-content-digest", digest);
        }
        let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
        return (headers, body).into_response();
    }
    not_found("NAME_UNKNOWN", &path)
}

fn not_found(code: &str, path: &str) -> Response {
    let body = serde_json::json!({ "errors": [{ "code": code, "message": format!("{path} is not in the e2e registry") }] });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}
