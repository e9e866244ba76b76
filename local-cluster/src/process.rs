use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{OnceLock, mpsc},
    time::Duration,
};

use crate::{Error, Result};

/// A child process whose output goes to a log file. It is killed when dropped, and (through `setpriv
/// --pdeathsig`) when the test process dies, so no process outlives a test.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
    child: Option<Child>,
}

/// Asks the long-lived spawner thread to start a command.
///
/// The parent-death signal fires when the *thread* that forked the child exits. Test runtimes create and end
/// threads freely, so every child is forked from one thread that lives as long as the process.
fn spawn(mut command: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("e2e-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("starting the e2e spawner thread");
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    command.stdin(Stdio::null());
    spawner
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

fn setpriv() -> Option<&'static Path> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV
        .get_or_init(|| {
            ["/usr/bin/setpriv", "/bin/setpriv"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
        })
        .as_deref()
}

impl ManagedProcess {
    /// Starts `program` with `args`, appending its stdout and stderr to `log_path`.
    pub fn start(name: &str, program: &Path, args: Vec<String>, log_path: PathBuf) -> Result<Self> {
        let mut process = Self {
            name: name.to_owned(),
            program: program.to_owned(),
            args,
            log_path,
            child: None,
        };
        process.restart()?;
        Ok(process)
    }

    /// Starts the process again with the same arguments (after [`stop`](Self::stop), or a crash).
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(Error::io(format!("opening log {}", self.log_path.display())))?;
        let log_err = log.try_clone().map_err(Error::io("duplicating a log handle"))?;
        let mut command = match setpriv() {
            Some(setpriv) => {
                let mut c = Command::new(setpriv);
                c.arg("--pdeathsig").arg("KILL").arg("--").arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        command.args(&self.args).stdout(log).stderr(log_err);
        let child = spawn(command).map_err(Error::io(format!("starting {}", self.program.display())))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the process and waits for it to end.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the process and does not reap it: it stays a zombie until this process exits (and whoever
    /// inherits it reaps it). For benchmarks only, which must not spend the run in the kernel's teardown of
    /// a process: after a run that kept a core saturated, reaping a stopped syncer (`wait4` spinning in
    /// `proc_invalidate_siblings_dcache`) took minutes of a core's time, on the benchmark's own core.
    pub fn kill_unreaped(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            std::mem::forget(child);
        }
    }

    /// Whether the process is running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// How the process ended, once it has (None while it runs, or before it was started).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Name used in logs and errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the output goes.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let Ok(mut file) = File::open(&self.log_path) else {
            return String::new();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// An error saying the process is not ready, with its log tail.
    pub fn not_ready(&self, reason: impl Into<String>) -> Error {
        Error::NotReady {
            name: self.name.clone(),
            reason: reason.into(),
            log_tail: self.log_tail(30),
        }
    }

    /// Polls `probe` until it succeeds, failing early if the process exits.
    pub async fn wait_ready<F, Fut>(&mut self, timeout: Duration, mut probe: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if !self.is_running() {
                return Err(self.not_ready("the process exited"));
            }
            if probe().await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.not_ready(format!("no readiness within {timeout:?}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            // The log disappears with the work folder; show its end while the failure is being reported.
            eprintln!(
                "--- last lines of {} ({}) ---\n{}",
                self.name,
                self.log_path.display(),
                self.log_tail(20)
            );
        }
        self.stop();
    }
}
