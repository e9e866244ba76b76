//! The patrol: a periodic comparison of every tenant with the super cluster that queues repairs for
//! missing, drifted and orphaned objects, stale vNodes and status that did not flow up, looks again at
//! pods waiting for quota, and removes the namespaces of tenants that no longer exist.

pub mod findings;
pub mod metrics;

use std::{sync::Arc, time::Instant};

use crate::engine::patrol::findings::Findings;
use crate::{
    engine::{context::Context, patrol::findings::found},
    resources,
    tenancy::attach,
};

/// Runs a scan every `config.patrol_interval`.
pub async fn run(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(ctx.config.patrol_interval);
    tick.tick().await;
    loop {
        tick.tick().await;
        let findings = scan(&ctx).await;
        tracing::info!(
            missing = findings.missing,
            drifted = findings.drifted,
            orphaned = findings.orphaned,
            stale_vnodes = findings.stale_vnodes,
            status = findings.status,
            quota_waiting = findings.quota_waiting,
            "patrol done"
        );
    }
}

/// Compares every attached tenant with the super cluster once and queues repairs.
pub async fn scan(ctx: &Context) -> Findings {
    let started = Instant::now();
    let mut findings = Findings::default();
    for tenant in ctx.tenants.all() {
        if !tenant.is_ready() {
            continue;
        }
        findings += resources::patrol(ctx, &tenant);
    }
    // Once for the whole super cluster: with sharded replicas, only the one holding the duties' Lease.
    if ctx.runs_cluster_duties() {
        findings.orphaned += remove_orphaned_tenants(ctx).await;
    }
    // Gone pods' tokens leave the shared token Secrets of the tenants this replica holds (the delete path
    // writes nothing).
    findings.drifted += ctx.tokens.sweep(ctx).await;
    ctx.metrics
        .patrol
        .patrol_duration
        .observe(started.elapsed().as_secs_f64());
    findings
}

/// Deletes super namespaces of tenants whose VirtualCluster no longer exists.
async fn remove_orphaned_tenants(ctx: &Context) -> usize {
    attach::delete_namespaces(ctx, |namespace| {
        let orphaned = attach::orphaned(ctx, namespace);
        if orphaned {
            found(ctx, "namespace", "orphaned-tenant");
        }
        orphaned
    })
    .await
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use kube::Resource;
    use serde_json::json;

    use super::*;
    use crate::{
        accounting::quota::Usage,
        cache::pods::TenantPod,
        engine::{
            context::testing::{self, from_json, put},
            items::{DownItem, Kind, UpItem},
        },
        resources::copy::{Conversion, Downward},
        tenancy::{identity, settings::TenantSettings},
    };

    fn tenant_pod(name: &str) -> TenantPod {
        from_json(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Pending"}
        }))
    }

    #[tokio::test]
    async fn pods_waiting_for_quota_are_looked_at_again() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let quota = crds::TenantQuota {
            pods: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "1".into(),
            )),
            ..Default::default()
        };
        let one = Usage {
            pods: 1,
            ..Default::default()
        };
        assert!(
            ctx.quota
                .admit(&tenant.id, Some(&quota), "ns", "admitted", one)
                .is_ok()
        );
        assert!(
            ctx.quota
                .admit(&tenant.id, Some(&quota), "ns", "waiting", one)
                .is_err()
        );
        put(&mut caches.pods, tenant_pod("admitted"));
        put(&mut caches.pods, tenant_pod("waiting"));

        let findings = scan(&ctx).await;
        // The admitted pod is being created (no copy yet): missing. The waiting one is queued as well.
        assert_eq!((findings.missing, findings.quota_waiting), (1, 1));
        let mut queued = testing::drain_down(&ctx).await;
        queued.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            queued,
            [
                DownItem::new(Kind::Pod, "ns", "admitted"),
                DownItem::new(Kind::Pod, "ns", "waiting")
            ]
        );
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn node_ports_that_did_not_reach_the_tenant_are_queued_up_and_nothing_drifts() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let tenant_service = |node_port: i32, super_ip: Option<&str>| -> Service {
            let mut service: Service = from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "svc-uid", "resourceVersion": "5"},
                "spec": {"type": "NodePort", "clusterIP": "10.32.0.10", "selector": {"app": "web"},
                    "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": node_port}]}
            }));
            if let Some(ip) = super_ip {
                service.metadata.annotations = Some(
                    [(
                        crds::wellknown::ANNOTATION_SUPER_CLUSTER_IP.to_owned(),
                        ip.to_owned(),
                    )]
                    .into(),
                );
            }
            service
        };
        // The super copy as the syncer made it (from the tenant Service with the port its apiserver picked),
        // with the node port and IP the super cluster allocated.
        let original = tenant_service(30080, None);
        let super_namespace = tenant.identity.super_namespace("shop");
        let meta = ctx.meta_policy(&[]);
        let cx = Conversion {
            ctx: &ctx,
            tenant: &tenant,
            meta: &meta,
            super_namespace: &super_namespace,
        };
        let mut copy = Service::to_super(&original, &cx)
            .expect("convert")
            .expect("synced");
        identity::stamp(&mut copy, |o| o.meta_mut());
        let spec = copy.spec.as_mut().expect("spec");
        spec.cluster_ip = Some("10.96.0.9".into());
        spec.ports.as_mut().expect("ports")[0].node_port = Some(31000);
        put(&mut super_caches.services, copy);

        put(&mut caches.services, original);
        let findings = scan(&ctx).await;
        assert_eq!(
            findings,
            Findings {
                status: 1,
                ..Default::default()
            }
        );
        assert!(testing::drain_down(&ctx).await.is_empty());
        assert_eq!(
            testing::drain_up(&ctx).await,
            [UpItem::new(Kind::Service, "shop", "web")]
        );

        // Once the tenant Service shows them, the patrol finds nothing: the copied-up values do not make the
        // super copy drift either.
        put(&mut caches.services, tenant_service(31000, Some("10.96.0.9")));
        assert_eq!(scan(&ctx).await, Findings::default());
        assert!(testing::drain_down(&ctx).await.is_empty());
        assert!(testing::drain_up(&ctx).await.is_empty());
        supers.idle().await;
        tenants.idle().await;
    }
}
