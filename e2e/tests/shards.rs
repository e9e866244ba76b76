//! Syncer replicas sharing the tenants (`--shards`): three replicas in process on a real super cluster and
//! four tenant masters. Every tenant is synced by exactly one replica; one replica is killed in the middle
//! of a burst of pod creates, its tenants move to the others, and every pod reaches the super cluster
//! exactly once, with nothing deleted. Then one of the two left stops gracefully and hands its tenants over.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Namespace, Pod},
};
use kube::{
    Api, ResourceExt,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions},
    wait,
};
use serde_json::json;
use syncer::{
    Metrics, Syncer, SyncerConfig,
    tenancy::shards::{LABEL_SYNCER_LEASE, ShardSettings, replica_of},
};
use vc_runtime::admin::Health;

use crate::{
    object_support::create,
    syncer::{config, pod_json, seed, tenant_synced},
};

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(90);
const TENANTS: usize = 4;
const PODS_PER_TENANT: usize = 20;
const LEASE_NAMESPACE: &str = "default";

fn replica_config(replica: &str) -> SyncerConfig {
    SyncerConfig {
        shards: Some(ShardSettings {
            replica_id: replica.to_owned(),
            namespace: LEASE_NAMESPACE.to_owned(),
            // The default: a dead replica's tenants move after about six seconds.
            lease_duration: Duration::from_secs(6),
        }),
        // The test measures its own tenants' usage nowhere.
        usage: syncer::accounting::usage::UsageSettings {
            interval: None,
            ..config().usage
        },
        ..config()
    }
}

async fn start_replica(tenancy: &Tenancy, replica: &str) -> anyhow::Result<Syncer> {
    Ok(Syncer::start(
        tenancy.super_client(),
        replica_config(replica),
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?)
}

/// Cluster key → replicas that have it attached now.
fn attached(replicas: &BTreeMap<String, Syncer>) -> BTreeMap<String, Vec<String>> {
    let mut by_tenant: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, syncer) in replicas {
        for tenant in syncer.context.tenants.all() {
            by_tenant
                .entry(tenant.identity.cluster_key.clone())
                .or_default()
                .push(name.clone());
        }
    }
    by_tenant
}

/// Cluster key → the replica whose Lease says it holds the tenant.
async fn lease_holders(tenancy: &Tenancy) -> anyhow::Result<BTreeMap<String, String>> {
    let leases: Api<Lease> = Api::namespaced(tenancy.super_client(), LEASE_NAMESPACE);
    let listed = leases
        .list(&ListParams::default().labels(&format!("{LABEL_SYNCER_LEASE}=tenant")))
        .await?;
    Ok(listed
        .items
        .iter()
        .filter_map(|lease| {
            let key = lease
                .annotations()
                .get(crds::wellknown::ANNOTATION_CLUSTER)?
                .clone();
            let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
            Some((key, replica_of(holder).to_owned()))
        })
        .collect())
}

/// Every super pod event seen: uids per `namespace/name`, and deletions.
#[derive(Default)]
struct SuperPods {
    uids: BTreeMap<String, BTreeSet<String>>,
    deleted: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_share_the_tenants_and_a_killed_ones_move_without_lost_or_duplicated_pods()
-> anyhow::Result<()> {
    if !local_cluster::require(
        "three_replicas_share_the_tenants_and_a_killed_ones_move_without_lost_or_duplicated_pods",
        NEEDS,
    ) {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: TENANTS,
        ..Default::default()
    })
    .await?;
    let mut replicas = BTreeMap::new();
    for name in ["syncer-0", "syncer-1", "syncer-2"] {
        replicas.insert(name.to_owned(), start_replica(&tenancy, name).await?);
    }
    for name in tenancy.names() {
        tenant_synced(&tenancy, &name, "True").await?;
    }
    let keys: BTreeMap<String, String> = tenancy
        .names()
        .into_iter()
        .map(|name| {
            let key = tenancy.tenant(&name).cluster_key.clone();
            (key, name)
        })
        .collect();

    // Every tenant attached on exactly one replica, the one its Lease names.
    let settled = wait::until(PATIENCE, "every tenant attached on exactly one replica", || {
        let now = attached(&replicas);
        let keys = &keys;
        async move { (now.len() == keys.len() && now.values().all(|r| r.len() == 1)).then_some(now) }
    })
    .await?;
    let holders = lease_holders(&tenancy).await?;
    for (key, on) in &settled {
        assert_eq!(
            holders.get(key),
            Some(&on[0]),
            "tenant {key}: Lease and attachment disagree"
        );
        assert_eq!(
            replicas[&on[0]].context.shards.as_ref().map(|s| s.holds(key)),
            Some(true)
        );
    }
    let mut share: BTreeMap<&str, usize> = BTreeMap::new();
    for on in settled.values() {
        *share.entry(on[0].as_str()).or_default() += 1;
    }
    println!("tenants per replica: {share:?}");

    // Watch: no tenant attached on two replicas at once, ever; every super pod event.
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let supers: Arc<Mutex<SuperPods>> = Arc::default();
    let super_watch = tokio::spawn({
        let supers = supers.clone();
        let pods: Api<Pod> = Api::all(tenancy.super_client());
        let keys: Vec<String> = keys.keys().cloned().collect();
        async move {
            let stream = watcher(pods, watcher::Config::default()).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let ours = |pod: &Pod| {
                    keys.iter()
                        .any(|k| pod.namespace().unwrap_or_default().starts_with(k.as_str()))
                };
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) if ours(&pod) => {
                        let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                        let mut seen = supers.lock().expect("lock");
                        seen.uids
                            .entry(name)
                            .or_default()
                            .insert(pod.uid().unwrap_or_default());
                    }
                    Ok(watcher::Event::Delete(pod)) if ours(&pod) => {
                        let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                        supers.lock().expect("lock").deleted.push(name);
                    }
                    _ => {}
                }
            }
        }
    });

    for name in tenancy.names() {
        seed(tenancy.tenant(&name), "burst").await?;
    }

    // The replica with the most tenants dies half-way through the burst.
    let victim = share
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(r, _)| (*r).to_owned())
        .context("a replica")?;
    let victims_tenants: Vec<String> = settled
        .iter()
        .filter(|(_, on)| on[0] == victim)
        .map(|(k, _)| k.clone())
        .collect();
    let replicas = Arc::new(Mutex::new(replicas));
    let monitor = tokio::spawn({
        let (replicas, overlaps) = (replicas.clone(), overlaps.clone());
        async move {
            loop {
                let now = attached(&replicas.lock().expect("lock"));
                for (key, on) in now {
                    if on.len() > 1 {
                        overlaps.lock().expect("lock").push(format!("{key} on {on:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    let mut creates = Vec::new();
    for name in tenancy.names() {
        let client = tenancy.tenant(&name).client();
        creates.push(tokio::spawn(async move {
            for i in 0..PODS_PER_TENANT {
                create::<Pod>(
                    &client,
                    Some("burst"),
                    pod_json(&format!("p-{i}"), json!({"app": "burst"}), "busybox"),
                )
                .await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(100 * PODS_PER_TENANT as u64 / 2)).await;
    let killed_at = Instant::now();
    // A crash: its tasks end where they are; its Leases are neither released nor deleted.
    drop(replicas.lock().expect("lock").remove(&victim));
    println!("killed {victim} holding {victims_tenants:?}");
    for create in creates {
        create.await??;
    }

    let moved = wait::until(
        PATIENCE,
        "the killed replica's tenants attached elsewhere",
        || {
            let now = attached(&replicas.lock().expect("lock"));
            let victims_tenants = &victims_tenants;
            async move {
                victims_tenants
                    .iter()
                    .all(|k| now.get(k).is_some_and(|on| on.len() == 1))
                    .then(|| killed_at.elapsed())
            }
        },
    )
    .await?;
    println!(
        "the killed replica's {} tenants attached elsewhere {:.1} s after the kill (Lease duration 6 s)",
        victims_tenants.len(),
        moved.as_secs_f64()
    );

    // Every tenant pod reaches the super cluster and runs; its status comes back up.
    for name in tenancy.names() {
        let tenant = tenancy.tenant(&name);
        let super_pods: Api<Pod> = Api::namespaced(tenancy.super_client(), &tenant.super_namespace("burst"));
        let tenant_pods: Api<Pod> = Api::namespaced(tenant.client(), "burst");
        wait::until(
            PATIENCE,
            &format!("{name}: every pod in the super cluster and Running in the tenant"),
            || {
                let (super_pods, tenant_pods) = (super_pods.clone(), tenant_pods.clone());
                async move {
                    let supers = super_pods.list(&ListParams::default()).await.ok()?;
                    let tenants = tenant_pods.list(&ListParams::default()).await.ok()?;
                    let running = tenants
                        .items
                        .iter()
                        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                        .count();
                    (supers.items.len() == PODS_PER_TENANT && running == PODS_PER_TENANT).then_some(())
                }
            },
        )
        .await?;
    }
    monitor.abort();
    super_watch.abort();

    let overlaps = overlaps.lock().expect("lock").clone();
    if !overlaps.is_empty() {
        bail!("tenants attached on two replicas at once: {overlaps:?}");
    }
    {
        // Checked in a block: the lock is not held across the awaits below.
        let seen = supers.lock().expect("lock");
        assert!(seen.deleted.is_empty(), "super pods deleted: {:?}", seen.deleted);
        assert_eq!(seen.uids.len(), TENANTS * PODS_PER_TENANT, "super pods seen");
        let recreated: Vec<&String> = seen
            .uids
            .iter()
            .filter(|(_, u)| u.len() != 1)
            .map(|(n, _)| n)
            .collect();
        assert!(
            recreated.is_empty(),
            "super pods created more than once: {recreated:?}"
        );
    }

    // The survivors hold every tenant, by Lease and by attachment, and no super namespace is going away.
    let holders = lease_holders(&tenancy).await?;
    let now = attached(&replicas.lock().expect("lock"));
    for key in keys.keys() {
        let on = now.get(key).context("attached")?;
        assert_eq!(on.len(), 1);
        assert_ne!(on[0], victim);
        assert_eq!(
            holders.get(key),
            Some(&on[0]),
            "tenant {key}: Lease and attachment disagree"
        );
    }
    let namespaces: Api<Namespace> = Api::all(tenancy.super_client());
    for namespace in namespaces.list(&ListParams::default()).await?.items {
        if keys.keys().any(|k| namespace.name_any().starts_with(k.as_str())) {
            assert!(
                namespace.metadata.deletion_timestamp.is_none(),
                "super namespace {} is being deleted",
                namespace.name_any()
            );
        }
    }
    let counts: HashMap<String, i64> = replicas
        .lock()
        .expect("lock")
        .iter()
        .map(|(n, s)| (n.clone(), s.context.metrics.shards.shard_owned_tenants.get()))
        .collect();
    println!("owned tenants per surviving replica: {counts:?}");

    // A graceful stop hands everything over at once: the last replica takes the tenants without waiting for
    // a Lease to expire, and the stopped replica's membership Lease is gone.
    let (leaving, mut syncer) = {
        let mut replicas = replicas.lock().expect("lock");
        let leaving = replicas.keys().next().cloned().context("a survivor")?;
        let syncer = replicas.remove(&leaving).context("the survivor")?;
        (leaving, syncer)
    };
    let resigned_at = Instant::now();
    syncer.resign().await;
    syncer.stop();
    let taken =
        wait::until(PATIENCE, "the last replica syncs every tenant", || {
            let now = attached(&replicas.lock().expect("lock"));
            let all = keys.len();
            async move {
                (now.len() == all && now.values().all(|on| on.len() == 1)).then(|| resigned_at.elapsed())
            }
        })
        .await?;
    println!(
        "{leaving} resigned; its tenants attached on the last replica {:.1} s later",
        taken.as_secs_f64()
    );
    let members: Api<Lease> = Api::namespaced(tenancy.super_client(), LEASE_NAMESPACE);
    assert!(
        members
            .get_opt(&syncer::tenancy::shards::member_lease_name(&leaving))
            .await?
            .is_none(),
        "the resigned replica's membership Lease is deleted"
    );
    let holders = lease_holders(&tenancy).await?;
    let last = replicas
        .lock()
        .expect("lock")
        .keys()
        .next()
        .cloned()
        .context("the last replica")?;
    assert!(keys.keys().all(|k| holders.get(k) == Some(&last)), "{holders:?}");
    Ok(())
}
