//! Response bodies and refusals.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};

/// Errors a proxied body can carry.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response vn-agent sends: a fixed body or a backend's body streamed through.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A fixed body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A response with a fixed body and content type.
pub fn with_body(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON response.
pub fn json(value: &serde_json::Value) -> Response<ProxyBody> {
    with_body(StatusCode::OK, "application/json", value.to_string())
}

/// Why a request is not served, with the status the caller gets. The message is for the caller; it never
/// names another tenant's objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The status.
    pub status: StatusCode,
    /// One line for the caller (and the log).
    pub message: String,
}

impl Refusal {
    /// A refusal with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    /// The response: plain text, as the kubelet answers errors.
    pub fn into_response(self) -> Response<ProxyBody> {
        with_body(
            self.status,
            "text/plain; charset=utf-8",
            format!("{}\n", self.message),
        )
    }
}
