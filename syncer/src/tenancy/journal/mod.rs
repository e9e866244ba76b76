//! The attach journal: a tenant that made a syncer process stop (a crash, an out-of-memory kill) is held
//! back before any replica attaches it again, so that one poisoned tenant cannot take every replica down in
//! turn (issue 32, item 5).
//!
//! - **The journal.** Each replica keeps one ConfigMap in its namespace, `vc-syncer-journal` (or
//!   `vc-syncer-journal-<replica id>` when sharded), label [`LABEL_SYNCER_JOURNAL`]: its process (`<replica>/
//!   <nonce>`, new for every process) and the tenants it is attaching, each with when it entered. A tenant
//!   enters before the syncer first talks to its apiserver and leaves once its caches have listed and it
//!   has stayed attached for the probation (`--attach-probation-seconds`). Entries are written in batches
//!   (a write covers every tenant that entered meanwhile, and at most two writes a second), so a restart
//!   costs a few journal writes whatever the number of tenants, and steady state none. A clean shutdown
//!   empties the journal.
//! - **A stop.** A journal whose process is gone (this replica's predecessor, read at start; another
//!   replica's, when its membership lapsed) and that still names tenants is the trace of a process that
//!   stopped while attaching them. Whoever finds it first counts it on each named tenant's VirtualCluster,
//!   `status.attachBackoff` (the syncer's own field manager, `vc-syncer-backoff`; VirtualCluster editors
//!   cannot write status), once per stop ([`decide::count`]), with a Warning event.
//! - **Backing off.** A tenant that was attached alone when a process stopped is held back for
//!   `--crash-backoff-seconds`, doubled for each further stop in a row up to `--crash-backoff-max-seconds`
//!   (`TenantSynced=False`, `TenantHeldBack`); every replica reads the same status, so the next shard owner
//!   holds it back too. One attached with others is a suspect: attached again at once, but only with
//!   suspects of the same stop and at most half as many ([`decide::admits`]), so that repeated stops single
//!   out the tenant behind them (log2 of the group) while the others are cleared and synced. A tenant that
//!   stays attached for the probation is cleared (`status.attachBackoff` removed).

pub mod decide;
pub mod flags;
pub mod stops;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crds::{
    AttachBackoff, VirtualCluster,
    wellknown::{FIELD_MANAGER_SYNCER, LABEL_SYNCER_JOURNAL},
};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::ConfigMap, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::sync::{Notify, watch};

pub use decide::{Kind, Policy, Record, Standing};

use crate::metrics::Metrics;

/// Name of an unsharded syncer's journal, and prefix of a sharded replica's (then `-<replica id>`).
pub const JOURNAL_NAME: &str = "vc-syncer-journal";
/// The ConfigMap key holding the journal (JSON, [`Record`]).
pub const DATA_KEY: &str = "journal";
/// Reason of the `TenantSynced` condition of a tenant held back.
pub const REASON_TENANT_HELD_BACK: &str = "TenantHeldBack";
/// Reason of the Warning event on a VirtualCluster when a stop is counted against it.
pub const REASON_STOPPED_WHILE_ATTACHING: &str = "SyncerStoppedWhileAttaching";
/// Least time between two journal writes: entries and exits in between are written together.
const WRITE_SPACING: Duration = Duration::from_millis(500);
/// A tenant leaves the journal at the latest this many probations after it entered, listed or not.
const PROBATION_CAP: u32 = 4;

/// The journal's flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalSettings {
    /// Namespace of the journals (the syncer's).
    pub namespace: String,
    /// How long a tenant stays in the journal after its caches listed.
    pub probation: Duration,
    /// How long a tenant is held back.
    pub policy: Policy,
}

/// A process identity for an unsharded syncer: `<host>-<pid>/<nonce>`, new for every process (the
/// sharded syncer's is its shards' instance).
pub fn process_instance() -> String {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let nonce = crate::tenancy::shards::assignment::score(
        &vc_runtime::leader::identity(),
        &format!("{}-{started:?}", std::process::id()),
    );
    format!("{}/{:012x}", vc_runtime::leader::identity(), nonce >> 16)
}

/// The name of a replica's journal: `vc-syncer-journal`, or `vc-syncer-journal-<replica id>` when sharded.
pub fn journal_name(replica_id: Option<&str>) -> String {
    match replica_id {
        Some(id) => format!("{JOURNAL_NAME}-{id}"),
        None => JOURNAL_NAME.to_owned(),
    }
}

/// The record a journal ConfigMap holds (an unreadable one names nobody).
pub fn record_of(config_map: &ConfigMap) -> Option<Record> {
    let text = config_map.data.as_ref()?.get(DATA_KEY)?;
    serde_json::from_str(text).ok()
}

/// A tenant in the journal.
#[derive(Debug)]
struct Member {
    kind: Kind,
    entered: Timestamp,
    /// Tickets held (a tenant attached again within its probation holds two).
    tickets: usize,
}

#[derive(Debug, Default)]
struct State {
    wave: BTreeMap<String, Member>,
    /// Kinds of the tenants waiting to enter, by waiter.
    waiting: BTreeMap<u64, Kind>,
    /// Bumped by every change of `wave`.
    generation: u64,
    /// Emptied by a clean shutdown: nothing more is written.
    closed: bool,
}

/// This process's journal, and the journals of the others (a cache of every journal in the namespace).
pub struct Journal {
    settings: JournalSettings,
    name: String,
    instance: String,
    api: Api<ConfigMap>,
    journals: Store<ConfigMap>,
    state: Mutex<State>,
    /// Rings on every change of `state` (the writer, and waiters whose turn may have come).
    changed: Notify,
    /// The last generation written.
    written: watch::Sender<u64>,
    /// Whether the predecessor's journal was read and its stops counted.
    recovered: watch::Sender<bool>,
    waiters: AtomicU64,
    /// Records this process wrote lately, which the VirtualCluster cache may not show yet.
    counted: Mutex<std::collections::HashMap<String, (AttachBackoff, std::time::Instant)>>,
    metrics: Arc<Metrics>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// How long a record this process wrote stands in for the cached one (the cache shows it well before).
const COUNTED_MEMORY: Duration = Duration::from_secs(30);

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("name", &self.name)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// A tenant's place in the journal; it leaves when the ticket is dropped.
pub struct Ticket {
    journal: Arc<Journal>,
    key: String,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("key", &self.key).finish()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.journal.leave(&self.key);
    }
}

/// A waiter's registration, removed when it enters or gives up.
struct Waiting<'a> {
    journal: &'a Journal,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let removed = self.journal.lock().waiting.remove(&self.id).is_some();
        if removed {
            self.journal.changed.notify_waiters();
        }
    }
}

impl Journal {
    /// The journal `name` of process `instance`, and the watch of every journal; call [`Journal::start`].
    pub fn new(
        client: Client,
        settings: JournalSettings,
        name: String,
        instance: String,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let api: Api<ConfigMap> = Api::namespaced(client, &settings.namespace);
        let (journals, writer) = reflector::store();
        let journal = Arc::new(Self {
            settings,
            name,
            instance,
            api: api.clone(),
            journals,
            state: Mutex::default(),
            changed: Notify::new(),
            written: watch::channel(0).0,
            recovered: watch::channel(false).0,
            waiters: AtomicU64::new(0),
            counted: Mutex::default(),
            metrics,
            tasks: Mutex::default(),
        });
        let watch = watcher(api, watcher::Config::default().labels(LABEL_SYNCER_JOURNAL))
            .default_backoff()
            .reflect(writer)
            .for_each(|_| futures::future::ready(()));
        journal.spawn(watch);
        journal.spawn(write_loop(journal.clone()));
        journal
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tokio::spawn(task));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This process's identity in the journals.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The flags.
    pub fn settings(&self) -> &JournalSettings {
        &self.settings
    }

    /// Waits until the predecessor's stops are counted: nothing is attached before.
    pub async fn recovered(&self) {
        let mut recovered = self.recovered.subscribe();
        let _ = recovered.wait_for(|done| *done).await;
    }

    /// The journals this process can see (its own included), with their ConfigMaps' names.
    pub fn records(&self) -> Vec<(String, Record)> {
        self.journals
            .state()
            .iter()
            .filter_map(|cm| Some((cm.name_any(), record_of(cm)?)))
            .collect()
    }

    /// The record of tenant `key`: the cached one, or one this process wrote lately that is newer.
    fn record_of_tenant(&self, key: &str, cached: Option<&AttachBackoff>) -> Option<AttachBackoff> {
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        counted.retain(|_, (_, at)| at.elapsed() < COUNTED_MEMORY);
        let last = |r: &AttachBackoff| r.last_attach_time.as_ref().map(|t| t.0);
        match (cached, counted.get(key)) {
            (Some(cached), Some((local, _))) if last(local) > last(cached) => Some(local.clone()),
            (None, Some((local, _))) => Some(local.clone()),
            (cached, _) => cached.cloned(),
        }
    }

    fn remember(&self, key: &str, record: Option<&AttachBackoff>) {
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        match record {
            Some(record) => {
                counted.insert(key.to_owned(), (record.clone(), std::time::Instant::now()));
            }
            None => {
                counted.remove(key);
            }
        }
    }

    /// Tenants being attached now.
    pub fn attaching(&self) -> Vec<String> {
        self.lock().wave.keys().cloned().collect()
    }

    /// Enters tenant `key` as `kind`, once its turn comes ([`decide::admits`]) and the journal says so in
    /// the super cluster: only then may the tenant's apiserver be talked to. Cancel-safe.
    pub async fn enter(self: &Arc<Self>, key: &str, kind: Kind) -> Ticket {
        self.recovered().await;
        let id = self.waiters.fetch_add(1, Ordering::Relaxed);
        let target = {
            let _registration = Waiting { journal: self, id };
            loop {
                let notified = self.changed.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                {
                    let mut state = self.lock();
                    state.waiting.insert(id, kind.clone());
                    let wave: Vec<Kind> = state.wave.values().map(|m| m.kind.clone()).collect();
                    let waiting: Vec<Kind> = state.waiting.values().cloned().collect();
                    if state.wave.contains_key(key) || decide::admits(&wave, &waiting, &kind) {
                        state.waiting.remove(&id);
                        state
                            .wave
                            .entry(key.to_owned())
                            .or_insert_with(|| Member {
                                kind: kind.clone(),
                                entered: Timestamp::now(),
                                tickets: 0,
                            })
                            .tickets += 1;
                        state.generation += 1;
                        break state.generation;
                    }
                }
                notified.await;
            }
            // `_registration` drops here: removed already, it rings nobody.
        };
        self.changed.notify_waiters();
        let ticket = Ticket {
            journal: self.clone(),
            key: key.to_owned(),
        };
        let mut written = self.written.subscribe();
        let _ = written.wait_for(|w| *w >= target).await;
        ticket
    }

    fn leave(&self, key: &str) {
        {
            let mut state = self.lock();
            let Some(member) = state.wave.get_mut(key) else {
                return;
            };
            member.tickets = member.tickets.saturating_sub(1);
            if member.tickets == 0 {
                state.wave.remove(key);
            }
            state.generation += 1;
        }
        self.changed.notify_waiters();
    }

    fn record(&self, state: &State) -> Record {
        Record {
            instance: self.instance.clone(),
            attaching: state.wave.iter().map(|(k, m)| (k.clone(), m.entered)).collect(),
        }
    }

    async fn write(&self, record: &Record) -> Result<(), kube::Error> {
        let config_map = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "namespace": self.settings.namespace,
                "labels": { LABEL_SYNCER_JOURNAL: "true" },
            },
            "data": { DATA_KEY: serde_json::to_string(record).unwrap_or_default() },
        });
        let params = PatchParams::apply(FIELD_MANAGER_SYNCER).force();
        self.api
            .patch(&self.name, &params, &Patch::Apply(&config_map))
            .await?;
        self.metrics.tenancy.journal_writes.inc();
        Ok(())
    }

    /// Empties the journal for good (a clean shutdown): a stop is not what follows.
    pub async fn close(&self) {
        let record = {
            let mut state = self.lock();
            state.closed = true;
            Record {
                instance: self.instance.clone(),
                attaching: BTreeMap::new(),
            }
        };
        for task in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            task.abort();
        }
        match tokio::time::timeout(Duration::from_secs(5), self.write(&record)).await {
            Ok(Ok(())) => tracing::debug!(journal = %self.name, "attach journal emptied"),
            Ok(Err(error)) => {
                tracing::warn!(journal = %self.name, error = &error as &dyn std::error::Error, "emptying the attach journal at shutdown")
            }
            Err(_) => {
                tracing::warn!(journal = %self.name, "emptying the attach journal at shutdown timed out")
            }
        }
    }

    /// Whether [`Journal::close`] emptied it.
    pub fn closed(&self) -> bool {
        self.lock().closed
    }

    /// Stops the watch and the writer without writing (the process is going away uncleanly, or a test
    /// drops it).
    pub fn abort(&self) {
        for task in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            task.abort();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Writes the journal whenever it changed, at most every [`WRITE_SPACING`]; retries a failed write.
async fn write_loop(journal: Arc<Journal>) {
    let mut failures = 0u32;
    loop {
        let notified = journal.changed.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        let pending = {
            let state = journal.lock();
            (!state.closed && state.generation > *journal.written.borrow())
                .then(|| (state.generation, journal.record(&state)))
        };
        let Some((generation, record)) = pending else {
            notified.await;
            continue;
        };
        match journal.write(&record).await {
            Ok(()) => {
                failures = 0;
                journal.written.send_replace(generation);
                tokio::time::sleep(WRITE_SPACING).await;
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(journal = %journal.name, error = &error as &dyn std::error::Error, "writing the attach journal; tenants wait to be attached until it is written");
                }
                tokio::time::sleep(Duration::from_secs(u64::from(failures.min(10)))).await;
            }
        }
    }
}

/// What a counted stop means for the tenant, for the event and the condition.
pub fn stop_message(record: &AttachBackoff) -> String {
    let with = match record.attached_with {
        n if n <= 1 => "while attaching this tenant alone".to_owned(),
        n => format!("while attaching this tenant and {} others", n - 1),
    };
    let what = match record.not_before.as_ref() {
        Some(until) => format!(
            "the tenant is held back until {} (the wait doubles with each stop in a row, up to --crash-backoff-max-seconds), then attached alone",
            until.0
        ),
        None => format!(
            "the tenant is attached again at once, with at most {} other suspects of that stop, to find which tenant it was",
            (record.attached_with.max(1) + 1) / 2 - 1
        ),
    };
    format!(
        "syncer process {} stopped without a clean shutdown {with} (stop {} in a row: a crash or an out-of-memory kill this tenant may have caused); {what}. Nothing of the tenant is deleted meanwhile.",
        record.instance.as_deref().unwrap_or("?"),
        record.stops
    )
}

/// The kind a tenant enters the journal as when it is attached again while attached (a new connection):
/// from its record, a held-back one as a suspect alone.
pub fn kind_of(vc: &VirtualCluster) -> Kind {
    let record = vc.status.as_ref().and_then(|s| s.attach_backoff.as_ref());
    match decide::standing(record, Timestamp::now()) {
        Standing::Attach(kind) => kind,
        Standing::HeldBack { .. } => Kind::Suspect {
            instance: record.and_then(|r| r.instance.clone()).unwrap_or_default(),
            group: 1,
        },
    }
}
