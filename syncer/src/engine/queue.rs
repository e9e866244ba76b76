//! Work queues keyed per tenant and dequeued by smooth weighted round-robin, so that one tenant's burst
//! cannot starve another.
//!
//! Each tenant has its own FIFO. An item is queued at most once (adding a queued item is a no-op) and
//! processed by at most one worker at a time (adding an item while it is processed queues it again once
//! it is done), like client-go's workqueue. A tenant may carry a token bucket: its items are only handed
//! out while it has tokens, so a rate-limited tenant waits in the queue without holding a worker.
//!
//! The rate limiter is part of the queue rather than a separate crate's limiter because eligibility for
//! the round-robin depends on it: a worker must never block on one tenant's bucket while others have work.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, HashSet, VecDeque},
    hash::Hash,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

/// Tenants are identified by their cluster key.
pub type TenantId = Arc<str>;

/// A token bucket: `rate` tokens per second up to `burst`. Tokens may go negative (debt) when one item
/// makes several writes; the tenant then waits until the debt is paid.
#[derive(Clone, Debug)]
struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(qps: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: f64::from(qps.max(1)),
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
    }

    fn ready_at(&self, now: Instant) -> Instant {
        if self.tokens >= 1.0 {
            now
        } else {
            now + Duration::from_secs_f64((1.0 - self.tokens) / self.rate)
        }
    }
}

#[derive(Debug)]
struct SubQueue<T> {
    weight: i64,
    current: i64,
    fifo: VecDeque<(T, Instant)>,
    queued: HashSet<T>,
    processing: HashSet<T>,
    dirty: HashSet<T>,
    bucket: Option<TokenBucket>,
}

impl<T> SubQueue<T> {
    fn new(weight: u32) -> Self {
        Self {
            weight: i64::from(weight.max(1)),
            current: 0,
            fifo: VecDeque::new(),
            queued: HashSet::new(),
            processing: HashSet::new(),
            dirty: HashSet::new(),
            bucket: None,
        }
    }
}

struct Delayed<T> {
    at: Instant,
    tenant: TenantId,
    item: T,
}

#[derive(Default)]
struct State<T> {
    tenants: HashMap<TenantId, SubQueue<T>>,
    delayed: BinaryHeap<Reverse<(Instant, u64)>>,
    delayed_items: HashMap<u64, Delayed<T>>,
    next_seq: u64,
    closed: bool,
    /// Workers draining the queue; with more than one tenant busy, each is held to its share of them.
    workers: usize,
}

/// An item handed to a worker. Give it back with [`FairQueue::done`].
#[derive(Debug, Clone)]
pub struct Work<T> {
    /// The tenant it belongs to.
    pub tenant: TenantId,
    /// The item.
    pub item: T,
    /// How long it waited in the queue.
    pub waited: Duration,
}

/// Room a queue keeps however empty it gets.
const KEPT_ROOM: usize = 64;

/// Hash tables and deques keep the room their largest burst gave them; one that has drained to under a
/// quarter of its room gives the rest back (to twice what it holds), so a burst of thousands of pods costs
/// nothing once it is through. Shrinking copies what is left, at most a quarter of the room: amortized
/// over the removals that emptied it.
macro_rules! give_back_room {
    ($collection:expr) => {{
        let collection = &mut $collection;
        if collection.capacity() > KEPT_ROOM && collection.len() < collection.capacity() / 4 {
            collection.shrink_to((collection.len() * 2).max(KEPT_ROOM));
        }
    }};
}

/// Workers kept for tenants with nothing in progress: an eighth of them (none below eight workers).
fn reserve(workers: usize) -> usize {
    workers / 8
}

/// A fair, deduplicating, per-tenant rate-limited work queue.
pub struct FairQueue<T> {
    state: Mutex<State<T>>,
    wake: Notify,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                tenants: HashMap::new(),
                delayed: BinaryHeap::new(),
                delayed_items: HashMap::new(),
                next_seq: 0,
                closed: false,
                workers: 0,
            }),
            wake: Notify::new(),
        }
    }
}

impl<T: Clone + Eq + Hash> FairQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells the queue how many workers drain it. While several tenants have work, none gets more than
    /// its weighted share of them, so a tenant whose items are slow (an apiserver that hangs) cannot hold
    /// every worker; and an eighth of them is kept for tenants with nothing in progress, so a quiet
    /// tenant's item does not wait for a busy one's to finish. `0` (the default) sets no cap.
    pub fn set_workers(&self, workers: usize) {
        self.lock().workers = workers;
    }

    /// Registers a tenant (or updates it) with its weight and optional `(qps, burst)` limit.
    pub fn configure_tenant(&self, tenant: &TenantId, weight: u32, rate_limit: Option<(u32, u32)>) {
        let now = Instant::now();
        let mut state = self.lock();
        let sub = state
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| SubQueue::new(weight));
        sub.weight = i64::from(weight.max(1));
        match (rate_limit, &mut sub.bucket) {
            (None, bucket) => *bucket = None,
            (Some((qps, burst)), Some(bucket)) => {
                bucket.refill(now);
                bucket.rate = f64::from(qps.max(1));
                bucket.burst = f64::from(burst.max(1));
                bucket.tokens = bucket.tokens.min(bucket.burst);
            }
            (Some((qps, burst)), bucket @ None) => *bucket = Some(TokenBucket::new(qps, burst, now)),
        }
        drop(state);
        self.wake.notify_waiters();
    }

    /// Forgets a tenant and everything queued for it.
    pub fn remove_tenant(&self, tenant: &TenantId) {
        let mut state = self.lock();
        state.tenants.remove(tenant);
        let stale: Vec<u64> = state
            .delayed_items
            .iter()
            .filter(|(_, d)| &d.tenant == tenant)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in stale {
            state.delayed_items.remove(&seq);
        }
    }

    /// Queues `item` for `tenant` (registering the tenant with weight 1 if unknown).
    pub fn add(&self, tenant: &TenantId, item: T) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        Self::enqueue(&mut state, tenant, item, Instant::now());
        drop(state);
        self.wake.notify_one();
    }

    fn enqueue(state: &mut State<T>, tenant: &TenantId, item: T, now: Instant) {
        let sub = state
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| SubQueue::new(1));
        if sub.processing.contains(&item) {
            sub.dirty.insert(item);
        } else if sub.queued.insert(item.clone()) {
            sub.fifo.push_back((item, now));
        }
    }

    /// Queues `item` after `delay`.
    pub fn add_after(&self, tenant: &TenantId, item: T, delay: Duration) {
        if delay.is_zero() {
            return self.add(tenant, item);
        }
        let mut state = self.lock();
        if state.closed {
            return;
        }
        let at = Instant::now() + delay;
        let seq = state.next_seq;
        state.next_seq += 1;
        state.delayed.push(Reverse((at, seq)));
        state.delayed_items.insert(
            seq,
            Delayed {
                at,
                tenant: tenant.clone(),
                item,
            },
        );
        drop(state);
        self.wake.notify_one();
    }

    /// Charges `tokens` more writes to a tenant's bucket (beyond the one taken when its item was handed
    /// out), or refunds with a negative number.
    pub fn charge(&self, tenant: &TenantId, tokens: f64) {
        let mut state = self.lock();
        if let Some(bucket) = state.tenants.get_mut(tenant).and_then(|s| s.bucket.as_mut()) {
            bucket.tokens = (bucket.tokens - tokens).min(bucket.burst);
        }
        drop(state);
        if tokens < 0.0 {
            self.wake.notify_one();
        }
    }

    /// Marks a handed-out item finished; if it was added again meanwhile, it is queued again.
    pub fn done(&self, work: &Work<T>) {
        let mut state = self.lock();
        let Some(sub) = state.tenants.get_mut(&work.tenant) else {
            return;
        };
        sub.processing.remove(&work.item);
        if sub.dirty.remove(&work.item) && sub.queued.insert(work.item.clone()) {
            sub.fifo.push_back((work.item.clone(), Instant::now()));
        }
        drop(state);
        // A finished item may lift a tenant back under its share of the workers.
        self.wake.notify_one();
    }

    /// Stops handing out work; [`next`](Self::next) returns `None` from now on.
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_waiters();
    }

    /// Items queued per tenant (not counting delayed or in-progress ones).
    pub fn depths(&self) -> Vec<(TenantId, usize)> {
        self.lock()
            .tenants
            .iter()
            .map(|(t, s)| (t.clone(), s.fifo.len()))
            .collect()
    }

    /// Items queued, delayed or in progress, over all tenants.
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.delayed_items.len()
            + state
                .tenants
                .values()
                .map(|s| s.fifo.len() + s.processing.len())
                .sum::<usize>()
    }

    /// Items queued or in progress (not counting delayed ones), over all tenants.
    pub fn pending(&self) -> usize {
        let state = self.lock();
        state
            .tenants
            .values()
            .map(|s| s.fifo.len() + s.processing.len())
            .sum()
    }

    /// Whether nothing is queued, delayed or in progress.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves due delayed items into their tenants' FIFOs.
    fn promote_delayed(state: &mut State<T>, now: Instant) {
        while let Some(Reverse((at, seq))) = state.delayed.peek().copied() {
            if at > now {
                break;
            }
            state.delayed.pop();
            if let Some(delayed) = state.delayed_items.remove(&seq) {
                Self::enqueue(state, &delayed.tenant, delayed.item, delayed.at);
            }
        }
        give_back_room!(state.delayed);
        give_back_room!(state.delayed_items);
    }

    /// Picks the next item by smooth weighted round-robin among tenants that have work and tokens, or
    /// says when to look again.
    fn try_next(state: &mut State<T>, now: Instant) -> Result<Work<T>, Option<Instant>> {
        Self::promote_delayed(state, now);
        let mut wake_at: Option<Instant> = state.delayed.peek().map(|Reverse((at, _))| *at);
        let mut total = 0i64;
        let mut best: Option<TenantId> = None;
        let mut best_current = i64::MIN;
        // Shares count every tenant with work queued or in progress.
        let busy: Vec<i64> = state
            .tenants
            .values()
            .filter(|s| !s.fifo.is_empty() || !s.processing.is_empty())
            .map(|s| s.weight)
            .collect();
        let busy_weight: i64 = busy.iter().sum();
        let contended = busy.len() > 1 && state.workers > 0;
        let workers = state.workers as i64;
        // The last free workers wait for a tenant with nothing in progress: a quiet tenant's first item
        // then starts at once instead of after one of a burst's slow items.
        let in_progress: usize = state.tenants.values().map(|s| s.processing.len()).sum();
        let reserved_for_idle =
            state.workers > 0 && state.workers.saturating_sub(in_progress) <= reserve(state.workers);
        for (tenant, sub) in state.tenants.iter_mut() {
            if sub.fifo.is_empty() {
                continue;
            }
            if reserved_for_idle && !sub.processing.is_empty() {
                continue;
            }
            if contended {
                let share = (workers * sub.weight + busy_weight - 1) / busy_weight.max(1);
                if sub.processing.len() as i64 >= share.max(1) {
                    continue;
                }
            }
            if let Some(bucket) = &mut sub.bucket {
                bucket.refill(now);
                if bucket.tokens < 1.0 {
                    let ready = bucket.ready_at(now);
                    wake_at = Some(wake_at.map_or(ready, |w| w.min(ready)));
                    continue;
                }
            }
            sub.current += sub.weight;
            total += sub.weight;
            if sub.current > best_current {
                best_current = sub.current;
                best = Some(tenant.clone());
            }
        }
        let Some(tenant) = best else { return Err(wake_at) };
        let sub = state.tenants.get_mut(&tenant).expect("chosen tenant exists");
        sub.current -= total;
        let (item, queued_at) = sub.fifo.pop_front().expect("chosen tenant has work");
        sub.queued.remove(&item);
        give_back_room!(sub.fifo);
        give_back_room!(sub.queued);
        sub.processing.insert(item.clone());
        if let Some(bucket) = &mut sub.bucket {
            bucket.tokens -= 1.0;
        }
        Ok(Work {
            tenant,
            item,
            waited: now.saturating_duration_since(queued_at),
        })
    }

    /// Waits for the next item; `None` once the queue is closed.
    pub async fn next(&self) -> Option<Work<T>> {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = {
                let mut state = self.lock();
                if state.closed {
                    return None;
                }
                match Self::try_next(&mut state, Instant::now()) {
                    Ok(work) => return Some(work),
                    Err(wake_at) => wake_at,
                }
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        Arc::from(name)
    }

    async fn drain(queue: &FairQueue<u32>, n: usize) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for _ in 0..n {
            let work = queue.next().await.expect("work");
            queue.done(&work);
            out.push((work.tenant.to_string(), work.item));
        }
        out
    }

    #[tokio::test]
    async fn items_are_deduplicated_while_queued() {
        let queue = FairQueue::new();
        let a = tenant("a");
        queue.add(&a, 1);
        queue.add(&a, 1);
        queue.add(&a, 2);
        assert_eq!(queue.depths(), vec![(a.clone(), 2)]);
        assert_eq!(drain(&queue, 2).await, vec![("a".into(), 1), ("a".into(), 2)]);
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn a_drained_burst_gives_its_room_back() {
        let queue = FairQueue::new();
        let a = tenant("a");
        for item in 0..10_000 {
            queue.add(&a, item);
            queue.add_after(&a, item + 10_000, Duration::from_millis(1));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        drain(&queue, 20_000).await;
        assert!(queue.is_empty());
        let state = queue.lock();
        let sub = &state.tenants[&a];
        for (what, room) in [
            ("fifo", sub.fifo.capacity()),
            ("queued", sub.queued.capacity()),
            ("delayed", state.delayed.capacity()),
            ("delayed items", state.delayed_items.capacity()),
        ] {
            assert!(room <= 2 * KEPT_ROOM, "{what} kept room for {room} items");
        }
    }

    #[tokio::test]
    async fn an_item_added_while_processing_runs_again_after_done() {
        let queue = FairQueue::new();
        let a = tenant("a");
        queue.add(&a, 7);
        let work = queue.next().await.expect("work");
        queue.add(&a, 7);
        // Not handed out twice at once.
        assert_eq!(queue.depths(), vec![(a.clone(), 0)]);
        queue.done(&work);
        assert_eq!(queue.depths(), vec![(a.clone(), 1)]);
        assert_eq!(drain(&queue, 1).await, vec![("a".into(), 7)]);
    }

    #[tokio::test]
    async fn a_burst_of_one_tenant_does_not_starve_another() {
        let queue = FairQueue::new();
        let (greedy, polite) = (tenant("greedy"), tenant("polite"));
        for i in 0..1000 {
            queue.add(&greedy, i);
        }
        queue.add(&polite, 1);
        let order = drain(&queue, 3).await;
        assert!(order.iter().any(|(t, _)| t == "polite"), "{order:?}");
    }

    #[tokio::test]
    async fn weights_set_the_share_of_each_tenant() {
        let queue = FairQueue::new();
        let (heavy, light) = (tenant("heavy"), tenant("light"));
        queue.configure_tenant(&heavy, 3, None);
        queue.configure_tenant(&light, 1, None);
        for i in 0..100 {
            queue.add(&heavy, i);
            queue.add(&light, i);
        }
        let order = drain(&queue, 40).await;
        let heavy_share = order.iter().filter(|(t, _)| t == "heavy").count();
        assert_eq!(heavy_share, 30, "{order:?}");
        // Smooth: the light tenant never waits more than three turns.
        let positions: Vec<usize> = order
            .iter()
            .enumerate()
            .filter(|(_, (t, _))| t == "light")
            .map(|(i, _)| i)
            .collect();
        assert!(positions.windows(2).all(|w| w[1] - w[0] <= 4), "{positions:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_items_arrive_after_their_delay() {
        let queue = FairQueue::new();
        let a = tenant("a");
        queue.add_after(&a, 5, Duration::from_secs(10));
        assert!(
            tokio::time::timeout(Duration::from_secs(9), queue.next())
                .await
                .is_err()
        );
        let work = tokio::time::timeout(Duration::from_secs(2), queue.next())
            .await
            .expect("due")
            .expect("work");
        assert_eq!(work.item, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_limited_tenant_waits_without_blocking_others() {
        let queue = FairQueue::new();
        let (limited, free) = (tenant("limited"), tenant("free"));
        queue.configure_tenant(&limited, 1, Some((2, 2)));
        for i in 0..10 {
            queue.add(&limited, i);
        }
        // Burst of two, then nothing for the limited tenant until tokens refill...
        let first = drain(&queue, 2).await;
        assert!(first.iter().all(|(t, _)| t == "limited"));
        // ...while another tenant's work is handed out at once.
        queue.add(&free, 1);
        let work = tokio::time::timeout(Duration::from_millis(1), queue.next())
            .await
            .expect("free tenant served")
            .expect("work");
        assert_eq!(&*work.tenant, "free");
        queue.done(&work);
        // Two per second afterwards.
        let start = Instant::now();
        drain(&queue, 4).await;
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(1900) && elapsed <= Duration::from_millis(2100),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unused_tokens_are_refunded_and_extra_writes_charged() {
        let queue = FairQueue::new();
        let a = tenant("a");
        queue.configure_tenant(&a, 1, Some((1, 1)));
        queue.add(&a, 1);
        queue.add(&a, 2);
        let work = queue.next().await.expect("work");
        queue.done(&work);
        // The item wrote nothing: its token comes back and the next item is served at once.
        queue.charge(&a, -1.0);
        let work = tokio::time::timeout(Duration::from_millis(1), queue.next())
            .await
            .expect("refunded")
            .expect("work");
        queue.done(&work);
        // Three writes for one item: a debt of two seconds before the next.
        queue.charge(&a, 2.0);
        queue.add(&a, 3);
        let start = Instant::now();
        queue.next().await.expect("work");
        assert!(start.elapsed() >= Duration::from_secs(3), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn the_last_workers_wait_for_a_tenant_with_nothing_in_progress() {
        let queue = FairQueue::new();
        queue.set_workers(16);
        let (greedy, quiet) = (tenant("greedy"), tenant("quiet"));
        for i in 0..100 {
            queue.add(&greedy, i);
        }
        // Alone, the greedy tenant gets all but the reserved two workers.
        let mut held = Vec::new();
        for _ in 0..14 {
            held.push(queue.next().await.expect("work"));
        }
        assert!(held.iter().all(|w| &*w.tenant == "greedy"));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), queue.next())
                .await
                .is_err(),
            "the reserve is not the greedy tenant's"
        );
        // A quiet tenant's first item starts at once, with nothing of the burst finished.
        queue.add(&quiet, 1000);
        let next = tokio::time::timeout(Duration::from_millis(50), queue.next())
            .await
            .expect("served from the reserve")
            .expect("work");
        assert_eq!(&*next.tenant, "quiet");
        // One greedy item done: its worker goes back to the burst only while the reserve stays free.
        queue.done(&held.pop().expect("held"));
        let after = tokio::time::timeout(Duration::from_millis(50), queue.next()).await;
        assert!(
            after.is_err(),
            "one worker free, and it is the reserve: {after:?}"
        );
    }

    #[tokio::test]
    async fn a_tenant_with_stuck_items_cannot_hold_every_worker() {
        let queue = FairQueue::new();
        queue.set_workers(4);
        let (slow, other) = (tenant("slow"), tenant("other"));
        for i in 0..100 {
            queue.add(&slow, i);
        }
        queue.add(&other, 1000);
        // Items of the slow tenant are handed out and never finish...
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(queue.next().await.expect("work"));
        }
        // ...but the other tenant's work still gets a worker, and the slow tenant stays at its share (2 of 4)
        // while the other has work queued or in progress.
        assert!(held.iter().any(|w| &*w.tenant == "other"), "{held:?}");
        queue.add(&other, 1001);
        let next = tokio::time::timeout(Duration::from_millis(50), queue.next())
            .await
            .expect("served")
            .expect("work");
        assert_eq!(&*next.tenant, "other");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), queue.next())
                .await
                .is_err(),
            "slow tenant over its share"
        );
        // Alone, a tenant may use every worker.
        for work in held
            .iter()
            .chain(std::iter::once(&next))
            .filter(|w| &*w.tenant == "other")
        {
            queue.done(work);
        }
        let more = tokio::time::timeout(Duration::from_millis(50), queue.next())
            .await
            .expect("slow alone")
            .expect("work");
        assert_eq!(&*more.tenant, "slow");
    }

    #[tokio::test]
    async fn removing_a_tenant_drops_its_work_and_closing_ends_workers() {
        let queue = Arc::new(FairQueue::new());
        let (a, b) = (tenant("a"), tenant("b"));
        queue.add(&a, 1);
        queue.add_after(&a, 2, Duration::from_secs(1));
        queue.add(&b, 3);
        queue.remove_tenant(&a);
        assert_eq!(drain(&queue, 1).await, vec![("b".into(), 3)]);
        assert!(queue.is_empty());
        let waiter = tokio::spawn({
            let queue = queue.clone();
            async move { queue.next().await.map(|w| w.item) }
        });
        tokio::task::yield_now().await;
        queue.close();
        assert_eq!(waiter.await.expect("join"), None);
    }
}
