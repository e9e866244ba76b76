use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{Binary, ManagedProcess, Result, WorkDir, free_port, locate};

/// A single-member etcd on loopback (plain HTTP), for one or more apiservers.
#[derive(Debug)]
pub struct Etcd {
    process: ManagedProcess,
    client_url: String,
    // Dropped after the process, so its data folder outlives it.
    _dir: WorkDir,
}

impl Etcd {
    /// Starts etcd and waits until it reports healthy.
    pub async fn start() -> Result<Self> {
        let binary = locate(Binary::Etcd)?;
        let dir = WorkDir::new("etcd")?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let args = vec![
            "--name=e2e".to_owned(),
            format!("--data-dir={}", dir.join("data").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=e2e={peer_url}"),
            // Test data need not survive a power cut; fsync would dominate the runtime.
            "--unsafe-no-fsync".to_owned(),
            "--quota-backend-bytes=8589934592".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let mut process = ManagedProcess::start("etcd", &binary, args, dir.join("etcd.log"))?;
        process
            .wait_ready(Duration::from_secs(30), || health(client_port))
            .await?;
        Ok(Self {
            process,
            client_url,
            _dir: dir,
        })
    }

    /// The URL apiservers use (`--etcd-servers`).
    pub fn client_url(&self) -> &str {
        &self.client_url
    }

    /// The process, for logs.
    pub fn process(&self) -> &ManagedProcess {
        &self.process
    }

    /// Deletes every key under `prefix` (an apiserver's `--etcd-prefix` plus `/`): what a wiped or
    /// replaced etcd looks like to that apiserver once it restarts. Returns how many keys went.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<u64> {
        use base64::{Engine, engine::general_purpose::STANDARD};
        let failed = |problem: String| crate::Error::Http {
            context: format!("POST /v3/kv/deleterange (etcd prefix {prefix})"),
            source: problem.into(),
        };
        // The range end of a prefix: the prefix with its last byte incremented.
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let body = format!(
            r#"{{"key":"{}","range_end":"{}"}}"#,
            STANDARD.encode(prefix),
            STANDARD.encode(&end)
        );
        let address = self.client_url.trim_start_matches("http://").to_owned();
        let mut stream = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let request = format!(
            "POST /v3/kv/deleterange HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut response))
            .await
            .map_err(|_| failed("no answer within 10 s".into()))?
            .map_err(|e| failed(e.to_string()))?;
        if !response.starts_with("HTTP/1.1 200") {
            return Err(failed(format!("etcd answered {response}")));
        }
        let deleted = response
            .split("\"deleted\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok(deleted)
    }
}

/// Whether etcd answers `/health` with `"health":"true"`.
async fn health(port: u16) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let request = format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = String::new();
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut response)).await;
    matches!(read, Ok(Ok(_))) && response.contains("\"health\":\"true\"")
}
