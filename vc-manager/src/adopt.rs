//! Adopting an existing tenant control plane: its kubeconfig is checked by calling `/version`, and the
//! tenant still gets a root namespace and a kubelet-client CA and certificate so that vn-agent can tell
//! its requests apart.

use std::time::Duration;

use crds::{
    VirtualCluster,
    v1alpha1::Adoption,
    wellknown::{CONDITION_APISERVER_READY, CONDITION_PKI_READY, CONDITION_READY, SECRET_KUBELET_CLIENT},
};
use kube::{
    Resource,
    runtime::{controller::Action, events::EventType},
};

use crate::{
    Error, Result,
    context::Context,
    identity::TenantIdentity,
    status::{self, ConditionState, DesiredStatus, Progress},
    steps::{self, RootNamespace},
};
use tenant_pki::{adopted::read_kubeconfig, kubeconfig, secrets::Scope};

/// Refuses a kubeconfig that is not plain data ([`vc_runtime::kubeconfig::parse_inline`]), naming the field.
pub fn refuse_unless_inline(origin: &str, yaml: &str) -> Result<()> {
    match vc_runtime::kubeconfig::parse_inline(yaml) {
        Ok(_) => Ok(()),
        Err(vc_runtime::Error::KubeconfigRefused { field, problem }) => Err(Error::KubeconfigRefused {
            origin: origin.to_owned(),
            field,
            problem,
        }),
        // vc_runtime tells kubeconfig errors without their content.
        Err(e) => Err(Error::Pki(tenant_pki::Error::KubeconfigInvalid {
            origin: origin.to_owned(),
            problem: e.to_string(),
        })),
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
        RootNamespace::Terminating => {
            return steps::wait_for_root_namespace(vc, identity, crds::ControlPlaneMode::Adopted, ctx).await;
        }
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
        return Err(Error::Pki(tenant_pki::Error::KubeconfigInvalid {
            origin,
            problem: "it names no cluster server".into(),
        }));
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
