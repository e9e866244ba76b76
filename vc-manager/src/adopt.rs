//! Adopting an existing tenant control plane: its kubeconfig is checked by calling `/version`, and the
//! tenant still gets a root namespace and a kubelet-client CA and certificate so that vn-agent can tell
//! its requests apart.

use std::time::Duration;

use base64::{Engine, engine::general_purpose::STANDARD};
use crds::{
    VirtualCluster,
    v1alpha1::Adoption,
    wellknown::{CONDITION_APISERVER_READY, CONDITION_PKI_READY, CONDITION_READY, SECRET_KUBELET_CLIENT},
};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Resource, ResourceExt,
    runtime::{controller::Action, events::EventType},
};
use vc_runtime::clients::ClientTimeouts;

use crate::{
    Error, Result,
    context::Context,
    identity::TenantIdentity,
    kubeconfig, native,
    status::{self, ConditionState, DesiredStatus, Progress},
    steps::{self, RootNamespace},
    tenant_pki::Scope,
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
            let invalid = |source: Box<dyn std::error::Error + Send + Sync>| Error::KubeconfigInvalid {
                origin: origin.clone(),
                source,
            };
            let config = vc_runtime::clients::config_from_kubeconfig_yaml(&kubeconfig, timeouts)
                .await
                .map_err(|e| match e {
                    vc_runtime::Error::KubeconfigRefused { field, problem } => Error::KubeconfigRefused {
                        origin: origin.clone(),
                        field,
                        problem,
                    },
                    e => invalid(Box::new(e)),
                })?;
            let server = config.cluster_url.to_string().trim_end_matches('/').to_owned();
            let client = kube::Client::try_from(config).map_err(|e| invalid(Box::new(e)))?;
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

/// Reads the kubeconfig of an adopted tenant with `client` (the super cluster): `(where it came from, YAML)`.
/// `kubectl vc kubeconfig` reads it the same way.
pub async fn read_kubeconfig(
    vc: &VirtualCluster,
    adoption: &Adoption,
    client: &kube::Client,
) -> Result<(String, String)> {
    let namespace = vc.namespace().unwrap_or_default();
    match adoption {
        Adoption::InlineBase64(encoded) => {
            let origin = format!(
                "annotation {} of VirtualCluster {namespace}/{}",
                crds::wellknown::ANNOTATION_ADMIN_KUBECONFIG,
                vc.name_any()
            );
            let bytes = STANDARD
                .decode(encoded.trim())
                .map_err(|e| Error::KubeconfigInvalid {
                    origin: origin.clone(),
                    source: Box::new(e),
                })?;
            let yaml = String::from_utf8(bytes).map_err(|e| Error::KubeconfigInvalid {
                origin: origin.clone(),
                source: Box::new(e),
            })?;
            Ok((origin, yaml))
        }
        Adoption::Secret(reference) => {
            let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
            let secret = api
                .get_opt(&reference.name)
                .await
                .map_err(|source| Error::KubeconfigSecretRead {
                    namespace: namespace.clone(),
                    name: reference.name.clone(),
                    source,
                })?
                .ok_or_else(|| Error::KubeconfigSecretNotFound {
                    namespace: namespace.clone(),
                    name: reference.name.clone(),
                })?;
            let origin = format!("Secret {namespace}/{} key {}", reference.name, reference.key);
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(&reference.key))
                .map(|b| b.0.clone())
                .or_else(|| {
                    secret
                        .string_data
                        .as_ref()
                        .and_then(|d| d.get(&reference.key))
                        .map(|s| s.clone().into_bytes())
                })
                .ok_or_else(|| Error::KubeconfigKeyMissing {
                    namespace: namespace.clone(),
                    name: reference.name.clone(),
                    key: reference.key.clone(),
                })?;
            let yaml = String::from_utf8(bytes).map_err(|e| Error::KubeconfigInvalid {
                origin: origin.clone(),
                source: Box::new(e),
            })?;
            Ok((origin, yaml))
        }
    }
}

/// Refuses a kubeconfig that is not plain data ([`vc_runtime::kubeconfig::parse_inline`]), naming the field.
pub fn refuse_unless_inline(origin: &str, yaml: &str) -> Result<()> {
    match vc_runtime::kubeconfig::parse_inline(yaml) {
        Ok(_) => Ok(()),
        Err(vc_runtime::Error::KubeconfigRefused { field, problem }) => Err(Error::KubeconfigRefused {
            origin: origin.to_owned(),
            field,
            problem,
        }),
        Err(e) => Err(Error::KubeconfigInvalid {
            origin: origin.to_owned(),
            source: Box::new(e),
        }),
    }
}

/// Reconciles an adopted VirtualCluster.
pub async fn reconcile(
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    adoption: &Adoption,
    ctx: &Context,
    progress: &mut Progress,
) -> Result<Action> {
    let namespace = identity.root_namespace();
    match steps::ensure_root_namespace(identity, ctx).await? {
        RootNamespace::Terminating => return native::wait_for_root_namespace(vc, identity, ctx).await,
        RootNamespace::Ready { created: true } => {
            ctx.publish(
                &vc.object_ref(&()),
                EventType::Normal,
                "Adopting",
                "Adopt",
                format!("created root namespace {namespace}"),
            )
            .await;
        }
        RootNamespace::Ready { created: false } => {}
    }
    let (plan, _) = steps::apply_pki(vc, identity, &Scope::KubeletClientOnly, ctx).await?;
    let pki = ConditionState::met(
        CONDITION_PKI_READY,
        "KubeletClientIssued",
        format!(
            "kubelet-client CA and certificate are in Secret {namespace}/{SECRET_KUBELET_CLIENT}; configure the adopted apiserver's --kubelet-client-certificate/--kubelet-client-key with them"
        ),
    );
    progress.settle(pki.clone());
    let (origin, yaml) = read_kubeconfig(vc, adoption, &ctx.client).await?;
    // Data, never a recipe: a kubeconfig naming a file, a program or a proxy is refused before anything
    // else reads it (the probe checks again, on the structure it builds its client from).
    refuse_unless_inline(&origin, &yaml)?;
    if kubeconfig::server(&yaml).is_none() {
        return Err(Error::KubeconfigInvalid {
            origin,
            source: "it names no cluster server".into(),
        });
    }
    let report = ctx.probe.version(origin, yaml).await?;
    let message = format!("{} answered /version with {}", report.server, report.version);
    let mut conditions = vec![
        pki,
        ConditionState::met(CONDITION_APISERVER_READY, "Reachable", message.clone()),
        ConditionState::met(CONDITION_READY, "TenantReachable", message.clone()),
    ];
    conditions.extend(status::paused_condition(vc));
    // An adopted control plane is not vc-manager's: pausing one stops only its pods (the syncer's part).
    let (phase, reason, message) = if vc.spec.paused {
        (
            crds::ClusterPhase::Paused,
            status::REASON_PAUSED.into(),
            format!(
                "spec.paused is true: the syncer removes the tenant's pods from the super cluster; the adopted control plane keeps running ({message})"
            ),
        )
    } else {
        (crds::ClusterPhase::Running, "TenantReachable".into(), message)
    };
    let desired = DesiredStatus {
        phase,
        reason,
        message,
        cluster_namespace: namespace.to_owned(),
        mode: crds::ControlPlaneMode::Adopted,
        conditions,
        observed_generation: vc.meta().generation,
    };
    steps::write_status(vc, &desired, ctx, true).await?;
    let interval = ctx.settings.adopt_check_interval.max(Duration::from_secs(1));
    Ok(Action::requeue(steps::requeue_after(interval, plan.next_renewal)))
}

#[cfg(test)]
mod tests {
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
