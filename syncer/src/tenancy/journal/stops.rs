//! The stops the journal shows, held against tenants: a predecessor's counted before anything is attached
//! ([`recover`]), another replica's when its tenant is taken over ([`judge`]), and cleared once a tenant
//! stayed attached for the probation ([`probation`]); and the journals of replicas long gone removed
//! ([`collect`]).

use std::{sync::Arc, time::Duration};

use crds::{AttachBackoff, VirtualCluster, wellknown::FIELD_MANAGER_SYNCER_BACKOFF};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
    runtime::events::{Event, EventType, Recorder},
};

use super::{
    JOURNAL_NAME, Journal, Kind, PROBATION_CAP, REASON_STOPPED_WHILE_ATTACHING, Record, Standing, Ticket,
    decide, record_of, stop_message,
};
use crate::{engine::context::Context, tenancy::tenant::Tenant};

/// Whether process `instance` (another replica's) is alive: never without sharding (only one process
/// syncs), else while its replica's membership is.
fn alive(ctx: &Context, instance: &str) -> bool {
    let Some(shards) = ctx.shards.as_ref() else {
        return false;
    };
    let members = crate::tenancy::shards::live_members(&shards.snapshot(), std::time::Instant::now());
    members.values().any(|live| live == instance)
}

/// The VirtualCluster of tenant `key`, as cached.
fn virtual_cluster_of(ctx: &Context, key: &str) -> Option<Arc<VirtualCluster>> {
    ctx.virtual_clusters
        .state()
        .into_iter()
        .find(|vc| crds::naming::cluster_key_of(vc).as_deref() == Some(key))
}

/// Reads this replica's journal as its predecessor left it and counts the stop it shows on every tenant
/// it names (the predecessor stopped without emptying it), before anything is attached. Retries until
/// the super cluster answers. Call once the VirtualClusters are cached.
pub async fn recover(ctx: Arc<Context>, journal: Arc<Journal>, recorder: Arc<Recorder>) {
    let mut failures = 0u32;
    let previous = loop {
        let params = ListParams::default().fields(&format!("metadata.name={}", journal.name));
        match journal.api.list(&params).await {
            Ok(list) => break list.items.first().and_then(record_of),
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(journal = %journal.name, error = &error as &dyn std::error::Error, "reading the attach journal; nothing is attached until it is read");
                }
                tokio::time::sleep(Duration::from_secs(u64::from(failures.min(10)))).await;
            }
        }
    };
    if let Some(previous) = previous.filter(|p| p.instance != journal.instance && !p.attaching.is_empty()) {
        tracing::warn!(
            journal = %journal.name,
            previous = %previous.instance,
            tenants = previous.attaching.len(),
            "the previous syncer process stopped without a clean shutdown while attaching tenants; counting the stop against them"
        );
        for key in previous.attaching.keys() {
            if let Some(vc) = virtual_cluster_of(&ctx, key) {
                let found = decide::evidence([&previous], &journal.instance, key, |_| false);
                count_stops(&ctx, &journal, &recorder, &vc, &found).await;
            }
        }
    }
    journal.recovered.send_replace(true);
}

/// Counts the stops in `found` that `vc` does not show yet; the record as it stands after.
async fn count_stops(
    ctx: &Context,
    journal: &Journal,
    recorder: &Recorder,
    vc: &VirtualCluster,
    found: &[decide::Evidence],
) -> Option<AttachBackoff> {
    let key = crds::naming::cluster_key_of(vc).unwrap_or_default();
    let current = journal.record_of_tenant(&key, vc.status.as_ref().and_then(|s| s.attach_backoff.as_ref()));
    let Some(counted) = decide::count(current.as_ref(), found, Timestamp::now(), journal.settings.policy)
    else {
        return current;
    };
    journal.remember(&key, Some(&counted));
    ctx.metrics.tenancy.attach_stops.inc();
    let message = stop_message(&counted);
    tracing::warn!(vc = %format!("{}/{}", vc.namespace().unwrap_or_default(), vc.name_any()), stops = counted.stops, attached_with = counted.attached_with, instance = counted.instance.as_deref().unwrap_or_default(), "{message}");
    if let Err(error) = write_backoff(ctx, vc, Some(&counted)).await {
        // Held back here all the same; the next replica that finds the stop writes it.
        tracing::warn!(vc = %vc.name_any(), namespace = %vc.namespace().unwrap_or_default(), error = &error as &dyn std::error::Error, "recording status.attachBackoff");
    }
    let event = Event {
        type_: EventType::Warning,
        reason: REASON_STOPPED_WHILE_ATTACHING.into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Attach".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &vc.object_ref(&())).await {
        tracing::debug!(vc = %vc.name_any(), %error, "publishing an event on the VirtualCluster");
    }
    Some(counted)
}

/// Writes (or, `None`, removes) `status.attachBackoff` under its own field manager.
async fn write_backoff(
    ctx: &Context,
    vc: &VirtualCluster,
    record: Option<&AttachBackoff>,
) -> Result<(), kube::Error> {
    let status = match record {
        Some(record) => serde_json::json!({ "attachBackoff": record }),
        None => serde_json::json!({}),
    };
    let patch = serde_json::json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "VirtualCluster",
        "status": status,
    });
    let api: Api<VirtualCluster> =
        Api::namespaced(ctx.super_client.clone(), &vc.namespace().unwrap_or_default());
    let params = PatchParams::apply(FIELD_MANAGER_SYNCER_BACKOFF).force();
    api.patch_status(&vc.name_any(), &params, &Patch::Apply(&patch))
        .await
        .map(|_| ())
}

/// Where a tenant about to be attached stands, and its record: the stops of other processes it was being
/// attached at are counted first (another replica died while attaching it, and this one takes it over).
pub async fn judge(
    ctx: &Context,
    journal: &Journal,
    recorder: &Recorder,
    vc: &VirtualCluster,
) -> (Standing, Option<AttachBackoff>) {
    journal.recovered().await;
    let Some(key) = crds::naming::cluster_key_of(vc) else {
        return (Standing::Attach(Kind::Clear), None);
    };
    let records: Vec<Record> = journal.records().into_iter().map(|(_, r)| r).collect();
    let found = decide::evidence(&records, &journal.instance, &key, |instance| alive(ctx, instance));
    let record = match found.is_empty() {
        true => journal.record_of_tenant(&key, vc.status.as_ref().and_then(|s| s.attach_backoff.as_ref())),
        false => count_stops(ctx, journal, recorder, vc, &found).await,
    };
    (decide::standing(record.as_ref(), Timestamp::now()), record)
}

/// Keeps a newly attached tenant in the journal until its caches have listed and it stayed attached for
/// the probation (at most [`PROBATION_CAP`] probations), then lets it leave; a tenant that made it is
/// cleared of the stops counted against it.
pub fn probation(ctx: Arc<Context>, tenant: Arc<Tenant>, ticket: Ticket) {
    let probation = ticket.journal.settings.probation;
    let journal = ticket.journal.clone();
    tokio::spawn(async move {
        let passed = tokio::time::timeout(probation * PROBATION_CAP, async {
            tenant.listed().await;
            tokio::time::sleep(probation).await;
        })
        .await
        .is_ok();
        drop(ticket);
        let key = tenant.identity.cluster_key.clone();
        let still = ctx
            .tenants
            .get(&key)
            .is_some_and(|current| Arc::ptr_eq(&current, &tenant));
        drop(tenant);
        if !(passed && still) {
            return;
        }
        let Some(vc) = virtual_cluster_of(&ctx, &key) else {
            return;
        };
        let lately = journal.record_of_tenant(&key, None).is_some();
        journal.remember(&key, None);
        if lately || vc.status.as_ref().is_some_and(|s| s.attach_backoff.is_some()) {
            match write_backoff(&ctx, &vc, None).await {
                Ok(()) => {
                    tracing::info!(vc = %format!("{}/{}", vc.namespace().unwrap_or_default(), vc.name_any()), "tenant stayed attached for the probation: the syncer stops counted against it are cleared")
                }
                Err(error) => {
                    tracing::warn!(vc = %vc.name_any(), error = &error as &dyn std::error::Error, "clearing status.attachBackoff")
                }
            }
        }
    });
}

/// Deletes the journals of replicas long gone: their membership Lease was collected (ten Lease durations
/// after they stopped renewing it), by when every tenant they named has been taken over, judged and its
/// stop counted. Run with the cluster-wide duties.
pub async fn collect(ctx: &Context, journal: &Journal) {
    let Some(shards) = ctx.shards.as_ref() else {
        return;
    };
    let observed = shards.snapshot();
    for config_map in journal.journals.state() {
        let name = config_map.name_any();
        let Some(replica) = name.strip_prefix(&format!("{JOURNAL_NAME}-")) else {
            continue;
        };
        if name == journal.name || observed.contains_key(&crate::tenancy::shards::member_lease_name(replica))
        {
            continue;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: config_map.uid(),
                resource_version: config_map.resource_version(),
            }),
            ..Default::default()
        };
        match journal.api.delete(&name, &params).await {
            Ok(_) => tracing::info!(journal = %name, "deleted the attach journal of a replica long gone"),
            Err(error) => tracing::debug!(journal = %name, %error, "deleting a stale attach journal"),
        }
    }
}
