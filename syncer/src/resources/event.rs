//! Events: super-cluster events about synced objects of every namespaced kind, copied up to their tenants with names and
//! namespaces translated back. They wait in the [`crate::engine::events::EventInbox`] until an upward worker
//! copies them; the syncer caches no events on either side.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use kube::{
    Api, ResourceExt,
    api::{ObjectMeta, Patch},
    runtime::{WatchStreamExt, watcher},
};

use super::{outcome::Outcome, synced::SyncedKind};
use crate::{
    cache::super_stores::{EventSubject, SuperCache, SuperWatch},
    engine::{
        context::Context,
        items::{Item, Kind, UpItem, kinds},
    },
    error::{Result, on_tenant},
    tenancy::{
        identity,
        tenant::{Tenant, TenantCache, TenantWatch},
    },
};

/// Queues new super-cluster events about synced objects for their tenants, with names and
/// namespaces translated back. Events that existed before the syncer started are not copied again.
pub async fn forward(ctx: Arc<Context>) {
    let api: Api<CoreEvent> = Api::all(ctx.super_client.clone());
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listed = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::InitDone) => listed = true,
            Ok(watcher::Event::Apply(event)) if listed => queue_up(&ctx, &event),
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "super event watch interrupted; retrying"),
        }
    }
}

/// Puts the tenant copy of a super event in the inbox and queues it for its tenant.
pub fn queue_up(ctx: &Context, event: &CoreEvent) {
    let Some((tenant, copy)) = tenant_copy(ctx, event) else {
        return;
    };
    let (namespace, name) = (copy.namespace().unwrap_or_default(), copy.name_any());
    if ctx.events.put(&tenant.id, copy) {
        ctx.queues
            .up
            .add(&tenant.id, UpItem::new(Kind::Event, &namespace, &name));
    } else {
        ctx.metrics.resources.events_dropped.inc();
        tracing::debug!(tenant = %tenant.identity.vc_ref(), %namespace, event = %name, "too many events waiting for the tenant; dropping one");
    }
}

/// The tenant and its copy of a super event, if the event concerns a synced object.
fn tenant_copy(ctx: &Context, event: &CoreEvent) -> Option<(Arc<Tenant>, CoreEvent)> {
    let involved = &event.involved_object;
    let (Some(kind), Some(super_namespace), Some(name)) =
        (&involved.kind, &involved.namespace, &involved.name)
    else {
        return None;
    };
    if awaits_first_tokens(event) {
        return None;
    }
    let meta = synced_object(ctx, kind, super_namespace, name)?;
    let (Some(cluster), Some(tenant_namespace), Some(tenant_uid)) = (
        identity::owner_cluster(&meta),
        identity::tenant_namespace(&meta),
        identity::tenant_uid(&meta),
    ) else {
        return None;
    };
    let tenant = ctx.tenants.get(cluster)?;
    let translate = |text: &str| text.replace(super_namespace.as_str(), tenant_namespace);
    let copy = CoreEvent {
        metadata: kube::api::ObjectMeta {
            name: event.metadata.name.clone(),
            namespace: Some(tenant_namespace.to_owned()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            namespace: Some(tenant_namespace.to_owned()),
            uid: Some(tenant_uid.to_owned()),
            resource_version: None,
            ..involved.clone()
        },
        message: event.message.as_deref().map(translate),
        reason: event.reason.clone(),
        type_: event.type_.clone(),
        count: event.count,
        first_timestamp: event.first_timestamp.clone(),
        last_timestamp: event.last_timestamp.clone(),
        event_time: event.event_time.clone(),
        source: event.source.clone(),
        reporting_component: event.reporting_component.clone(),
        reporting_instance: event.reporting_instance.clone(),
        action: event.action.clone(),
        series: event.series.clone(),
        related: None,
    };
    Some((tenant, copy))
}

/// Whether an event is a kubelet's failed mount of a pod's tokens not written yet: they are minted once
/// the tenant pod is bound, a moment after the kubelet first looks, and it mounts them on a retry. That
/// wait is the syncer's business and names super-cluster Secrets; a token the tenant apiserver refuses to
/// issue is told to the tenant by the syncer (`TokenNotIssued`).
fn awaits_first_tokens(event: &CoreEvent) -> bool {
    let (Some("Pod"), Some("FailedMount"), Some(pod), Some(message)) = (
        event.involved_object.kind.as_deref(),
        event.reason.as_deref(),
        event.involved_object.name.as_deref(),
        event.message.as_deref(),
    ) else {
        return false;
    };
    // `secret "shard-0.vc-tokens" not found`, or `references non-existent secret key: <pod prefix>.token`.
    message.contains(&format!("{}\"", crate::tokens::mounts::SHARD_SUFFIX))
        || message.contains(&format!(
            "non-existent secret key: {}.",
            crate::tokens::mounts::key_prefix(pod)
        ))
}

/// The metadata of the synced super object of `kind` an event is about: every namespaced kind the syncer
/// copies down (PVC provisioning, Service load balancers, ingress controllers, ... report on them), found
/// in the cache its kind names ([`SuperCache::event_subject`]).
fn synced_object(ctx: &Context, kind: &str, namespace: &str, name: &str) -> Option<ObjectMeta> {
    match ctx
        .supers
        .event_subject(Kind::of_api_kind(kind)?, namespace, name)
    {
        EventSubject::Found(meta) => Some(*meta),
        EventSubject::Missing | EventSubject::NotCopied => None,
    }
}

/// Copies the waiting event `namespace/name` into its tenant. A failed copy waits in the inbox again for
/// the worker's retry (unless a newer version arrived meanwhile).
pub async fn copy_up(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(copy) = ctx.events.take(&tenant.id, namespace, name) else {
        return Ok(Outcome::InSync);
    };
    let api: Api<CoreEvent> = Api::namespaced(tenant.client.clone(), namespace);
    ctx.metrics.resources.tenant_write("event", "apply");
    let params = crate::resources::write::apply_params().force();
    match api.patch(name, &params, &Patch::Apply(&copy)).await {
        Ok(_) => Ok(Outcome::Created { writes: 1 }),
        // The involved object's namespace is gone, or the tenant refuses the event: nothing to retry.
        Err(kube::Error::Api(status)) if (400..500).contains(&status.code) && status.code != 429 => {
            tracing::debug!(code = status.code, message = %status.message, "the tenant refused an event copy");
            Ok(Outcome::InSync)
        }
        Err(error) => {
            ctx.events.put_back(&tenant.id, namespace, name, copy);
            Err(on_tenant(
                &tenant.identity.cluster_key,
                format!("copying event {namespace}/{name}"),
            )(error))
        }
    }
}

impl TenantCache for kinds::Event {
    type Cache = ();
    type State = ();

    fn watch(_tenant: &mut TenantWatch<'_>) {}
}

impl SuperCache for kinds::Event {
    type Cache = ();

    /// Super events are not cached: [`forward`] watches them and hands each new one to the inbox.
    fn watch(_supers: &mut SuperWatch<'_>) {}
}

impl SyncedKind for kinds::Event {
    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy_up(ctx, tenant, &item.namespace, &item.name).await
    }
}

#[cfg(test)]
mod tests {
    use crds::wellknown::{ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_UID};
    use serde_json::json;

    use super::*;
    use crate::engine::events::PENDING_EVENTS_PER_TENANT;
    use crate::{
        cache::pods::SuperPod,
        engine::context::testing,
        tenancy::{identity::TenantIdentity, settings::TenantSettings, tenant::Tenant},
    };

    fn identity(cluster_key: &str) -> TenantIdentity {
        TenantIdentity {
            cluster_key: cluster_key.into(),
            vc_name: cluster_key.into(),
            vc_namespace: "team".into(),
            vc_uid: format!("{cluster_key}-uid"),
        }
    }

    fn super_pod(cluster_key: &str) -> SuperPod {
        testing::from_json(json!({"metadata": {
            "name": "web", "namespace": format!("{cluster_key}-shop"),
            "annotations": {ANNOTATION_CLUSTER: cluster_key, ANNOTATION_NAMESPACE: "shop", ANNOTATION_UID: "pod-uid"}
        }}))
    }

    fn event(cluster_key: &str, name: &str) -> CoreEvent {
        testing::from_json(json!({
            "metadata": {"name": name, "namespace": format!("{cluster_key}-shop")},
            "involvedObject": {"kind": "Pod", "namespace": format!("{cluster_key}-shop"), "name": "web"},
            "reason": "BackOff", "message": format!("pod {cluster_key}-shop/web restarting")
        }))
    }

    /// The kubelet's failed mounts of a pod's tokens not written yet stay in the super cluster; other
    /// failed mounts (the tenant's own Secrets) reach the tenant.
    #[test]
    fn only_the_wait_for_a_pods_first_tokens_is_kept_from_the_tenant() {
        let failed_mount = |message: &str| -> CoreEvent {
            testing::from_json(json!({
                "metadata": {"name": "web.1", "namespace": "t-shop"},
                "involvedObject": {"kind": "Pod", "namespace": "t-shop", "name": "web"},
                "reason": "FailedMount", "message": message
            }))
        };
        for message in [
            r#"MountVolume.SetUp failed for volume "kube-api-access-x" : secret "shard-0.vc-tokens" not found"#,
            r#"MountVolume.SetUp failed for volume "kube-api-access-x" : references non-existent secret key: web.token"#,
        ] {
            assert!(awaits_first_tokens(&failed_mount(message)), "{message}");
        }
        for message in [
            r#"MountVolume.SetUp failed for volume "config" : secret "db-password" not found"#,
            r#"MountVolume.SetUp failed for volume "config" : references non-existent secret key: password"#,
            r#"MountVolume.SetUp failed for volume "x" : references non-existent secret key: web-other.token"#,
        ] {
            assert!(!awaits_first_tokens(&failed_mount(message)), "{message}");
        }
        assert!(!awaits_first_tokens(&event("t", "web.2")));
    }

    /// A tenant whose pods flood the super cluster with events waits behind its own events: another
    /// tenant's event is handed out among the first, and the flood waits in a bounded inbox, not in one
    /// task per event.
    #[tokio::test]
    async fn an_event_storm_waits_behind_its_own_tenant() {
        let (super_client, _supers) = testing::mock();
        let (ctx, mut writers) = testing::context(super_client);
        for key in ["storm", "calm"] {
            let (client, _) = testing::mock();
            let (tenant, _) =
                Tenant::for_tests(identity(key), client, TenantSettings::default(), &ctx.queues);
            ctx.tenants.insert(tenant);
            testing::put(&mut writers.pods, super_pod(key));
        }
        for n in 0..PENDING_EVENTS_PER_TENANT + 500 {
            queue_up(&ctx, &event("storm", &format!("web.{n}")));
        }
        queue_up(&ctx, &event("calm", "web.1"));
        assert_eq!(ctx.events.len(), PENDING_EVENTS_PER_TENANT + 1);
        assert_eq!(ctx.metrics.resources.events_dropped.get(), 500);

        let mut handed_out = Vec::new();
        for _ in 0..3 {
            let work = ctx.queues.up.next().await.expect("work");
            ctx.queues.up.done(&work);
            handed_out.push(work.tenant.to_string());
        }
        assert!(
            handed_out.iter().any(|t| t == "calm"),
            "the calm tenant's event waited behind the storm: {handed_out:?}"
        );
        let copy = ctx
            .events
            .take(&Arc::from("calm"), "shop", "web.1")
            .expect("copy");
        assert_eq!(copy.involved_object.namespace.as_deref(), Some("shop"));
        assert_eq!(copy.involved_object.uid.as_deref(), Some("pod-uid"));
        assert_eq!(copy.message.as_deref(), Some("pod shop/web restarting"));
    }

    /// Events about a synced claim (provisioning) and Service (load balancers) reach the tenant, with the
    /// tenant's namespace and uid; events about objects the syncer did not write, or of kinds it does not
    /// sync, do not.
    #[tokio::test]
    async fn events_about_every_synced_kind_reach_their_tenant() {
        let (super_client, _supers) = testing::mock();
        let (ctx, mut writers) = testing::context(super_client);
        let (client, _) = testing::mock();
        let (tenant, _) = Tenant::for_tests(identity("team"), client, TenantSettings::default(), &ctx.queues);
        ctx.tenants.insert(tenant);
        let synced = |name: &str, uid: &str| {
            json!({"metadata": {"name": name, "namespace": "team-shop",
                "annotations": {ANNOTATION_CLUSTER: "team", ANNOTATION_NAMESPACE: "shop", ANNOTATION_UID: uid}}})
        };
        testing::put(
            &mut writers.claims,
            testing::from_json(synced("data", "claim-uid")),
        );
        testing::put(
            &mut writers.services,
            testing::from_json(synced("web", "service-uid")),
        );
        testing::put(
            &mut writers.services,
            testing::from_json(json!({"metadata": {"name": "platform", "namespace": "team-shop"}})),
        );
        let about = |kind: &str, name: &str, event: &str| -> CoreEvent {
            testing::from_json(json!({
                "metadata": {"name": event, "namespace": "team-shop"},
                "involvedObject": {"kind": kind, "namespace": "team-shop", "name": name, "uid": "super-uid"},
                "reason": "Provisioning", "message": format!("{kind} team-shop/{name}")
            }))
        };
        queue_up(&ctx, &about("PersistentVolumeClaim", "data", "data.1"));
        queue_up(&ctx, &about("Service", "web", "web.1"));
        queue_up(&ctx, &about("Service", "platform", "platform.1"));
        queue_up(&ctx, &about("Lease", "web", "lease.1"));
        let queued: Vec<String> = testing::drain_up(&ctx)
            .await
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(queued, ["data.1", "web.1"]);
        let claim = ctx
            .events
            .take(&Arc::from("team"), "shop", "data.1")
            .expect("claim event");
        assert_eq!(
            claim.involved_object.kind.as_deref(),
            Some("PersistentVolumeClaim")
        );
        assert_eq!(claim.involved_object.namespace.as_deref(), Some("shop"));
        assert_eq!(claim.involved_object.uid.as_deref(), Some("claim-uid"));
        assert_eq!(claim.message.as_deref(), Some("PersistentVolumeClaim shop/data"));
        let service = ctx
            .events
            .take(&Arc::from("team"), "shop", "web.1")
            .expect("service event");
        assert_eq!(service.involved_object.uid.as_deref(), Some("service-uid"));
    }

    /// Every kind in the list says where the events about its super objects are found, unless its events
    /// are, for a stated reason, not copied: a kind added to the list without saying so fails here rather
    /// than having its events silently dropped.
    #[test]
    fn every_kind_in_the_list_dispatches_its_events() {
        let not_copied = [
            // Cluster-scoped, or public super objects no tenant owns: no tenant namespace to copy into.
            Kind::Namespace,
            Kind::IngressClass,
            Kind::Node,
            Kind::PersistentVolume,
            Kind::StorageClass,
            Kind::PriorityClass,
            Kind::RuntimeClass,
            // Events about custom resources name their own kinds, which the list does not hold.
            Kind::CustomResource,
            // Events about events.
            Kind::Event,
        ];
        let (supers, _writers) = crate::cache::super_stores::SuperStores::for_tests();
        for kind in Kind::ALL {
            let subject = supers.event_subject(*kind, "team-shop", "web");
            if not_copied.contains(kind) {
                assert_eq!(
                    subject,
                    EventSubject::NotCopied,
                    "{kind}: its events are copied; drop it from the list"
                );
            } else {
                assert_eq!(
                    subject,
                    EventSubject::Missing,
                    "{kind} has no event dispatch: say in its SuperCache::event_subject where its super objects are cached"
                );
            }
        }
    }
}
