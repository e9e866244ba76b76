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
    /// Serve on every address and advertise the real nodes' host address
    /// ([`crate::realnodes::host::HOST_IP`]), so that kubelets and pods in the nodes' network namespaces
    /// reach it: the super cluster of real nodes, and tenant masters whose syncer runs as a pod.
    pub reachable_from_nodes: bool,
    /// Keep an audit log of every request that writes (its metadata: who, what, which object, the answer),
    /// read with [`ApiServer::audit_events`].
    pub audit: bool,
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
            reachable_from_nodes: false,
            audit: false,
        }
    }
}

/// A kube-apiserver process with its own PKI, serving on a free loopback port.
pub struct ApiServer {
    process: ManagedProcess,
    url: String,
    port: u16,
    reachable_from_nodes: bool,
    service_cidr: String,
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
        if options.reachable_from_nodes {
            serving_names.push(crate::realnodes::host::HOST_IP);
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
            match options.reachable_from_nodes {
                true => "--bind-address=0.0.0.0".to_owned(),
                false => "--bind-address=127.0.0.1".to_owned(),
            },
            match options.reachable_from_nodes {
                true => format!("--advertise-address={}", crate::realnodes::host::HOST_IP),
                false => "--advertise-address=127.0.0.1".to_owned(),
            },
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
        if options.audit {
            let policy = dir.write("audit-policy.yaml", AUDIT_POLICY)?;
            args.push(format!("--audit-policy-file={}", policy.display()));
            args.push(format!("--audit-log-path={}", dir.join(AUDIT_LOG).display()));
            args.push("--audit-log-format=json".to_owned());
        }
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
            port,
            reachable_from_nodes: options.reachable_from_nodes,
            service_cidr: options.service_cidr.clone(),
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

    /// Where the nodes and their pods reach this apiserver: `https://<host address>:<port>` when it was
    /// started [`reachable_from_nodes`](ApiServerOptions::reachable_from_nodes), else [`Self::url`].
    pub fn node_url(&self) -> String {
        match self.reachable_from_nodes {
            true => format!("https://{}:{}", crate::realnodes::host::HOST_IP, self.port),
            false => self.url.clone(),
        }
    }

    /// Whether the nodes and their pods reach it ([`ApiServerOptions::reachable_from_nodes`]).
    pub fn is_reachable_from_nodes(&self) -> bool {
        self.reachable_from_nodes
    }

    /// Its `--service-cluster-ip-range`.
    pub fn service_cidr(&self) -> &str {
        &self.service_cidr
    }

    /// The admin kubeconfig with [`Self::node_url`], for clients in the nodes' pods.
    pub fn node_admin_kubeconfig(&self) -> String {
        kubeconfig_yaml("admin", &self.node_url(), self.ca.cert_pem(), &self.admin)
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

    /// Every write in the audit log so far, oldest first (empty without
    /// [`ApiServerOptions::audit`]).
    pub fn audit_events(&self) -> Result<Vec<AuditEvent>> {
        let path = self.dir.join(AUDIT_LOG);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(crate::Error::Io {
                    context: format!("reading {}", path.display()),
                    source: error,
                });
            }
        };
        Ok(text.lines().filter_map(AuditEvent::parse).collect())
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

/// What the audit log keeps: the metadata of every write, once its answer is sent.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted, Panic]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
";

/// The audit log's file in the apiserver's folder.
const AUDIT_LOG: &str = "audit.log";

/// One write the apiserver answered, from its audit log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditEvent {
    /// `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The user who asked.
    pub user: String,
    /// The client's User-Agent.
    pub user_agent: String,
    /// Resource (`pods`), subresource (`status`, or empty), namespace and name of the object.
    pub resource: String,
    /// See [`Self::resource`].
    pub subresource: String,
    /// See [`Self::resource`].
    pub namespace: String,
    /// See [`Self::resource`].
    pub name: String,
    /// The answer's HTTP status.
    pub code: u16,
    /// When the request arrived (RFC 3339, microseconds).
    pub received: String,
}

impl AuditEvent {
    /// Parses one line of the JSON audit log; `None` for lines that are not a completed request.
    pub fn parse(line: &str) -> Option<Self> {
        let event: serde_json::Value = serde_json::from_str(line).ok()?;
        if event["stage"] != "ResponseComplete" {
            return None;
        }
        let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
        let object = &event["objectRef"];
        Some(Self {
            verb: text(&event["verb"]),
            user: text(&event["user"]["username"]),
            user_agent: text(&event["userAgent"]),
            resource: text(&object["resource"]),
            subresource: text(&object["subresource"]),
            namespace: text(&object["namespace"]),
            name: text(&object["name"]),
            code: event["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
            received: text(&event["requestReceivedTimestamp"]),
        })
    }

    /// Whether the write changed something: answered with a success.
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_lines_parse() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"x","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/a/pods/p/status","verb":"patch","user":{"username":"system:serviceaccount:vc-system:vc-syncer","groups":["system:serviceaccounts"]},"userAgent":"syncer/0.1.0","objectRef":{"resource":"pods","namespace":"a","name":"p","apiVersion":"v1","subresource":"status"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-29T00:00:00.000000Z"}"#;
        let event = AuditEvent::parse(line).expect("parsed");
        assert_eq!(
            event,
            AuditEvent {
                verb: "patch".into(),
                user: "system:serviceaccount:vc-system:vc-syncer".into(),
                user_agent: "syncer/0.1.0".into(),
                resource: "pods".into(),
                subresource: "status".into(),
                namespace: "a".into(),
                name: "p".into(),
                code: 200,
                received: "2026-11-29T00:00:00.000000Z".into(),
            }
        );
        assert!(event.succeeded());
        assert!(AuditEvent::parse(&line.replace("ResponseComplete", "RequestReceived")).is_none());
        assert!(AuditEvent::parse("not json").is_none());
    }
}
