//! Bounds on what a tenant apiserver's responses may make a component hold in memory.
//!
//! A tenant apiserver is hostile input like everything else a tenant controls: an adopted one is whatever
//! the VirtualCluster's kubeconfig points at. kube's client reads a whole response body before parsing it
//! and splits watch streams into lines of any length (its `LinesCodec` is unbounded), so an apiserver that
//! answers with an endless body or an endless watch line would grow a component's memory until it is
//! killed. [`ResponseLimitLayer`] wraps every response body of a tenant client:
//!
//! - all of a tenant's responses together may hold at most [`ResponseLimits::max_bytes`] at once (a
//!   finished body gives its bytes back when it is dropped; a watch holds only the line it is reading);
//! - a watch line may be at most [`ResponseLimits::max_line_bytes`] long.
//!
//! Past either, the body fails with [`ResponseTooLarge`] (the connection is dropped, nothing more is read)
//! and the budget remembers it, so the component can tell which tenant and stop attaching it for a while.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

/// How much a tenant's responses may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseLimits {
    /// Bytes all of a tenant's open response bodies may hold at once.
    pub max_bytes: u64,
    /// Bytes of one watch event line.
    pub max_line_bytes: u64,
}

impl Default for ResponseLimits {
    fn default() -> Self {
        Self {
            max_bytes: 128 * 1024 * 1024,
            max_line_bytes: 16 * 1024 * 1024,
        }
    }
}

/// A response passed a limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the response to {request} was cut: {problem}")]
pub struct ResponseTooLarge {
    /// Method and path of the request.
    pub request: String,
    /// Which limit, and how far.
    pub problem: String,
}

/// One tenant's responses against its limits, shared by every response of its client.
#[derive(Debug)]
pub struct ResponseBudget {
    limits: ResponseLimits,
    held: AtomicU64,
    exceeded: Mutex<Option<ResponseTooLarge>>,
    notify: tokio::sync::Notify,
}

impl ResponseBudget {
    /// A budget with nothing held.
    pub fn new(limits: ResponseLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            held: AtomicU64::new(0),
            exceeded: Mutex::new(None),
            notify: tokio::sync::Notify::new(),
        })
    }

    /// Its limits.
    pub fn limits(&self) -> ResponseLimits {
        self.limits
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The first response that passed a limit, once one did.
    pub fn exceeded(&self) -> Option<ResponseTooLarge> {
        self.exceeded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until a response passes a limit (returns at once when one did).
    pub async fn wait_exceeded(&self) -> ResponseTooLarge {
        loop {
            let notified = self.notify.notified();
            if let Some(exceeded) = self.exceeded() {
                return exceeded;
            }
            notified.await;
        }
    }

    fn take(&self, bytes: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes)
                    .filter(|total| *total <= self.limits.max_bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(bytes))
            });
    }

    fn refuse(&self, error: ResponseTooLarge) -> ResponseTooLarge {
        let mut exceeded = self.exceeded.lock().unwrap_or_else(|e| e.into_inner());
        if exceeded.is_none() {
            *exceeded = Some(error.clone());
        }
        drop(exceeded);
        self.notify.notify_waiters();
        error
    }
}

/// Whether a request is a watch (its response is a stream of lines that may last forever).
pub fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1" | "watch=True"))
    })
}

/// What one frame of a body does to what it holds: the pure part of [`LimitedBody`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// Bytes held (a whole body so far, or a watch's unfinished line).
    pub held: u64,
}

impl Holding {
    /// After a frame of `data`: the bytes now held, or why the frame is refused. A watch holds only its
    /// unfinished line, and each of its lines is checked against `max_line_bytes`.
    pub fn after(self, data: &[u8], watch: bool, limits: ResponseLimits) -> Result<Self, String> {
        if !watch {
            return Ok(Self {
                held: self.held + data.len() as u64,
            });
        }
        let mut line = self.held;
        let mut segments = data.split(|b| *b == b'\n').peekable();
        while let Some(segment) = segments.next() {
            line += segment.len() as u64;
            if line > limits.max_line_bytes {
                return Err(format!(
                    "a watch line passed {} bytes without ending",
                    limits.max_line_bytes
                ));
            }
            if segments.peek().is_some() {
                line = 0;
            }
        }
        Ok(Self { held: line })
    }
}

/// A response body held to a [`ResponseBudget`].
pub struct LimitedBody<B> {
    inner: B,
    budget: Arc<ResponseBudget>,
    request: String,
    watch: bool,
    holding: Holding,
    failed: bool,
}

impl<B> LimitedBody<B> {
    /// Wraps `inner`, the body of the response to `request` (method and path, for the error).
    pub fn new(inner: B, budget: Arc<ResponseBudget>, request: String, watch: bool) -> Self {
        Self {
            inner,
            budget,
            request,
            watch,
            holding: Holding::default(),
            failed: false,
        }
    }

    fn refuse(&mut self, problem: String) -> tower::BoxError {
        self.failed = true;
        self.budget.give_back(self.holding.held);
        self.holding = Holding::default();
        Box::new(self.budget.refuse(ResponseTooLarge {
            request: self.request.clone(),
            problem,
        }))
    }
}

impl<B> Drop for LimitedBody<B> {
    fn drop(&mut self) {
        self.budget.give_back(self.holding.held);
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tower::BoxError>,
{
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let Some(data) = frame.data_ref() else {
            return Poll::Ready(Some(Ok(frame)));
        };
        let limits = self.budget.limits();
        let before = self.holding;
        let after = match before.after(data, self.watch, limits) {
            Ok(after) => after,
            Err(problem) => return Poll::Ready(Some(Err(self.refuse(problem)))),
        };
        if after.held > before.held {
            if !self.budget.take(after.held - before.held) {
                let problem = format!(
                    "this tenant's responses would hold more than {} bytes at once",
                    limits.max_bytes
                );
                return Poll::Ready(Some(Err(self.refuse(problem))));
            }
        } else {
            self.budget.give_back(before.held - after.held);
        }
        self.holding = after;
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A tower layer that holds every response body of a client to one [`ResponseBudget`].
#[derive(Clone, Debug)]
pub struct ResponseLimitLayer {
    budget: Arc<ResponseBudget>,
}

impl ResponseLimitLayer {
    /// A layer charging `budget`.
    pub fn new(budget: Arc<ResponseBudget>) -> Self {
        Self { budget }
    }
}

impl<S> tower::Layer<S> for ResponseLimitLayer {
    type Service = ResponseLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ResponseLimit {
            inner,
            budget: self.budget.clone(),
        }
    }
}

/// The service of [`ResponseLimitLayer`].
#[derive(Clone, Debug)]
pub struct ResponseLimit<S> {
    inner: S,
    budget: Arc<ResponseBudget>,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for ResponseLimit<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin,
{
    type Response = http::Response<LimitedBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let watch = is_watch(request.uri());
        let described = format!(
            "{} {}",
            request.method(),
            request.uri().path_and_query().map_or("/", |p| p.as_str())
        );
        let budget = self.budget.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| LimitedBody::new(body, budget, described, watch)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ResponseLimits = ResponseLimits {
        max_bytes: 100,
        max_line_bytes: 10,
    };

    #[test]
    fn watches_hold_only_their_unfinished_line_and_each_line_is_bounded() {
        let cases: &[(u64, &str, bool, Result<u64, ()>)] = &[
            // A whole body is held as it comes.
            (0, "0123456789abcdef", false, Ok(16)),
            (16, "xyz", false, Ok(19)),
            // A watch holds what follows its last newline.
            (0, "{\"a\":1}\n{\"b", true, Ok(3)),
            (3, "\":2}\n", true, Ok(0)),
            (0, "12345\n12345\n12", true, Ok(2)),
            // A line of exactly the limit passes, one byte more does not, across frames too.
            (0, "0123456789\n", true, Ok(0)),
            (0, "0123456789x\n", true, Err(())),
            (8, "abc", true, Err(())),
            (8, "ab\nc", true, Ok(1)),
        ];
        for (held, data, watch, expected) in cases {
            let after = Holding { held: *held }
                .after(data.as_bytes(), *watch, LIMITS)
                .map(|h| h.held)
                .map_err(|_| ());
            assert_eq!(after, *expected, "{held} {data:?} {watch}");
        }
    }

    #[test]
    fn watch_requests_are_recognised() {
        for (uri, watch) in [
            ("/api/v1/pods?watch=true&resourceVersion=5", true),
            ("/api/v1/pods?resourceVersion=5&watch=1", true),
            ("/api/v1/pods?limit=100", false),
            ("/api/v1/pods?watchy=true", false),
            ("/version", false),
        ] {
            assert_eq!(is_watch(&uri.parse().expect("uri")), watch, "{uri}");
        }
    }

    async fn read_all<B>(mut body: LimitedBody<B>) -> Result<usize, tower::BoxError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<tower::BoxError>,
    {
        use http_body_util::BodyExt;
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            read += frame?.data_ref().map_or(0, Bytes::len);
        }
        Ok(read)
    }

    /// A body of these chunks, one frame each.
    struct Chunks(std::collections::VecDeque<&'static str>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))),
            )
        }
    }

    fn body(budget: &Arc<ResponseBudget>, chunks: &[&'static str], watch: bool) -> LimitedBody<Chunks> {
        LimitedBody::new(
            Chunks(chunks.iter().copied().collect()),
            budget.clone(),
            "GET /api/v1/configmaps".into(),
            watch,
        )
    }

    #[tokio::test]
    async fn bodies_share_one_budget_and_give_it_back_when_dropped() {
        let budget = ResponseBudget::new(LIMITS);
        assert_eq!(
            read_all(body(&budget, &["x"; 60], false)).await.expect("fits"),
            60
        );
        assert_eq!(budget.held(), 0, "a finished body gives its bytes back");
        // Two bodies read at once: the second passes what is left.
        let mut first = body(&budget, &["0123456789"; 7], false);
        {
            use http_body_util::BodyExt;
            for _ in 0..7 {
                first.frame().await.expect("frame").expect("fits");
            }
        }
        assert_eq!(budget.held(), 70);
        let error = read_all(body(&budget, &["0123456789"; 4], false))
            .await
            .expect_err("over the budget");
        assert!(error.to_string().contains("more than 100 bytes"), "{error}");
        assert!(error.to_string().contains("GET /api/v1/configmaps"), "{error}");
        assert_eq!(
            budget.exceeded().map(|e| e.request),
            Some("GET /api/v1/configmaps".into())
        );
        drop(first);
        assert_eq!(budget.held(), 0);
        // An endless line of a watch is cut at its limit; whole lines of any number pass.
        let budget = ResponseBudget::new(LIMITS);
        assert_eq!(
            read_all(body(&budget, &["12345\n"; 100], true))
                .await
                .expect("lines"),
            600
        );
        let error = read_all(body(&budget, &["123456"; 100], true))
            .await
            .expect_err("endless line");
        assert!(error.to_string().contains("watch line"), "{error}");
        assert_eq!(budget.held(), 0);
    }
}
