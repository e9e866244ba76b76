//! A bound on the syncer's in-flight writes to the super cluster, shared by tenant weight.
//!
//! The fair queue keeps tenants apart inside the syncer, but 32 workers can each have a write in flight,
//! and a greedy tenant's burst then waits in the super apiserver's own queue, where every later write (a
//! quiet tenant's included) queues behind it. The [`WriteGate`] holds at most `slots` mutating requests in
//! flight. When none is free, a write waits here instead, and a freed slot goes to the waiting share that
//! holds the least in proportion to its weight (ties: the longest waiting). A quiet tenant therefore gets
//! the next slot that frees, whatever the greedy ones have queued.
//!
//! Every super write passes through it without call-site changes: [`gated`] wraps the syncer's super
//! [`Client`] in a service that gates `POST`, `PUT`, `PATCH` and `DELETE` requests by the share the
//! calling task runs as ([`on_behalf`]; the workers set it per item). Writes outside the workers (attach,
//! patrol, usage) run as the platform's share, with weight [`PLATFORM_WEIGHT`].

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    sync::{Arc, Mutex},
    task::{Context as TaskContext, Poll},
    time::Instant,
};

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::{Client, client::Body};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
use tokio::sync::oneshot;

use crate::engine::queue::TenantId;

/// Weight of the writes made outside the workers (attach, patrol, usage): one tenant's default share.
pub const PLATFORM_WEIGHT: u32 = 1;

/// Whose share of the slots a write is taken from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShareKey {
    /// The syncer's own writes, not made for one tenant's item.
    Platform,
    /// A tenant, by its cluster key.
    Tenant(TenantId),
}

/// A share and its weight (the VirtualCluster's `spec.weight` for a tenant).
#[derive(Clone, Debug)]
pub struct Share {
    /// Whose share.
    pub key: ShareKey,
    /// Its weight, at least 1.
    pub weight: u32,
}

impl Share {
    /// The platform's share.
    pub fn platform() -> Self {
        Self {
            key: ShareKey::Platform,
            weight: PLATFORM_WEIGHT,
        }
    }

    /// A tenant's share.
    pub fn tenant(id: TenantId, weight: u32) -> Self {
        Self {
            key: ShareKey::Tenant(id),
            weight: weight.max(1),
        }
    }

    fn class(&self) -> &'static str {
        match self.key {
            ShareKey::Platform => "platform",
            ShareKey::Tenant(_) => "tenant",
        }
    }
}

tokio::task_local! {
    static CURRENT_SHARE: Share;
}

/// Runs `work` with its super writes taken from `share`.
pub async fn on_behalf<F: Future>(share: Share, work: F) -> F::Output {
    CURRENT_SHARE.scope(share, work).await
}

/// The share the current task writes as: the one [`on_behalf`] set, else the platform's.
pub fn current_share() -> Share {
    CURRENT_SHARE
        .try_with(Share::clone)
        .unwrap_or_else(|_| Share::platform())
}

/// Labels of the super-write slot waits.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotLabels {
    /// `tenant` (a worker's write for a tenant's item) or `platform` (attach, patrol, usage).
    pub class: &'static str,
}

/// The gate's metrics (clones of the registered families).
#[derive(Clone, Debug)]
pub struct GateMetrics {
    /// Seconds writes waited for a slot, by class (`tenant`, `platform`).
    pub wait: Family<SlotLabels, Histogram, fn() -> Histogram>,
    /// Slots held.
    pub in_use: Gauge,
    /// Writes waiting for a slot.
    pub waiting: Gauge,
}

impl Default for GateMetrics {
    fn default() -> Self {
        Self {
            // The syncer's duration buckets: 1 ms to about 2 min.
            wait: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 18))),
            in_use: Gauge::default(),
            waiting: Gauge::default(),
        }
    }
}

impl GateMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "super_write_slot_wait_seconds",
            "Time super writes waited for one of the --super-write-slots, by class (tenant, platform)",
            self.wait.clone(),
        );
        registry.register(
            "super_write_slots_in_use",
            "Super writes in flight (at most --super-write-slots)",
            self.in_use.clone(),
        );
        registry.register(
            "super_write_slot_waiters",
            "Super writes waiting for a slot",
            self.waiting.clone(),
        );
    }
}

struct Waiter {
    seq: u64,
    grant: oneshot::Sender<()>,
}

struct ShareState {
    weight: u32,
    held: usize,
    waiters: VecDeque<Waiter>,
}

struct GateState {
    free: usize,
    shares: HashMap<ShareKey, ShareState>,
    next_seq: u64,
    waiting: usize,
}

/// A weighted-fair semaphore: `slots` permits, a freed one handed to the waiting share with the least
/// held per weight. Free slots exist only while nobody waits.
pub struct WriteGate {
    slots: usize,
    state: Mutex<GateState>,
    metrics: GateMetrics,
}

impl std::fmt::Debug for WriteGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGate")
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl WriteGate {
    /// A gate of `slots` (at least 1).
    pub fn new(slots: usize, metrics: GateMetrics) -> Arc<Self> {
        let slots = slots.max(1);
        Arc::new(Self {
            slots,
            state: Mutex::new(GateState {
                free: slots,
                shares: HashMap::new(),
                next_seq: 0,
                waiting: 0,
            }),
            metrics,
        })
    }

    /// How many slots it has.
    pub fn slots(&self) -> usize {
        self.slots
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Slots held by `key` now (for tests and inspection).
    pub fn held_by(&self, key: &ShareKey) -> usize {
        self.lock().shares.get(key).map_or(0, |s| s.held)
    }

    /// Writes waiting now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Waits for a slot for `share`. The slot is given back when the permit is dropped; a wait that is
    /// dropped (its request cancelled) leaves the line, or passes on a slot granted meanwhile.
    pub async fn acquire(self: &Arc<Self>, share: &Share) -> WritePermit {
        let started = Instant::now();
        let in_line = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let entry = state.shares.entry(share.key.clone()).or_insert(ShareState {
                weight: share.weight,
                held: 0,
                waiters: VecDeque::new(),
            });
            entry.weight = share.weight.max(1);
            if state.free > 0 {
                state.free -= 1;
                entry.held += 1;
                self.metrics.in_use.inc();
                None
            } else {
                let seq = state.next_seq;
                state.next_seq += 1;
                let (grant, granted) = oneshot::channel();
                entry.waiters.push_back(Waiter { seq, grant });
                state.waiting += 1;
                self.metrics.waiting.inc();
                Some((seq, granted))
            }
        };
        if let Some((seq, granted)) = in_line {
            let mut pending = Pending {
                gate: self,
                key: &share.key,
                seq,
                granted: false,
            };
            // The sender lives until its waiter is granted (the slot is then this share's) or taken out of
            // line, which only `Pending` does: the wait ends with a grant.
            let _ = granted.await;
            pending.granted = true;
        }
        self.observe_wait(share, started);
        self.permit(share)
    }

    fn permit(self: &Arc<Self>, share: &Share) -> WritePermit {
        WritePermit {
            gate: self.clone(),
            key: share.key.clone(),
        }
    }

    fn observe_wait(&self, share: &Share, started: Instant) {
        self.metrics
            .wait
            .get_or_create(&SlotLabels { class: share.class() })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Gives back a slot of `key` and hands it on.
    fn release(&self, key: &ShareKey) {
        let mut state = self.lock();
        if let Some(share) = state.shares.get_mut(key) {
            share.held = share.held.saturating_sub(1);
            if share.held == 0 && share.waiters.is_empty() {
                state.shares.remove(key);
            }
        }
        self.metrics.in_use.dec();
        self.hand_on(&mut state);
    }

    /// Gives a free slot to the waiting share with the least held per weight, else keeps it free.
    fn hand_on(&self, state: &mut GateState) {
        loop {
            let next = state
                .shares
                .iter()
                .filter_map(|(key, share)| share.waiters.front().map(|w| (key, share, w.seq)))
                .min_by(|(_, a, a_seq), (_, b, b_seq)| {
                    // held_a / weight_a against held_b / weight_b, without division.
                    let a_load = a.held as u128 * u128::from(b.weight);
                    let b_load = b.held as u128 * u128::from(a.weight);
                    a_load.cmp(&b_load).then(a_seq.cmp(b_seq))
                })
                .map(|(key, _, _)| key.clone());
            let Some(key) = next else {
                state.free += 1;
                return;
            };
            let share = state.shares.get_mut(&key).expect("picked from the map");
            let waiter = share.waiters.pop_front().expect("picked for its waiter");
            state.waiting -= 1;
            self.metrics.waiting.dec();
            share.held += 1;
            if waiter.grant.send(()).is_ok() {
                self.metrics.in_use.inc();
                return;
            }
            // Unreachable while `Pending` removes its waiter before its receiver goes; kept safe anyway.
            share.held -= 1;
            if share.held == 0 && share.waiters.is_empty() {
                state.shares.remove(&key);
            }
        }
    }
}

/// A waiter in line; dropping it before it is granted takes it out of line.
struct Pending<'a> {
    gate: &'a Arc<WriteGate>,
    key: &'a ShareKey,
    seq: u64,
    granted: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut state = self.gate.lock();
        let Some(share) = state.shares.get_mut(self.key) else {
            return;
        };
        if let Some(at) = share.waiters.iter().position(|w| w.seq == self.seq) {
            share.waiters.remove(at);
            if share.held == 0 && share.waiters.is_empty() {
                state.shares.remove(self.key);
            }
            state.waiting -= 1;
            self.gate.metrics.waiting.dec();
            return;
        }
        // Granted, but cancelled before it noticed: the slot is ours to give back.
        drop(state);
        self.gate.release(self.key);
    }
}

/// A held slot, given back when dropped.
#[derive(Debug)]
pub struct WritePermit {
    gate: Arc<WriteGate>,
    key: ShareKey,
}

impl Drop for WritePermit {
    fn drop(&mut self) {
        self.gate.release(&self.key);
    }
}

/// Whether a request changes state in the apiserver (and so takes a slot).
pub fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// The super client behind the gate: writes wait for a slot; reads and watches pass straight through.
#[derive(Clone)]
struct GatedService {
    inner: Client,
    gate: Arc<WriteGate>,
}

impl tower::Service<Request<Body>> for GatedService {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        if !is_write(request.method()) {
            return Box::pin(async move { inner.send(request).await });
        }
        let gate = self.gate.clone();
        // Runs when the caller first polls it, in the caller's task, where its share is set.
        Box::pin(async move {
            let share = current_share();
            // Held until the response head arrives: by then the apiserver has done the write.
            let _permit = gate.acquire(&share).await;
            inner.send(request).await
        })
    }
}

/// `client` with its writes gated by `gate`.
pub fn gated(client: Client, gate: Arc<WriteGate>) -> Client {
    let namespace = client.default_namespace().to_owned();
    Client::new(GatedService { inner: client, gate }, namespace)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn gate(slots: usize) -> Arc<WriteGate> {
        WriteGate::new(slots, GateMetrics::default())
    }

    fn tenant(name: &str, weight: u32) -> Share {
        Share::tenant(Arc::from(name), weight)
    }

    /// Queues one waiter per share in `order` behind a full gate, then frees `releases` slots one by one
    /// (each handed on before the next; first those filling the gate, then the oldest grants, as writes
    /// finish in order), and returns whose waiters got them, in order.
    async fn grant_order(gate: &Arc<WriteGate>, order: &[Share], releases: usize) -> Vec<ShareKey> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut held = Vec::new();
        for _ in 0..gate.slots() {
            held.push(gate.acquire(&Share::platform()).await);
        }
        let mut tasks = Vec::new();
        for share in order {
            let (task_gate, share, tx) = (gate.clone(), share.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let permit = task_gate.acquire(&share).await;
                let _ = tx.send((share.key.clone(), permit));
            }));
            // Line up in this order.
            while gate.waiting() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        let mut granted = Vec::new();
        let mut permits = VecDeque::new();
        for _ in 0..releases {
            if held.pop().is_none() {
                permits.pop_front();
            }
            let (key, permit) = rx.recv().await.expect("a grant");
            granted.push(key);
            permits.push_back(permit);
        }
        drop(held);
        for task in &tasks {
            task.abort();
        }
        granted
    }

    #[tokio::test]
    async fn takes_free_slots_without_waiting_and_bounds_them() {
        let gate = gate(3);
        let a = tenant("a", 1);
        let permits = [
            gate.acquire(&a).await,
            gate.acquire(&a).await,
            gate.acquire(&a).await,
        ];
        assert_eq!(gate.held_by(&a.key), 3);
        let fourth = tokio::time::timeout(Duration::from_millis(50), gate.acquire(&a)).await;
        assert!(fourth.is_err(), "a fourth write must wait for one of three slots");
        assert_eq!(gate.waiting(), 0, "the timed-out wait left the line");
        drop(permits);
        assert_eq!(gate.held_by(&a.key), 0);
        let _again = gate.acquire(&a).await;
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_share_holding_least() {
        let gate = gate(4);
        let (greedy, quiet) = (tenant("greedy", 1), tenant("quiet", 1));
        // The greedy tenant holds every slot and has a backlog of waiters; the quiet one comes last.
        let mut greedy_permits = Vec::new();
        for _ in 0..4 {
            greedy_permits.push(gate.acquire(&greedy).await);
        }
        let mut tasks = Vec::new();
        for share in [&greedy, &greedy, &greedy, &quiet] {
            let (task_gate, share) = (gate.clone(), share.clone());
            tasks.push(tokio::spawn(async move { task_gate.acquire(&share).await }));
            while gate.waiting() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        greedy_permits.pop();
        let quiet_permit = tasks.pop().expect("quiet").await.expect("granted");
        assert_eq!(
            gate.held_by(&quiet.key),
            1,
            "the quiet tenant overtook the backlog"
        );
        assert_eq!(gate.held_by(&greedy.key), 3);
        drop(quiet_permit);
        drop(greedy_permits);
        for task in tasks {
            drop(task.await.expect("granted"));
        }
        assert_eq!(gate.held_by(&greedy.key), 0);
        assert_eq!(gate.waiting(), 0);
    }

    #[tokio::test]
    async fn weights_set_the_shares_of_slots() {
        // Both tenants keep a backlog; as slots free one by one, the weight-3 tenant ends up with three
        // slots for every one of the weight-1 tenant.
        let gate = gate(8);
        let (heavy, light) = (tenant("heavy", 3), tenant("light", 1));
        let mut order = Vec::new();
        for _ in 0..8 {
            order.push(light.clone());
            order.push(heavy.clone());
        }
        let granted = grant_order(&gate, &order, 8).await;
        let heavy_count = granted.iter().filter(|k| **k == heavy.key).count();
        assert_eq!(heavy_count, 6, "grants: {granted:?}");
        assert_eq!(granted.len() - heavy_count, 2);
    }

    #[tokio::test]
    async fn equal_weights_alternate_and_nobody_starves() {
        let gate = gate(2);
        let shares: Vec<Share> = ["a", "b", "c"].iter().map(|n| tenant(n, 1)).collect();
        // Many waiters of `a` first, then one each of `b` and `c`.
        let mut order = vec![shares[0].clone(); 6];
        order.push(shares[1].clone());
        order.push(shares[2].clone());
        let granted = grant_order(&gate, &order, 8).await;
        let first_b = granted
            .iter()
            .position(|k| *k == shares[1].key)
            .expect("b granted");
        let first_c = granted
            .iter()
            .position(|k| *k == shares[2].key)
            .expect("c granted");
        // In arrival order they would come 7th and 8th.
        assert!(
            first_b < 4 && first_c < 4,
            "b and c overtake a's backlog: {granted:?}"
        );
        assert_eq!(granted.iter().filter(|k| **k == shares[0].key).count(), 6);
    }

    #[tokio::test]
    async fn a_heavy_share_cannot_starve_a_light_one() {
        let gate = gate(4);
        let (heavy, light) = (tenant("heavy", 100), tenant("light", 1));
        let mut order = vec![heavy.clone(); 20];
        order.push(light.clone());
        let granted = grant_order(&gate, &order, 21).await;
        assert!(granted.contains(&light.key), "grants: {granted:?}");
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_the_line_and_a_cancelled_grant_is_handed_on() {
        let gate = gate(1);
        let (a, b, c) = (tenant("a", 1), tenant("b", 1), tenant("c", 1));
        let held = gate.acquire(&a).await;
        // Cancelled while waiting: out of line, no slot lost.
        let cancelled = {
            let (gate, b) = (gate.clone(), b.clone());
            tokio::spawn(async move { gate.acquire(&b).await })
        };
        while gate.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        cancelled.abort();
        assert!(cancelled.await.is_err());
        assert_eq!(gate.waiting(), 0);
        // Granted, then cancelled before it ran: the slot goes on to the next waiter.
        let stalled = {
            let (gate, b) = (gate.clone(), b.clone());
            tokio::spawn(async move { gate.acquire(&b).await })
        };
        while gate.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        let next = {
            let (gate, c) = (gate.clone(), c.clone());
            tokio::spawn(async move { gate.acquire(&c).await })
        };
        while gate.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        drop(held);
        // `b` was granted the slot; it is aborted before it takes it.
        stalled.abort();
        let _ = stalled.await;
        let permit = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("c got the slot b never took")
            .expect("granted");
        assert_eq!(gate.held_by(&c.key), 1);
        assert_eq!(gate.held_by(&b.key), 0);
        drop(permit);
        let _again = tokio::time::timeout(Duration::from_secs(5), gate.acquire(&a))
            .await
            .expect("no slot was lost");
    }

    #[tokio::test]
    async fn a_failed_write_gives_its_slot_back() {
        let gate = gate(1);
        let a = tenant("a", 1);
        let failing = async {
            let _permit = gate.acquire(&a).await;
            Err::<(), &str>("the apiserver said no")
        };
        assert!(failing.await.is_err());
        assert_eq!(gate.held_by(&a.key), 0);
        tokio::time::timeout(Duration::from_secs(5), gate.acquire(&a))
            .await
            .expect("the slot came back");
    }

    #[tokio::test]
    async fn the_share_is_the_calling_tasks() {
        assert_eq!(current_share().key, ShareKey::Platform);
        let share = on_behalf(tenant("t", 5), async { current_share() }).await;
        assert_eq!(share.key, ShareKey::Tenant(Arc::from("t")));
        assert_eq!(share.weight, 5);
    }

    #[test]
    fn only_writes_are_gated() {
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(is_write(&method), "{method}");
        }
        for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert!(!is_write(&method), "{method}");
        }
    }

    /// Writes through the syncer's own write path on a gated client wait for a slot; reads do not.
    #[tokio::test]
    async fn super_writes_through_the_client_are_gated() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::Api;

        use crate::{engine::context::testing, resources::write};

        let (client, mut apiserver) = testing::mock();
        let gate = gate(1);
        let (ctx, _) = testing::context(gated(client, gate.clone()));
        let ctx = Arc::new(ctx);
        let config_map = |name: &str| -> ConfigMap {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "ns"}}))
                .expect("a ConfigMap")
        };
        let api: Api<ConfigMap> = Api::namespaced(ctx.super_client.clone(), "ns");

        // A platform write takes the only slot and is not answered yet.
        let first = {
            let (ctx, api, desired) = (ctx.clone(), api.clone(), config_map("first"));
            tokio::spawn(async move { write::apply(&ctx, &api, desired, None).await })
        };
        let first_call = apiserver
            .expect("PATCH", "/api/v1/namespaces/ns/configmaps/first")
            .await;
        assert_eq!(gate.held_by(&ShareKey::Platform), 1);

        // A tenant's write waits in the syncer, not in the apiserver.
        let tenant_share = tenant("team-abc123-vc", 2);
        let second = {
            let (ctx, api, desired) = (ctx.clone(), api.clone(), config_map("second"));
            let share = tenant_share.clone();
            tokio::spawn(async move {
                on_behalf(
                    share,
                    async move { write::apply(&ctx, &api, desired, None).await },
                )
                .await
            })
        };
        while gate.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        apiserver.idle().await;

        // Reads pass while every slot is taken.
        let read = {
            let api = api.clone();
            tokio::spawn(async move { api.get_opt("other").await })
        };
        apiserver
            .expect("GET", "/api/v1/namespaces/ns/configmaps/other")
            .await
            .not_found("configmaps", "other");
        assert!(read.await.expect("read").expect("answered").is_none());

        // The first write's answer frees the slot for the tenant's.
        first_call.echo();
        first.await.expect("first").expect("applied");
        let second_call = apiserver
            .expect("PATCH", "/api/v1/namespaces/ns/configmaps/second")
            .await;
        assert_eq!(gate.held_by(&tenant_share.key), 1);
        assert_eq!(gate.held_by(&ShareKey::Platform), 0);
        // An error answer gives the slot back too.
        second_call.fail(500, "InternalError", "etcd is down");
        assert!(second.await.expect("second").is_err());
        assert_eq!(gate.held_by(&tenant_share.key), 0);
        assert_eq!(gate.waiting(), 0);
        apiserver.idle().await;
    }
}
