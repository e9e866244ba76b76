//! Tenant PodDisruptionBudgets in the super cluster: a platform drain (the eviction API, as
//! `kubectl drain` uses it) of a node running a tenant's pods is refused while the tenant's budget allows
//! no disruption, and allowed once it does; with `--sync-disruption-budgets=false` the copies go.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    core::v1::{Namespace, Pod, ServiceAccount},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client,
    api::{EvictParams, Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(60);

fn config() -> SyncerConfig {
    SyncerConfig {
        patrol_interval: Duration::from_secs(2),
        tenant_health_period: Duration::from_secs(2),
        token_ttl_seconds: 600,
        ..SyncerConfig::for_tests()
    }
}

async fn start_syncer(client: Client, config: SyncerConfig) -> anyhow::Result<Syncer> {
    Ok(Syncer::start(client, config, Arc::new(Metrics::default()), Health::new()).await?)
}

/// Whether the super cluster lets a drain evict `pod`.
async fn evict(pods: &Api<Pod>, pod: &str) -> anyhow::Result<bool> {
    match pods.evict(pod, &EvictParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 429 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_drains_respect_tenant_disruption_budgets() -> anyhow::Result<()> {
    if !local_cluster::require("node_drains_respect_tenant_disruption_budgets", NEEDS) {
        return Ok(());
    }
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 1,
        ..Default::default()
    })
    .await?;
    let super_client = tenancy.super_client();
    tenancy.nodes.wait_ready(&super_client).await?;
    let master = tenancy.tenant("tenant-0");
    let tenant = master.client();
    Api::<Namespace>::all(tenant.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shop"}}))?,
        )
        .await?;
    wait::until_true(PATIENCE, "shop's default ServiceAccount", || {
        let tenant = tenant.clone();
        async move {
            Api::<ServiceAccount>::namespaced(tenant, "shop")
                .get_opt("default")
                .await
                .ok()
                .flatten()
                .is_some()
        }
    })
    .await?;
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), "shop");
    for name in ["web-0", "web-1"] {
        tenant_pods
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "busybox"}]}}))?,
            )
            .await?;
    }
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(tenant.clone(), "shop");
    budgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))?,
        )
        .await?;
    let _syncer = start_syncer(super_client.clone(), config()).await?;

    let super_namespace = master.super_namespace("shop");
    // The platform's own client, as `kubectl drain` uses it: an eviction the budget refuses answers 429,
    // which kube's client would otherwise retry with backoff for minutes.
    let platform = {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(tenancy.super_cluster.apiserver().kubeconfig_path())?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        config.default_retry = false;
        Client::try_from(config)?
    };
    let super_pods: Api<Pod> = Api::namespaced(platform.clone(), &super_namespace);
    let super_budgets: Api<PodDisruptionBudget> = Api::namespaced(platform.clone(), &super_namespace);
    // The copy, as the super cluster's disruption controller sees it: both pods healthy, none to spare.
    wait::until_true(PATIENCE, "the super budget with both pods healthy", || {
        let super_budgets = super_budgets.clone();
        async move {
            super_budgets
                .get_opt("web")
                .await
                .ok()
                .flatten()
                .and_then(|b| b.status)
                .is_some_and(|s| s.current_healthy == 2 && s.disruptions_allowed == 0)
        }
    })
    .await?;
    assert!(
        !evict(&super_pods, "web-0").await?,
        "a drain evicted a pod the budget protects"
    );

    // The tenant allows one disruption: the drain may evict one pod, and no second.
    budgets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
        )
        .await?;
    wait::until_true(PATIENCE, "the super budget allowing one disruption", || {
        let super_budgets = super_budgets.clone();
        async move {
            super_budgets
                .get_opt("web")
                .await
                .ok()
                .flatten()
                .and_then(|b| b.status)
                .is_some_and(|s| s.disruptions_allowed == 1)
        }
    })
    .await?;
    assert!(evict(&super_pods, "web-0").await?, "the drain was refused");
    assert!(
        !evict(&super_pods, "web-1").await?,
        "a drain evicted past the budget"
    );

    // The platform turns copying off: the copies go; the tenant keeps its budget.
    drop(_syncer);
    let _syncer = start_syncer(
        super_client.clone(),
        SyncerConfig {
            sync_disruption_budgets: false,
            ..config()
        },
    )
    .await?;
    wait::until_true(PATIENCE, "the super budget removed", || {
        let super_budgets = super_budgets.clone();
        async move { matches!(super_budgets.get_opt("web").await, Ok(None)) }
    })
    .await?;
    assert!(budgets.get_opt("web").await?.is_some());
    Ok(())
}
