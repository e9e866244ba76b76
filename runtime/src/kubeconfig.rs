//! Kubeconfigs that come from tenants or from whoever edits a VirtualCluster: data, never a recipe to run.
//!
//! kube-rs, like client-go, can read files (`certificate-authority`, `client-certificate`, `client-key`,
//! `tokenFile`), run programs (`exec`, and `auth-provider` helpers) and send traffic through a proxy
//! (`proxy-url`) because a kubeconfig says so. A component that did that for a kubeconfig taken from a
//! Secret or an annotation would run an attacker's program, or send the file behind `tokenFile` — its own
//! service-account token, for example — to an attacker's server. So every kubeconfig that names a tenant
//! apiserver is checked here, on the very structure kube-rs then builds its client from, before anything
//! else looks at it: only inline credentials (`token`, `client-certificate-data` with `client-key-data`),
//! inline CA data and an `https://` server are accepted. Anything else is refused with the field named.
//!
//! Every cluster and user entry is checked, not only the current context's: what a file holds is refused
//! as a whole, whichever entry a reader would pick. Fields kube-rs does not model (kept in its `other`
//! maps) are inert — nothing reads them — and are ignored.

use kube::config::{AuthInfo, Cluster, Kubeconfig};

use crate::Error;

/// Why a kubeconfig field is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Where, e.g. `users[admin].exec`.
    pub field: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

const FILE: &str = "reads a local file; only inline data (the *-data fields, token) is accepted";
const PROGRAM: &str = "runs a program; only inline credentials (token, client-certificate-data and client-key-data) are accepted";
const PROXY: &str = "sends traffic through a proxy; the tenant apiserver must be reached directly";
const BASIC: &str = "basic authentication is not accepted (Kubernetes removed it in 1.19); use a token or a client certificate";

/// The first field of `kubeconfig` that is not plain data, if any.
pub fn refusal(kubeconfig: &Kubeconfig) -> Option<Refusal> {
    for named in &kubeconfig.clusters {
        if let Some(cluster) = &named.cluster
            && let Some(refusal) = cluster_refusal(&named.name, cluster)
        {
            return Some(refusal);
        }
    }
    for named in &kubeconfig.auth_infos {
        if let Some(user) = &named.auth_info
            && let Some(refusal) = user_refusal(&named.name, user)
        {
            return Some(refusal);
        }
    }
    None
}

fn set<T>(value: &Option<T>) -> bool {
    value.is_some()
}

fn cluster_refusal(name: &str, cluster: &Cluster) -> Option<Refusal> {
    let at = |field: &str, problem| {
        Some(Refusal {
            field: format!("clusters[{name}].{field}"),
            problem,
        })
    };
    if set(&cluster.certificate_authority) {
        return at("certificate-authority", FILE);
    }
    if set(&cluster.proxy_url) {
        return at("proxy-url", PROXY);
    }
    match cluster.server.as_deref() {
        Some(server) if server.starts_with("https://") && server.len() > "https://".len() => None,
        Some(_) => at(
            "server",
            "must be an https:// URL: credentials are never sent in clear text",
        ),
        None => None,
    }
}

fn user_refusal(name: &str, user: &AuthInfo) -> Option<Refusal> {
    let at = |field: &str, problem| {
        Some(Refusal {
            field: format!("users[{name}].{field}"),
            problem,
        })
    };
    if set(&user.exec) {
        return at("exec", PROGRAM);
    }
    if set(&user.auth_provider) {
        return at("auth-provider", PROGRAM);
    }
    if set(&user.token_file) {
        return at("tokenFile", FILE);
    }
    if set(&user.client_certificate) {
        return at("client-certificate", FILE);
    }
    if set(&user.client_key) {
        return at("client-key", FILE);
    }
    if set(&user.username) || set(&user.password) {
        return at(
            if set(&user.username) {
                "username"
            } else {
                "password"
            },
            BASIC,
        );
    }
    None
}

/// What is wrong with a kubeconfig, told without a byte of what it holds. YAML, base64, PEM and URL parse
/// errors quote their input, and so do kube's messages about a missing context (the name comes from the
/// kubeconfig): a kubeconfig holds credentials, and whatever is told here lands in conditions, events and
/// logs that more people read than the Secret. Where the YAML breaks is told by line and column only.
pub fn without_content(error: &kube::config::KubeconfigError) -> String {
    use kube::config::KubeconfigError as E;
    match error {
        E::Parse(yaml) => match yaml.location() {
            Some(at) => format!(
                "not a kubeconfig document (YAML error at line {}, column {})",
                at.line(),
                at.column()
            ),
            None => "not a kubeconfig document (YAML error)".to_owned(),
        },
        E::CurrentContextNotSet => "no current-context is set".to_owned(),
        E::KindMismatch | E::ApiVersionMismatch => "its documents differ in kind or apiVersion".to_owned(),
        E::LoadContext(_) => "its current-context names no context it has".to_owned(),
        E::LoadClusterOfContext(_) => "its current context names no cluster it has".to_owned(),
        E::MissingClusterUrl => "the current context's cluster has no server".to_owned(),
        E::ParseClusterUrl(_) => "the current context's server is not a valid URL".to_owned(),
        E::ParseProxyUrl(_) => "proxy-url is not a valid URL".to_owned(),
        E::LoadCertificateAuthority(_) => {
            "certificate-authority-data is not base64 of PEM certificates".to_owned()
        }
        E::LoadClientCertificate(_) => {
            "client-certificate-data is not base64 of a PEM certificate".to_owned()
        }
        E::LoadClientKey(_) => "client-key-data is not base64 of a PEM private key".to_owned(),
        E::ParseCertificates(_) => "a certificate is not valid PEM".to_owned(),
        _ => "it cannot be used".to_owned(),
    }
}

/// Parses a kubeconfig (YAML) that must be plain data: refuses it, naming the field, when it would make a
/// reader open a file, run a program or use a proxy, or talk to a server without TLS.
pub fn parse_inline(yaml: &str) -> Result<Kubeconfig, Error> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|source| Error::Kubeconfig {
        what: "is not valid YAML",
        problem: without_content(&source),
    })?;
    match refusal(&kubeconfig) {
        Some(refusal) => Err(Error::KubeconfigRefused {
            field: refusal.field,
            problem: refusal.problem,
        }),
        None => Ok(kubeconfig),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{{cluster}}}}}]
users: [{{name: u, user: {{{user}}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"
        )
    }

    const SERVER: &str = "server: 'https://10.0.0.1:6443', certificate-authority-data: QUJD";

    fn refused(cluster: &str, user: &str) -> String {
        match parse_inline(&kubeconfig(cluster, user)) {
            Err(Error::KubeconfigRefused { field, .. }) => field,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn inline_credentials_are_accepted() {
        for user in [
            "token: abc",
            "client-certificate-data: QUJD, client-key-data: QUJD",
            "",
            "token: abc, as: someone, as-groups: [g]",
        ] {
            parse_inline(&kubeconfig(SERVER, user)).unwrap_or_else(|e| panic!("{user}: {e}"));
        }
        parse_inline(&kubeconfig(
            "server: 'https://t:6443', insecure-skip-tls-verify: true, tls-server-name: x",
            "token: abc",
        ))
        .expect("skip-verify is the tenant's own risk, not a file or a program");
    }

    #[test]
    fn programs_files_proxies_and_clear_text_are_refused_by_name() {
        let cases = [
            (
                SERVER,
                "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'id']}",
                "users[u].exec",
            ),
            (
                SERVER,
                "auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}",
                "users[u].auth-provider",
            ),
            (
                SERVER,
                "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
                "users[u].tokenFile",
            ),
            (SERVER, "token: abc, tokenFile: /etc/passwd", "users[u].tokenFile"),
            (
                SERVER,
                "client-certificate: /etc/cert, client-key-data: QUJD",
                "users[u].client-certificate",
            ),
            (
                SERVER,
                "client-certificate-data: QUJD, client-key: /etc/key",
                "users[u].client-key",
            ),
            (SERVER, "username: admin, password: secret", "users[u].username"),
            (SERVER, "password: secret", "users[u].password"),
            (
                "server: 'https://t:6443', certificate-authority: /etc/ca.crt",
                "token: a",
                "clusters[c].certificate-authority",
            ),
            (
                "server: 'https://t:6443', proxy-url: 'http://attacker:3128'",
                "token: a",
                "clusters[c].proxy-url",
            ),
            ("server: 'http://t:8080'", "token: a", "clusters[c].server"),
            ("server: 'https://'", "token: a", "clusters[c].server"),
        ];
        for (cluster, user, field) in cases {
            assert_eq!(refused(cluster, user), field, "{cluster} / {user}");
        }
    }

    #[test]
    fn entries_outside_the_current_context_are_checked_too() {
        let yaml = format!(
            "{}users: [{{name: other, user: {{exec: {{command: /bin/true}}}}}}]\n",
            kubeconfig(SERVER, "token: a").replace("users: [{name: u, user: {token: a}}]\n", "")
        );
        let error = parse_inline(&yaml).expect_err("refused");
        assert!(error.to_string().contains("users[other].exec"), "{error}");
        // A second YAML document is merged by kube-rs: it is checked as part of the whole.
        let merged = format!(
            "{}---\nclusters: [{{name: d, cluster: {{server: 'https://x', proxy-url: 'socks5://p'}}}}]\n",
            kubeconfig(SERVER, "token: a")
        );
        let error = parse_inline(&merged).expect_err("refused");
        assert!(error.to_string().contains("clusters[d].proxy-url"), "{error}");
    }

    #[test]
    fn the_message_names_the_field_and_the_reason() {
        let error = parse_inline(&kubeconfig(SERVER, "exec: {command: /bin/sh}")).expect_err("refused");
        assert_eq!(
            error.to_string(),
            format!("kubeconfig field users[u].exec is refused: {PROGRAM}")
        );
    }
}
