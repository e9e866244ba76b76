//! The syncer: one controller that keeps every tenant master and the super cluster in step.
//!
//! Its modules, by concern:
//! - [`cache`]: watch-fed caches of both sides, kept small, and the super cluster's caches.
//! - [`tenancy`]: which tenant owns a super object, attached tenants and their settings, attaching and
//!   detaching them ([`tenancy::attach`]), the attach journal and the shards across replicas.
//! - [`accounting`]: the per-tenant quota ledger and what each tenant consumes.
//! - [`engine`]: the fair queues and the one list of kinds, the flags, the [`Context`], the workers
//!   that drain the queues and the patrol that repairs drift.
//! - [`resources`]: one module per kind, syncing it down (tenant → super) and up (super → tenant).
//! - [`metrics`]: the syncer's series, each subsystem's registered by its own struct; [`error`]: its one
//!   error type.

pub mod accounting;
pub mod cache;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod resources;
pub mod tenancy;
pub mod tokens;

use std::sync::Arc;

use crds::VirtualCluster;
use kube::{
    Api, Client,
    api::ListParams,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::task::JoinHandle;
use vc_runtime::{Runtime, admin::Health};

pub use engine::{
    config::{Args, SyncerArgs, SyncerConfig},
    context::Context,
};
pub use error::{Error, Result};
pub use metrics::Metrics;

use crate::{
    accounting::{quota::Quota, usage},
    cache::{stores, super_stores::SuperStores},
    engine::{patrol, queue::FairQueue, workers, write_gate},
    tenancy::{
        attach, journal, shards,
        tenant::{Queues, Tenants},
    },
};

/// A running syncer. Dropping it (or calling [`Syncer::stop`]) stops every loop.
pub struct Syncer {
    /// Shared state, for inspection (tests, benchmarks).
    pub context: Arc<Context>,
    tasks: Vec<JoinHandle<()>>,
    /// The loops that keep this replica's Leases (sharded replicas): stopped first when it resigns.
    shard_tasks: Vec<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the syncer against the super cluster: caches, tenant supervisors, workers, patrol. Returns
    /// once the super-cluster caches are synced, and marks `health` ready.
    pub async fn start(
        client: Client,
        config: SyncerConfig,
        metrics: Arc<Metrics>,
        health: Health,
    ) -> Result<Self> {
        // Every super write of the syncer goes through the gate, reads and watches do not.
        let client = match config.super_write_slots {
            0 => client,
            slots => write_gate::gated(
                client,
                write_gate::WriteGate::new(slots, metrics.engine.write_slots.clone()),
            ),
        };
        let virtual_clusters: Api<VirtualCluster> = Api::all(client.clone());
        virtual_clusters
            .list(&ListParams::default().limit(1))
            .await
            .map_err(error::on_super(
                "listing VirtualClusters (is the tenancy.x-k8s.io CRD installed?)",
            ))?;

        let queues = Queues {
            down: Arc::new(FairQueue::new()),
            up: Arc::new(FairQueue::new()),
        };
        let tenants = Arc::new(Tenants::default());
        let quota = Arc::new(Quota::new(queues.down.clone(), metrics.quota.clone()));
        let tokens = Arc::new(tokens::Tokens::default());
        let supers = SuperStores::start(&client, &queues, tenants.clone(), quota.clone(), &tokens, &config);
        let (vc_store, vc_writer) = reflector::store();
        let shards = config
            .shards
            .clone()
            .map(|settings| Arc::new(shards::Shards::new(settings)));
        let journal = config.journal.clone().map(|settings| {
            // The shards' process identity when sharded: the journal is read against their membership.
            let (name, instance) = match &shards {
                Some(shards) => (
                    journal::journal_name(Some(&shards.settings.replica_id)),
                    shards.instance().to_owned(),
                ),
                None => (journal::journal_name(None), journal::process_instance()),
            };
            journal::Journal::new(client.clone(), settings, name, instance, metrics.clone())
        });
        let ctx = Arc::new(Context {
            super_client: client,
            config,
            tenants,
            supers,
            tokens,
            virtual_clusters: vc_store,
            queues,
            quota,
            metrics,
            events: Default::default(),
            shards,
            journal,
        });

        let mut tasks = Vec::new();
        let vc_events = watcher(virtual_clusters, watcher::Config::default())
            .default_backoff()
            .modify(stores::trim)
            .reflect(vc_writer);
        ctx.supers.wait_ready().await;
        // Tenants attach once the super caches have listed: no tenant's work can start before, and their
        // lists would otherwise compete with the super cluster's for the syncer's CPU, delaying readiness.
        // (Started here rather than waiting on its own: a store wakes only the last of concurrent waiters.)
        tasks.push(tokio::spawn(attach::supervise(ctx.clone(), vc_events)));
        let _ = ctx.virtual_clusters.wait_until_ready().await;
        if let Some(journal) = ctx.journal.clone() {
            // Before any tenant is attached (attaching waits for it): the stop a predecessor left in the
            // journal is counted first, on the VirtualClusters just cached.
            tasks.push(tokio::spawn(journal::stops::recover(
                ctx.clone(),
                journal,
                Arc::new(attach::recorder(&ctx)),
            )));
        }

        ctx.queues.down.set_workers(ctx.config.downward_workers);
        ctx.queues.up.set_workers(ctx.config.upward_workers);
        let down_backoff = Arc::new(workers::new_backoff());
        for _ in 0..ctx.config.downward_workers {
            tasks.push(tokio::spawn(workers::downward(ctx.clone(), down_backoff.clone())));
        }
        let up_backoff = Arc::new(workers::new_backoff());
        for _ in 0..ctx.config.upward_workers {
            tasks.push(tokio::spawn(workers::upward(ctx.clone(), up_backoff.clone())));
        }
        tasks.push(tokio::spawn(patrol::run(ctx.clone())));
        tasks.push(tokio::spawn(tokens::renewal::run(
            ctx.tokens.clone(),
            ctx.queues.down.clone(),
        )));
        tasks.push(tokio::spawn(resources::event::forward(ctx.clone())));
        tasks.push(tokio::spawn(workers::publish_depths(ctx.clone())));
        tasks.push(tokio::spawn(usage::run(ctx.clone())));
        let mut shard_tasks = Vec::new();
        if let Some(shards) = ctx.shards.clone() {
            // After the VirtualClusters are listed: the assignment places every one of them.
            shard_tasks.push(tokio::spawn(shards::watch_leases(
                ctx.super_client.clone(),
                shards.clone(),
            )));
            shard_tasks.push(tokio::spawn(shards::keep_membership(
                ctx.super_client.clone(),
                shards.clone(),
            )));
            shard_tasks.push(tokio::spawn(shards::handover::guard_membership(
                ctx.clone(),
                shards.clone(),
                attach::AttachHandover::new(ctx.clone()),
            )));
            shard_tasks.push(tokio::spawn(shards::handover::balance(
                ctx.clone(),
                shards.clone(),
                attach::AttachHandover::new(ctx.clone()),
            )));
            tracing::info!(replica = %shards.settings.replica_id, instance = %shards.instance(), "sharding tenants across replicas");
        }
        health.set_ready(true);
        tracing::info!("syncer ready: super-cluster caches synced");
        Ok(Self {
            context: ctx,
            tasks,
            shard_tasks,
        })
    }

    /// Hands every tenant over before stopping (sharded replicas; nothing to do otherwise): the others take
    /// them at once instead of after this replica's Leases expire. Call before [`Syncer::stop`] on a
    /// graceful stop; a replica that crashes (or is dropped) leaves its Leases to expire.
    pub async fn resign(&mut self) {
        for task in self.shard_tasks.drain(..) {
            task.abort();
        }
        if let Some(shards) = self.context.shards.clone() {
            let hands = attach::AttachHandover::new(self.context.clone());
            shards::handover::resign(&self.context, &shards, &hands).await;
        }
        // A clean stop: the tenants being attached are not to blame for it.
        if let Some(journal) = self.context.journal.clone() {
            journal.close().await;
        }
    }

    /// Stops every loop and detaches every tenant.
    pub fn stop(&mut self) {
        self.context.queues.down.close();
        self.context.queues.up.close();
        for task in self.shard_tasks.drain(..).chain(self.tasks.drain(..)) {
            task.abort();
        }
        for tenant in self.context.tenants.all() {
            attach::detach(&self.context, &tenant.identity.cluster_key);
        }
        // Dropped without `resign` (an embedding that stops it, a test): emptied the same, best effort.
        if let Some(journal) = self.context.journal.clone() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) if !journal.closed() => {
                    runtime.spawn(async move { journal.close().await });
                }
                _ => journal.abort(),
            }
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Name of the syncer's leader-election Lease.
pub const LEASE_NAME: &str = "vc-syncer";

/// Runs the syncer on `runtime` until it is asked to stop. With leader election, the syncer starts once
/// this replica holds the Lease and stops (cleanly, like on a signal) when it loses it.
pub async fn run(mut runtime: Runtime, config: SyncerConfig) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    metrics.register(runtime.registry_mut());
    let (client, health, shutdown, lease) = (
        runtime.client(),
        runtime.health(),
        runtime.shutdown(),
        runtime.lease(),
    );
    runtime
        .run(async move {
            let mut leadership = match lease {
                Some(lease) => tokio::select! {
                    acquired = lease.acquire() => Some(acquired?),
                    () = shutdown.requested() => return Ok(()),
                },
                None => None,
            };
            let mut syncer = Syncer::start(client, config, metrics, health.clone()).await?;
            match leadership.as_mut() {
                Some(leadership) => tokio::select! {
                    () = shutdown.requested() => {}
                    error = leadership.lost() => tracing::error!(
                        error = &error as &dyn std::error::Error,
                        "stopping: leadership lost"
                    ),
                },
                None => shutdown.requested().await,
            }
            health.set_ready(false);
            syncer.resign().await;
            syncer.stop();
            Ok(())
        })
        .await
}
