//! Polling helpers for tests.

use std::{future::Future, time::Duration};

use crate::{Error, Result};

/// Polls `check` every 100 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs_f64(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Like [`until`], for a boolean condition.
pub async fn until_true<F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    until(timeout, what, || {
        let fut = check();
        async move { fut.await.then_some(()) }
    })
    .await
}
