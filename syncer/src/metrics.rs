//! The syncer's Prometheus metrics.
//!
//! Labels are a fixed set of words (resource, direction, operation, result) plus the tenant, which is one
//! series per VirtualCluster: its series are removed when the tenant is detached.

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// Which way an object flows.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Direction {
    /// Tenant to super.
    Down,
    /// Super to tenant.
    Up,
}

/// What a reconcile did.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Operation {
    /// Created an object.
    Create,
    /// Updated an object.
    Update,
    /// Deleted an object.
    Delete,
    /// Found everything in sync.
    None,
    /// Held back (quota, policy, waiting for a dependency).
    Wait,
}

/// Labels of reconcile counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// Resource, e.g. `pod`.
    pub resource: &'static str,
    /// Direction.
    pub direction: Direction,
    /// What was done.
    pub operation: Operation,
    /// `success` or an error category.
    pub result: &'static str,
}

/// Labels of per-resource histograms.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// Resource.
    pub resource: &'static str,
    /// Direction.
    pub direction: Direction,
}

/// Labels of writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// Resource.
    pub resource: &'static str,
    /// `apply` or `delete` (super), or the tenant-side verb.
    pub verb: &'static str,
}

/// Labels of tenant handovers between sharded replicas.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandoverLabels {
    /// `acquired` (a free or new Lease), `taken_over` (its holder's membership had expired), `released`
    /// (handed to the replica that should own it), `lost` (membership lapsed, or another replica holds it).
    pub reason: &'static str,
}

/// Labels of per-tenant series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    /// `namespace/name` of the VirtualCluster.
    pub tenant: String,
    /// Direction (queue series) or `none`.
    pub direction: Direction,
}

/// Labels of per-tenant usage gauges: defined beside the usage series, which own them.
pub use crate::accounting::usage::metrics::UsageLabels;

/// Labels of patrol counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PatrolLabels {
    /// Resource.
    pub resource: &'static str,
    /// `missing`, `drifted`, `orphaned`, `stale-vnode`.
    pub finding: &'static str,
}

/// Labels of the refusal counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// Resource refused.
    pub resource: &'static str,
    /// Event reason the tenant saw: `PodPolicyViolation`, `ResourcesRequired`, `StorageClassNotPublished`,
    /// `ClaimRefused`, `IngressRefused`, `LoadBalancerClassRefused`, `TenantQuotaExceeded`, ...
    pub reason: &'static str,
}

/// Labels of the tenant-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `attached`, `unreachable`, `over_limit` (detached for its cache limits), `paused` (`spec.paused`),
    /// `held_back` (a syncer process stopped while attaching it, [`crate::tenancy::journal`]) or `waiting`.
    pub state: &'static str,
}

/// Every metric of the syncer.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles by resource, direction, operation and result.
    pub operations: Family<OperationLabels, Counter>,
    /// Reconcile duration.
    pub operation_duration: Family<ResourceLabels, Histogram>,
    /// Writes to the super cluster.
    pub super_writes: Family<WriteLabels, Counter>,
    /// Writes to tenant apiservers.
    pub tenant_writes: Family<WriteLabels, Counter>,
    /// Items waiting per tenant and direction.
    pub queue_depth: Family<TenantLabels, Gauge>,
    /// Time items waited in the queue.
    pub queue_wait: Family<TenantLabels, Histogram>,
    /// Non-terminal super pods per tenant.
    pub tenant_pods: Family<UsageLabels, Gauge>,
    /// Sum of CPU requests of super pods per tenant, in millicores.
    pub tenant_cpu_requests_millicores: Family<UsageLabels, Gauge>,
    /// Sum of memory requests of super pods per tenant, in bytes.
    pub tenant_memory_requests_bytes: Family<UsageLabels, Gauge>,
    /// Pods held back by the tenant's quota.
    pub quota_waiting_pods: Family<UsageLabels, Gauge>,
    /// Patrol findings.
    pub patrol_findings: Family<PatrolLabels, Counter>,
    /// Patrol remedies queued or done.
    pub patrol_remedies: Family<PatrolLabels, Counter>,
    /// Patrol scan duration.
    pub patrol_duration: Histogram,
    /// Time from a tenant's attach until every cache of it has listed (its work waits until then).
    pub tenant_list_duration: Histogram,
    /// Tenant objects refused (not written to the super cluster) by resource and reason.
    pub refusals: Family<RefusalLabels, Counter>,
    /// Fields of VirtualClusters' specs the platform's limits changed (counted when the limits newly apply
    /// or apply otherwise).
    pub spec_limited: Counter,
    /// Tenants by state.
    pub tenants: Family<StateLabels, Gauge>,
    /// Super events not copied up because their tenant had too many waiting.
    pub events_dropped: Counter,
    /// Tenants this replica holds the Lease of (sharded replicas only).
    pub shard_owned_tenants: Gauge,
    /// Live replicas this replica sees, itself included (sharded replicas only).
    pub shard_members: Gauge,
    /// 1 while this replica runs the cluster-wide duties (sharded replicas only).
    pub shard_duties: Gauge,
    /// Tenant Leases this replica acquired, took over, released or lost.
    pub shard_handovers: Family<HandoverLabels, Counter>,
    /// What tenants consume ([`crate::accounting::usage`]).
    pub usage: crate::accounting::usage::metrics::UsageMetrics,
    /// The bound on in-flight super writes ([`crate::engine::write_gate`]).
    pub write_slots: crate::engine::write_gate::GateMetrics,
    /// Writes of this replica's attach journal ([`crate::tenancy::journal`]).
    pub journal_writes: Counter,
    /// Syncer stops counted against tenants (one per tenant a stopped process was attaching).
    pub attach_stops: Counter,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            operations: Family::default(),
            operation_duration: Family::new_with_constructor(duration_histogram),
            super_writes: Family::default(),
            tenant_writes: Family::default(),
            queue_depth: Family::default(),
            queue_wait: Family::new_with_constructor(duration_histogram),
            tenant_pods: Family::default(),
            tenant_cpu_requests_millicores: Family::default(),
            tenant_memory_requests_bytes: Family::default(),
            quota_waiting_pods: Family::default(),
            patrol_findings: Family::default(),
            patrol_remedies: Family::default(),
            patrol_duration: duration_histogram(),
            tenant_list_duration: duration_histogram(),
            refusals: Family::default(),
            spec_limited: Counter::default(),
            tenants: Family::default(),
            events_dropped: Counter::default(),
            shard_owned_tenants: Gauge::default(),
            shard_members: Gauge::default(),
            shard_duties: Gauge::default(),
            shard_handovers: Family::default(),
            usage: Default::default(),
            write_slots: crate::engine::write_gate::GateMetrics::default(),
            journal_writes: Counter::default(),
            attach_stops: Counter::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric under the `syncer` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("syncer");
        registry.register(
            "operations",
            "Reconciles by resource, direction, operation and result",
            self.operations.clone(),
        );
        registry.register(
            "operation_duration_seconds",
            "Reconcile duration by resource and direction",
            self.operation_duration.clone(),
        );
        registry.register(
            "super_writes",
            "Writes to the super cluster",
            self.super_writes.clone(),
        );
        registry.register(
            "tenant_writes",
            "Writes to tenant apiservers",
            self.tenant_writes.clone(),
        );
        registry.register(
            "queue_depth",
            "Items waiting per tenant and direction",
            self.queue_depth.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time items waited in the queue",
            self.queue_wait.clone(),
        );
        registry.register(
            "tenant_pods",
            "Non-terminal super pods per tenant",
            self.tenant_pods.clone(),
        );
        registry.register(
            "tenant_cpu_requests_millicores",
            "CPU requests of super pods per tenant",
            self.tenant_cpu_requests_millicores.clone(),
        );
        registry.register(
            "tenant_memory_requests_bytes",
            "Memory requests of super pods per tenant",
            self.tenant_memory_requests_bytes.clone(),
        );
        registry.register(
            "quota_waiting_pods",
            "Pods held back by the tenant's quota",
            self.quota_waiting_pods.clone(),
        );
        registry.register(
            "patrol_findings",
            "Differences the patrol found",
            self.patrol_findings.clone(),
        );
        registry.register(
            "patrol_remedies",
            "Repairs the patrol queued",
            self.patrol_remedies.clone(),
        );
        registry.register(
            "patrol_duration_seconds",
            "Duration of a patrol scan",
            self.patrol_duration.clone(),
        );
        registry.register(
            "tenant_list_duration_seconds",
            "Time from a tenant's attach until every cache of it has listed",
            self.tenant_list_duration.clone(),
        );
        registry.register(
            "refusals",
            "Tenant objects refused by resource and event reason (nothing written)",
            self.refusals.clone(),
        );
        registry.register(
            "spec_limited_fields",
            "Fields of VirtualCluster specs the platform's limits changed (weight, quota, rate limit, ingress hosts, runtime class)",
            self.spec_limited.clone(),
        );
        registry.register("tenants", "Tenants by state", self.tenants.clone());
        registry.register(
            "attach_journal_writes",
            "Writes of this replica's attach journal (a few per attach wave, none in steady state)",
            self.journal_writes.clone(),
        );
        registry.register(
            "attach_stops",
            "Syncer processes' unclean stops counted against tenants they were attaching",
            self.attach_stops.clone(),
        );
        registry.register(
            "events_dropped",
            "Super events not copied up because their tenant had too many waiting",
            self.events_dropped.clone(),
        );
        registry.register(
            "shard_owned_tenants",
            "Tenants this replica holds the Lease of (sharded replicas)",
            self.shard_owned_tenants.clone(),
        );
        registry.register(
            "shard_members",
            "Live syncer replicas this replica sees, itself included (sharded replicas)",
            self.shard_members.clone(),
        );
        registry.register(
            "shard_duties",
            "1 while this replica runs the cluster-wide duties (sharded replicas)",
            self.shard_duties.clone(),
        );
        registry.register(
            "shard_handovers",
            "Tenant Leases acquired, taken over, released or lost, by reason",
            self.shard_handovers.clone(),
        );
        registry.register(
            "super_write_slot_wait_seconds",
            "Time super writes waited for one of the --super-write-slots, by class (tenant, platform)",
            self.write_slots.wait.clone(),
        );
        registry.register(
            "super_write_slots_in_use",
            "Super writes in flight (at most --super-write-slots)",
            self.write_slots.in_use.clone(),
        );
        registry.register(
            "super_write_slot_waiters",
            "Super writes waiting for a slot",
            self.write_slots.waiting.clone(),
        );
        self.usage.register(registry);
    }

    /// Counts a write to the super cluster.
    pub fn super_write(&self, resource: &'static str, verb: &'static str) {
        self.super_writes
            .get_or_create(&WriteLabels { resource, verb })
            .inc();
    }

    /// Counts a tenant object the syncer refused to write.
    pub fn refused(&self, resource: &'static str, reason: &'static str) {
        self.refusals
            .get_or_create(&RefusalLabels { resource, reason })
            .inc();
    }

    /// Counts a write to a tenant.
    pub fn tenant_write(&self, resource: &'static str, verb: &'static str) {
        self.tenant_writes
            .get_or_create(&WriteLabels { resource, verb })
            .inc();
    }

    /// Writes to the super cluster so far, by resource and verb (non-zero only).
    pub fn super_write_counts(&self) -> Vec<(&'static str, &'static str, u64)> {
        const RESOURCES: [&str; 10] = [
            "namespace",
            "pod",
            "service",
            "endpoints",
            "configmap",
            "secret",
            "serviceaccount",
            "persistentvolumeclaim",
            "ingress",
            "networkpolicy",
        ];
        let mut counts = Vec::new();
        for resource in RESOURCES {
            for verb in [
                "apply",
                "create",
                "patch",
                "delete",
                "resize",
                "ephemeralcontainers",
            ] {
                if let Some(counter) = self.super_writes.get(&WriteLabels { resource, verb }) {
                    let count = counter.get();
                    if count > 0 {
                        counts.push((resource, verb, count));
                    }
                }
            }
        }
        counts
    }

    /// Total writes to the super cluster so far.
    pub fn super_writes_total(&self) -> u64 {
        self.super_write_counts().iter().map(|(_, _, n)| n).sum()
    }

    /// Removes a detached tenant's series.
    pub fn forget_tenant(&self, tenant: &str) {
        for direction in [Direction::Down, Direction::Up] {
            let labels = TenantLabels {
                tenant: tenant.to_owned(),
                direction,
            };
            self.queue_depth.remove(&labels);
            self.queue_wait.remove(&labels);
        }
        let labels = UsageLabels {
            tenant: tenant.to_owned(),
        };
        self.tenant_pods.remove(&labels);
        self.tenant_cpu_requests_millicores.remove(&labels);
        self.tenant_memory_requests_bytes.remove(&labels);
        self.quota_waiting_pods.remove(&labels);
        self.usage.forget(&labels);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use prometheus_client::{encoding::text::encode, registry::Registry};

    use super::*;
    use crate::{accounting::usage::metrics::SourceLabels, engine::write_gate::SlotLabels};

    /// One exposed family: type, HELP, label names and the values seen of each label.
    #[derive(Default)]
    struct Exposed {
        kind: String,
        help: String,
        labels: BTreeMap<String, BTreeSet<String>>,
        samples: usize,
    }

    /// Reads the text exposition back into families (sample lines go to the longest family name they
    /// start with; a histogram's `le` is its own, not a label of ours).
    fn exposition(metrics: &Metrics) -> BTreeMap<String, Exposed> {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        let mut families: BTreeMap<String, Exposed> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("name and help");
                families.entry(name.to_owned()).or_default().help = help.to_owned();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("name and type");
                families.entry(name.to_owned()).or_default().kind = kind.to_owned();
            } else if !line.starts_with('#') {
                let name_end = line.find(['{', ' ']).expect("a sample");
                let family = families
                    .keys()
                    .filter(|f| line[..name_end].starts_with(f.as_str()))
                    .max_by_key(|f| f.len())
                    .cloned()
                    .unwrap_or_else(|| panic!("sample of no family: {line}"));
                let exposed = families.get_mut(&family).expect("just found");
                exposed.samples += 1;
                if let Some(set) = line.split_once('{').and_then(|(_, l)| l.split_once('}')) {
                    for pair in set.0.split(',') {
                        let (label, value) = pair.split_once('=').expect("label=value");
                        if label != "le" {
                            exposed
                                .labels
                                .entry(label.to_owned())
                                .or_default()
                                .insert(value.trim_matches('"').to_owned());
                        }
                    }
                }
            }
        }
        families
    }

    /// A series in every family, so that each shows its label names.
    fn populated() -> Metrics {
        let metrics = Metrics::default();
        for direction in [Direction::Down, Direction::Up] {
            for operation in [
                Operation::Create,
                Operation::Update,
                Operation::Delete,
                Operation::None,
                Operation::Wait,
            ] {
                metrics
                    .operations
                    .get_or_create(&OperationLabels {
                        resource: "pod",
                        direction,
                        operation,
                        result: "success",
                    })
                    .inc();
            }
            metrics
                .operation_duration
                .get_or_create(&ResourceLabels {
                    resource: "pod",
                    direction,
                })
                .observe(0.1);
            let tenant = TenantLabels {
                tenant: "ns/a".into(),
                direction,
            };
            metrics.queue_depth.get_or_create(&tenant).set(1);
            metrics.queue_wait.get_or_create(&tenant).observe(0.1);
        }
        metrics.super_write("pod", "apply");
        metrics.tenant_write("pod", "patch");
        metrics.refused("pod", "PodPolicyViolation");
        let tenant = UsageLabels {
            tenant: "ns/a".into(),
        };
        metrics.tenant_pods.get_or_create(&tenant).set(1);
        metrics
            .tenant_cpu_requests_millicores
            .get_or_create(&tenant)
            .set(1);
        metrics.tenant_memory_requests_bytes.get_or_create(&tenant).set(1);
        metrics.quota_waiting_pods.get_or_create(&tenant).set(1);
        let finding = PatrolLabels {
            resource: "pod",
            finding: "missing",
        };
        metrics.patrol_findings.get_or_create(&finding).inc();
        metrics.patrol_remedies.get_or_create(&finding).inc();
        metrics
            .tenants
            .get_or_create(&StateLabels { state: "attached" })
            .set(1);
        metrics
            .shard_handovers
            .get_or_create(&HandoverLabels { reason: "acquired" })
            .inc();
        metrics
            .write_slots
            .wait
            .get_or_create(&SlotLabels { class: "tenant" })
            .observe(0.1);
        let usage = &metrics.usage;
        usage.cpu_cores.get_or_create(&tenant).set(1.0);
        for gauge in [
            &usage.memory_bytes,
            &usage.measured_pods,
            &usage.claims,
            &usage.storage_bytes,
            &usage.load_balancers,
            &usage.node_ports,
        ] {
            gauge.get_or_create(&tenant).set(1);
        }
        usage.apiserver_requests.get_or_create(&tenant).inc();
        usage
            .failures
            .get_or_create(&SourceLabels { source: "node" })
            .inc();
        metrics
    }

    /// Every family as `name type [labels] help`, as main exposed it before the metrics moved beside
    /// their subsystems (issue 33): dashboards, the chart's PrometheusRule and docs/syncer.md name them.
    const PINNED: &[&str] = &[
        "syncer_attach_journal_writes counter [] Writes of this replica's attach journal (a few per attach wave, none in steady state).",
        "syncer_attach_stops counter [] Syncer processes' unclean stops counted against tenants they were attaching.",
        "syncer_events_dropped counter [] Super events not copied up because their tenant had too many waiting.",
        "syncer_operation_duration_seconds histogram [direction,resource] Reconcile duration by resource and direction.",
        "syncer_operations counter [direction,operation,resource,result] Reconciles by resource, direction, operation and result.",
        "syncer_patrol_duration_seconds histogram [] Duration of a patrol scan.",
        "syncer_patrol_findings counter [finding,resource] Differences the patrol found.",
        "syncer_patrol_remedies counter [finding,resource] Repairs the patrol queued.",
        "syncer_queue_depth gauge [direction,tenant] Items waiting per tenant and direction.",
        "syncer_queue_wait_seconds histogram [direction,tenant] Time items waited in the queue.",
        "syncer_quota_waiting_pods gauge [tenant] Pods held back by the tenant's quota.",
        "syncer_refusals counter [reason,resource] Tenant objects refused by resource and event reason (nothing written).",
        "syncer_shard_duties gauge [] 1 while this replica runs the cluster-wide duties (sharded replicas).",
        "syncer_shard_handovers counter [reason] Tenant Leases acquired, taken over, released or lost, by reason.",
        "syncer_shard_members gauge [] Live syncer replicas this replica sees, itself included (sharded replicas).",
        "syncer_shard_owned_tenants gauge [] Tenants this replica holds the Lease of (sharded replicas).",
        "syncer_spec_limited_fields counter [] Fields of VirtualCluster specs the platform's limits changed (weight, quota, rate limit, ingress hosts, runtime class).",
        "syncer_super_write_slot_wait_seconds histogram [class] Time super writes waited for one of the --super-write-slots, by class (tenant, platform).",
        "syncer_super_write_slot_waiters gauge [] Super writes waiting for a slot.",
        "syncer_super_write_slots_in_use gauge [] Super writes in flight (at most --super-write-slots).",
        "syncer_super_writes counter [resource,verb] Writes to the super cluster.",
        "syncer_tenant_apiserver_requests counter [tenant] Requests the tenant apiserver served (apiserver_request_total, read every interval; native tenants).",
        "syncer_tenant_cpu_requests_millicores gauge [tenant] CPU requests of super pods per tenant.",
        "syncer_tenant_cpu_usage_cores gauge [tenant] CPU the tenant's super pods use (kubelet summaries, usageNanoCores), in cores.",
        "syncer_tenant_list_duration_seconds histogram [] Time from a tenant's attach until every cache of it has listed.",
        "syncer_tenant_load_balancers gauge [tenant] The tenant's Services of type LoadBalancer.",
        "syncer_tenant_measured_pods gauge [tenant] Tenant pods whose CPU and memory the kubelets reported.",
        "syncer_tenant_memory_requests_bytes gauge [tenant] Memory requests of super pods per tenant.",
        "syncer_tenant_memory_working_set_bytes gauge [tenant] Working-set memory of the tenant's super pods (kubelet summaries), in bytes.",
        "syncer_tenant_node_ports gauge [tenant] Node ports allocated to the tenant's Services.",
        "syncer_tenant_persistentvolumeclaims gauge [tenant] The tenant's Pending or Bound claims in the super cluster.",
        "syncer_tenant_pods gauge [tenant] Non-terminal super pods per tenant.",
        "syncer_tenant_storage_requests_bytes gauge [tenant] Storage the tenant's Pending or Bound claims request, in bytes.",
        "syncer_tenant_writes counter [resource,verb] Writes to tenant apiservers.",
        "syncer_tenants gauge [state] Tenants by state.",
        "syncer_usage_measure_duration_seconds histogram [] Duration of one usage measurement of every tenant.",
        "syncer_usage_read_failures counter [source] Stats summaries and tenant apiserver metrics that could not be read.",
    ];

    #[test]
    fn exposition_is_pinned() {
        let families = exposition(&populated());
        let mut seen = Vec::new();
        for (name, exposed) in &families {
            assert!(exposed.samples > 0, "{name} has no series: populate it above");
            let labels: Vec<&str> = exposed.labels.keys().map(String::as_str).collect();
            seen.push(format!(
                "{name} {} [{}] {}",
                exposed.kind,
                labels.join(","),
                exposed.help
            ));
        }
        assert_eq!(seen, PINNED);
    }

    /// The enum label values (the `&'static str` ones are written at their call sites).
    #[test]
    fn enum_label_values_are_pinned() {
        let families = exposition(&populated());
        let operations = &families["syncer_operations"].labels;
        let values = |label: &str| -> Vec<&str> { operations[label].iter().map(String::as_str).collect() };
        assert_eq!(values("direction"), ["Down", "Up"]);
        assert_eq!(
            values("operation"),
            ["Create", "Delete", "None", "Update", "Wait"]
        );
    }
}
