use std::{path::PathBuf, time::Duration};

use kube::Client;

use crate::{
    Binary, Etcd, ManagedProcess, Result, WorkDir, client_from_kubeconfig_file, free_port, kubeconfig_yaml,
    locate,
    pki::{CertificateAuthority, CertifiedKey, Usage},
};

/// How to start a kube-apiserver.
#[derive(Clone, Debug)]
pub struct ApiServerOptions {
    /// Names the process in logs and its etcd prefix (`/<name>`), so apiservers sharing an etcd stay apart.
    pub name: String,
    /// `--service-cluster-ip-range`.
    pub service_cidr: String,
    /// `--kubelet-client-certificate/key`: what the apiserver presents to kubelets (default: a certificate
    /// for `kube-apiserver-kubelet-client` from this control plane's CA).
    pub kubelet_client: Option<CertifiedKey>,
    /// `--kubelet-certificate-authority` (PEM): verify kubelet serving certificates against it. Default:
    /// this control plane's CA, which signs the simulated kubelets' certificates.
    pub kubelet_ca: Option<String>,
    /// More flags, appended last.
    pub extra_args: Vec<String>,
}

impl ApiServerOptions {
    /// Defaults for an apiserver called `name`.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            service_cidr: "10.0.0.0/16".to_owned(),
            kubelet_client: None,
            kubelet_ca: None,
            extra_args: Vec::new(),
        }
    }
}

/// A kube-apiserver process with its own PKI, serving on a free loopback port.
pub struct ApiServer {
    process: ManagedProcess,
    url: String,
    ca: CertificateAuthority,
    admin: CertifiedKey,
    kubeconfig_path: PathBuf,
    client: Client,
    dir: WorkDir,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

impl ApiServer {
    /// Starts an apiserver on `etcd` and waits until `/readyz` answers.
    pub async fn start(etcd: &Etcd, options: ApiServerOptions) -> Result<Self> {
        let binary = locate(Binary::KubeApiserver)?;
        let dir = WorkDir::new(&format!("apiserver-{}", options.name))?;
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");

        let ca = CertificateAuthority::new(&format!("{} CA", options.name))?;
        let first_service_ip = first_service_ip(&options.service_cidr);
        let mut serving_names = vec![
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        if let Some(ip) = &first_service_ip {
            serving_names.push(ip);
        }
        let serving = ca.issue("kube-apiserver", &[], &serving_names, Usage::Server)?;
        let admin = ca.issue("e2e-admin", &["system:masters"], &[], Usage::Client)?;
        let kubelet_client = match &options.kubelet_client {
            Some(cert) => cert.clone(),
            None => ca.issue(
                "kube-apiserver-kubelet-client",
                &["system:masters"],
                &[],
                Usage::Client,
            )?,
        };
        let service_account = crate::pki::service_account_key()?;

        let ca_path = dir.write("ca.crt", ca.cert_pem())?;
        dir.write("ca.key", ca.key_pem())?;
        let serving_cert = dir.write("apiserver.crt", &serving.cert_pem)?;
        let serving_key = dir.write("apiserver.key", &serving.key_pem)?;
        let kubelet_cert = dir.write("kubelet-client.crt", &kubelet_client.cert_pem)?;
        let kubelet_key = dir.write("kubelet-client.key", &kubelet_client.key_pem)?;
        let kubelet_ca = dir.write(
            "kubelet-ca.crt",
            options.kubelet_ca.as_deref().unwrap_or(ca.cert_pem()),
        )?;
        let sa_key = dir.write("sa.key", &service_account.private_pem)?;
        let sa_pub = dir.write("sa.pub", &service_account.public_pem)?;

        let mut args = vec![
            format!("--etcd-servers={}", etcd.client_url()),
            format!("--etcd-prefix=/{}", options.name),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca_path.display()),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            format!("--service-cluster-ip-range={}", options.service_cidr),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--allow-privileged=true".to_owned(),
            format!("--kubelet-client-certificate={}", kubelet_cert.display()),
            format!("--kubelet-client-key={}", kubelet_key.display()),
            format!("--kubelet-certificate-authority={}", kubelet_ca.display()),
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
            "--profiling=false".to_owned(),
            "--v=1".to_owned(),
        ];
        args.extend(options.extra_args.iter().cloned());

        let kubeconfig_path = dir.write(
            "admin.kubeconfig",
            kubeconfig_yaml(&options.name, &url, ca.cert_pem(), &admin),
        )?;
        let client = client_from_kubeconfig_file(&kubeconfig_path).await?;
        let process = ManagedProcess::start(
            &format!("kube-apiserver {}", options.name),
            &binary,
            args,
            dir.join("kube-apiserver.log"),
        )?;
        let mut server = Self {
            process,
            url,
            ca,
            admin,
            kubeconfig_path,
            client,
            dir,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.client.clone();
        self.process
            .wait_ready(Duration::from_secs(90), move || {
                let client = client.clone();
                async move { readyz(&client).await }
            })
            .await
    }

    /// Stops the process (etcd keeps the data).
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Starts the process again with the same port, data and certificates, and waits until it is ready.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.restart()?;
        self.wait_ready().await
    }

    /// Replaces the certificate the apiserver presents to kubelets and restarts it.
    pub async fn restart_with_kubelet_client(&mut self, cert: &CertifiedKey) -> Result<()> {
        self.dir.write("kubelet-client.crt", &cert.cert_pem)?;
        self.dir.write("kubelet-client.key", &cert.key_pem)?;
        self.restart().await
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA that signed the serving certificate and every client certificate, PEM.
    pub fn ca(&self) -> &CertificateAuthority {
        &self.ca
    }

    /// A client with cluster-admin rights.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig_path(&self) -> &std::path::Path {
        &self.kubeconfig_path
    }

    /// The admin kubeconfig, as YAML.
    pub fn admin_kubeconfig(&self) -> String {
        kubeconfig_yaml("admin", &self.url, self.ca.cert_pem(), &self.admin)
    }

    /// A kubeconfig for user `name` in `groups`, authenticated by a client certificate from this CA.
    pub fn user_kubeconfig(&self, name: &str, groups: &[&str]) -> Result<String> {
        let cert = self.ca.issue(name, groups, &[], Usage::Client)?;
        Ok(kubeconfig_yaml(name, &self.url, self.ca.cert_pem(), &cert))
    }

    /// Writes a kubeconfig into this apiserver's folder and returns its path.
    pub fn write_file(&self, name: &str, contents: &str) -> Result<PathBuf> {
        self.dir.write(name, contents)
    }

    /// The process, for logs.
    pub fn process(&self) -> &ManagedProcess {
        &self.process
    }

    /// The folder holding certificates, keys and logs.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Whether `/readyz` answers `ok` and the system namespaces exist. The apiserver's bootstrap controller
/// creates `default` and friends shortly after it turns ready; tests expect them.
pub(crate) async fn readyz(client: &Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    let ready = matches!(
        tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await,
        Ok(Ok(body)) if body.trim() == "ok"
    );
    if !ready {
        return false;
    }
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if !matches!(namespaces.get_opt(name).await, Ok(Some(_))) {
            return false;
        }
    }
    true
}

/// The first address of a service range, which the apiserver takes for the `kubernetes` Service.
fn first_service_ip(cidr: &str) -> Option<String> {
    let (base, _) = cidr.split(',').next()?.split_once('/')?;
    let ip: std::net::Ipv4Addr = base.parse().ok()?;
    Some(std::net::Ipv4Addr::from(u32::from(ip) + 1).to_string())
}
