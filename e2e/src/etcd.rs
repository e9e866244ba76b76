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
