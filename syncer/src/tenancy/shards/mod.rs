//! Sharding tenants across syncer replicas (`--shards`).
//!
//! Every replica is active; each syncs the tenants it holds a Lease for, and no tenant is synced by two
//! replicas at once. All Leases live in the syncer's namespace and carry label [`LABEL_SYNCER_LEASE`]:
//!
//! - **Membership**: each replica keeps Lease `vc-syncer-member-<replica id>`, renewed every
//!   `duration / 3`. Its holder is the replica's *instance* (`<replica id>/<nonce>`), new for every
//!   process, so a restarted replica of the same name waits for its predecessor's Lease to expire. The live
//!   members are those whose Lease this replica saw change within its `leaseDurationSeconds` (time
//!   observed locally, as client-go's leader election does: clocks of different machines never compare).
//! - **Ownership**: tenant Lease `vc-syncer-tenant-<cluster key>`; its holder syncs the tenant. A tenant
//!   Lease is valid while its holder's *membership* is: tenant Leases are written only when they change
//!   hands, so the cost is one write per replica per renewal, not one per tenant. Which replica should
//!   hold each tenant is [`assignment::assign`] over the live members, the same answer on every replica.
//! - **Taking**: a free Lease (no holder) or one whose holder is no longer a live member is taken with a
//!   merge patch pinned to its resourceVersion, so of two replicas that try, one wins.
//! - **Handing over**: a replica that should no longer hold a tenant detaches it (nothing is deleted),
//!   waits for its in-flight work, then clears the holder; the new owner takes it on its next look.
//! - **Stopping in time**: a replica that could not renew its membership within the renew deadline
//!   (`2/3` of the duration, measured from before the last successful renewal was sent) detaches every
//!   tenant at once, before any other replica can see its Lease expire.
//! - **Cluster-wide duties** (removing super namespaces of deleted tenants, collecting stale tenant
//!   Leases) run on the holder of Lease `vc-syncer-duties`, placed like a tenant.

pub mod assignment;
pub mod flags;
pub mod handover;
pub mod metrics;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crds::wellknown::{ANNOTATION_CLUSTER, FIELD_MANAGER_SYNCER};
use futures::StreamExt;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions},
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::{Notify, watch};

use crate::{
    error::{Error, on_super},
    tenancy::shards::assignment::{Placed, assign, first_choice},
};

pub use crds::wellknown::LABEL_SYNCER_LEASE;
const ROLE_MEMBER: &str = "member";
const ROLE_TENANT: &str = "tenant";
const ROLE_DUTIES: &str = "duties";
/// Prefix of membership Leases (then the replica id).
pub const MEMBER_LEASE_PREFIX: &str = "vc-syncer-member-";
/// Prefix of tenant Leases (then the cluster key).
pub const TENANT_LEASE_PREFIX: &str = "vc-syncer-tenant-";
/// The Lease of the cluster-wide duties.
pub const DUTIES_LEASE: &str = "vc-syncer-duties";
/// What the duties are placed by in the assignment.
const DUTIES_KEY: &str = "cluster-duties";
/// Shortest Lease duration: renewing every third of it must leave time for a request.
pub const MIN_LEASE_DURATION: Duration = Duration::from_secs(3);

/// What the handover ([`handover`]) needs done as tenants change hands, by the layers above the shards
/// (attaching, the attach journal): the shards decide which replica syncs which tenant, and ask through
/// this what follows from it, so they import nothing above them.
pub trait Handover: Send + Sync {
    /// Stops syncing a tenant this replica no longer holds (deleting nothing): its watches stop and its
    /// queued work and series are forgotten.
    fn stop(&self, cluster_key: &str);

    /// Removes the super namespaces of a tenant whose VirtualCluster is gone (this replica held its Lease,
    /// so it was its owner).
    fn remove(&self, cluster_key: &str) -> impl Future<Output = ()> + Send;

    /// The cluster-wide duties' chores beyond the Leases (the attach journals of replicas long gone), on
    /// every look while this replica runs the duties.
    fn run_duties(&self) -> impl Future<Output = ()> + Send;
}

/// Sharding flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSettings {
    /// This replica's name (the pod name): what the assignment hashes.
    pub replica_id: String,
    /// Namespace of the Leases.
    pub namespace: String,
    /// How long a membership stays valid without renewal.
    pub lease_duration: Duration,
}

impl ShardSettings {
    /// Time between renewals (and between looks at the assignment).
    pub fn renew_period(&self) -> Duration {
        self.lease_duration / 3
    }

    /// How long after the last successful renewal this replica stops syncing if it cannot renew.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }
}

/// Checks a replica id: it names a Lease, so it must fit a DNS subdomain after the prefix.
pub fn replica_id(value: &str) -> Result<String, String> {
    let id = value.trim();
    let fits = !id.is_empty()
        && MEMBER_LEASE_PREFIX.len() + id.len() <= 253
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    match fits {
        true => Ok(id.to_owned()),
        false => Err(format!(
            "--replica-id must be a DNS subdomain of at most {} characters (lower-case letters, digits, '-', '.'), got {value:?}",
            253 - MEMBER_LEASE_PREFIX.len()
        )),
    }
}

/// The Lease of tenant `cluster_key`.
pub fn tenant_lease_name(cluster_key: &str) -> String {
    format!("{TENANT_LEASE_PREFIX}{cluster_key}")
}

/// The membership Lease of replica `replica_id`.
pub fn member_lease_name(replica_id: &str) -> String {
    format!("{MEMBER_LEASE_PREFIX}{replica_id}")
}

/// The replica of an instance identity (`<replica id>/<nonce>`).
pub fn replica_of(instance: &str) -> &str {
    instance.rsplit_once('/').map_or(instance, |(replica, _)| replica)
}

/// A Lease as this replica last saw it, and since when it has looked like that.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The Lease.
    pub lease: Arc<Lease>,
    /// When its resourceVersion last changed, as seen here.
    pub since: Instant,
}

/// The non-empty holder of a Lease.
pub fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn role(lease: &Lease) -> Option<&str> {
    lease.labels().get(LABEL_SYNCER_LEASE).map(String::as_str)
}

fn duration_of(lease: &Lease) -> Duration {
    let seconds = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(0)
        .max(1);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(1))
}

/// The live members, replica id → instance: membership Leases with a holder that changed within their
/// duration, as observed here.
pub fn live_members(observed: &HashMap<String, Observed>, now: Instant) -> HashMap<String, String> {
    observed
        .values()
        .filter(|o| role(&o.lease) == Some(ROLE_MEMBER))
        .filter(|o| now.saturating_duration_since(o.since) < duration_of(&o.lease))
        .filter_map(|o| holder(&o.lease).map(|h| (replica_of(h).to_owned(), h.to_owned())))
        .collect()
}

/// What to do about one Lease (a tenant's or the duties').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ours, and it should be: keep syncing (nothing to write).
    Hold,
    /// Ours to take, and there is no Lease yet: create it.
    Create,
    /// Ours to take: a Lease without holder, or (`expired`) one whose holder is no longer a member.
    Take {
        /// Its holder is gone (a replica that died), rather than one that handed it over.
        expired: bool,
    },
    /// Ours to take, but a live member still holds it: it hands it over on its next look.
    Wait,
    /// Not ours any more: detach, wait for in-flight work, release.
    HandOver,
    /// We synced it, but the Lease is gone or says someone else holds it: stop at once.
    Lost,
    /// Not ours, and we do not hold it.
    Nothing,
}

/// The step for one Lease. `instance`: this replica's holder identity; `ours`: the assignment gives it to
/// this replica; `holding`: this replica syncs it now; `live`: the instances of the live members.
pub fn step(instance: &str, ours: bool, lease: Option<&Lease>, holding: bool, live: &HashSet<&str>) -> Step {
    let current = lease.and_then(holder);
    if holding && current != Some(instance) {
        return Step::Lost;
    }
    if !ours {
        return match holding || current == Some(instance) {
            true => Step::HandOver,
            false => Step::Nothing,
        };
    }
    match (lease, current) {
        (None, _) => Step::Create,
        (Some(_), Some(h)) if h == instance => Step::Hold,
        (Some(_), None) => Step::Take { expired: false },
        (Some(_), Some(h)) if !live.contains(h) => Step::Take { expired: true },
        (Some(_), Some(_)) => Step::Wait,
    }
}

/// This replica's share of the tenants: which it holds, whether it runs the cluster-wide duties, and what
/// it has seen of the Leases.
pub struct Shards {
    /// The flags.
    pub settings: ShardSettings,
    instance: String,
    /// Cluster keys of the tenants this replica holds the Lease of (and may sync). Changed only under this
    /// lock, which attaching also takes to insert a tenant: once a key is removed, no attach can add it.
    held: Mutex<HashSet<String>>,
    duties: AtomicBool,
    /// Bumped whenever `held` changes; the VirtualCluster supervisors wait on it.
    changes: watch::Sender<u64>,
    observed: Mutex<HashMap<String, Observed>>,
    /// Whether the Lease watch has listed once (before, an absent Lease may just not be seen yet).
    listed: AtomicBool,
    /// When the membership was first renewed.
    joined: std::sync::OnceLock<Instant>,
    /// Until when the membership is valid (the last successful renewal's start plus the renew deadline).
    valid_until: Mutex<Option<Instant>>,
    /// Rings when a Lease changed or the membership was renewed (the balancing loop).
    wake: Notify,
    /// Rings every waiter when the membership was renewed or lapsed (the guard).
    membership: Notify,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Shards {
    /// This replica's state, holding nothing yet.
    pub fn new(settings: ShardSettings) -> Self {
        // New for every process: a restarted replica is not its predecessor.
        let nonce = crate::tenancy::shards::assignment::score(
            &settings.replica_id,
            &format!(
                "{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
            ),
        );
        let instance = format!("{}/{:012x}", settings.replica_id, nonce >> 16);
        Self {
            settings,
            instance,
            held: Mutex::new(HashSet::new()),
            duties: AtomicBool::new(false),
            changes: watch::channel(0).0,
            observed: Mutex::new(HashMap::new()),
            listed: AtomicBool::new(false),
            joined: std::sync::OnceLock::new(),
            valid_until: Mutex::new(None),
            wake: Notify::new(),
            membership: Notify::new(),
        }
    }

    /// This process's holder identity.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this replica holds tenant `cluster_key`.
    pub fn holds(&self, cluster_key: &str) -> bool {
        self.lock_held().contains(cluster_key)
    }

    /// The tenants this replica holds.
    pub fn held(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock_held().iter().cloned().collect();
        keys.sort();
        keys
    }

    /// Runs `admit` while this replica holds `cluster_key` (and keeps holding it until `admit` returns);
    /// `None` when it does not.
    pub fn admit<R>(&self, cluster_key: &str, admit: impl FnOnce() -> R) -> Option<R> {
        let held = self.lock_held();
        held.contains(cluster_key).then(admit)
    }

    /// Whether this replica runs the cluster-wide duties.
    pub fn runs_duties(&self) -> bool {
        self.duties.load(Ordering::Acquire)
    }

    /// Changes of the held tenants.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Adds a held tenant, unless the membership has lapsed (checked under the lock that
    /// [`drop_everything`] takes, so a grant never survives a lapse).
    fn grant(&self, cluster_key: &str) -> bool {
        let mut held = self.lock_held();
        if !self.member_at(Instant::now()) {
            return false;
        }
        let added = held.insert(cluster_key.to_owned());
        drop(held);
        if added {
            self.changes.send_modify(|v| *v += 1);
        }
        added
    }

    fn revoke(&self, cluster_key: &str) -> bool {
        let removed = self.lock_held().remove(cluster_key);
        if removed {
            self.changes.send_modify(|v| *v += 1);
        }
        removed
    }

    /// Whether the membership is valid at `now`.
    pub fn member_at(&self, now: Instant) -> bool {
        self.valid_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|until| now < until)
    }

    fn valid_until(&self) -> Option<Instant> {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn renewed(&self, sent: Instant) {
        let _ = self.joined.set(sent);
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(sent + self.settings.renew_deadline());
        self.membership.notify_waiters();
        self.wake.notify_one();
    }

    fn lapse(&self) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.membership.notify_waiters();
        self.wake.notify_one();
    }

    fn lock_observed(&self) -> std::sync::MutexGuard<'_, HashMap<String, Observed>> {
        self.observed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a Lease as read (watch) or written (our own answer). An older version than the one held is
    /// ignored: our write's answer can arrive before the watch delivers the versions before it.
    pub fn observe(&self, lease: Lease, now: Instant) {
        let name = lease.name_any();
        let mut observed = self.lock_observed();
        let version = |l: &Lease| l.resource_version().and_then(|v| v.parse::<u64>().ok());
        match observed.get(&name) {
            Some(known) if known.lease.resource_version() == lease.resource_version() => {}
            Some(known) if matches!((version(&known.lease), version(&lease)), (Some(k), Some(n)) if n < k) => {
            }
            _ => {
                observed.insert(
                    name,
                    Observed {
                        lease: Arc::new(lease),
                        since: now,
                    },
                );
            }
        }
    }

    fn forget(&self, name: &str) {
        self.lock_observed().remove(name);
    }

    /// What this replica has seen of the Leases.
    pub fn snapshot(&self) -> HashMap<String, Observed> {
        self.lock_observed().clone()
    }
}

/// Follows the syncer's Leases into [`Shards::observe`].
pub async fn watch_leases(client: Client, shards: Arc<Shards>) {
    let api: Api<Lease> = Api::namespaced(client, &shards.settings.namespace);
    let config = watcher::Config::default().labels(LABEL_SYNCER_LEASE);
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listed: Vec<String> = Vec::new();
    while let Some(event) = stream.next().await {
        let now = Instant::now();
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(lease)) => {
                listed.push(lease.name_any());
                shards.observe(lease, now);
            }
            Ok(watcher::Event::InitDone) => {
                let gone: Vec<String> = shards
                    .snapshot()
                    .into_keys()
                    .filter(|name| !listed.contains(name))
                    .collect();
                for name in gone {
                    shards.forget(&name);
                }
                shards.listed.store(true, Ordering::Release);
            }
            Ok(watcher::Event::Apply(lease)) => shards.observe(lease, now),
            Ok(watcher::Event::Delete(lease)) => shards.forget(&lease.name_any()),
            Err(error) => {
                tracing::debug!(%error, "syncer Lease watch interrupted; retrying");
                continue;
            }
        }
        shards.wake.notify_one();
    }
}

fn lease_object(
    name: &str,
    role: &str,
    cluster_key: Option<&str>,
    spec: LeaseSpec,
    resource_version: Option<String>,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([(LABEL_SYNCER_LEASE.to_owned(), role.to_owned())].into()),
            annotations: cluster_key.map(|key| [(ANNOTATION_CLUSTER.to_owned(), key.to_owned())].into()),
            resource_version,
            ..Default::default()
        },
        spec: Some(spec),
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER_SYNCER.to_owned()),
        ..Default::default()
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn duration_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)
}

fn conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409 || status.code == 404)
}

/// Leases are compare-and-swap records, so they are written with create and with merge patches pinned to the
/// resourceVersion read (as client-go's leader election does with updates), not applied.
struct Leases {
    api: Api<Lease>,
    shards: Arc<Shards>,
}

impl Leases {
    async fn create(&self, name: &str, role: &str, cluster_key: Option<&str>) -> Result<Lease, kube::Error> {
        let now = now_micro();
        let spec = LeaseSpec {
            holder_identity: Some(self.shards.instance.clone()),
            lease_duration_seconds: Some(duration_seconds(self.shards.settings.lease_duration)),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..Default::default()
        };
        let created = self
            .api
            .create(&post_params(), &lease_object(name, role, cluster_key, spec, None))
            .await?;
        self.shards.observe(created.clone(), Instant::now());
        Ok(created)
    }

    /// Writes `current` with its spec changed by `change`, only if it is still the version read.
    async fn update(
        &self,
        current: &Lease,
        change: impl FnOnce(&mut LeaseSpec),
    ) -> Result<Lease, kube::Error> {
        let mut spec = current.spec.clone().unwrap_or_default();
        change(&mut spec);
        // A merge patch of the whole spec, pinned to the version read: the apiserver refuses it (409) if the
        // Lease changed meanwhile. Fields now unset are sent as null, so that they are removed.
        let mut fields = serde_json::to_value(&spec).unwrap_or_default();
        if let Some(fields) = fields.as_object_mut() {
            for field in [
                "holderIdentity",
                "acquireTime",
                "renewTime",
                "leaseDurationSeconds",
                "leaseTransitions",
            ] {
                fields.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": fields,
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER_SYNCER.to_owned()),
            ..Default::default()
        };
        let written = self
            .api
            .patch(&current.name_any(), &params, &Patch::Merge(&patch))
            .await?;
        self.shards.observe(written.clone(), Instant::now());
        Ok(written)
    }

    async fn take(&self, current: &Lease) -> Result<Lease, kube::Error> {
        let instance = self.shards.instance.clone();
        let duration = duration_seconds(self.shards.settings.lease_duration);
        self.update(current, |spec| {
            let now = now_micro();
            spec.holder_identity = Some(instance);
            spec.lease_duration_seconds = Some(duration);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        })
        .await
    }

    async fn release(&self, current: &Lease) -> Result<Lease, kube::Error> {
        self.update(current, |spec| {
            spec.holder_identity = None;
            spec.renew_time = Some(now_micro());
        })
        .await
    }

    async fn delete(&self, current: &Lease) -> Result<(), kube::Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: current.uid(),
                resource_version: current.resource_version(),
            }),
            ..Default::default()
        };
        self.api.delete(&current.name_any(), &params).await?;
        self.shards.forget(&current.name_any());
        Ok(())
    }
}

/// Creates or renews this replica's membership Lease every renew period, for as long as it runs.
pub async fn keep_membership(client: Client, shards: Arc<Shards>) {
    let leases = Leases {
        api: Api::namespaced(client, &shards.settings.namespace),
        shards: shards.clone(),
    };
    let name = member_lease_name(&shards.settings.replica_id);
    let mut failing = false;
    loop {
        let sent = Instant::now();
        // A renewal that takes longer than the renew deadline is too late anyway.
        let renewal =
            tokio::time::timeout(shards.settings.renew_deadline(), renew_membership(&leases, &name));
        let renewal = renewal
            .await
            .unwrap_or_else(|_| Err(Error::LeaseTimeout { name: name.clone() }));
        match renewal {
            Ok(()) => {
                if failing {
                    tracing::info!(lease = %name, "membership renewed again");
                }
                failing = false;
                shards.renewed(sent);
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(lease = %name, error = &error as &dyn std::error::Error, "renewing this replica's membership");
                }
                failing = true;
                if matches!(error, Error::LeaseHeld { .. }) {
                    shards.lapse();
                }
            }
        }
        tokio::time::sleep_until((sent + shards.settings.renew_period()).into()).await;
    }
}

async fn renew_membership(leases: &Leases, name: &str) -> Result<(), Error> {
    let shards = &leases.shards;
    let failed = |doing: &str| on_super(format!("{doing} membership Lease {name}"));
    let known = shards.snapshot().remove(name);
    let known = match known {
        Some(known) => known,
        None => match leases.api.get_opt(name).await.map_err(failed("reading"))? {
            Some(lease) => {
                let now = Instant::now();
                shards.observe(lease.clone(), now);
                Observed {
                    lease: Arc::new(lease),
                    since: now,
                }
            }
            None => {
                leases
                    .create(name, ROLE_MEMBER, None)
                    .await
                    .map_err(failed("creating"))?;
                return Ok(());
            }
        },
    };
    let current = holder(&known.lease).map(str::to_owned);
    let result = match current.as_deref() {
        Some(h) if h == shards.instance => {
            leases
                .update(&known.lease, |spec| spec.renew_time = Some(now_micro()))
                .await
        }
        Some(h) if known.since.elapsed() < duration_of(&known.lease) => {
            return Err(Error::LeaseHeld {
                name: name.to_owned(),
                holder: h.to_owned(),
            });
        }
        _ => leases.take(&known.lease).await,
    };
    match result {
        Ok(_) => Ok(()),
        Err(error) => {
            if conflict(&error) {
                // Someone else wrote it (or deleted it): read it again for the next round.
                match leases.api.get_opt(name).await {
                    Ok(Some(lease)) => shards.observe(lease, Instant::now()),
                    Ok(None) => shards.forget(name),
                    Err(_) => {}
                }
            }
            Err(failed("renewing")(error))
        }
    }
}

#[cfg(test)]
mod tests;
