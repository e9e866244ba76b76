//! What goes when a tenant goes: detaching stops its watches and forgets its queued work, usage and
//! series; a paused tenant's super pods are removed; a deleted tenant's super namespaces are deleted, and
//! so are those the patrol finds orphaned. Every delete is pinned to the uid the cache holds.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{Api, Resource, ResourceExt, runtime::reflector::ObjectRef};

use crate::engine::context::Context;

/// Stops syncing a tenant and forgets its queued work and series.
pub fn detach(ctx: &Context, cluster_key: &str) {
    if let Some(tenant) = ctx.tenants.remove(cluster_key) {
        tracing::info!(tenant = %tenant.identity.vc_ref(), "detaching tenant");
        tenant.stop();
        ctx.queues.down.remove_tenant(&tenant.id);
        ctx.queues.up.remove_tenant(&tenant.id);
        ctx.quota.forget(&tenant.id);
        ctx.events.forget(&tenant.id);
        ctx.metrics.forget_tenant(&tenant.identity.vc_ref());
    }
}

/// Deletes every super namespace of a tenant whose VirtualCluster is gone (their contents go with them).
pub async fn clean_up(ctx: &Context, cluster_key: &str) {
    delete_namespaces(ctx, |namespace| {
        crate::tenancy::identity::belongs_to(namespace.meta(), cluster_key)
    })
    .await;
}

/// Deletes the super namespaces of removed tenants that `doomed` picks, unless already being deleted, each
/// only while it has the uid the cache holds; returns how many it deleted.
pub async fn delete_namespaces(ctx: &Context, doomed: impl Fn(&Namespace) -> bool) -> usize {
    let api: Api<Namespace> = Api::all(ctx.super_client.clone());
    let mut deleted = 0;
    for namespace in ctx.supers.namespaces.store.state() {
        if namespace.meta().deletion_timestamp.is_some() || !doomed(&namespace) {
            continue;
        }
        match crate::resources::write::delete(ctx, &api, &namespace.name_any(), namespace.uid(), None).await {
            Ok(()) => deleted += 1,
            Err(error) => {
                tracing::warn!(namespace = %namespace.name_any(), error = &error as &dyn std::error::Error, "deleting a removed tenant's namespace")
            }
        }
    }
    deleted
}

/// Whether a super namespace belongs to no live VirtualCluster (its tenant was deleted while the syncer
/// was not running).
pub fn orphaned(ctx: &Context, namespace: &Namespace) -> bool {
    let Some(key) = crate::tenancy::identity::owner_cluster(namespace.meta()) else {
        return false;
    };
    let vc_namespace = namespace
        .annotations()
        .get(crds::wellknown::ANNOTATION_VC_NAMESPACE);
    let vc_name = namespace.annotations().get(crds::wellknown::ANNOTATION_VC_NAME);
    let (Some(vc_namespace), Some(vc_name)) = (vc_namespace, vc_name) else {
        return false;
    };
    let live = ctx
        .virtual_clusters
        .get(&ObjectRef::new(vc_name).within(vc_namespace))
        .is_some_and(|vc| crds::naming::cluster_key_of(&vc).as_deref() == Some(key));
    !live
}

/// Removes a paused tenant's super pods, each pinned to its uid and with its own grace period; nothing in
/// the tenant is touched. Returns how many of its super pods are still there (terminating, or refused).
pub async fn remove_paused_pods(ctx: &Context, cluster_key: &str) -> usize {
    let mut remaining = 0;
    for pod in ctx.supers.pods.copies.state() {
        if !crate::tenancy::identity::belongs_to(pod.meta(), cluster_key) {
            continue;
        }
        remaining += 1;
        if pod.meta().deletion_timestamp.is_some() {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(ctx.super_client.clone(), &namespace);
        if let Err(error) = crate::resources::write::delete(ctx, &api, &pod.name_any(), pod.uid(), None).await
        {
            tracing::warn!(%namespace, pod = %pod.name_any(), error = &error as &dyn std::error::Error, "removing a paused tenant's super pod");
        }
    }
    remaining
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
    use serde_json::json;

    use super::*;
    use crate::engine::context::testing::{self, from_json};

    /// The super namespace of tenant namespace `tenant_namespace`, as the syncer writes it.
    fn super_namespace(tenant_namespace: &str, cluster_key: &str, deleting: bool) -> Namespace {
        let name = crds::naming::super_namespace(cluster_key, tenant_namespace);
        let mut namespace: Namespace = from_json(json!({
            "metadata": {
                "name": name,
                "uid": format!("uid-{name}"),
                "annotations": {
                    crds::wellknown::ANNOTATION_CLUSTER: cluster_key,
                    crds::wellknown::ANNOTATION_NAMESPACE: tenant_namespace,
                },
            }
        }));
        if deleting {
            namespace.metadata.deletion_timestamp =
                Some(Time(Timestamp::from_second(1_800_000_000).expect("time")));
        }
        namespace
    }

    #[tokio::test]
    async fn a_removed_tenants_namespaces_are_deleted_pinned_and_a_failure_does_not_stop_the_rest() {
        let (super_client, mut supers) = testing::mock();
        let (ctx, mut writers) = testing::context(super_client);
        let key = testing::identity().cluster_key;
        for namespace in [
            super_namespace("mine-a", &key, false),
            super_namespace("mine-b", &key, false),
            super_namespace("mine-going", &key, true),
            super_namespace("theirs", "team-ffffff-vc", false),
        ] {
            testing::put(&mut writers.namespaces, namespace);
        }
        let ((), mut deleted) = tokio::join!(clean_up(&ctx, &key), async {
            let mut deleted = Vec::new();
            for _ in 0..2 {
                let call = supers.expect("DELETE", "/api/v1/namespaces/").await;
                let name = call.uri["/api/v1/namespaces/".len()..]
                    .trim_end_matches('?')
                    .to_owned();
                assert_eq!(
                    call.body["preconditions"]["uid"],
                    format!("uid-{name}"),
                    "{}",
                    call.body
                );
                // The first answer refuses; the other namespace is still deleted.
                if deleted.is_empty() {
                    call.fail(403, "Forbidden", "namespaces is forbidden");
                } else {
                    call.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
                }
                deleted.push(name);
            }
            deleted
        });
        deleted.sort();
        assert_eq!(deleted, [format!("{key}-mine-a"), format!("{key}-mine-b")]);
        // Every delete asked counts as a write to the super cluster, the refused one too.
        assert_eq!(ctx.metrics.resources.super_writes_total(), 2);
        supers.idle().await;
    }

    fn super_pod(name: &str, cluster_key: &str, deleting: bool) -> crate::cache::pods::SuperPod {
        let mut pod: crate::cache::pods::SuperPod = from_json(json!({"metadata": {
            "name": name, "namespace": format!("{cluster_key}-shop"), "uid": format!("uid-{name}"),
            "annotations": {crds::wellknown::ANNOTATION_CLUSTER: cluster_key, crds::wellknown::ANNOTATION_NAMESPACE: "shop"},
        }}));
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(Time(Timestamp::from_second(1_800_000_000).expect("time")));
        }
        pod
    }

    #[tokio::test]
    async fn a_paused_tenants_super_pods_are_removed_pinned_and_nothing_else() {
        let (super_client, mut supers) = testing::mock();
        let (ctx, mut writers) = testing::context(super_client);
        let key = testing::identity().cluster_key;
        for pod in [
            super_pod("web-a", &key, false),
            super_pod("web-b", &key, false),
            super_pod("web-going", &key, true),
            super_pod("theirs", "team-ffffff-vc", false),
        ] {
            testing::put(&mut writers.pods, pod);
        }
        let prefix = format!("/api/v1/namespaces/{key}-shop/pods/");
        let (remaining, mut deleted) = tokio::join!(remove_paused_pods(&ctx, &key), async {
            let mut deleted = Vec::new();
            for _ in 0..2 {
                let call = supers.expect("DELETE", &prefix).await;
                let name = call.uri[prefix.len()..].trim_end_matches('?').to_owned();
                assert_eq!(
                    call.body["preconditions"]["uid"],
                    format!("uid-{name}"),
                    "{}",
                    call.body
                );
                // A refused delete does not stop the others; it counts as still there.
                if deleted.is_empty() {
                    call.fail(403, "Forbidden", "pods is forbidden");
                } else {
                    call.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
                }
                deleted.push(name);
            }
            deleted
        });
        deleted.sort();
        assert_eq!(deleted, ["web-a", "web-b"]);
        // The terminating one is not deleted again but is still there, as are the two just deleted (the
        // cache shows them until their watch events come).
        assert_eq!(remaining, 3);
        supers.idle().await;
    }
}
