//! The workers that drain the queues: dispatch by kind, measure, retry with backoff.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::Instrument;

use crate::{
    engine::metrics::{Direction, Operation, OperationLabels, ResourceLabels, TenantLabels},
    engine::{
        context::Context,
        items::Item,
        queue::{FairQueue, TenantId, Work},
        write_gate::{Share, on_behalf},
    },
    error::Result,
    resources::{self, Outcome},
    tenancy::tenant::Tenant,
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
    ctx.metrics.engine.operations.get_or_create(&labels).inc();
    ctx.metrics
        .engine
        .operation_duration
        .get_or_create(&ResourceLabels { resource, direction })
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .engine
        .queue_wait
        .get_or_create(&TenantLabels {
            tenant: tenant.identity.vc_ref(),
            direction,
        })
        .observe(work_waited.as_secs_f64());
}

/// Drains the downward queue until it closes.
pub async fn downward(ctx: Arc<Context>, backoff: Arc<Backoff<Item>>) {
    drain(&ctx, Direction::Down, &ctx.queues.down, &backoff).await;
}

/// Drains the upward queue until it closes.
pub async fn upward(ctx: Arc<Context>, backoff: Arc<Backoff<Item>>) {
    drain(&ctx, Direction::Up, &ctx.queues.up, &backoff).await;
}

async fn drain(ctx: &Context, direction: Direction, queue: &FairQueue<Item>, backoff: &Backoff<Item>) {
    while let Some(work) = queue.next().await {
        process(ctx, direction, queue, backoff, &work).await;
        queue.done(&work);
    }
}

/// Syncs one item of `queue`, which flows in `direction`. Only the downward queue rate-limits tenants (by
/// the writes their items make in the super cluster), so only its items are charged.
async fn process(
    ctx: &Context,
    direction: Direction,
    queue: &FairQueue<Item>,
    backoff: &Backoff<Item>,
    work: &Work<Item>,
) {
    let charged = direction == Direction::Down;
    let Some(tenant) = ctx.tenants.get(&work.tenant) else {
        // Detached meanwhile; its items are dropped with it.
        if charged {
            queue.charge(&work.tenant, -1.0);
        }
        return;
    };
    let _in_flight = tenant.in_flight.enter();
    if !tenant.is_ready() {
        if charged {
            queue.charge(&work.tenant, -1.0);
        }
        queue.add_after(&work.tenant, work.item.clone(), NOT_READY_DELAY);
        return;
    }
    let item = &work.item;
    // Whatever the sync logs carries the object it works on, once, from this span.
    let span = tracing::info_span!(
        "sync",
        tenant = %tenant.identity.vc_ref(),
        ?direction,
        kind = %item.kind,
        namespace = %item.namespace,
        name = %item.name,
    );
    let started = Instant::now();
    // Its super writes take from the tenant's share of the write slots.
    let share = Share::tenant(work.tenant.clone(), tenant.settings().weight);
    let result = match direction {
        Direction::Down => {
            on_behalf(
                share,
                resources::sync_down(ctx, &tenant, item).instrument(span.clone()),
            )
            .await
        }
        Direction::Up => {
            on_behalf(
                share,
                resources::sync_up(ctx, &tenant, item).instrument(span.clone()),
            )
            .await
        }
    };
    // No await below: the span may be entered for the logs of the outcome.
    let _entered = span.enter();
    record(
        ctx,
        &tenant,
        work.item.kind.as_str(),
        direction,
        work.waited,
        started,
        &result,
    );
    match result {
        Ok(outcome) => {
            backoff.reset(&(work.tenant.clone(), item.clone()));
            if charged {
                // One token was taken when the item was handed out; settle for the writes actually made.
                queue.charge(&work.tenant, f64::from(outcome.writes()) - 1.0);
            }
            if let Outcome::Waiting { reason, retry_after } = &outcome {
                tracing::debug!(%reason, "waiting");
                if let Some(delay) = retry_after {
                    queue.add_after(&work.tenant, item.clone(), *delay);
                }
            }
        }
        Err(error) => {
            let delay = backoff.failed(&(work.tenant.clone(), item.clone()));
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                retry_in_ms = delay.as_millis() as u64,
                "sync failed"
            );
            queue.add_after(&work.tenant, item.clone(), delay);
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
                    ctx.metrics
                        .engine
                        .queue_depth
                        .get_or_create(&labels)
                        .set(depth as i64);
                }
            }
        }
    }
}
