//! Provisioning a tenant control plane from its ClusterVersion: root namespace, Services, PKI, then the
//! etcd, apiserver and controller-manager StatefulSets, and the status their readiness gives.

use std::{collections::BTreeMap, net::IpAddr};

use crds::{
    ClusterPhase, ClusterVersion, VirtualCluster,
    wellknown::{
        CONDITION_PKI_READY, CONDITION_READY, LABEL_EXTERNAL_APISERVER_DOMAIN, SECRET_ADMIN_KUBECONFIG,
    },
};
use k8s_openapi::{
    api::{
        apps::v1::StatefulSet,
        core::v1::{Secret, Service},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::Patch,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};

use crate::{
    Error, Result,
    cached::CachedClusterVersion,
    component::Component,
    context::{Context, NativeReadiness},
    identity::TenantIdentity,
    probe::ProbeReport,
    render::{self, ANNOTATION_CLUSTER_VERSION, ANNOTATION_CLUSTER_VERSION_GENERATION, RenderInputs},
    restore::{REASON_RESTORING, RestoreStage},
    status::{self, ComponentState, ConditionState, DesiredStatus, Progress},
    steps::{self, RootNamespace, apply_params},
};
use tenant_pki::secrets::{Network, Scope, first_service_ips};

/// Reconciles a provisioned VirtualCluster.
pub async fn reconcile(
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    ctx: &Context,
    progress: &mut Progress,
) -> Result<Action> {
    let namespace = identity.root_namespace();
    match steps::ensure_root_namespace(identity, ctx).await? {
        RootNamespace::Terminating => {
            return steps::wait_for_root_namespace(vc, identity, crds::ControlPlaneMode::Provisioned, ctx)
                .await;
        }
        RootNamespace::Ready { created: true } => {
            ctx.publish(
                &vc.object_ref(&()),
                EventType::Normal,
                "Provisioning",
                "Provision",
                format!("created root namespace {namespace}"),
            )
            .await;
        }
        RootNamespace::Ready { created: false } => {}
    }
    let restore = RestoreStage::of(vc);
    if restore == Some(RestoreStage::Pki) {
        return hold_for_restore(vc, namespace, ctx).await;
    }

    let cv_name = vc.spec.cluster_version_name.clone().unwrap_or_default();
    // Read live, not from the cache: the watch event that triggered this reconcile may be ahead of the
    // cache, and an upgrade must not be missed.
    let cv = Api::<CachedClusterVersion>::all(ctx.client.clone())
        .get_opt(&cv_name)
        .await
        .map_err(|source| Error::ClusterVersionRead {
            name: cv_name.clone(),
            source,
        })?
        .ok_or_else(|| Error::ClusterVersionNotFound {
            name: cv_name.clone(),
        })?
        .to_cluster_version();
    render::validate(&cv).map_err(|problem| Error::ClusterVersionInvalid {
        name: cv_name.clone(),
        problem,
    })?;

    let services = apply_services(&cv, identity, ctx).await?;
    let network = network(vc, &cv, &services, ctx)?;
    let (plan, secrets) = steps::apply_pki(vc, identity, &Scope::Native(Box::new(network)), ctx).await?;

    let next_renewal = plan
        .next_renewal
        .and_then(|at| Timestamp::from_second(at).ok())
        .map_or_else(|| "none".to_owned(), |t| t.to_string());
    let pki = ConditionState::met(
        CONDITION_PKI_READY,
        "CertificatesValid",
        format!(
            "{} Secrets in {namespace}; next certificate renewal at {next_renewal}",
            plan.secrets.len()
        ),
    );
    progress.settle(pki.clone());

    let inputs = RenderInputs::new(vc, secrets.values());
    let mut components = Vec::new();
    let mut previous: Option<(Component, bool)> = None;
    let mut changes = StatefulSetChanges::default();
    let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
    let paused = vc.spec.paused;
    for component in Component::ALL {
        let mut desired = render::render_statefulset(component, &cv, identity, &inputs);
        let name = desired.metadata.name.clone().unwrap_or_default();
        let cached = ctx.statefulsets.get(&ObjectRef::new(&name).within(namespace));
        if paused {
            // Scaled to zero, not deleted: volumes, PKI and Services stay, so resuming loses nothing.
            if cached.is_none() {
                continue;
            }
            if let Some(spec) = desired.spec.as_mut() {
                spec.replicas = Some(0);
            }
        }
        // A restore feeds etcd before anything reads it; only components not created yet wait.
        if restore.is_some_and(|stage| stage.holds(component)) && cached.is_none() {
            components.push((component, ComponentState::Waiting { on: Component::Etcd }));
            previous = Some((component, false));
            continue;
        }
        // A new component starts once the one before it is ready (the apiserver needs etcd, the
        // controller-manager the apiserver); an existing one is always kept up to date.
        if let Some((before, false)) = previous
            && cached.is_none()
        {
            components.push((component, ComponentState::Waiting { on: before }));
            previous = Some((component, false));
            continue;
        }
        let hash = crate::applied::hash_of(&desired);
        if let Some(live) = cached.as_deref()
            && crate::applied::unchanged(
                ctx.applied.get("StatefulSet", namespace, &name).as_ref(),
                &hash,
                Some(&live.metadata),
            )
        {
            // As the last apply left it, and nothing else is wanted of it: applying again would change
            // nothing.
            let state = ComponentState::of(live);
            progress.settle(state.condition(component));
            previous = Some((component, state.is_ready()));
            components.push((component, state));
            continue;
        }
        let applied = match api.patch(&name, &apply_params(), &Patch::Apply(&desired)).await {
            Ok(applied) => {
                ctx.applied
                    .record("StatefulSet", namespace, &name, &hash, &applied.metadata);
                applied
            }
            Err(source) => {
                // What this pass changed before is told now: the next pass compares with a cache that
                // shows it done already, and would not tell it.
                changes.announce(vc, ctx).await;
                return Err(Error::StatefulSetApply {
                    component,
                    namespace: namespace.to_owned(),
                    name: name.clone(),
                    source,
                });
            }
        };
        changes.record(vc, component, cached.as_deref(), &applied);
        let state = ComponentState::of(&applied);
        progress.settle(state.condition(component));
        previous = Some((component, state.is_ready()));
        components.push((component, state));
    }
    changes.announce(vc, ctx).await;

    let (mut phase, mut reason, mut message) = if paused {
        status::paused_phase(&components)
    } else {
        status::native_phase(vc.phase(), &components)
    };
    if let Some(stage) = restore
        && phase == ClusterPhase::Pending
    {
        reason = REASON_RESTORING.to_owned();
        message = stage.message(namespace);
    }
    let mut ready = if paused {
        ConditionState::unmet(CONDITION_READY, &reason, &message)
    } else {
        status::native_ready(phase, &reason, &message, &components)
    };
    let mut answered = true;
    if phase == ClusterPhase::Running && ctx.settings.native_readiness == NativeReadiness::ApiserverAnswers {
        match apiserver_answers(&secrets, identity, ctx).await {
            Ok(report) => {
                message = format!(
                    "{message}; the apiserver answers at {} ({})",
                    report.server, report.version
                );
                ready = ConditionState::met(CONDITION_READY, &reason, &message);
            }
            Err(error) => {
                answered = false;
                (phase, reason, message) =
                    status::apiserver_silent(vc.phase(), error.reason(), &error.full_message());
                ready = ConditionState::unmet(CONDITION_READY, &reason, &message);
            }
        }
    }
    let mut conditions = vec![pki];
    conditions.extend(components.iter().map(|(c, s)| s.condition(*c)));
    conditions.push(ready);
    conditions.extend(status::paused_condition(vc));
    let desired = DesiredStatus {
        phase,
        reason,
        message,
        cluster_namespace: namespace.to_owned(),
        mode: crds::ControlPlaneMode::Provisioned,
        conditions,
        observed_generation: vc.meta().generation,
    };
    steps::write_status(vc, &desired, ctx, true).await?;
    tracing::debug!(vc = %identity.vc_ref(), phase = %desired.phase, "reconciled");
    let vc_key = format!("{}/{}", identity.vc_namespace, identity.vc_name);
    if !answered {
        // Nothing the controller watches changes when an apiserver starts answering: look again, sooner at
        // first, then less often (up to --not-ready-recheck-max-seconds), so that a tenant that never
        // answers costs next to nothing.
        return Ok(Action::requeue(ctx.rechecks.failed(&vc_key)));
    }
    ctx.rechecks.reset(&vc_key);
    Ok(Action::requeue(steps::requeue_after(
        ctx.settings.resync_interval,
        plan.next_renewal,
    )))
}

/// The status of a tenant whose restore has not written the snapshot's certificate authorities yet: its
/// root namespace exists, nothing else is made (PKI generated now would be replaced by the snapshot's).
async fn hold_for_restore(vc: &VirtualCluster, namespace: &str, ctx: &Context) -> Result<Action> {
    let message = RestoreStage::Pki.message(namespace);
    let desired = DesiredStatus {
        phase: ClusterPhase::Pending,
        reason: REASON_RESTORING.to_owned(),
        message: message.clone(),
        cluster_namespace: namespace.to_owned(),
        mode: crds::ControlPlaneMode::Provisioned,
        conditions: vec![ConditionState::unmet(CONDITION_READY, REASON_RESTORING, &message)],
        observed_generation: vc.meta().generation,
    };
    steps::write_status(vc, &desired, ctx, true).await?;
    // The restore moves on by changing the annotation, which triggers the next reconcile.
    Ok(Action::requeue(ctx.settings.resync_interval))
}

/// Asks the tenant apiserver with the admin kubeconfig vc-manager wrote, at its Service's cluster IP.
async fn apiserver_answers(
    secrets: &BTreeMap<String, Secret>,
    identity: &TenantIdentity,
    ctx: &Context,
) -> Result<ProbeReport> {
    let namespace = identity.root_namespace();
    let origin = format!("Secret {namespace}/{SECRET_ADMIN_KUBECONFIG}");
    let kubeconfig = secrets
        .get(SECRET_ADMIN_KUBECONFIG)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(SECRET_ADMIN_KUBECONFIG))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .ok_or_else(|| {
            Error::from(tenant_pki::Error::KubeconfigInvalid {
                origin: origin.clone(),
                problem: format!("no key {SECRET_ADMIN_KUBECONFIG}, or not UTF-8 text"),
            })
        })?;
    let reachable = reach_at_cluster_ip(&kubeconfig, &ctx.client, namespace)
        .await
        .map_err(|source| {
            Error::from(tenant_pki::Error::KubeconfigInvalid {
                origin: origin.clone(),
                problem: source.to_string(),
            })
        })?;
    ctx.probe.version(origin, reachable).await
}

/// The kubeconfig with its server replaced by the apiserver Service's cluster IP (which its serving
/// certificate carries), so that vc-manager does not depend on cluster DNS.
async fn reach_at_cluster_ip(
    kubeconfig: &str,
    client: &kube::Client,
    namespace: &str,
) -> std::result::Result<String, vc_runtime::Error> {
    let Some(server) = kubeconfig.lines().find_map(|l| l.trim().strip_prefix("server: ")) else {
        return Ok(kubeconfig.to_owned());
    };
    let reachable = vc_runtime::clients::cluster_ip_url(client, server, namespace).await?;
    Ok(kubeconfig.replacen(&format!("server: {server}"), &format!("server: {reachable}"), 1))
}

async fn apply_services(
    cv: &ClusterVersion,
    identity: &TenantIdentity,
    ctx: &Context,
) -> Result<BTreeMap<Component, Service>> {
    let namespace = identity.root_namespace();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let applies = Component::ALL.into_iter().filter_map(|component| {
        let service = render::render_service(component, cv, identity)?;
        let api = api.clone();
        Some(async move {
            let name = service.metadata.name.clone().unwrap_or_default();
            let failed = |source| Error::ServiceApply {
                component,
                namespace: namespace.to_owned(),
                name: name.clone(),
                source,
            };
            let hash = crate::applied::hash_of(&service);
            let last = ctx.applied.get("Service", namespace, &name);
            if last.as_ref().is_some_and(|last| last.hash == hash) {
                // A read instead of a write: as the last apply left it, nothing needs applying.
                let live = api.get_opt(&name).await.map_err(failed)?;
                if let Some(live) = live
                    && crate::applied::unchanged(last.as_ref(), &hash, Some(&live.metadata))
                {
                    return Ok::<_, Error>((component, live));
                }
            }
            let result = api
                .patch(&name, &apply_params(), &Patch::Apply(&service))
                .await
                .map_err(failed)?;
            ctx.applied
                .record("Service", namespace, &name, &hash, &result.metadata);
            Ok::<_, Error>((component, result))
        })
    });
    Ok(futures::future::try_join_all(applies)
        .await?
        .into_iter()
        .collect())
}

/// Names and addresses for the certificates and kubeconfigs.
fn network(
    vc: &VirtualCluster,
    cv: &ClusterVersion,
    services: &BTreeMap<Component, Service>,
    ctx: &Context,
) -> Result<Network> {
    let apiserver = render::apiserver_endpoint(cv).map_err(|problem| Error::ClusterVersionInvalid {
        name: cv.name_any(),
        problem,
    })?;
    let mut apiserver_ips: Vec<IpAddr> = Vec::new();
    let mut apiserver_hostnames: Vec<String> = Vec::new();
    if let Some(service) = services.get(&Component::ApiServer) {
        if let Some(spec) = &service.spec {
            let ips = spec
                .cluster_ip
                .iter()
                .chain(spec.cluster_ips.iter().flatten())
                .chain(spec.external_ips.iter().flatten());
            apiserver_ips.extend(ips.filter_map(|ip| ip.parse::<IpAddr>().ok()));
        }
        let ingress = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for ingress in ingress.into_iter().flatten() {
            apiserver_ips.extend(ingress.ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()));
            apiserver_hostnames.extend(ingress.hostname.clone().filter(|h| !h.is_empty()));
        }
    }
    if let Some(domain) = vc
        .labels()
        .get(LABEL_EXTERNAL_APISERVER_DOMAIN)
        .filter(|d| !d.is_empty())
    {
        apiserver_hostnames.push(domain.clone());
    }
    apiserver_ips.sort();
    apiserver_ips.dedup();
    apiserver_hostnames.sort();
    apiserver_hostnames.dedup();
    let (etcd_service, etcd_peer_service) = render::etcd_service_names(cv);
    let etcd = &cv.spec.etcd.statefulset;
    let etcd_name = etcd.metadata.name.clone().unwrap_or_default();
    let replicas = etcd.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0);
    let etcd_members = (0..replicas).map(|i| format!("{etcd_name}-{i}")).collect();
    let ranges = render::apiserver_service_range(vc, cv).unwrap_or_default();
    Ok(Network {
        apiserver,
        apiserver_ips,
        apiserver_hostnames,
        etcd_service,
        etcd_peer_service,
        etcd_members,
        cluster_domain: vc.spec.cluster_domain.clone(),
        super_cluster_domain: ctx.settings.super_cluster_domain.clone(),
        tenant_service_ips: first_service_ips(&ranges),
    })
}

/// What applying the StatefulSets changed, for events (one per kind of change: the event recorder merges
/// events of the same reason).
#[derive(Debug, Default)]
struct StatefulSetChanges {
    created: Vec<(Component, String)>,
    restored: Vec<(Component, String)>,
    upgraded: Vec<Component>,
    upgrade: Option<((String, String), (String, String))>,
    updated: Vec<Component>,
}

impl StatefulSetChanges {
    fn record(
        &mut self,
        vc: &VirtualCluster,
        component: Component,
        before: Option<&StatefulSet>,
        after: &StatefulSet,
    ) {
        let name = format!("{}/{}", after.namespace().unwrap_or_default(), after.name_any());
        let Some(before) = before else {
            if after.meta().generation == Some(1) {
                // Made again rather than for the first time: the cluster ran, or its status shows this
                // component's StatefulSet observed before (the status may have gone to Pending first).
                let observed_before = vc.status.as_ref().is_some_and(|status| {
                    status.conditions.iter().any(|c| {
                        c.type_ == component.condition()
                            && matches!(
                                c.reason.as_str(),
                                "StatefulSetReady" | "StatefulSetNotReady" | "RollingOut"
                            )
                    })
                });
                match vc.phase() {
                    Some(ClusterPhase::Running | ClusterPhase::Updating) => {
                        self.restored.push((component, name))
                    }
                    _ if observed_before => self.restored.push((component, name)),
                    _ => self.created.push((component, name)),
                }
            }
            return;
        };
        // The cache still showed the one deleted meanwhile, and the apply made a new one: a restore too.
        if let (Some(old), Some(new)) = (&before.metadata.uid, &after.metadata.uid)
            && old != new
        {
            self.restored.push((component, name));
            return;
        }
        let version = |sts: &StatefulSet| {
            let annotations = sts.annotations();
            (
                annotations
                    .get(ANNOTATION_CLUSTER_VERSION)
                    .cloned()
                    .unwrap_or_default(),
                annotations
                    .get(ANNOTATION_CLUSTER_VERSION_GENERATION)
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        let (old, new) = (version(before), version(after));
        if old != new && !old.0.is_empty() {
            self.upgraded.push(component);
            self.upgrade = Some((old, new));
        } else if before.meta().generation < after.meta().generation {
            self.updated.push(component);
        }
    }

    async fn announce(self, vc: &VirtualCluster, ctx: &Context) {
        let regarding = vc.object_ref(&());
        for (component, name) in self.created {
            ctx.publish(
                &regarding,
                EventType::Normal,
                &format!("{}Created", component.camel()),
                "Provision",
                format!("created the {component} StatefulSet {name}"),
            )
            .await;
        }
        for (component, name) in self.restored {
            ctx.publish(
                &regarding,
                EventType::Warning,
                &format!("{}Restored", component.camel()),
                "Provision",
                format!("restored the {component} StatefulSet {name}, which had been deleted"),
            )
            .await;
        }
        let names =
            |components: &[Component]| components.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
        if let Some((old, new)) = &self.upgrade {
            ctx.publish(
                &regarding,
                EventType::Normal,
                "Upgrading",
                "Upgrade",
                format!(
                    "rolling {} from ClusterVersion {} (generation {}) to {} (generation {})",
                    names(&self.upgraded),
                    old.0,
                    old.1,
                    new.0,
                    new.1
                ),
            )
            .await;
        }
        if !self.updated.is_empty() {
            ctx.publish(
                &regarding,
                EventType::Normal,
                "StatefulSetsUpdated",
                "Provision",
                format!(
                    "updated the {} StatefulSet(s): rotated Secrets or a reverted edit",
                    names(&self.updated)
                ),
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statefulset(uid: &str, generation: i64) -> StatefulSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "apiserver", "namespace": "root", "uid": uid, "generation": generation}
        }))
        .expect("a StatefulSet")
    }

    /// What one apply of the apiserver StatefulSet is told as, the cache showing `before`.
    fn told(before: &StatefulSet, after: &StatefulSet) -> StatefulSetChanges {
        let vc: VirtualCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": "alpha", "namespace": "tenants"},
            "spec": {"clusterVersionName": "cv"},
            "status": {"phase": "Pending"}
        }))
        .expect("a VirtualCluster");
        let mut changes = StatefulSetChanges::default();
        changes.record(&vc, Component::ApiServer, Some(before), after);
        changes
    }

    #[test]
    fn a_statefulset_made_again_behind_a_stale_cache_is_told_as_restored() {
        // The cache still shows the deleted one (uid a); the apply created a new one (uid b).
        let changes = told(&statefulset("a", 3), &statefulset("b", 1));
        assert_eq!(
            changes.restored,
            [(Component::ApiServer, "root/apiserver".to_owned())]
        );
        assert!(changes.created.is_empty() && changes.updated.is_empty());
        // The same one, unchanged: nothing to tell.
        let unchanged = told(&statefulset("a", 3), &statefulset("a", 3));
        assert!(
            unchanged.restored.is_empty() && unchanged.created.is_empty() && unchanged.updated.is_empty()
        );
    }
}
