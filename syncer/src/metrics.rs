//! The syncer's Prometheus metrics: one struct per subsystem, defined beside the code that records its
//! series and owning their label types, composed here and registered under the `syncer` prefix.
//!
//! Labels are a fixed set of words (resource, direction, operation, result) plus the tenant, which is one
//! series per VirtualCluster: its series are removed when the tenant is detached.

use prometheus_client::registry::Registry;

use crate::{
    accounting::{
        quota::metrics::QuotaMetrics,
        usage::metrics::{UsageLabels, UsageMetrics},
    },
    engine::{metrics::EngineMetrics, patrol::metrics::PatrolMetrics},
    resources::metrics::ResourceMetrics,
    tenancy::{metrics::TenancyMetrics, shards::metrics::ShardMetrics},
};

/// Every metric of the syncer, by subsystem.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Reconciles, the fair queues and the write gate ([`crate::engine::metrics`]).
    pub engine: EngineMetrics,
    /// The patrol's findings and scans ([`crate::engine::patrol::metrics`]).
    pub patrol: PatrolMetrics,
    /// The kinds' writes, refusals and dropped events ([`crate::resources::metrics`]).
    pub resources: ResourceMetrics,
    /// Tenants by state, attaching them and the attach journal ([`crate::tenancy::metrics`]).
    pub tenancy: TenancyMetrics,
    /// The shards across replicas ([`crate::tenancy::shards::metrics`]).
    pub shards: ShardMetrics,
    /// The quota ledger's requests and held-back pods ([`crate::accounting::quota::metrics`]).
    pub quota: QuotaMetrics,
    /// What tenants consume ([`crate::accounting::usage::metrics`]).
    pub usage: UsageMetrics,
}

impl Metrics {
    /// Registers every metric under the `syncer` prefix, each subsystem its own.
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("syncer");
        self.engine.register(registry);
        self.patrol.register(registry);
        self.resources.register(registry);
        self.tenancy.register(registry);
        self.shards.register(registry);
        self.quota.register(registry);
        self.usage.register(registry);
    }

    /// Removes a detached tenant's series.
    pub fn forget_tenant(&self, tenant: &str) {
        self.engine.forget_tenant(tenant);
        let labels = UsageLabels {
            tenant: tenant.to_owned(),
        };
        self.quota.forget(&labels);
        self.usage.forget(&labels);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use prometheus_client::{encoding::text::encode, registry::Registry};

    use super::*;
    use crate::{
        accounting::usage::metrics::{SourceLabels, UsageLabels},
        engine::{
            metrics::{Direction, Operation, OperationLabels, ResourceLabels, TenantLabels},
            patrol::metrics::PatrolLabels,
            write_gate::SlotLabels,
        },
        tenancy::{metrics::StateLabels, shards::metrics::HandoverLabels},
    };

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
                    .engine
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
                .engine
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
            metrics.engine.queue_depth.get_or_create(&tenant).set(1);
            metrics.engine.queue_wait.get_or_create(&tenant).observe(0.1);
        }
        metrics.resources.super_write("pod", "apply");
        metrics.resources.tenant_write("pod", "patch");
        metrics.resources.refused("pod", "PodPolicyViolation");
        let tenant = UsageLabels {
            tenant: "ns/a".into(),
        };
        metrics.quota.tenant_pods.get_or_create(&tenant).set(1);
        metrics
            .quota
            .tenant_cpu_requests_millicores
            .get_or_create(&tenant)
            .set(1);
        metrics
            .quota
            .tenant_memory_requests_bytes
            .get_or_create(&tenant)
            .set(1);
        metrics.quota.quota_waiting_pods.get_or_create(&tenant).set(1);
        let finding = PatrolLabels {
            resource: "pod",
            finding: "missing",
        };
        metrics.patrol.patrol_findings.get_or_create(&finding).inc();
        metrics.patrol.patrol_remedies.get_or_create(&finding).inc();
        metrics
            .tenancy
            .tenants
            .get_or_create(&StateLabels { state: "attached" })
            .set(1);
        metrics
            .shards
            .shard_handovers
            .get_or_create(&HandoverLabels { reason: "acquired" })
            .inc();
        metrics
            .engine
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
