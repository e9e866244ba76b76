//! Scheduled snapshots: `kubectl vc snapshot schedule`, the platform's snapshot scheduler (in the chart,
//! a Deployment with a PersistentVolumeClaim as its store), and `kubectl vc snapshot create NAME --to
//! pvc/<claim>`, which asks it for a snapshot now.
//!
//! The scheduler looks at every VirtualCluster each `--poll`. A running native tenant with
//! `spec.snapshots` is snapshotted into `<store>/<namespace>/` when its interval (at least
//! `--min-interval`) has passed since its newest snapshot in the store, or when the annotation
//! [`ANNOTATION_SNAPSHOT_REQUESTED`] names this store and a time after that snapshot (at most one a
//! `--min-request-gap`). Then all but its newest `retain` (at most `--max-retain`) are removed, and
//! `status.snapshots` (field manager `vc-snapshots`) and an Event tell the result. Tenants are done one at
//! a time: a tenant asking too often delays the others, never overloads the super cluster.
//!
//! The store is the truth: what was last taken is read from the snapshots' manifests, so a restarted
//! scheduler (or a tampered status) changes nothing.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use crds::{ClusterPhase, SnapshotStatus, VirtualCluster, wellknown::ANNOTATION_SNAPSHOT_REQUESTED};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use serde_json::json;

use super::{
    SnapshotReport, create,
    metrics::{Metrics, TriggerLabels},
    scan, to_remove,
};
use crate::{
    Error, Result, Streams,
    args::{SnapshotCreateArgs, SnapshotScheduleArgs},
    output,
};

/// The scheduler's field manager for `status.snapshots`, and the controller its Events name.
pub use crds::wellknown::FIELD_MANAGER_SNAPSHOTS as FIELD_MANAGER;
/// A requested time further ahead than this is refused (a far-future time would stay "newer than the last
/// snapshot" forever and ask for one every gap).
const REQUEST_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// After a failed attempt, the next one waits this long (or the tenant's interval, when shorter) unless a
/// newer request comes.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(300);

/// The store a `--to` value names: `pvc/<claim>`; `None` for a folder.
pub fn store_of(to: &Path) -> Option<String> {
    let text = to.to_str()?;
    let claim = text.strip_prefix("pvc/")?;
    (!claim.is_empty() && !claim.contains('/')).then(|| text.to_owned())
}

/// Why a tenant is snapshotted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Its interval has passed (or it has no snapshot yet).
    Scheduled,
    /// `snapshot create --to <this store>` asked.
    Requested,
}

impl Due {
    /// The metric labels of a snapshot taken because of this.
    pub fn labels(self) -> TriggerLabels {
        TriggerLabels {
            trigger: match self {
                Self::Scheduled => "scheduled",
                Self::Requested => "requested",
            },
        }
    }
}

/// What the scheduler knows of one tenant between polls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantRecord {
    /// Its newest snapshot in the store.
    pub last_taken: Option<Timestamp>,
    /// Its last failed attempt, if after `last_taken`.
    pub last_failure: Option<Timestamp>,
}

/// The scheduler's limits, from its flags.
#[derive(Clone, Debug)]
pub struct Limits {
    /// What status and requests call the store.
    pub store: String,
    /// `--min-interval`.
    pub min_interval: Duration,
    /// `--min-request-gap`.
    pub min_request_gap: Duration,
    /// `--max-retain`.
    pub max_retain: u32,
}

impl Limits {
    fn of(args: &SnapshotScheduleArgs) -> Self {
        Self {
            store: args.store_name.clone(),
            min_interval: args.min_interval,
            min_request_gap: args.min_request_gap,
            max_retain: args.max_retain,
        }
    }

    /// How many snapshots of `vc` are kept.
    pub fn retain(&self, vc: &VirtualCluster) -> u32 {
        vc.spec
            .snapshots
            .as_ref()
            .map_or(1, |s| s.retain.max(1))
            .min(self.max_retain)
    }
}

/// The time a request annotation asks for, when it names `store`: `<store> <RFC 3339 time>`.
pub fn requested_time(vc: &VirtualCluster, store: &str) -> Option<Timestamp> {
    let value = vc.annotations().get(ANNOTATION_SNAPSHOT_REQUESTED)?;
    let (named, time) = value.trim().split_once(' ')?;
    (named == store).then(|| time.trim().parse().ok())?
}

/// The request annotation's value asking `store` for a snapshot at `at`.
pub fn request_value(store: &str, at: Timestamp) -> String {
    format!("{store} {}", whole_seconds(at))
}

/// `time` without its fraction of a second, as the API shows times (never later than `time`).
fn whole_seconds(time: Timestamp) -> Timestamp {
    Timestamp::from_second(time.as_second()).unwrap_or(time)
}

fn after(time: Timestamp, duration: Duration) -> Timestamp {
    k8s_openapi::jiff::SignedDuration::try_from(duration)
        .ok()
        .and_then(|d| time.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// The schedule of `vc` when it can be snapshotted now: it has `spec.snapshots`, is a native tenant,
/// Running, not paused and not being deleted.
fn snapshottable(vc: &VirtualCluster) -> Option<&crds::SnapshotSchedule> {
    let schedule = vc.spec.snapshots.as_ref()?;
    let running = vc.status.as_ref().and_then(|s| s.phase) == Some(ClusterPhase::Running);
    if vc.meta().deletion_timestamp.is_some() || vc.spec.paused || !running {
        return None;
    }
    create::native_cluster_version(vc, "").ok()?;
    Some(schedule)
}

/// The time between two scheduled snapshots: the tenant's interval, at least the platform's minimum.
fn interval_of(schedule: &crds::SnapshotSchedule, limits: &Limits) -> Duration {
    Duration::from_secs(u64::from(schedule.interval_minutes.max(1)) * 60).max(limits.min_interval)
}

/// Whether `vc`, which could be snapshotted, has no snapshot newer than twice its interval at `now` (or
/// none at all after a failed attempt): what `vc_snapshots_overdue_tenants` counts.
pub fn overdue(vc: &VirtualCluster, record: &TenantRecord, now: Timestamp, limits: &Limits) -> bool {
    let Some(schedule) = snapshottable(vc) else {
        return false;
    };
    match record.last_taken {
        Some(last) => now > after(last, interval_of(schedule, limits) * 2),
        None => record.last_failure.is_some(),
    }
}

/// The Lease a scheduler of `store` holds (`--lease-namespace`): `vc-snapshots-<store>`, lowercase, with
/// every character a Lease name cannot hold replaced by `-`. The chart's Role grants exactly this name.
pub fn lease_name(store: &str) -> String {
    let name: String = format!("vc-snapshots-{store}")
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        })
        .take(253)
        .collect();
    name.trim_end_matches(['-', '.']).to_owned()
}

/// Whether `vc` is snapshotted at `now`, given what the store holds of it.
pub fn due(vc: &VirtualCluster, record: &TenantRecord, now: Timestamp, limits: &Limits) -> Option<Due> {
    let schedule = snapshottable(vc)?;
    // The later of the last snapshot and the last failure: nothing is retried at every poll.
    let last_attempt = record.last_taken.max(record.last_failure);
    if let Some(asked) = requested_time(vc, &limits.store)
        && asked <= after(now, REQUEST_CLOCK_SKEW)
        && last_attempt.is_none_or(|last| asked > last)
        && record
            .last_taken
            .is_none_or(|last| now >= after(last, limits.min_request_gap))
    {
        return Some(Due::Requested);
    }
    let interval = interval_of(schedule, limits);
    match (record.last_taken, record.last_failure) {
        (_, Some(failed)) if now < after(failed, interval.min(RETRY_AFTER_FAILURE)) => None,
        (None, _) => Some(Due::Scheduled),
        (Some(last), _) if now >= after(last, interval) => Some(Due::Scheduled),
        _ => None,
    }
}

/// The newest snapshot of the tenant with `uid` among `found`.
fn newest_of(found: &[SnapshotReport], uid: &str) -> Option<Timestamp> {
    found
        .iter()
        .filter(|s| s.manifest.virtual_cluster.uid == uid)
        .filter_map(|s| s.manifest.created_at.parse::<Timestamp>().ok())
        .max()
}

/// Removes folders a stopped scheduler left half written (hidden `.<name>.partial`) under `dir`'s
/// namespace folders.
fn remove_partial(dir: &Path, io: &mut Streams<'_>) -> Result<()> {
    let Ok(namespaces) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for namespace in namespaces.filter_map(|e| e.ok()) {
        let Ok(entries) = std::fs::read_dir(namespace.path()) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(create::PARTIAL_SUFFIX) {
                let path = entry.path();
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => log(io, &format!("removed the unfinished snapshot {}", path.display()))?,
                    Err(error) => io.warn(&format!(
                        "left the unfinished snapshot {}: {error}",
                        path.display()
                    ))?,
                }
            }
        }
    }
    Ok(())
}

/// A log line on stdout, with the time.
fn log(io: &mut Streams<'_>, line: &str) -> Result<()> {
    io.result(&format!("{} {line}", whole_seconds(Timestamp::now())))
}

/// The scheduler.
struct Scheduler {
    client: Client,
    dir: PathBuf,
    limits: Limits,
    records: HashMap<String, TenantRecord>,
    recorder: Recorder,
    metrics: Metrics,
    /// `--snapshot-timeout`.
    timeout: Duration,
    /// Unix time of the last poll finished or snapshot ended: the watchdog's measure of progress.
    progress: Arc<AtomicI64>,
}

impl Scheduler {
    /// What the store holds of `vc` (read from its namespace's folder the first time).
    fn record(&mut self, vc: &VirtualCluster, io: &mut Streams<'_>) -> Result<TenantRecord> {
        let uid = vc.uid().unwrap_or_default();
        if let Some(record) = self.records.get(&uid) {
            return Ok(record.clone());
        }
        let folder = self.dir.join(vc.namespace().unwrap_or_default());
        let last_taken = match scan(&folder) {
            Ok((found, _)) => newest_of(&found, &uid),
            Err(_) if !folder.exists() => None,
            Err(error) => {
                io.warn(&format!("reading {}: {}", folder.display(), error.one_line()))?;
                None
            }
        };
        let record = TenantRecord {
            last_taken,
            last_failure: None,
        };
        self.records.insert(uid, record.clone());
        Ok(record)
    }

    /// One look at every VirtualCluster; `false` when they could not be listed.
    async fn poll(&mut self, io: &mut Streams<'_>) -> Result<bool> {
        let vcs = match Api::<VirtualCluster>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(error) => {
                io.warn(&format!(
                    "listing VirtualClusters: {}",
                    Error::api("listing", error).one_line()
                ))?;
                return Ok(false);
            }
        };
        let present: std::collections::HashSet<String> = vcs.iter().filter_map(|vc| vc.uid()).collect();
        self.records.retain(|uid, _| present.contains(uid));
        for vc in &vcs {
            if vc.spec.snapshots.is_none() {
                continue;
            }
            let record = self.record(vc, io)?;
            if let Some(why) = due(vc, &record, Timestamp::now(), &self.limits) {
                self.snapshot(vc, why, io).await?;
            }
        }
        let now = Timestamp::now();
        let scheduled: Vec<&VirtualCluster> = vcs.iter().filter(|vc| vc.spec.snapshots.is_some()).collect();
        let overdue_count = scheduled
            .iter()
            .filter(|vc| {
                let record = self
                    .records
                    .get(&vc.uid().unwrap_or_default())
                    .cloned()
                    .unwrap_or_default();
                overdue(vc, &record, now, &self.limits)
            })
            .count();
        self.metrics
            .scheduled_tenants
            .set(i64::try_from(scheduled.len()).unwrap_or(i64::MAX));
        self.metrics
            .overdue_tenants
            .set(i64::try_from(overdue_count).unwrap_or(i64::MAX));
        self.mark_progress();
        Ok(true)
    }

    fn mark_progress(&self) {
        self.progress
            .store(Timestamp::now().as_second(), Ordering::Relaxed);
    }

    /// Snapshots `vc`, prunes its old snapshots, and reports.
    async fn snapshot(&mut self, vc: &VirtualCluster, why: Due, io: &mut Streams<'_>) -> Result<()> {
        let (namespace, name) = (vc.namespace().unwrap_or_default(), vc.name_any());
        let uid = vc.uid().unwrap_or_default();
        let vc_ref = format!("{namespace}/{name}");
        let folder = self.dir.join(&namespace);
        let started = Timestamp::now();
        let clock = std::time::Instant::now();
        // The snapshot's own progress lines are not wanted in a log.
        let (mut quiet_out, mut quiet_err) = (std::io::sink(), std::io::sink());
        let mut quiet = Streams::new(&mut quiet_out, &mut quiet_err, false);
        let taken = match tokio::time::timeout(
            self.timeout,
            create::take(&self.client, &namespace, &name, &folder, &mut quiet),
        )
        .await
        {
            Ok(taken) => taken,
            Err(_) => {
                // The unfinished folder goes now, not at the next start.
                remove_partial(&self.dir, io)?;
                Err(Error::Timeout {
                    what: format!("the snapshot of VirtualCluster {vc_ref}"),
                    after: self.timeout,
                    last: "still reading its etcd (--snapshot-timeout)".into(),
                })
            }
        };
        self.metrics.duration.observe(clock.elapsed().as_secs_f64());
        self.mark_progress();
        let trigger = why.labels();
        match taken {
            Ok(report) => {
                self.metrics.taken.get_or_create(&trigger).inc();
                self.metrics.last_success.set(Timestamp::now().as_second());
                self.records.insert(
                    uid.clone(),
                    TenantRecord {
                        last_taken: Some(record_time(&report, started)),
                        last_failure: None,
                    },
                );
                let retained = self.prune(&folder, &uid, self.limits.retain(vc), io)?;
                let relative = format!(
                    "{namespace}/{}",
                    report
                        .path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                );
                log(
                    io,
                    &format!(
                        "snapshot {relative} of VirtualCluster {vc_ref} ({why:?}): {}; checksum {}; {retained} kept",
                        report.summary(),
                        report.checksum
                    ),
                )?;
                let status = SnapshotStatus {
                    store: Some(self.limits.store.clone()),
                    last_snapshot_time: Some(Time(record_time(&report, started))),
                    last_snapshot: Some(relative.clone()),
                    last_checksum: Some(report.checksum.clone()),
                    retained: Some(i64::from(retained)),
                    last_failure_time: None,
                    last_failure: None,
                };
                self.write_status(vc, &status, io).await?;
                self.event(
                    vc,
                    EventType::Normal,
                    "SnapshotTaken",
                    format!(
                        "snapshot {relative} in {} ({}), checksum {}; {retained} kept",
                        self.limits.store,
                        report.summary(),
                        report.checksum
                    ),
                    io,
                )
                .await?;
            }
            Err(error) => {
                self.metrics.failed.get_or_create(&trigger).inc();
                let now = Timestamp::now();
                self.records.entry(uid.clone()).or_default().last_failure = Some(now);
                let message = error.one_line();
                log(
                    io,
                    &format!("snapshot of VirtualCluster {vc_ref} ({why:?}) failed: {message}"),
                )?;
                let mut status = vc
                    .status
                    .as_ref()
                    .and_then(|s| s.snapshots.clone())
                    .unwrap_or_default();
                status.store = Some(self.limits.store.clone());
                status.last_failure_time = Some(Time(now));
                status.last_failure = Some(message.clone());
                self.write_status(vc, &status, io).await?;
                self.event(vc, EventType::Warning, "SnapshotFailed", message, io)
                    .await?;
            }
        }
        Ok(())
    }

    /// Removes all but the newest `keep` snapshots of the tenant `uid` from `folder`; returns how many
    /// are left.
    fn prune(&self, folder: &Path, uid: &str, keep: u32, io: &mut Streams<'_>) -> Result<u32> {
        let (found, _) = scan(folder)?;
        let own: Vec<SnapshotReport> = found
            .into_iter()
            .filter(|s| s.manifest.virtual_cluster.uid == uid)
            .collect();
        let removed = to_remove(&own, usize::try_from(keep).unwrap_or(usize::MAX));
        for snapshot in &removed {
            match std::fs::remove_dir_all(&snapshot.path) {
                Ok(()) => log(io, &format!("removed {} (retention)", snapshot.path.display()))?,
                Err(error) => io.warn(&format!("removing {}: {error}", snapshot.path.display()))?,
            }
        }
        let left = own.len().saturating_sub(removed.len());
        Ok(u32::try_from(left).unwrap_or(u32::MAX))
    }

    async fn write_status(
        &self,
        vc: &VirtualCluster,
        status: &SnapshotStatus,
        io: &mut Streams<'_>,
    ) -> Result<()> {
        let api = Api::<VirtualCluster>::namespaced(self.client.clone(), &vc.namespace().unwrap_or_default());
        let patch = json!({
            "apiVersion": crate::manifest::API_VERSION,
            "kind": "VirtualCluster",
            "status": {"snapshots": status},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if let Err(error) = api
            .patch_status(&vc.name_any(), &params, &Patch::Apply(&patch))
            .await
        {
            // The snapshot is in the store whatever the status says; a later one writes it again.
            io.warn(&format!(
                "writing the status of VirtualCluster {}/{}: {}",
                vc.namespace().unwrap_or_default(),
                vc.name_any(),
                Error::api("patching", error).one_line()
            ))?;
        }
        Ok(())
    }

    async fn event(
        &self,
        vc: &VirtualCluster,
        type_: EventType,
        reason: &str,
        note: String,
        io: &mut Streams<'_>,
    ) -> Result<()> {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Snapshot".to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &vc.object_ref(&())).await {
            io.warn(&format!(
                "recording event {reason} on VirtualCluster {}/{}: {error}",
                vc.namespace().unwrap_or_default(),
                vc.name_any()
            ))?;
        }
        Ok(())
    }
}

fn record_time(report: &SnapshotReport, fallback: Timestamp) -> Timestamp {
    report.manifest.created_at.parse().unwrap_or(fallback)
}

/// How long the scheduler may go without progress (a poll finished, a snapshot ended) before `/healthz`
/// fails: a snapshot may take `--snapshot-timeout`, and a poll a little on top.
fn stall_limit(args: &SnapshotScheduleArgs) -> Duration {
    args.snapshot_timeout + args.poll.max(Duration::from_secs(1)) * 2 + Duration::from_secs(120)
}

/// `kubectl vc snapshot schedule`: runs until `interrupt`, on the shared runtime: with
/// `--admin-address` it serves `/metrics` ([`Metrics`]), `/healthz` (failing once the scheduler has made no
/// progress for [`stall_limit`]) and `/readyz` (once it has listed the VirtualClusters, holding the Lease when
/// `--lease-namespace` asks for one).
pub async fn command(
    client: &Client,
    args: &SnapshotScheduleArgs,
    io: &mut Streams<'_>,
    interrupt: impl Future<Output = ()> + Send,
) -> Result<()> {
    if args.store_name.trim().is_empty() {
        return Err(Error::InvalidArgument {
            flag: "--store-name",
            problem: "must name the store, e.g. pvc/vc-snapshots".into(),
        });
    }
    std::fs::create_dir_all(&args.to).map_err(|e| Error::Snapshot {
        path: args.to.clone(),
        problem: format!("creating the store folder: {e}"),
    })?;
    remove_partial(&args.to, io)?;
    let election = args
        .lease_namespace
        .as_ref()
        .map(|namespace| vc_runtime::leader::LeaderElection {
            namespace: namespace.clone(),
            lease_duration: Duration::from_secs(args.lease_duration_seconds),
            identity: None,
        });
    // Stopped by `interrupt` (the binary's: Ctrl-C or SIGTERM), so that a test running it in process
    // installs no signal handler.
    let mut builder = vc_runtime::Runtime::builder()
        .with_client(client.clone())
        .with_shutdown_on(std::future::pending())
        .with_leader_election(&lease_name(&args.store_name), election);
    if let Some(address) = args.admin_address {
        builder = builder.with_admin(address);
    }
    let mut runtime = builder.build().await?;
    let metrics = Metrics::default();
    metrics.register(runtime.registry_mut());
    let health = runtime.health();
    let lease = runtime.lease();
    let progress = Arc::new(AtomicI64::new(Timestamp::now().as_second()));
    let reporter = Reporter {
        controller: FIELD_MANAGER.to_owned(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let mut scheduler = Scheduler {
        client: client.clone(),
        dir: args.to.clone(),
        limits: Limits::of(args),
        records: HashMap::new(),
        recorder: Recorder::new(client.clone(), reporter),
        metrics,
        timeout: args.snapshot_timeout,
        progress: progress.clone(),
    };
    let work = async {
        let mut leadership = match &lease {
            Some(lease) => {
                log(
                    io,
                    &format!(
                        "waiting for Lease {}/{}",
                        args.lease_namespace.as_deref().unwrap_or_default(),
                        lease.name()
                    ),
                )?;
                Some(lease.acquire().await?)
            }
            None => None,
        };
        progress.store(Timestamp::now().as_second(), Ordering::Relaxed);
        let watchdog = tokio::spawn(watch_progress(
            progress.clone(),
            stall_limit(args),
            health.clone(),
        ));
        log(
            io,
            &format!(
                "snapshot scheduler for store {} in {}: every VirtualCluster with spec.snapshots, at most every {}, keeping at most {}",
                args.store_name,
                args.to.display(),
                crate::duration::format(args.min_interval),
                args.max_retain
            ),
        )?;
        let run = async {
            loop {
                if scheduler.poll(io).await? {
                    health.set_ready(true);
                }
                // A poll of 0 would spin: once a second at the most.
                tokio::time::sleep(args.poll.max(Duration::from_secs(1))).await;
            }
        };
        let lost = async {
            match leadership.as_mut() {
                Some(leadership) => leadership.lost().await,
                None => std::future::pending().await,
            }
        };
        let result = tokio::select! {
            result = run => result,
            error = lost => Err(Error::from(error)),
            () = interrupt => Ok(()),
        };
        watchdog.abort();
        // A snapshot cut short leaves its hidden folder; it goes now rather than at the next start.
        remove_partial(&args.to, io)?;
        result
    };
    runtime.run(work).await
}

/// Marks the scheduler dead (`/healthz` 503, so the kubelet restarts it) once it has made no progress for
/// `limit`.
async fn watch_progress(progress: Arc<AtomicI64>, limit: Duration, health: vc_runtime::admin::Health) {
    let limit = i64::try_from(limit.as_secs()).unwrap_or(i64::MAX);
    loop {
        tokio::time::sleep(Duration::from_secs(15)).await;
        let stalled = Timestamp::now().as_second() - progress.load(Ordering::Relaxed);
        if stalled > limit {
            eprintln!(
                "{} no progress for {stalled}s (more than {limit}s): reporting unhealthy",
                whole_seconds(Timestamp::now())
            );
            health.set_dead();
            return;
        }
    }
}

/// `kubectl vc snapshot create NAME --to pvc/<claim>`: asks the scheduler serving that store and waits for
/// its snapshot (or its failure).
pub async fn request(
    client: &Client,
    namespace: &str,
    args: &SnapshotCreateArgs,
    store: &str,
    io: &mut Streams<'_>,
) -> Result<()> {
    let name = args.name.as_str();
    let vc_ref = format!("{namespace}/{name}");
    let api = Api::<VirtualCluster>::namespaced(client.clone(), namespace);
    let vc = api
        .get(name)
        .await
        .map_err(|e| Error::reading("VirtualCluster", namespace, name, e))?;
    create::native_cluster_version(&vc, &vc_ref)?;
    let asked = whole_seconds(Timestamp::now());
    let value = request_value(store, asked);
    let patch = json!({"metadata": {"annotations": {ANNOTATION_SNAPSHOT_REQUESTED: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::api(format!("asking for a snapshot of VirtualCluster {vc_ref}"), e))?;
    io.progress(&format!(
        "{vc_ref}: asked the snapshot scheduler of {store} for a snapshot"
    ))?;
    let deadline = tokio::time::Instant::now() + args.timeout;
    let mut last = "no answer yet".to_owned();
    loop {
        let vc = api
            .get(name)
            .await
            .map_err(|e| Error::reading("VirtualCluster", namespace, name, e))?;
        let status = vc.status.as_ref().and_then(|s| s.snapshots.as_ref());
        if let Some(status) = status.filter(|s| s.store.as_deref() == Some(store)) {
            if let Some(failed) = status.last_failure_time.as_ref().filter(|t| t.0 >= asked) {
                return Err(Error::Snapshot {
                    path: PathBuf::from(store),
                    problem: format!(
                        "the scheduler's snapshot of VirtualCluster {vc_ref} failed at {}: {}",
                        failed.0,
                        status.last_failure.as_deref().unwrap_or("no reason given")
                    ),
                });
            }
            if status.last_snapshot_time.as_ref().is_some_and(|t| t.0 >= asked) {
                return report_request(&vc_ref, store, status, args, io);
            }
            last = format!(
                "last snapshot {} at {}",
                status.last_snapshot.as_deref().unwrap_or("none"),
                status
                    .last_snapshot_time
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default()
            );
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!(
                    "the snapshot scheduler serving {store} to snapshot VirtualCluster {vc_ref} (is the chart's snapshots.enabled set, and is the VirtualCluster Running?)"
                ),
                after: args.timeout,
                last,
            });
        }
        io.progress(&format!(
            "{vc_ref}: waiting for the snapshot scheduler of {store}; {last}"
        ))?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn report_request(
    vc_ref: &str,
    store: &str,
    status: &SnapshotStatus,
    args: &SnapshotCreateArgs,
    io: &mut Streams<'_>,
) -> Result<()> {
    match args.output.output {
        Some(format) => io
            .out
            .write_all(output::serialize(status, format, "the snapshot")?.as_bytes())?,
        None => io.result(&format!(
            "snapshot {store}:{} of VirtualCluster {vc_ref}: {} kept in the store\nchecksum {}",
            status.last_snapshot.as_deref().unwrap_or_default(),
            status.retained.unwrap_or_default(),
            status.last_checksum.as_deref().unwrap_or_default()
        ))?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{ControlPlaneMode, SnapshotSchedule, VirtualClusterStatus};

    fn at(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    #[test]
    fn a_snapshot_is_labelled_by_what_asked_for_it() {
        assert_eq!(Due::Scheduled.labels().trigger, "scheduled");
        assert_eq!(Due::Requested.labels().trigger, "requested");
    }

    fn limits() -> Limits {
        Limits {
            store: "pvc/vc-snapshots".into(),
            min_interval: Duration::from_secs(15 * 60),
            min_request_gap: Duration::from_secs(5 * 60),
            max_retain: 30,
        }
    }

    fn tenant(interval_minutes: u32, retain: u32) -> VirtualCluster {
        let mut vc = VirtualCluster::new("team-a", Default::default());
        vc.metadata.namespace = Some("tenants".into());
        vc.metadata.uid = Some("uid-1".into());
        vc.spec.cluster_version_name = Some("cv".into());
        vc.spec.snapshots = Some(SnapshotSchedule {
            interval_minutes,
            retain,
        });
        vc.status = Some(VirtualClusterStatus {
            phase: Some(ClusterPhase::Running),
            mode: Some(ControlPlaneMode::Provisioned),
            ..Default::default()
        });
        vc
    }

    fn taken(time: &str) -> TenantRecord {
        TenantRecord {
            last_taken: Some(at(time)),
            last_failure: None,
        }
    }

    #[test]
    fn a_running_native_tenant_is_due_first_and_then_every_interval_at_least_the_platform_minimum() {
        let now = at("2026-11-25T12:00:00Z");
        let limits = limits();
        assert_eq!(
            due(&tenant(60, 7), &TenantRecord::default(), now, &limits),
            Some(Due::Scheduled)
        );
        assert_eq!(
            due(&tenant(60, 7), &taken("2026-11-25T11:00:00Z"), now, &limits),
            Some(Due::Scheduled)
        );
        assert_eq!(
            due(&tenant(60, 7), &taken("2026-11-25T11:00:01Z"), now, &limits),
            None
        );
        // One minute asked, fifteen the platform's minimum.
        assert_eq!(
            due(&tenant(1, 7), &taken("2026-11-25T11:50:00Z"), now, &limits),
            None
        );
        assert_eq!(
            due(&tenant(1, 7), &taken("2026-11-25T11:45:00Z"), now, &limits),
            Some(Due::Scheduled)
        );
    }

    #[test]
    fn paused_pending_deleting_adopted_or_unscheduled_tenants_are_never_due() {
        let now = at("2026-11-25T12:00:00Z");
        let never = TenantRecord::default();
        let mut paused = tenant(60, 7);
        paused.spec.paused = true;
        let mut pending = tenant(60, 7);
        pending.status.as_mut().expect("status").phase = Some(ClusterPhase::Pending);
        let mut deleting = tenant(60, 7);
        deleting.metadata.deletion_timestamp = Some(Time(now));
        let mut adopted = tenant(60, 7);
        adopted.status.as_mut().expect("status").mode = Some(ControlPlaneMode::Adopted);
        let mut unscheduled = tenant(60, 7);
        unscheduled.spec.snapshots = None;
        for vc in [paused, pending, deleting, adopted, unscheduled] {
            assert_eq!(due(&vc, &never, now, &limits()), None, "{vc:?}");
        }
    }

    #[test]
    fn a_request_for_this_store_is_honoured_once_after_the_gap_and_never_from_the_future() {
        let now = at("2026-11-25T12:00:00Z");
        let limits = limits();
        let mut vc = tenant(1440, 7);
        let ask = |vc: &mut VirtualCluster, value: &str| {
            vc.metadata.annotations =
                Some([(ANNOTATION_SNAPSHOT_REQUESTED.to_owned(), value.to_owned())].into());
        };
        ask(
            &mut vc,
            &request_value("pvc/vc-snapshots", at("2026-11-25T11:59:30Z")),
        );
        assert_eq!(
            due(&vc, &taken("2026-11-25T11:00:00Z"), now, &limits),
            Some(Due::Requested)
        );
        // Already answered: the snapshot is newer than the request.
        assert_eq!(due(&vc, &taken("2026-11-25T11:59:31Z"), now, &limits), None);
        // Too soon after the last one: waits for the gap, then is honoured.
        ask(
            &mut vc,
            &request_value("pvc/vc-snapshots", at("2026-11-25T11:59:50Z")),
        );
        assert_eq!(due(&vc, &taken("2026-11-25T11:58:00Z"), now, &limits), None);
        assert_eq!(
            due(
                &vc,
                &taken("2026-11-25T11:58:00Z"),
                at("2026-11-25T12:03:00Z"),
                &limits
            ),
            Some(Due::Requested)
        );
        // Another store's request, a far-future one, and a malformed one are not this scheduler's.
        for value in [
            "pvc/other 2026-11-25T11:59:30Z",
            "pvc/vc-snapshots 2027-01-01T00:00:00Z",
            "pvc/vc-snapshots soon",
            "garbage",
        ] {
            ask(&mut vc, value);
            assert_eq!(
                due(&vc, &taken("2026-11-25T11:00:00Z"), now, &limits),
                None,
                "{value}"
            );
        }
    }

    #[test]
    fn a_failure_is_retried_after_five_minutes_or_the_interval_not_at_every_poll() {
        let limits = Limits {
            min_interval: Duration::from_secs(60),
            ..limits()
        };
        let failed = TenantRecord {
            last_taken: None,
            last_failure: Some(at("2026-11-25T12:00:00Z")),
        };
        assert_eq!(
            due(&tenant(60, 7), &failed, at("2026-11-25T12:04:59Z"), &limits),
            None
        );
        assert_eq!(
            due(&tenant(60, 7), &failed, at("2026-11-25T12:05:00Z"), &limits),
            Some(Due::Scheduled)
        );
        assert_eq!(
            due(&tenant(2, 7), &failed, at("2026-11-25T12:02:00Z"), &limits),
            Some(Due::Scheduled)
        );
    }

    #[test]
    fn retention_is_the_tenant_s_within_the_platform_cap() {
        let limits = Limits {
            max_retain: 10,
            ..limits()
        };
        assert_eq!(limits.retain(&tenant(60, 3)), 3);
        assert_eq!(limits.retain(&tenant(60, 1000)), 10);
    }

    #[test]
    fn a_tenant_is_overdue_past_twice_its_interval_or_after_a_failure_without_any_snapshot() {
        let now = at("2026-11-25T12:00:00Z");
        let limits = limits();
        // Hourly: overdue after two hours.
        assert!(!overdue(
            &tenant(60, 7),
            &taken("2026-11-25T10:00:00Z"),
            now,
            &limits
        ));
        assert!(overdue(
            &tenant(60, 7),
            &taken("2026-11-25T09:59:59Z"),
            now,
            &limits
        ));
        // Never taken: not overdue until an attempt failed.
        assert!(!overdue(&tenant(60, 7), &TenantRecord::default(), now, &limits));
        let failed = TenantRecord {
            last_taken: None,
            last_failure: Some(at("2026-11-25T11:59:00Z")),
        };
        assert!(overdue(&tenant(60, 7), &failed, now, &limits));
        // A paused tenant is not snapshotted, so never overdue.
        let mut paused = tenant(60, 7);
        paused.spec.paused = true;
        assert!(!overdue(&paused, &taken("2026-11-01T00:00:00Z"), now, &limits));
    }

    #[test]
    fn the_lease_is_named_after_the_store_as_the_chart_grants_it() {
        assert_eq!(
            lease_name("pvc/vc-virtualcluster-snapshots"),
            "vc-snapshots-pvc-vc-virtualcluster-snapshots"
        );
        assert_eq!(lease_name("PVC/Backups_1/"), "vc-snapshots-pvc-backups-1");
        assert!(lease_name(&"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn only_pvc_slash_claim_names_a_store() {
        assert_eq!(
            store_of(Path::new("pvc/vc-snapshots")).as_deref(),
            Some("pvc/vc-snapshots")
        );
        for folder in ["./pvc/vc-snapshots", "/backups", "pvc/", "pvc/a/b", "pvcs/x"] {
            assert_eq!(store_of(Path::new(folder)), None, "{folder}");
        }
    }
}
