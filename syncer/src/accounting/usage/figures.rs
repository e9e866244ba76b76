//! The pure part of usage: who owns which super pod, what the kubelets' summaries say each tenant's pods
//! use, what each tenant holds (pods, claims, load balancers, node ports), and the apiserver's request
//! counter read from its `/metrics` text.
//!
//! A tenant is whoever the syncer's own identity annotation (`tenancy.x-k8s.io/cluster`) on a super object
//! names; tenants cannot set it. A summary entry counts only for a pod the syncer's cache holds, matched
//! by uid, namespace and name, and only from the summary of the node that pod is bound to: a node cannot
//! report another node's pods, and a pod is counted once however many summaries list it.

use std::collections::{HashMap, HashSet};

use crds::quantity::parse_quantity;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use serde::Deserialize;

use crate::{cache::pods::SuperPod, engine::queue::TenantId, tenancy::identity};

/// A node's stats summary (`/stats/summary`), as far as usage reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Summary {
    /// Pods on the node.
    #[serde(default)]
    pub pods: Vec<PodSummary>,
}

/// One pod of a summary.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSummary {
    /// Which pod.
    pub pod_ref: PodRef,
    /// The pod's CPU (its cgroup).
    #[serde(default)]
    pub cpu: Option<CpuStats>,
    /// The pod's memory (its cgroup).
    #[serde(default)]
    pub memory: Option<MemoryStats>,
    /// Its containers, summed when the pod-level figure is missing.
    #[serde(default)]
    pub containers: Vec<ContainerSummary>,
}

/// A pod reference of a summary.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodRef {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace (the super namespace).
    #[serde(default)]
    pub namespace: String,
    /// Uid of the super pod.
    #[serde(default)]
    pub uid: String,
}

/// A container of a summary.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ContainerSummary {
    /// CPU.
    #[serde(default)]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(default)]
    pub memory: Option<MemoryStats>,
}

/// CPU figures.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// Cores used, in billionths, averaged by the kubelet over its own short window.
    #[serde(default)]
    pub usage_nano_cores: Option<u64>,
}

/// Memory figures.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// Working set: what the kernel cannot reclaim without swapping, what evictions and `kubectl top` use.
    #[serde(default)]
    pub working_set_bytes: Option<u64>,
}

/// CPU and memory a tenant's pods use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Consumption {
    /// Sum of `usageNanoCores`.
    pub cpu_nano_cores: u64,
    /// Sum of `workingSetBytes`.
    pub memory_bytes: u64,
    /// Pods the figures cover.
    pub measured_pods: u64,
}

/// A super pod the syncer made: its tenant and node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedPod {
    /// The tenant (cluster key).
    pub tenant: TenantId,
    /// Super namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Node it is bound to.
    pub node: String,
}

/// The super pods of `tenants` that are bound to a node, by uid.
pub fn owned_pods<'a>(
    pods: impl IntoIterator<Item = &'a SuperPod>,
    tenants: &HashSet<TenantId>,
) -> HashMap<String, OwnedPod> {
    pods.into_iter()
        .filter_map(|pod| {
            let tenant = tenants.get(identity::owner_cluster(pod.meta())?)?.clone();
            Some((
                pod.uid()?,
                OwnedPod {
                    tenant,
                    namespace: pod.namespace()?,
                    name: pod.name_any(),
                    node: pod.spec.node_name.clone().filter(|n| !n.is_empty())?,
                },
            ))
        })
        .collect()
}

/// The nodes `pods` are bound to, sorted.
pub fn nodes_of(pods: &HashMap<String, OwnedPod>) -> Vec<String> {
    let nodes: HashSet<&str> = pods.values().map(|p| p.node.as_str()).collect();
    let mut nodes: Vec<String> = nodes.into_iter().map(str::to_owned).collect();
    nodes.sort();
    nodes
}

/// A pod's CPU and memory: its own figures, else the sum of its containers'; `None` while the kubelet has
/// neither.
fn pod_figures(pod: &PodSummary) -> Option<(u64, u64)> {
    let containers = |figure: fn(&ContainerSummary) -> Option<u64>| -> Option<u64> {
        let values: Vec<u64> = pod.containers.iter().filter_map(figure).collect();
        (!values.is_empty()).then(|| values.iter().fold(0u64, |sum, v| sum.saturating_add(*v)))
    };
    let cpu = pod
        .cpu
        .as_ref()
        .and_then(|c| c.usage_nano_cores)
        .or_else(|| containers(|c| c.cpu.as_ref()?.usage_nano_cores));
    let memory = pod
        .memory
        .as_ref()
        .and_then(|m| m.working_set_bytes)
        .or_else(|| containers(|c| c.memory.as_ref()?.working_set_bytes));
    match (cpu, memory) {
        (None, None) => None,
        (cpu, memory) => Some((cpu.unwrap_or(0), memory.unwrap_or(0))),
    }
}

/// What each tenant's pods use, from the summaries of the nodes (`(node, summary)`).
pub fn consumption<'a>(
    summaries: impl IntoIterator<Item = (&'a str, &'a Summary)>,
    pods: &HashMap<String, OwnedPod>,
) -> HashMap<TenantId, Consumption> {
    let mut counted: HashSet<&str> = HashSet::new();
    let mut sums: HashMap<TenantId, Consumption> = HashMap::new();
    for (node, summary) in summaries {
        for entry in &summary.pods {
            let reference = &entry.pod_ref;
            let Some(owned) = pods.get(&reference.uid) else {
                continue;
            };
            let same_pod =
                owned.node == node && owned.namespace == reference.namespace && owned.name == reference.name;
            if !same_pod || counted.contains(reference.uid.as_str()) {
                continue;
            }
            let Some((cpu, memory)) = pod_figures(entry) else {
                continue;
            };
            counted.insert(reference.uid.as_str());
            let sum = sums.entry(owned.tenant.clone()).or_default();
            sum.cpu_nano_cores = sum.cpu_nano_cores.saturating_add(cpu);
            sum.memory_bytes = sum.memory_bytes.saturating_add(memory);
            sum.measured_pods += 1;
        }
    }
    sums
}

/// What a tenant holds in the super cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Pods neither Succeeded nor Failed.
    pub pods: u64,
    /// Claims Pending or Bound.
    pub claims: u64,
    /// Storage those claims request, bytes.
    pub storage_bytes: u64,
    /// Services of type LoadBalancer.
    pub load_balancers: u64,
    /// Node ports allocated (every port of a Service with a `nodePort`).
    pub node_ports: u64,
}

fn tenant_of<'t>(
    meta: &impl crate::cache::meta::Tagged,
    tenants: &'t HashSet<TenantId>,
) -> Option<&'t TenantId> {
    tenants.get(identity::owner_cluster(meta)?)
}

/// What each of `tenants` holds, from the syncer's caches of super pods, claims and Services. Every tenant
/// gets an entry, also one that holds nothing.
pub fn holdings<'a>(
    tenants: &HashSet<TenantId>,
    pods: impl IntoIterator<Item = &'a SuperPod>,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
    services: impl IntoIterator<Item = &'a Service>,
) -> HashMap<TenantId, Holdings> {
    let mut all: HashMap<TenantId, Holdings> =
        tenants.iter().map(|t| (t.clone(), Holdings::default())).collect();
    for pod in pods {
        if let Some(tenant) = tenant_of(pod.meta(), tenants)
            && !matches!(pod.phase().as_deref(), Some("Succeeded" | "Failed"))
        {
            all.entry(tenant.clone()).or_default().pods += 1;
        }
    }
    for claim in claims {
        let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
        let Some(tenant) = tenant_of(&claim.metadata, tenants) else {
            continue;
        };
        // A claim that lost its volume holds nothing any more; a new one is Pending.
        if !matches!(phase, None | Some("Pending" | "Bound")) {
            continue;
        }
        let requested = claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| parse_quantity(&q.0, 1.0))
            .and_then(|bytes| u64::try_from(bytes).ok())
            .unwrap_or(0);
        let held = all.entry(tenant.clone()).or_default();
        held.claims += 1;
        held.storage_bytes = held.storage_bytes.saturating_add(requested);
    }
    for service in services {
        let Some(tenant) = tenant_of(&service.metadata, tenants) else {
            continue;
        };
        let spec = service.spec.as_ref();
        let held = all.entry(tenant.clone()).or_default();
        if spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer") {
            held.load_balancers += 1;
        }
        held.node_ports += spec.and_then(|s| s.ports.as_ref()).map_or(0, |ports| {
            ports
                .iter()
                .filter(|p| p.node_port.is_some_and(|n| n > 0))
                .count()
        }) as u64;
    }
    all
}

/// What the apiserver's `/metrics` says about the requests it served.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestCounter {
    /// Sum of every `apiserver_request_total` series.
    pub total: f64,
    /// `process_start_time_seconds`: which process counted (a restart, or another replica behind the
    /// Service, starts from another count).
    pub process_start: Option<f64>,
}

/// Longest `/metrics` line read; longer lines (no request counter is) are skipped.
const MAX_LINE: usize = 16 * 1024;

/// Reads the Prometheus text format a chunk at a time, keeping one line at most.
#[derive(Debug, Default)]
pub struct MetricsText {
    line: Vec<u8>,
    overlong: bool,
    counter: RequestCounter,
    found: bool,
}

impl MetricsText {
    /// Reads the next chunk of the body.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            match chunk.iter().position(|b| *b == b'\n') {
                Some(end) => {
                    self.push(&chunk[..end]);
                    self.end_line();
                    chunk = &chunk[end + 1..];
                }
                None => {
                    self.push(chunk);
                    chunk = &[];
                }
            }
        }
    }

    fn push(&mut self, part: &[u8]) {
        if self.overlong || self.line.len() + part.len() > MAX_LINE {
            self.overlong = true;
            self.line.clear();
        } else {
            self.line.extend_from_slice(part);
        }
    }

    fn end_line(&mut self) {
        if !self.overlong {
            let line = std::mem::take(&mut self.line);
            if let Ok(text) = std::str::from_utf8(&line) {
                self.read_line(text.trim_end_matches('\r'));
            }
        }
        self.line.clear();
        self.overlong = false;
    }

    fn read_line(&mut self, line: &str) {
        let (name, rest) = match line.find(['{', ' ']) {
            Some(at) => line.split_at(at),
            None => return,
        };
        let wanted = matches!(name, "apiserver_request_total" | "process_start_time_seconds");
        if !wanted {
            return;
        }
        // The value follows the labels (whose values may hold spaces and braces, escaped or not).
        let after_labels = match rest.strip_prefix('{') {
            Some(labels) => match labels.rfind('}') {
                Some(end) => &labels[end + 1..],
                None => return,
            },
            None => rest,
        };
        let Some(value) = after_labels
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
        else {
            return;
        };
        match name {
            "apiserver_request_total" => {
                self.counter.total += value;
                self.found = true;
            }
            _ => self.counter.process_start = Some(value),
        }
    }

    /// The counter, once the body has ended; `None` when it had no `apiserver_request_total`.
    pub fn finish(mut self) -> Option<RequestCounter> {
        if !self.line.is_empty() {
            self.end_line();
        }
        self.found.then_some(self.counter)
    }
}

/// Requests per second between two readings `seconds` apart; `None` when they came from different
/// processes (a restart, another replica) or no time passed.
pub fn request_rate(before: &RequestCounter, after: &RequestCounter, seconds: f64) -> Option<f64> {
    if seconds <= 0.0 || before.process_start != after.process_start || after.total < before.total {
        return None;
    }
    Some((after.total - before.total) / seconds)
}

/// Nanocores as a quantity in millicores, rounded: `1250m`.
pub fn cpu_quantity(nano_cores: u64) -> String {
    format!("{}m", (nano_cores + 500_000) / 1_000_000)
}

/// A rate as a quantity in thousandths: `12500m` is 12.5 per second.
pub fn rate_quantity(per_second: f64) -> String {
    format!("{}m", (per_second * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const A: &str = "team-aaaaaa-a";
    const B: &str = "team-bbbbbb-b";
    const UNATTACHED: &str = "team-cccccc-c";

    /// Metadata of a super object: a tenant's (`cluster`) sits in the super namespace of its tenant
    /// namespace `ns`, as the syncer writes it; a platform object sits in `ns`.
    fn meta(name: &str, cluster: Option<&str>, uid: &str) -> serde_json::Value {
        let mut meta = json!({"name": name, "namespace": super_ns(cluster), "uid": uid});
        if let Some(cluster) = cluster {
            meta["annotations"] =
                json!({"tenancy.x-k8s.io/cluster": cluster, "tenancy.x-k8s.io/namespace": "ns"});
        }
        meta
    }

    fn super_ns(cluster: Option<&str>) -> String {
        cluster.map_or_else(|| "ns".to_owned(), |c| crds::naming::super_namespace(c, "ns"))
    }

    fn pod(name: &str, cluster: Option<&str>, node: Option<&str>, phase: &str) -> SuperPod {
        serde_json::from_value(json!({
            "metadata": meta(name, cluster, &format!("uid-{name}")),
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    fn entry(cluster: Option<&str>, name: &str, uid: &str, cpu: u64, memory: u64) -> serde_json::Value {
        json!({
            "podRef": {"name": name, "namespace": super_ns(cluster), "uid": uid},
            "cpu": {"usageNanoCores": cpu},
            "memory": {"workingSetBytes": memory},
        })
    }

    fn tenants(keys: &[&str]) -> HashSet<TenantId> {
        keys.iter().map(|k| TenantId::from(*k)).collect()
    }

    #[test]
    fn each_pod_counts_once_from_the_node_it_is_bound_to_and_for_its_own_tenant_only() {
        let pods = [
            pod("a1", Some(A), Some("n1"), "Running"),
            pod("a2", Some(A), Some("n2"), "Running"),
            pod("b1", Some(B), Some("n1"), "Running"),
            pod("c1", Some(UNATTACHED), Some("n1"), "Running"),
            pod("platform", None, Some("n1"), "Running"),
            pod("unbound", Some(A), None, "Pending"),
        ];
        let owned = owned_pods(&pods, &tenants(&[A, B]));
        assert_eq!(owned.len(), 3, "{owned:?}");
        assert_eq!(nodes_of(&owned), ["n1", "n2"]);
        // n1's kubelet lists every pod of both nodes (as the harness's shared simulated kubelet does), a
        // pod of an unattached tenant, a platform pod, and an entry carrying a1's uid under another name.
        let n1: Summary = serde_json::from_value(json!({"pods": [
            entry(Some(A), "a1", "uid-a1", 10_000_000, 1 << 20),
            entry(Some(A), "a2", "uid-a2", 999_000_000, 999 << 20),
            entry(Some(B), "b1", "uid-b1", 30_000_000, 3 << 20),
            entry(Some(UNATTACHED), "c1", "uid-c1", 50_000_000, 5 << 20),
            entry(None, "platform", "uid-platform", 70_000_000, 7 << 20),
            entry(Some(B), "b1", "uid-a1", 1_000_000_000, 1 << 30),
        ]}))
        .expect("summary");
        let n2: Summary = serde_json::from_value(json!({"pods": [
            entry(Some(A), "a1", "uid-a1", 999_000_000, 999 << 20),
            entry(Some(A), "a2", "uid-a2", 20_000_000, 2 << 20),
        ]}))
        .expect("summary");
        let sums = consumption([("n1", &n1), ("n2", &n2), ("n1", &n1)], &owned);
        assert_eq!(
            sums.get(A),
            Some(&Consumption {
                cpu_nano_cores: 30_000_000,
                memory_bytes: 3 << 20,
                measured_pods: 2
            })
        );
        assert_eq!(
            sums.get(B),
            Some(&Consumption {
                cpu_nano_cores: 30_000_000,
                memory_bytes: 3 << 20,
                measured_pods: 1
            })
        );
        assert_eq!(sums.len(), 2);
    }

    #[test]
    fn a_pod_without_its_own_figures_sums_its_containers_and_one_without_any_is_not_measured() {
        let pods = [
            pod("split", Some(A), Some("n1"), "Running"),
            pod("new", Some(A), Some("n1"), "Running"),
        ];
        let owned = owned_pods(&pods, &tenants(&[A]));
        let summary: Summary = serde_json::from_value(json!({"pods": [
            {"podRef": {"name": "split", "namespace": super_ns(Some(A)), "uid": "uid-split"}, "containers": [
                {"cpu": {"usageNanoCores": 4_000_000}, "memory": {"workingSetBytes": 1024}},
                {"cpu": {"usageNanoCores": 6_000_000}, "memory": {"workingSetBytes": 2048}},
            ]},
            {"podRef": {"name": "new", "namespace": super_ns(Some(A)), "uid": "uid-new"}, "containers": []},
        ]}))
        .expect("summary");
        let sums = consumption([("n1", &summary)], &owned);
        assert_eq!(
            sums.get(A),
            Some(&Consumption {
                cpu_nano_cores: 10_000_000,
                memory_bytes: 3072,
                measured_pods: 1
            })
        );
    }

    #[test]
    fn holdings_count_live_pods_claims_load_balancers_and_allocated_node_ports_per_tenant() {
        let pods = [
            pod("run", Some(A), Some("n1"), "Running"),
            pod("wait", Some(A), None, "Pending"),
            pod("done", Some(A), Some("n1"), "Succeeded"),
            pod("failed", Some(A), Some("n1"), "Failed"),
            pod("other", Some(UNATTACHED), Some("n1"), "Running"),
        ];
        let claim =
            |name: &str, cluster: &str, storage: &str, phase: Option<&str>| -> PersistentVolumeClaim {
                serde_json::from_value(json!({
                    "metadata": meta(name, Some(cluster), name),
                    "spec": {"resources": {"requests": {"storage": storage}}},
                    "status": {"phase": phase},
                }))
                .expect("claim")
            };
        let claims = [
            claim("bound", A, "1Gi", Some("Bound")),
            claim("pending", A, "512Mi", Some("Pending")),
            claim("new", A, "1Mi", None),
            claim("lost", A, "100Gi", Some("Lost")),
            claim("theirs", B, "5Gi", Some("Bound")),
            claim("stranger", UNATTACHED, "7Gi", Some("Bound")),
        ];
        let service = |name: &str, cluster: &str, spec: serde_json::Value| -> Service {
            serde_json::from_value(json!({"metadata": meta(name, Some(cluster), name), "spec": spec}))
                .expect("service")
        };
        let services = [
            service(
                "lb",
                A,
                json!({"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}, {"port": 443, "nodePort": 30443}]}),
            ),
            service(
                "lb-without-node-ports",
                A,
                json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": [{"port": 80}]}),
            ),
            service(
                "np",
                A,
                json!({"type": "NodePort", "ports": [{"port": 53, "nodePort": 30053}]}),
            ),
            service("plain", A, json!({"type": "ClusterIP", "ports": [{"port": 80}]})),
            service(
                "theirs",
                B,
                json!({"type": "NodePort", "ports": [{"port": 1, "nodePort": 30001}]}),
            ),
        ];
        let held = holdings(&tenants(&[A, B]), &pods, &claims, &services);
        assert_eq!(
            held.get(A),
            Some(&Holdings {
                pods: 2,
                claims: 3,
                storage_bytes: (1 << 30) + (512 << 20) + (1 << 20),
                load_balancers: 2,
                node_ports: 3,
            })
        );
        assert_eq!(
            held.get(B),
            Some(&Holdings {
                claims: 1,
                storage_bytes: 5 << 30,
                node_ports: 1,
                ..Default::default()
            })
        );
        assert_eq!(held.len(), 2, "an unattached tenant gets no entry");
        assert_eq!(
            holdings(&tenants(&[A]), &[], &[], &[]).get(A),
            Some(&Holdings::default()),
            "a tenant holding nothing still gets its zeros"
        );
    }

    const METRICS: &str = "# HELP apiserver_request_total Counter of apiserver requests\n\
        # TYPE apiserver_request_total counter\n\
        apiserver_request_total{code=\"200\",component=\"apiserver\",group=\"\",resource=\"pods\",verb=\"LIST\"} 120\n\
        apiserver_request_total{code=\"201\",group=\"x.io\",resource=\"a b} 9e9\",verb=\"POST\"} 1.5e+01\n\
        apiserver_request_total_other{code=\"200\"} 1000\n\
        apiserver_request_duration_seconds_count{verb=\"GET\"} 500\n\
        process_start_time_seconds 1.7e+09\r\n\
        apiserver_request_total{code=\"500\"} 5";

    #[test]
    fn the_request_counter_is_summed_from_metrics_text_however_it_is_chunked() {
        let expected = RequestCounter {
            total: 140.0,
            process_start: Some(1.7e9),
        };
        for split in 0..METRICS.len() {
            let (first, second) = METRICS.as_bytes().split_at(split);
            let mut text = MetricsText::default();
            text.feed(first);
            text.feed(second);
            assert_eq!(text.finish(), Some(expected), "split at {split}");
        }
        let mut one_byte_at_a_time = MetricsText::default();
        for byte in METRICS.as_bytes() {
            one_byte_at_a_time.feed(std::slice::from_ref(byte));
        }
        assert_eq!(one_byte_at_a_time.finish(), Some(expected));
    }

    #[test]
    fn overlong_lines_and_bad_values_are_skipped_and_no_counter_is_none() {
        let mut text = MetricsText::default();
        let long = format!(
            "apiserver_request_total{{resource=\"{}\"}} 1000000\n",
            "x".repeat(MAX_LINE)
        );
        text.feed(long.as_bytes());
        text.feed(b"apiserver_request_total{code=\"200\"} NaN\napiserver_request_total{code=\"200\"} -4\n");
        text.feed(b"apiserver_request_total{code=\"200\"} 7\n");
        assert_eq!(text.finish().map(|c| c.total), Some(7.0));
        let mut none = MetricsText::default();
        none.feed(b"# nothing here\nprocess_start_time_seconds 5\n");
        assert_eq!(none.finish(), None);
    }

    #[test]
    fn a_rate_needs_two_readings_of_the_same_process() {
        let at = |total: f64, start: f64| RequestCounter {
            total,
            process_start: Some(start),
        };
        assert_eq!(request_rate(&at(100.0, 1.0), &at(400.0, 1.0), 30.0), Some(10.0));
        assert_eq!(
            request_rate(&at(100.0, 1.0), &at(400.0, 2.0), 30.0),
            None,
            "restarted"
        );
        assert_eq!(
            request_rate(&at(400.0, 1.0), &at(100.0, 1.0), 30.0),
            None,
            "went back"
        );
        assert_eq!(request_rate(&at(1.0, 1.0), &at(2.0, 1.0), 0.0), None);
    }

    #[test]
    fn quantities_are_millicores_and_thousandths() {
        assert_eq!(cpu_quantity(1_250_000_000), "1250m");
        assert_eq!(cpu_quantity(499_999), "0m");
        assert_eq!(cpu_quantity(1_500_000), "2m");
        assert_eq!(rate_quantity(12.5), "12500m");
        assert_eq!(rate_quantity(0.0004), "0m");
    }
}
