//! What the benchmark binaries share: percentiles of measured values and plain reads of a component's
//! admin endpoint (`/metrics`, `/readyz`) on loopback.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `p` percentile (0.0 to 1.0) of `values`, nearest rank; NaN when there are none. Sorts `values`.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 - 1.0) * p).round() as usize]
}

/// The whole HTTP/1.1 answer (headers and body) of `GET path` on `127.0.0.1:port`, within `timeout`;
/// `None` when the endpoint does not answer.
pub async fn admin_get(port: u16, path: &str, timeout: Duration) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut body = String::new();
    tokio::time::timeout(timeout, stream.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(body)
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles_are_nearest_rank() {
        let mut values = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(super::percentile(&mut values, 0.5), 3.0);
        assert_eq!(super::percentile(&mut values, 0.99), 5.0);
        assert!(super::percentile(&mut [], 0.5).is_nan());
    }
}
