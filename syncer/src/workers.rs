//! The workers that drain the queues: dispatch by kind, measure, retry with backoff.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Endpoints, PersistentVolumeClaim, Secret, Service, ServiceAccount},
    networking::v1::{Ingress, NetworkPolicy},
    policy::v1::PodDisruptionBudget,
};

use crate::{
    context::Context,
    error::Result,
    items::{DownItem, Kind, UpItem},
    metrics::{Direction, Operation, OperationLabels, ResourceLabels, TenantLabels},
    queue::{TenantId, Work},
    resources::{Outcome, namespace, pod, public, sync_down, up, vnode},
    tenant::Tenant,
};

/// Per-item failure counts, for exponential backoff that resets on success.
pub type Backoff<T> = vc_runtime::backoff::Backoff<(TenantId, T)>;

/// The backoff of one queue's items.
pub fn new_backoff<T: Eq + std::hash::Hash>() -> Backoff<T> {
    Backoff::new(BACKOFF_BASE, BACKOFF_MAX)
}

/// How long items of a tenant whose caches are still filling wait before they are looked at again.
const NOT_READY_DELAY: Duration = Duration::from_millis(300);

const BACKOFF_BASE: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(120);

fn operation(outcome: &Outcome) -> Operation {
    match outcome {
        Outcome::Created { .. } => Operation::Create,
        Outcome::Updated { .. } => Operation::Update,
        Outcome::Deleted => Operation::Delete,
        Outcome::InSync => Operation::None,
        Outcome::Waiting { .. } => Operation::Wait,
    }
}

async fn sync_down_item(ctx: &Context, tenant: &Tenant, item: &DownItem) -> Result<Outcome> {
    match item.kind {
        Kind::Namespace => namespace::sync(ctx, tenant, item).await,
        Kind::Pod => pod::sync(ctx, tenant, item).await,
        Kind::Service => sync_down::<Service>(ctx, tenant, item).await,
        Kind::Endpoints => sync_down::<Endpoints>(ctx, tenant, item).await,
        Kind::ConfigMap => sync_down::<ConfigMap>(ctx, tenant, item).await,
        Kind::Secret => sync_down::<Secret>(ctx, tenant, item).await,
        Kind::ServiceAccount => sync_down::<ServiceAccount>(ctx, tenant, item).await,
        Kind::PersistentVolumeClaim => sync_down::<PersistentVolumeClaim>(ctx, tenant, item).await,
        Kind::Ingress => sync_down::<Ingress>(ctx, tenant, item).await,
        Kind::NetworkPolicy => sync_down::<NetworkPolicy>(ctx, tenant, item).await,
        Kind::PodDisruptionBudget => sync_down::<PodDisruptionBudget>(ctx, tenant, item).await,
    }
}

async fn sync_up_item(ctx: &Context, tenant: &Tenant, item: &UpItem) -> Result<Outcome> {
    match item {
        UpItem::Pod { namespace, name } => up::pod(ctx, tenant, namespace, name).await,
        UpItem::Service { namespace, name } => up::service(ctx, tenant, namespace, name).await,
        UpItem::PersistentVolumeClaim { namespace, name } => up::claim(ctx, tenant, namespace, name).await,
        UpItem::Node { name } => vnode::sync(ctx, tenant, name).await,
        UpItem::PersistentVolume { name } => public::volume(ctx, tenant, name).await,
        UpItem::StorageClass { name } => public::storage_class(ctx, tenant, name).await,
        UpItem::PriorityClass { name } => public::priority_class(ctx, tenant, name).await,
        UpItem::Event { namespace, name } => crate::events::copy_up(ctx, tenant, namespace, name).await,
    }
}

fn record(
    ctx: &Context,
    tenant: &Tenant,
    resource: &'static str,
    direction: Direction,
    work_waited: Duration,
    started: Instant,
    result: &Result<Outcome>,
) {
    let labels = OperationLabels {
        resource,
        direction,
        operation: result.as_ref().map(operation).unwrap_or(Operation::None),
        result: match result {
            Ok(_) => "success",
            Err(error) => error.category(),
        },
    };
    ctx.metrics.operations.get_or_create(&labels).inc();
    ctx.metrics
        .operation_duration
        .get_or_create(&ResourceLabels { resource, direction })
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .queue_wait
        .get_or_create(&TenantLabels {
            tenant: tenant.identity.vc_ref(),
            direction,
        })
        .observe(work_waited.as_secs_f64());
}

/// Drains the downward queue until it closes.
pub async fn downward(ctx: Arc<Context>, backoff: Arc<Backoff<DownItem>>) {
    while let Some(work) = ctx.queues.down.next().await {
        process_down(&ctx, &backoff, &work).await;
        ctx.queues.down.done(&work);
    }
}

async fn process_down(ctx: &Context, backoff: &Backoff<DownItem>, work: &Work<DownItem>) {
    let Some(tenant) = ctx.tenants.get(&work.tenant) else {
        // Detached meanwhile; its items are dropped with it.
        ctx.queues.down.charge(&work.tenant, -1.0);
        return;
    };
    if !tenant.is_ready() {
        ctx.queues.down.charge(&work.tenant, -1.0);
        ctx.queues
            .down
            .add_after(&work.tenant, work.item.clone(), NOT_READY_DELAY);
        return;
    }
    let started = Instant::now();
    let result = sync_down_item(ctx, &tenant, &work.item).await;
    record(
        ctx,
        &tenant,
        work.item.kind.as_str(),
        Direction::Down,
        work.waited,
        started,
        &result,
    );
    match result {
        Ok(outcome) => {
            backoff.reset(&(work.tenant.clone(), work.item.clone()));
            // One token was taken when the item was handed out; settle for the writes actually made.
            ctx.queues
                .down
                .charge(&work.tenant, f64::from(outcome.writes()) - 1.0);
            if let Outcome::Waiting { reason, retry_after } = &outcome {
                tracing::debug!(tenant = %tenant.identity.vc_ref(), kind = %work.item.kind, namespace = %work.item.namespace, name = %work.item.name, reason = %reason, "waiting");
                if let Some(delay) = retry_after {
                    ctx.queues.down.add_after(&work.tenant, work.item.clone(), *delay);
                }
            }
        }
        Err(error) => {
            let delay = backoff.failed(&(work.tenant.clone(), work.item.clone()));
            tracing::warn!(
                tenant = %tenant.identity.vc_ref(),
                kind = %work.item.kind,
                namespace = %work.item.namespace,
                name = %work.item.name,
                error = &error as &dyn std::error::Error,
                retry_in_ms = delay.as_millis() as u64,
                "sync down failed"
            );
            ctx.queues.down.add_after(&work.tenant, work.item.clone(), delay);
        }
    }
}

/// Drains the upward queue until it closes.
pub async fn upward(ctx: Arc<Context>, backoff: Arc<Backoff<UpItem>>) {
    while let Some(work) = ctx.queues.up.next().await {
        process_up(&ctx, &backoff, &work).await;
        ctx.queues.up.done(&work);
    }
}

async fn process_up(ctx: &Context, backoff: &Backoff<UpItem>, work: &Work<UpItem>) {
    let Some(tenant) = ctx.tenants.get(&work.tenant) else {
        return;
    };
    if !tenant.is_ready() {
        ctx.queues
            .up
            .add_after(&work.tenant, work.item.clone(), NOT_READY_DELAY);
        return;
    }
    let started = Instant::now();
    let result = sync_up_item(ctx, &tenant, &work.item).await;
    record(
        ctx,
        &tenant,
        work.item.resource(),
        Direction::Up,
        work.waited,
        started,
        &result,
    );
    match result {
        Ok(outcome) => {
            backoff.reset(&(work.tenant.clone(), work.item.clone()));
            if let Outcome::Waiting {
                retry_after: Some(delay),
                ..
            } = &outcome
            {
                ctx.queues.up.add_after(&work.tenant, work.item.clone(), *delay);
            }
        }
        Err(error) => {
            let delay = backoff.failed(&(work.tenant.clone(), work.item.clone()));
            tracing::warn!(
                tenant = %tenant.identity.vc_ref(),
                item = ?work.item,
                error = &error as &dyn std::error::Error,
                retry_in_ms = delay.as_millis() as u64,
                "sync up failed"
            );
            ctx.queues.up.add_after(&work.tenant, work.item.clone(), delay);
        }
    }
}

/// Publishes queue depths per tenant every second.
pub async fn publish_depths(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        for (queue, direction) in [
            (ctx.queues.down.depths(), Direction::Down),
            (ctx.queues.up.depths(), Direction::Up),
        ] {
            for (id, depth) in queue {
                if let Some(tenant) = ctx.tenants.get(&id) {
                    let labels = TenantLabels {
                        tenant: tenant.identity.vc_ref(),
                        direction,
                    };
                    ctx.metrics.queue_depth.get_or_create(&labels).set(depth as i64);
                }
            }
        }
    }
}
