//! A scripted apiserver for unit tests: [`pair`] gives a real [`kube::Client`] whose transport is a
//! `tower-test` mock, and the [`ApiServer`] the test answers it with, one [`Call`] at a time.
//!
//! A test lists the requests the code under test must make, in order, with method, URI and body, and what
//! the apiserver answers. A missing request times the script out ([`run`], or [`ApiServer::with_patience`]);
//! an extra one finds the mock closed (or is caught by [`ApiServer::idle`]).
//!
//! Every crate's unit tests use this one harness (a dev-dependency); crate-specific helpers (fixtures,
//! contexts on the mocked client) stay in the crate.

use std::{future::Future, time::Duration};

use http::{Request, Response};
use http_body_util::BodyExt;
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};

/// The mock's handle: what [`ApiServer`] wraps, for a test that needs the raw requests.
pub type MockHandle = Handle<Request<Body>, Response<Body>>;

/// A client of a scripted apiserver (default namespace `default`), and the apiserver.
pub fn pair() -> (Client, ApiServer) {
    pair_in("default")
}

/// A client of a scripted apiserver whose default namespace is `namespace`, and the apiserver.
pub fn pair_in(namespace: &str) -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, namespace), ApiServer::new(handle))
}

/// How [`ApiServer::expect`] compares a request's URI with the expected one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UriMatch {
    Exact,
    Prefix,
}

/// The scripted apiserver.
pub struct ApiServer {
    handle: MockHandle,
    patience: Option<Duration>,
    uri_match: UriMatch,
}

impl ApiServer {
    /// Scripts answers on `handle`: [`expect`](Self::expect) compares whole URIs, and [`next`](Self::next)
    /// waits as long as it takes.
    pub fn new(handle: MockHandle) -> Self {
        Self {
            handle,
            patience: None,
            uri_match: UriMatch::Exact,
        }
    }

    /// [`next`](Self::next) panics when no request comes within `patience`.
    #[must_use]
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = Some(patience);
        self
    }

    /// [`expect`](Self::expect) accepts a URI that starts with the expected one (a script that names paths
    /// and leaves the query out).
    #[must_use]
    pub fn matching_uri_prefixes(mut self) -> Self {
        self.uri_match = UriMatch::Prefix;
        self
    }

    /// The next request.
    pub async fn next(&mut self) -> Call {
        let next = self.handle.next_request();
        let (request, send) = match self.patience {
            Some(patience) => tokio::time::timeout(patience, next)
                .await
                .expect("another request was expected"),
            None => next.await,
        }
        .expect("another request was expected, but the client is gone");
        let method = request.method().to_string();
        let uri = request.uri().to_string();
        let headers = request.headers().clone();
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = request.into_body().collect().await.expect("body").to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        Call {
            method,
            uri,
            body,
            content_type,
            headers,
            send,
        }
    }

    /// The next request, which must be `method uri` (or, after
    /// [`matching_uri_prefixes`](Self::matching_uri_prefixes), `method` on a URI starting with `uri`).
    pub async fn expect(&mut self, method: &str, uri: &str) -> Call {
        let call = self.next().await;
        let uri_matches = match self.uri_match {
            UriMatch::Exact => call.uri == uri,
            UriMatch::Prefix => call.uri.starts_with(uri),
        };
        assert!(
            call.method == method && uri_matches,
            "expected {method} {uri}, got {} {} (body {})",
            call.method,
            call.uri,
            call.body
        );
        call
    }

    /// Checks that no request is made for a while.
    pub async fn idle(&mut self) {
        if let Ok(Some((request, _))) =
            tokio::time::timeout(Duration::from_millis(200), self.handle.next_request()).await
        {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

/// One request, waiting for its answer.
pub struct Call {
    /// Method.
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// Body as JSON (`Null` when empty).
    pub body: Value,
    /// Content type.
    pub content_type: String,
    /// Every header.
    pub headers: http::HeaderMap,
    send: SendResponse<Response<Body>>,
}

impl Call {
    /// Answers with `status` and a JSON body.
    pub fn respond(self, status: u16, body: &Value) {
        self.respond_bytes(status, serde_json::to_vec(body).expect("json"));
    }

    /// Answers with `status` and `body` as it is (e.g. a watch's stream of events).
    pub fn respond_bytes(self, status: u16, body: Vec<u8>) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("response");
        self.send.send_response(response);
    }

    /// Answers 200 with `body`.
    pub fn ok(self, body: Value) {
        self.respond(200, &body);
    }

    /// Answers with the request body, completed as the apiserver would (uid, resourceVersion and
    /// generation where the request has none). Returns what it answered.
    pub fn echo(self) -> Value {
        let mut body = self.body.clone();
        if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.entry("uid").or_insert(json!("uid-of-object"));
            meta.entry("resourceVersion").or_insert(json!("200"));
            meta.entry("generation").or_insert(json!(1));
        }
        self.respond(200, &body);
        body
    }

    /// Answers with a Kubernetes `Status` error.
    pub fn fail(self, code: u16, reason: &str, message: &str) {
        self.respond(
            code,
            &json!({
                "apiVersion": "v1",
                "kind": "Status",
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            }),
        );
    }

    /// Answers 404 for `kind` `name`.
    pub fn not_found(self, kind: &str, name: &str) {
        self.fail(404, "NotFound", &format!("{kind} \"{name}\" not found"));
    }
}

/// Runs `work` against `script`; fails if the script does not finish within a second of it.
pub async fn run<T, S>(script: S, work: impl Future<Output = T>) -> T
where
    S: Future<Output = ()> + Send + 'static,
{
    let script = tokio::spawn(script);
    let result = work.await;
    tokio::time::timeout(Duration::from_secs(1), script)
        .await
        .expect("the apiserver script did not finish: a request is missing")
        .expect("the apiserver script failed");
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GET of a ConfigMap by path (no typed API needed here).
    async fn get(client: &Client, name: &str) -> Result<Value, String> {
        let request = http::Request::get(format!("/api/v1/namespaces/team/configmaps/{name}"))
            .body(Vec::new())
            .expect("request");
        client
            .request::<Value>(request)
            .await
            .map_err(|e| format!("{e:?}"))
    }

    /// The answers reach the client as the apiserver's: an object, and an error with its reason.
    #[tokio::test]
    async fn answers_reach_the_client() {
        let (client, mut api) = pair();
        let script = async move {
            api.expect("GET", "/api/v1/namespaces/team/configmaps/one")
                .await
                .ok(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}}));
            api.expect("GET", "/api/v1/namespaces/team/configmaps/two")
                .await
                .not_found("configmaps", "two");
        };
        let (one, two) = run(script, async {
            let one = get(&client, "one").await;
            let two = get(&client, "two").await;
            (one, two)
        })
        .await;
        assert_eq!(one.expect("found")["metadata"]["name"], "one");
        let error = two.expect_err("not found");
        assert!(error.contains("NotFound"), "{error}");
    }

    /// A script that names only paths accepts any query after them.
    #[tokio::test]
    async fn prefixes_match_when_asked() {
        let (client, api) = pair();
        let mut api = api.matching_uri_prefixes().with_patience(Duration::from_secs(5));
        let script = async move {
            let call = api.expect("GET", "/api/v1/namespaces/team/configmaps/one").await;
            assert_eq!(call.method, "GET");
            call.echo();
            api.idle().await;
        };
        run(script, async {
            let _ = get(&client, "one?x=1").await;
        })
        .await;
    }
}
