//! Helpers for e2e tests that run real kubectl: plain runs, runs on a terminal, port-forward, and a
//! metrics API for `kubectl top`.

#![allow(dead_code)]

pub mod metrics_api;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, bail};
use local_cluster::Binary;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    process::{Child, Command},
};

/// What a kubectl run produced.
#[derive(Debug)]
pub struct Output {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Output {
    /// Fails with both outputs unless kubectl exited with 0.
    pub fn ok(self) -> anyhow::Result<Self> {
        match self.code {
            Some(0) => Ok(self),
            _ => bail!(
                "kubectl exited with {:?}\nstdout: {}\nstderr: {}",
                self.code,
                self.stdout,
                self.stderr
            ),
        }
    }
}

/// kubectl with one kubeconfig.
#[derive(Clone, Debug)]
pub struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    /// kubectl's discovery cache, private to this kubectl: the default one under `~/.kube/cache` is keyed
    /// by host and port, so a loopback apiserver of an earlier test on the same port would hand this one
    /// its API groups for up to six hours (seen: `kubectl top` refused with "Metrics API not available").
    cache: Arc<tempfile::TempDir>,
}

impl Kubectl {
    /// kubectl (from the harness's binary folders) using `kubeconfig`.
    pub fn new(kubeconfig: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            binary: local_cluster::locate(Binary::Kubectl)?,
            kubeconfig: kubeconfig.to_owned(),
            cache: Arc::new(
                tempfile::Builder::new()
                    .prefix("kubectl-cache")
                    .tempdir()
                    .context("kubectl cache folder")?,
            ),
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args)
            .kill_on_drop(true);
        command
    }

    /// Runs kubectl with `stdin` fed in (and then closed), within 60 s.
    pub async fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<Output> {
        let mut command = self.command(args);
        command
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().context("starting kubectl")?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().context("stdin")?;
            pipe.write_all(input).await?;
            drop(pipe);
        }
        let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .with_context(|| format!("kubectl {args:?} did not finish in 60 s"))??;
        Ok(Output {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Runs kubectl with `input` fed in and its stdin kept open until it ends, within 60 s: a person at a
    /// keyboard, whose input does not end when the typing does. (A closed stdin ends a real kubelet's
    /// attach session at once, before what the input asked for is printed.)
    pub async fn run_typing(&self, args: &[&str], input: &[u8]) -> anyhow::Result<Output> {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl")?;
        let mut keyboard = child.stdin.take().context("stdin")?;
        keyboard.write_all(input).await?;
        keyboard.flush().await?;
        let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .with_context(|| format!("kubectl {args:?} did not finish in 60 s"))??;
        drop(keyboard);
        Ok(Output {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Starts kubectl and returns the first `count` lines it prints (e.g. `logs -f`), then stops it.
    pub async fn first_lines(&self, args: &[&str], count: usize) -> anyhow::Result<Vec<String>> {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kubectl")?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let mut collected = Vec::new();
        let read = async {
            while collected.len() < count {
                match lines.next_line().await? {
                    Some(line) => collected.push(line),
                    None => bail!("kubectl ended after {} lines", collected.len()),
                }
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .with_context(|| format!("{count} lines of kubectl {args:?} within 30 s"))??;
        child.kill().await?;
        Ok(collected)
    }

    /// Runs kubectl on a pseudo-terminal of 80x24 (through util-linux `script`), as a person at a
    /// terminal would; returns what the terminal showed.
    pub async fn run_in_terminal(&self, args: &[&str]) -> anyhow::Result<Output> {
        let quoted: Vec<String> = std::iter::once(self.binary.display().to_string())
            .chain([
                "--kubeconfig".to_owned(),
                self.kubeconfig.display().to_string(),
                "--cache-dir".to_owned(),
                self.cache.path().display().to_string(),
            ])
            .chain(args.iter().map(|a| (*a).to_owned()))
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect();
        let script = format!("stty cols 80 rows 24; exec {}", quoted.join(" "));
        let mut child = Command::new("script")
            .args(["-qec", &script, "/dev/null"])
            // An open stdin that never ends: at end of input `script` hands the terminal an EOF and may
            // stop before it copied what kubectl printed (seen under load).
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting script")?;
        let stdin = child.stdin.take();
        let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .context("kubectl on a terminal did not finish in 60 s")??;
        drop(stdin);
        Ok(Output {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Starts `kubectl port-forward <args> :<remote>` and returns once it listens.
    pub async fn port_forward(&self, args: &[&str], remote: u16) -> anyhow::Result<PortForward> {
        let remote_arg = format!(":{remote}");
        let mut all: Vec<&str> = vec!["port-forward", "--address", "127.0.0.1"];
        all.extend_from_slice(args);
        all.push(&remote_arg);
        let mut child = self
            .command(&all)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl port-forward")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let wait = async {
            while let Some(line) = lines.next_line().await? {
                // "Forwarding from 127.0.0.1:40123 -> 8080"
                if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:")
                    && let Some((port, _)) = rest.split_once(' ')
                {
                    return anyhow::Ok(port.parse::<u16>()?);
                }
            }
            bail!("kubectl port-forward ended before listening")
        };
        let local_port = match tokio::time::timeout(Duration::from_secs(30), wait).await {
            Ok(Ok(port)) => port,
            Ok(Err(error)) => {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr).await;
                }
                bail!("{error}: {stderr}");
            }
            Err(_) => bail!("kubectl port-forward did not listen within 30 s"),
        };
        // Keep draining stdout ("Handling connection for ...") so kubectl never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(PortForward { child, local_port })
    }
}

/// A running `kubectl port-forward`; killed when dropped.
pub struct PortForward {
    child: Child,
    local_port: u16,
}

impl PortForward {
    /// Connects to the local port, sends `payload`, closes the sending side and returns all that came
    /// back.
    pub async fn exchange(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.local_port)).await?;
        stream.write_all(payload).await?;
        let mut received = Vec::new();
        // The remote side sends a banner, echoes, and closes once the local side closed.
        let read = async {
            let mut buffer = [0u8; 4096];
            loop {
                let n = stream.read(&mut buffer).await?;
                if n == 0 {
                    break;
                }
                received.extend_from_slice(&buffer[..n]);
                if received.ends_with(payload) {
                    stream.shutdown().await?;
                }
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .context("port-forward exchange did not finish in 30 s")??;
        Ok(received)
    }

    /// Whether kubectl still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}
