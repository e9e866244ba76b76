//! What the benchmark binaries share: percentiles of measured values, plain reads of a component's
//! admin endpoint (`/metrics`, `/readyz`) on loopback, and what a process holds open.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

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

/// What a process holds open: descriptors, sockets, and its established TCP connections by remote port.
#[derive(Debug, Default)]
pub struct OpenFiles {
    /// File descriptors.
    pub fds: usize,
    /// Sockets among them.
    pub sockets: usize,
    /// Established TCP connections, by remote port.
    pub tcp_by_port: HashMap<u16, usize>,
}

/// What process `pid` holds open now (from `/proc`).
pub fn open_files(pid: u32) -> OpenFiles {
    let mut found = OpenFiles::default();
    let mut inodes = HashSet::new();
    if let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for entry in entries.flatten() {
            found.fds += 1;
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            if let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
            {
                found.sockets += 1;
                inodes.insert(inode.to_owned());
            }
        }
    }
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local, remote, state (01 = established), ..., inode at 9.
            let (Some(remote), Some(state), Some(inode)) = (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if *state != "01" || !inodes.contains(*inode) {
                continue;
            }
            let Some(port) = remote
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            else {
                continue;
            };
            *found.tcp_by_port.entry(port).or_default() += 1;
        }
    }
    found
}

/// The port of an `https://host:port` URL.
pub fn port_of(url: &str) -> u16 {
    url.rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .unwrap_or(443)
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
