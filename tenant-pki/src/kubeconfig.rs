//! Kubeconfigs for a tenant's admin and controller-manager: written deterministically (so an unchanged one
//! compares equal) and read back to reuse their certificate.

use base64::{Engine, engine::general_purpose::STANDARD};

use crate::pki::CertifiedKey;

/// A kubeconfig with one cluster, one client-certificate user and one context.
pub fn render(cluster: &str, server: &str, ca_pem: &str, user: &str, client: &CertifiedKey) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {cluster}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {user}@{cluster}
  context:
    cluster: {cluster}
    user: {user}
current-context: {user}@{cluster}
",
        ca = STANDARD.encode(ca_pem),
        cert = STANDARD.encode(&client.cert_pem),
        key = STANDARD.encode(&client.key_pem),
    )
}

/// The client certificate and key of a kubeconfig's first user, if it has them inline.
pub fn client_certificate(yaml: &str) -> Option<CertifiedKey> {
    let value: serde_json::Value = serde_saphyr::from_str(yaml).ok()?;
    let user = value.get("users")?.get(0)?.get("user")?;
    let decode = |field: &str| -> Option<String> {
        let encoded = user.get(field)?.as_str()?;
        String::from_utf8(STANDARD.decode(encoded).ok()?).ok()
    };
    Some(CertifiedKey {
        cert_pem: decode("client-certificate-data")?,
        key_pem: decode("client-key-data")?,
    })
}

/// The `server` of a kubeconfig's current context (else its first cluster).
pub fn server(yaml: &str) -> Option<String> {
    let value: serde_json::Value = serde_saphyr::from_str(yaml).ok()?;
    let clusters = value.get("clusters")?.as_array()?;
    let current_cluster = value
        .get("current-context")
        .and_then(|c| c.as_str())
        .and_then(|current| {
            value
                .get("contexts")?
                .as_array()?
                .iter()
                .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(current))?
                .get("context")?
                .get("cluster")?
                .as_str()
        });
    let cluster = clusters
        .iter()
        .find(|c| current_cluster.is_some() && c.get("name").and_then(|n| n.as_str()) == current_cluster)
        .or_else(|| clusters.first())?;
    cluster.get("cluster")?.get("server")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_kubeconfigs_read_back_and_load_in_kube() {
        let client = CertifiedKey {
            cert_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nBBBB\n-----END PRIVATE KEY-----\n".into(),
        };
        let yaml = render(
            "team-abc-vc",
            "https://apiserver-svc.team-abc-vc.svc:6443",
            "CA",
            "admin",
            &client,
        );
        assert_eq!(client_certificate(&yaml), Some(client.clone()));
        assert_eq!(
            server(&yaml).as_deref(),
            Some("https://apiserver-svc.team-abc-vc.svc:6443")
        );
        let parsed = kube::config::Kubeconfig::from_yaml(&yaml).expect("kube reads it");
        assert_eq!(parsed.current_context.as_deref(), Some("admin@team-abc-vc"));
        // Deterministic: the same inputs give the same bytes.
        assert_eq!(
            yaml,
            render(
                "team-abc-vc",
                "https://apiserver-svc.team-abc-vc.svc:6443",
                "CA",
                "admin",
                &client
            )
        );
        assert_eq!(client_certificate("not: [a kubeconfig"), None);
        assert_eq!(client_certificate("users: []"), None);
    }
}
