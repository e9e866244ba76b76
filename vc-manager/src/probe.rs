//! Whether a tenant apiserver answers a kubeconfig: the check ([`TenantProbe`], a trait so that the
//! mocked-apiserver tests can answer for the tenant), what it reports, and the real check
//! ([`KubeconfigProbe`]). The shared `Context` carries a probe, so this module must import no reconcile.

use futures::future::BoxFuture;
use vc_runtime::clients::ClientTimeouts;

use crate::{Error, Result};

/// What the probe's answers may hold: `/version` and a list of one namespace are a few kilobytes.
const PROBE_RESPONSE_LIMITS: vc_runtime::limits::ResponseLimits = vc_runtime::limits::ResponseLimits {
    max_bytes: 4 * 1024 * 1024,
    max_line_bytes: 4 * 1024 * 1024,
};

/// What an adopted apiserver answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    /// The kubeconfig's server URL.
    pub server: String,
    /// `gitVersion` from `/version`.
    pub version: String,
}

/// Checks that a kubeconfig reaches a working apiserver.
pub trait TenantProbe: Send + Sync {
    /// Calls `/version` and lists one namespace with the kubeconfig (YAML) found at `origin` (for
    /// messages).
    fn version(&self, origin: String, kubeconfig: String) -> BoxFuture<'static, Result<ProbeReport>>;
}

/// The real probe: a kube client from the kubeconfig, with timeouts.
#[derive(Clone, Debug)]
pub struct KubeconfigProbe {
    /// Connect and read timeouts.
    pub timeouts: ClientTimeouts,
}

impl TenantProbe for KubeconfigProbe {
    fn version(&self, origin: String, kubeconfig: String) -> BoxFuture<'static, Result<ProbeReport>> {
        let timeouts = self.timeouts;
        Box::pin(async move {
            // vc_runtime tells kubeconfig and client errors without the kubeconfig's content.
            let invalid = |problem: String| {
                Error::from(tenant_pki::Error::KubeconfigInvalid {
                    origin: origin.clone(),
                    problem,
                })
            };
            let config = vc_runtime::clients::config_from_kubeconfig_yaml(&kubeconfig, timeouts)
                .await
                .map_err(|e| match e {
                    vc_runtime::Error::KubeconfigRefused { field, problem } => Error::KubeconfigRefused {
                        origin: origin.clone(),
                        field,
                        problem,
                    },
                    e => invalid(e.to_string()),
                })?;
            let server = config.cluster_url.to_string().trim_end_matches('/').to_owned();
            // A hostile apiserver's answers are bounded like the syncer's: the probe reads two small ones.
            let client = vc_runtime::clients::tenant_client(
                config,
                timeouts,
                false,
                vc_runtime::limits::ResponseBudget::new(PROBE_RESPONSE_LIMITS),
            )
            .map_err(|e| invalid(e.to_string()))?;
            let deadline = timeouts.connect + timeouts.read;
            // `/version` answers anonymous callers too; listing one namespace proves the credentials.
            let answer = tokio::time::timeout(deadline, async {
                let info = client.apiserver_version().await?;
                kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                    .list_metadata(&kube::api::ListParams::default().limit(1))
                    .await?;
                Ok::<_, kube::Error>(info)
            })
            .await;
            match answer {
                Ok(Ok(info)) => Ok(ProbeReport {
                    server,
                    version: info.git_version,
                }),
                Ok(Err(source)) => Err(classify(server, source)),
                Err(_) => Err(Error::TenantUnreachable {
                    server,
                    source: kube::Error::Service(
                        format!("no answer within {} s", deadline.as_secs_f64()).into(),
                    ),
                }),
            }
        })
    }
}

/// Which failure an error from `/version` is.
pub fn classify(server: String, source: kube::Error) -> Error {
    match &source {
        kube::Error::Api(status) if status.code == 401 => Error::TenantUnauthorized { server, source },
        kube::Error::Api(status) if status.code == 403 => Error::TenantForbidden { server, source },
        kube::Error::Api(_) | kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => {
            Error::TenantError { server, source }
        }
        _ => Error::TenantUnreachable { server, source },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: "nope".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn errors_from_version_are_told_apart() {
        let server = || "https://tenant:6443".to_owned();
        assert_eq!(classify(server(), api_error(401)).reason(), "Unauthorized");
        assert_eq!(classify(server(), api_error(403)).reason(), "Forbidden");
        assert_eq!(classify(server(), api_error(500)).reason(), "APIServerError");
        assert_eq!(
            classify(server(), kube::Error::Service("connection refused".into())).reason(),
            "APIServerUnreachable"
        );
    }

    #[tokio::test]
    async fn the_real_probe_reports_unparsable_and_unreachable_kubeconfigs() {
        let probe = KubeconfigProbe {
            timeouts: ClientTimeouts {
                connect: Duration::from_secs(2),
                read: Duration::from_secs(2),
            },
        };
        let error = probe
            .version("Secret a/b key value".into(), "clusters: [unclosed".into())
            .await
            .expect_err("unparsable");
        assert_eq!(error.reason(), "KubeconfigInvalid");
        assert!(
            error.full_message().contains("Secret a/b key value"),
            "{}",
            error.full_message()
        );

        // A port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let yaml = format!(
            "apiVersion: v1
kind: Config
clusters: [{{name: t, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}]
users: [{{name: t, user: {{token: abc}}}}]
contexts: [{{name: t, context: {{cluster: t, user: t}}}}]
current-context: t
"
        );
        let error = probe.version("test".into(), yaml).await.expect_err("unreachable");
        assert_eq!(error.reason(), "APIServerUnreachable", "{}", error.full_message());
        assert!(
            error.to_string().contains(&format!("127.0.0.1:{port}")),
            "{error}"
        );
    }
}
