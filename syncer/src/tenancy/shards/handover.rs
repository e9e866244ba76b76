//! What a replica does as tenant Leases change hands: it attaches the tenants the assignment gives it and
//! detaches the others (waiting for their work in progress before it lets their Leases go), runs the
//! cluster-wide duties while it holds them, and stops everything when its membership lapses. What follows
//! from a change of hands (stopping a tenant, removing a deleted one's namespaces, the duties' chores) it
//! asks of a [`Handover`], which the layers above implement.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, ResourceExt};

use super::*;
use crate::{engine::context::Context, tenancy::shards::metrics::HandoverLabels};

/// Keeps this replica's share of the tenants: takes the Leases the assignment gives it, hands over the
/// others, stops everything when the membership lapses. Looks every renew period and whenever a Lease
/// changes.
pub async fn balance(ctx: Arc<Context>, shards: Arc<Shards>, hands: impl Handover) {
    let leases = Leases {
        api: Api::namespaced(ctx.super_client.clone(), &shards.settings.namespace),
        shards: shards.clone(),
    };
    let mut tick = tokio::time::interval(shards.settings.renew_period());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shards.wake.notified() => {}
        }
        balance_once(&ctx, &leases, &hands).await;
    }
}

/// Stops every tenant as soon as the membership lapses: a loop of its own, so that no slow request of the
/// others can hold it past the renew deadline.
pub async fn guard_membership(ctx: Arc<Context>, shards: Arc<Shards>, hands: impl Handover) {
    loop {
        let wake = shards.membership.notified();
        let mut wake = std::pin::pin!(wake);
        wake.as_mut().enable();
        match shards.valid_until() {
            Some(until) if Instant::now() < until => {
                tokio::select! {
                    () = tokio::time::sleep_until(until.into()) => {}
                    () = wake => {}
                }
            }
            _ => {
                let dropped = drop_everything(&ctx, &shards, &hands);
                if dropped > 0 {
                    tracing::error!(
                        tenants = dropped,
                        "membership not renewed within the renew deadline: stopped syncing every tenant before another replica may take them"
                    );
                    publish(&ctx, &shards, 0);
                }
                wake.await;
            }
        }
    }
}

/// One look at the assignment: what `balance` does each time.
pub(super) async fn balance_once(ctx: &Context, leases: &Leases, hands: &impl Handover) {
    let shards = &leases.shards;
    let now = Instant::now();
    if !shards.member_at(now) {
        // `guard_membership` has stopped everything.
        publish(ctx, shards, 0);
        return;
    }
    if !shards.listed.load(Ordering::Acquire) {
        return;
    }
    // Replicas started together (a new Deployment) see each other within a renew period: waiting that long
    // spares taking every tenant and handing most of them over again.
    if shards
        .joined
        .get()
        .is_some_and(|joined| now.saturating_duration_since(*joined) < shards.settings.renew_period())
    {
        return;
    }
    let observed = shards.snapshot();
    let mut live = live_members(&observed, now);
    live.insert(shards.settings.replica_id.clone(), shards.instance.clone());
    let members: Vec<&str> = live.keys().map(String::as_str).collect();
    let instances: HashSet<&str> = live.values().map(String::as_str).collect();
    let tenants: Vec<Placed> = ctx
        .virtual_clusters
        .state()
        .iter()
        .filter_map(|vc| {
            Some(Placed {
                key: crds::naming::cluster_key_of(vc)?,
                // Within the platform's ceiling, as the queues weigh it (`TenantSettings::within`).
                weight: u64::from(vc.spec.weight.clamp(1, ctx.config.limits.max_weight.max(1))),
            })
        })
        .collect();
    let owners = assign(&tenants, &members);
    let me = shards.settings.replica_id.as_str();

    let mut handovers = Vec::new();
    for (key, owner) in &owners {
        let name = tenant_lease_name(key);
        let lease = observed.get(&name).map(|o| &*o.lease);
        let holding = shards.holds(key);
        match step(&shards.instance, owner == me, lease, holding, &instances) {
            Step::Hold => {
                if shards.grant(key) {
                    handover(ctx, "acquired");
                }
            }
            Step::Create => match leases.create(&name, ROLE_TENANT, Some(key)).await {
                Ok(_) => acquired(ctx, shards, key, "acquired"),
                Err(error) => lease_write_failed(&name, "creating", &error),
            },
            Step::Take { expired } => {
                if let Some(lease) = lease {
                    match leases.take(lease).await {
                        Ok(_) => {
                            let reason = if expired { "taken_over" } else { "acquired" };
                            acquired(ctx, shards, key, reason);
                        }
                        Err(error) => lease_write_failed(&name, "taking", &error),
                    }
                }
            }
            Step::HandOver => handovers.push((key.clone(), lease.cloned())),
            Step::Lost => lost(ctx, shards, hands, key),
            Step::Wait | Step::Nothing => {}
        }
    }
    // Tenants whose VirtualCluster is gone and whose Lease this replica holds: it was their owner, so it
    // removes their super namespaces (as a single syncer does when a VirtualCluster is deleted) and their
    // Lease.
    let mut gone: HashSet<String> = shards.held().into_iter().collect();
    gone.extend(
        observed
            .values()
            .filter(|o| {
                role(&o.lease) == Some(ROLE_TENANT) && holder(&o.lease) == Some(shards.instance.as_str())
            })
            .filter_map(|o| o.lease.annotations().get(ANNOTATION_CLUSTER).cloned()),
    );
    gone.retain(|key| !owners.contains_key(key));
    for key in gone {
        shards.revoke(&key);
        hands.stop(&key);
        tracing::info!(cluster_key = %key, "tenant deleted; removing its super namespaces");
        hands.remove(&key).await;
        if let Some(lease) = observed.get(&tenant_lease_name(&key)) {
            delete_lease(leases, &lease.lease).await;
        }
    }
    futures::future::join_all(
        handovers
            .into_iter()
            .map(|(key, lease)| hand_over(ctx, leases, hands, key, lease)),
    )
    .await;

    let duties_ours = first_choice(&members, DUTIES_KEY) == Some(me);
    let duties_lease = observed.get(DUTIES_LEASE).map(|o| &*o.lease);
    match step(
        &shards.instance,
        duties_ours,
        duties_lease,
        shards.runs_duties(),
        &instances,
    ) {
        Step::Hold => {
            if !shards.runs_duties() {
                start_duties(shards);
            }
        }
        Step::Create => match leases.create(DUTIES_LEASE, ROLE_DUTIES, None).await {
            Ok(_) => start_duties(shards),
            Err(error) => lease_write_failed(DUTIES_LEASE, "creating", &error),
        },
        Step::Take { .. } => {
            if let Some(lease) = duties_lease {
                match leases.take(lease).await {
                    Ok(_) => start_duties(shards),
                    Err(error) => lease_write_failed(DUTIES_LEASE, "taking", &error),
                }
            }
        }
        Step::HandOver => {
            shards.duties.store(false, Ordering::Release);
            if let Some(lease) = duties_lease.filter(|l| holder(l) == Some(shards.instance.as_str())) {
                release_lease(leases, lease).await;
            }
        }
        Step::Lost => {
            shards.duties.store(false, Ordering::Release);
            tracing::warn!("another replica took the cluster-wide duties");
        }
        Step::Wait | Step::Nothing => {}
    }
    if shards.runs_duties() {
        collect_stale_leases(leases, &observed, &owners, &instances).await;
        hands.run_duties().await;
    }
    publish(ctx, shards, live.len());
}

fn start_duties(shards: &Shards) {
    // Under the lock `drop_everything` takes, so a lapse in between is not undone.
    let held = shards.lock_held();
    if !shards.member_at(Instant::now()) {
        return;
    }
    shards.duties.store(true, Ordering::Release);
    drop(held);
    tracing::info!(replica = %shards.settings.replica_id, "running the cluster-wide duties");
}

fn acquired(ctx: &Context, shards: &Shards, key: &str, reason: &'static str) {
    // Taken while the membership was valid; if it lapsed meanwhile, the next look drops it again.
    shards.grant(key);
    handover(ctx, reason);
    tracing::info!(cluster_key = %key, replica = %shards.settings.replica_id, reason, "tenant Lease acquired");
}

fn lost(ctx: &Context, shards: &Shards, hands: &impl Handover, key: &str) {
    shards.revoke(key);
    hands.stop(key);
    handover(ctx, "lost");
    tracing::warn!(cluster_key = %key, "tenant Lease now held by another replica; stopped syncing the tenant");
}

fn handover(ctx: &Context, reason: &'static str) {
    ctx.metrics
        .shards
        .shard_handovers
        .get_or_create(&HandoverLabels { reason })
        .inc();
}

fn lease_write_failed(name: &str, doing: &str, error: &kube::Error) {
    match conflict(error) {
        // Another replica was quicker, or our view is behind: the watch brings the news.
        true => tracing::debug!(lease = %name, %error, "{doing} a Lease: changed meanwhile"),
        false => tracing::warn!(lease = %name, error = error as &dyn std::error::Error, "{doing} a Lease"),
    }
}

/// Detaches a tenant this replica should no longer sync, waits (at most a renew period) for its in-flight
/// work, and releases its Lease.
async fn hand_over(ctx: &Context, leases: &Leases, hands: &impl Handover, key: String, lease: Option<Lease>) {
    let shards = &leases.shards;
    shards.revoke(&key);
    let tenant = ctx.tenants.get(&key);
    hands.stop(&key);
    if let Some(tenant) = tenant
        && tokio::time::timeout(shards.settings.renew_period(), tenant.in_flight.idle())
            .await
            .is_err()
    {
        tracing::warn!(cluster_key = %key, in_flight = tenant.in_flight.count(), "handing over a tenant whose work is still in flight after a renew period");
    }
    if let Some(lease) = lease.filter(|l| holder(l) == Some(shards.instance.as_str())) {
        release_lease(leases, &lease).await;
    }
    handover(ctx, "released");
    tracing::info!(cluster_key = %key, "tenant handed over");
}

async fn release_lease(leases: &Leases, lease: &Lease) {
    if let Err(error) = leases.release(lease).await {
        lease_write_failed(&lease.name_any(), "releasing", &error);
    }
}

async fn delete_lease(leases: &Leases, lease: &Lease) {
    if let Err(error) = leases.delete(lease).await {
        lease_write_failed(&lease.name_any(), "deleting", &error);
    }
}

/// Deletes tenant Leases of VirtualClusters that no longer exist, once nobody live holds them (their owner
/// deletes them itself; these are left by replicas that died meanwhile), and membership Leases of replicas
/// long gone.
async fn collect_stale_leases(
    leases: &Leases,
    observed: &HashMap<String, Observed>,
    owners: &std::collections::BTreeMap<String, String>,
    live: &HashSet<&str>,
) {
    let now = Instant::now();
    for seen in observed.values() {
        let lease = &seen.lease;
        let unheld = holder(lease).is_none_or(|h| !live.contains(h));
        let stale = match role(lease) {
            Some(ROLE_TENANT) => {
                let key = lease.annotations().get(ANNOTATION_CLUSTER);
                unheld && key.is_none_or(|k| !owners.contains_key(k))
            }
            // A member gone for ten of its durations (a scaled-down Deployment's pod names never return).
            Some(ROLE_MEMBER) => {
                unheld && now.saturating_duration_since(seen.since) > duration_of(lease) * 10
            }
            _ => false,
        };
        if stale {
            delete_lease(leases, lease).await;
        }
    }
}

/// Stops syncing everything at once (membership lapsed); returns how many tenants were dropped.
pub(super) fn drop_everything(ctx: &Context, shards: &Shards, hands: &impl Handover) -> usize {
    let keys = {
        let mut held = shards.lock_held();
        if shards.member_at(Instant::now()) {
            // Renewed meanwhile.
            return 0;
        }
        shards.duties.store(false, Ordering::Release);
        let keys: Vec<String> = held.drain().collect();
        drop(held);
        if !keys.is_empty() {
            shards.changes.send_modify(|v| *v += 1);
        }
        keys
    };
    for key in &keys {
        hands.stop(key);
        handover(ctx, "lost");
    }
    keys.len()
}

fn publish(ctx: &Context, shards: &Shards, members: usize) {
    let metrics = &ctx.metrics;
    metrics
        .shards
        .shard_owned_tenants
        .set(i64::try_from(shards.lock_held().len()).unwrap_or(i64::MAX));
    metrics
        .shards
        .shard_members
        .set(i64::try_from(members).unwrap_or(i64::MAX));
    metrics.shards.shard_duties.set(i64::from(shards.runs_duties()));
}

/// Hands everything over before this replica stops (a graceful shutdown): detaches every tenant, waits for
/// in-flight work, releases the Leases and deletes the membership Lease, so the others take over at once
/// rather than after the Leases expire.
pub async fn resign(ctx: &Context, shards: &Arc<Shards>, hands: &impl Handover) {
    let leases = Leases {
        api: Api::namespaced(ctx.super_client.clone(), &shards.settings.namespace),
        shards: shards.clone(),
    };
    let observed = shards.snapshot();
    let keys = shards.held();
    futures::future::join_all(keys.into_iter().map(|key| {
        let lease = observed.get(&tenant_lease_name(&key)).map(|o| (*o.lease).clone());
        hand_over(ctx, &leases, hands, key, lease)
    }))
    .await;
    if shards.runs_duties() {
        shards.duties.store(false, Ordering::Release);
        if let Some(lease) = observed.get(DUTIES_LEASE) {
            release_lease(&leases, &lease.lease).await;
        }
    }
    shards.lapse();
    if let Some(member) = observed.get(&member_lease_name(&shards.settings.replica_id))
        && holder(&member.lease) == Some(shards.instance.as_str())
    {
        delete_lease(&leases, &member.lease).await;
    }
    publish(ctx, shards, 0);
    tracing::info!(replica = %shards.settings.replica_id, "resigned: every tenant handed over");
}
