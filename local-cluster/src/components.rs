use std::time::Duration;

use crate::{ApiServer, Binary, ManagedProcess, Result, WorkDir, locate};

/// A kube-controller-manager for one apiserver.
#[derive(Debug)]
pub struct ControllerManager {
    process: ManagedProcess,
    _dir: WorkDir,
}

impl ControllerManager {
    /// Starts the controllers in `controllers` (kube-controller-manager's `--controllers` syntax).
    pub async fn start(
        apiserver: &ApiServer,
        name: &str,
        controllers: &str,
        service_cidr: &str,
        extra_args: &[String],
    ) -> Result<Self> {
        let binary = locate(Binary::KubeControllerManager)?;
        let dir = WorkDir::new(&format!("kcm-{name}"))?;
        let pki = apiserver.dir();
        let kubeconfig = apiserver.kubeconfig_path().display().to_string();
        let mut args = vec![
            format!("--kubeconfig={kubeconfig}"),
            "--leader-elect=false".to_owned(),
            // 0 turns the serving endpoint off: no port to allocate and no delegated authentication.
            "--secure-port=0".to_owned(),
            format!("--controllers={controllers}"),
            format!("--root-ca-file={}", pki.join("ca.crt").display()),
            format!(
                "--service-account-private-key-file={}",
                pki.join("sa.key").display()
            ),
            format!("--cluster-signing-cert-file={}", pki.join("ca.crt").display()),
            format!("--cluster-signing-key-file={}", pki.join("ca.key").display()),
            format!("--service-cluster-ip-range={service_cidr}"),
            "--use-service-account-credentials=false".to_owned(),
            // The defaults (20 qps) would make the harness, not the code under test, the bottleneck.
            "--kube-api-qps=1000".to_owned(),
            "--kube-api-burst=2000".to_owned(),
            "--concurrent-statefulset-syncs=20".to_owned(),
            "--concurrent-gc-syncs=50".to_owned(),
            "--concurrent-namespace-syncs=20".to_owned(),
            "--v=1".to_owned(),
        ];
        args.extend(extra_args.iter().cloned());
        let mut process = ManagedProcess::start(
            &format!("kube-controller-manager {name}"),
            &binary,
            args,
            dir.join("kube-controller-manager.log"),
        )?;
        // It has no endpoint to probe: give it a moment and make sure it did not exit on a bad flag.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !process.is_running() {
            return Err(process.not_ready("the process exited"));
        }
        Ok(Self { process, _dir: dir })
    }

    /// The process, for logs.
    pub fn process(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

/// A kube-scheduler for one apiserver.
#[derive(Debug)]
pub struct Scheduler {
    process: ManagedProcess,
    _dir: WorkDir,
}

impl Scheduler {
    /// Starts a scheduler.
    pub async fn start(apiserver: &ApiServer, name: &str) -> Result<Self> {
        let binary = locate(Binary::KubeScheduler)?;
        let dir = WorkDir::new(&format!("scheduler-{name}"))?;
        let config = dir.write(
            "scheduler.yaml",
            format!(
                "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {}
  qps: 1000
  burst: 2000
leaderElection:
  leaderElect: false
",
                apiserver.kubeconfig_path().display()
            ),
        )?;
        let args = vec![
            format!("--config={}", config.display()),
            "--secure-port=0".to_owned(),
            "--v=1".to_owned(),
        ];
        let mut process = ManagedProcess::start(
            &format!("kube-scheduler {name}"),
            &binary,
            args,
            dir.join("kube-scheduler.log"),
        )?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !process.is_running() {
            return Err(process.not_ready("the process exited"));
        }
        Ok(Self { process, _dir: dir })
    }

    /// The process, for logs.
    pub fn process(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}
