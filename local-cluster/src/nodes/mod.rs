//! Simulated nodes and kubelets, in the manner of kwok.
//!
//! [`NodeSimulator`] creates Ready nodes with addresses and capacity, renews their leases, binds pods when no
//! scheduler runs, moves pods bound to its nodes to Running with a pod IP and container statuses, finishes
//! the deletion of their pods as a kubelet would, and serves a kubelet HTTPS API on loopback.

mod kubelet;
mod streaming;

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Node,
            NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo, Pod, PodCondition,
            PodIP, PodStatus,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{MicroTime, ObjectMeta, Time},
    },
    jiff::Timestamp,
};
use kube::{
    Client, ResourceExt,
    api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::task::JoinHandle;

pub use kubelet::{KubeletApi, expected_log_lines, pod_usage};

use crate::{ControlPlane, Error, Result, wait};

const FIELD_MANAGER: &str = "e2e-node-simulator";

/// Label on every simulated node.
pub const SIMULATED_NODE_LABEL: &str = "e2e.virtualcluster.io/simulated";

/// How to simulate nodes.
#[derive(Clone, Debug)]
pub struct NodeSimulatorOptions {
    /// How many nodes.
    pub node_count: usize,
    /// Node names are this prefix plus an index.
    pub name_prefix: String,
    /// Capacity and allocatable CPU.
    pub cpu: String,
    /// Capacity and allocatable memory.
    pub memory: String,
    /// Capacity and allocatable pod count.
    pub pods: String,
    /// Bind pods that have no node (when no scheduler runs).
    pub bind_pods: bool,
    /// Serve the kubelet API.
    pub kubelet: bool,
    /// CA certificates (PEM) whose client certificates the kubelet API accepts, besides the apiserver's CA.
    pub extra_client_cas: Vec<String>,
    /// How many pod updates run at once.
    pub concurrency: usize,
    /// Extra node labels.
    pub labels: BTreeMap<String, String>,
    /// Pods carrying this label get loopback addresses (`127.100.0.1` on): every one of them is this
    /// machine's, so a test can send from such a pod's address (tenant DNS identifies tenants by their pods'
    /// addresses). Only those pods: the apiserver refuses loopback addresses in endpoints.
    pub loopback_ip_label: Option<String>,
    /// Where the kubelet API listens and what the nodes advertise as their InternalIP (default
    /// 127.0.0.1). The apiserver's node proxy refuses loopback addresses, so a test that reads nodes
    /// through it gives one of the machine's own addresses.
    pub kubelet_address: Option<std::net::IpAddr>,
    /// How often node leases are renewed (a kubelet's 10 s by default); Ready heartbeats go every sixth.
    pub heartbeat_interval: Duration,
}

impl Default for NodeSimulatorOptions {
    fn default() -> Self {
        Self {
            node_count: 2,
            name_prefix: "sim-node-".to_owned(),
            cpu: "64".to_owned(),
            memory: "256Gi".to_owned(),
            pods: "10000".to_owned(),
            bind_pods: true,
            kubelet: true,
            extra_client_cas: Vec::new(),
            concurrency: 64,
            loopback_ip_label: None,
            kubelet_address: None,
            labels: BTreeMap::new(),
            heartbeat_interval: Duration::from_secs(10),
        }
    }
}

/// Counters of what the simulator did.
#[derive(Debug, Default)]
pub struct SimulatorCounters {
    /// Pods bound to a node.
    pub bound: AtomicUsize,
    /// Pods moved to Running.
    pub started: AtomicUsize,
    /// Pods whose deletion was completed.
    pub deleted: AtomicUsize,
}

/// Simulated nodes and kubelets for one cluster. Dropping it stops the simulation (the Node objects stay).
pub struct NodeSimulator {
    nodes: Vec<String>,
    dead: Arc<std::sync::Mutex<HashSet<String>>>,
    kubelet: Option<KubeletApi>,
    counters: Arc<SimulatorCounters>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for NodeSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSimulator")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

struct Shared {
    client: Client,
    nodes: HashSet<String>,
    dead: Arc<std::sync::Mutex<HashSet<String>>>,
    node_list: Vec<String>,
    next_node: AtomicUsize,
    next_ip: AtomicU32,
    bind_pods: bool,
    loopback_ip_label: Option<String>,
    counters: Arc<SimulatorCounters>,
}

impl NodeSimulator {
    /// Creates the nodes in `cluster` and starts simulating them.
    pub async fn start(cluster: &ControlPlane, options: NodeSimulatorOptions) -> Result<Self> {
        Self::start_with_client(cluster, cluster.client(), options).await
    }

    /// Like [`start`](Self::start), talking to `cluster` through `client`: one made on the runtime the
    /// simulation is to run on (a client's connection tasks run on the runtime it was made on).
    pub async fn start_with_client(
        cluster: &ControlPlane,
        client: Client,
        options: NodeSimulatorOptions,
    ) -> Result<Self> {
        let nodes: Vec<String> = (0..options.node_count)
            .map(|i| format!("{}{i}", options.name_prefix))
            .collect();

        let (reader, writer) = reflector::store();
        let kubelet = match options.kubelet {
            true => {
                let mut cas = vec![cluster.apiserver().ca().cert_pem().to_owned()];
                cas.extend(options.extra_client_cas.iter().cloned());
                Some(
                    KubeletApi::start(
                        cluster.apiserver().ca(),
                        &cas,
                        reader.clone(),
                        nodes.clone(),
                        kubelet_address(&options),
                    )
                    .await?,
                )
            }
            false => None,
        };
        let kubelet_port = kubelet.as_ref().map(KubeletApi::port).unwrap_or(10250);

        for node in &nodes {
            create_node(&client, node, &options, kubelet_port).await?;
        }

        let counters = Arc::new(SimulatorCounters::default());
        let dead: Arc<std::sync::Mutex<HashSet<String>>> = Arc::default();
        let shared = Arc::new(Shared {
            client: client.clone(),
            nodes: nodes.iter().cloned().collect(),
            dead: dead.clone(),
            node_list: nodes.clone(),
            next_node: AtomicUsize::new(0),
            next_ip: AtomicU32::new(1),
            bind_pods: options.bind_pods,
            loopback_ip_label: options.loopback_ip_label.clone(),
            counters: counters.clone(),
        });

        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(heartbeat(
            client.clone(),
            nodes.clone(),
            dead.clone(),
            options.heartbeat_interval,
        )));
        let concurrency = options.concurrency.max(1);
        let pods = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(|pod| pod.managed_fields_mut().clear())
            .reflect(writer)
            .applied_objects();
        let pod_shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            pods.for_each_concurrent(concurrency, |event| {
                let shared = pod_shared.clone();
                async move {
                    match event {
                        Ok(pod) => shared.handle(pod).await,
                        Err(error) => tracing::debug!(%error, "node simulator pod watch"),
                    }
                }
            })
            .await;
        }));
        reader.wait_until_ready().await.map_err(|e| Error::Http {
            context: "node simulator pod cache".into(),
            source: Box::new(e),
        })?;

        Ok(Self {
            nodes,
            dead,
            kubelet,
            counters,
            tasks,
        })
    }

    /// The simulated nodes' names.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Lets a node die as a machine does: its lease and status are no longer renewed and its pods are no
    /// longer run or finished (the Node object and its pods stay, as the super cluster last saw them).
    pub fn kill_node(&self, name: &str) {
        self.dead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
    }

    /// The kubelet API, when served.
    pub fn kubelet(&self) -> Option<&KubeletApi> {
        self.kubelet.as_ref()
    }

    /// What the simulator did so far.
    pub fn counters(&self) -> &SimulatorCounters {
        &self.counters
    }

    /// Waits until every node reports Ready (useful right after start, before pods are created).
    pub async fn wait_ready(&self, client: &Client) -> Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        for node in &self.nodes {
            wait::until_true(Duration::from_secs(30), &format!("node {node} Ready"), || {
                let api = api.clone();
                let node = node.clone();
                async move { api.get(&node).await.ok().is_some_and(|n| node_is_ready(&n)) }
            })
            .await?;
        }
        Ok(())
    }
}

impl Drop for NodeSimulator {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Whether a node's Ready condition is True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn quantity(value: &str) -> Quantity {
    Quantity(value.to_owned())
}

fn kubelet_address(options: &NodeSimulatorOptions) -> std::net::IpAddr {
    options
        .kubelet_address
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

async fn create_node(
    client: &Client,
    name: &str,
    options: &NodeSimulatorOptions,
    kubelet_port: u16,
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let mut labels = options.labels.clone();
    labels.insert(SIMULATED_NODE_LABEL.to_owned(), "true".to_owned());
    labels.insert("kubernetes.io/hostname".to_owned(), name.to_owned());
    labels.insert("kubernetes.io/os".to_owned(), "linux".to_owned());
    labels.insert("kubernetes.io/arch".to_owned(), "amd64".to_owned());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(&node))
        .await
        .map_err(Error::kube(format!("creating node {name}")))?;

    let resources: BTreeMap<String, Quantity> = [
        ("cpu", quantity(&options.cpu)),
        ("memory", quantity(&options.memory)),
        ("pods", quantity(&options.pods)),
        ("ephemeral-storage", quantity("1Ti")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let status = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            conditions: Some(node_conditions()),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: kubelet_address(options).to_string(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.to_owned(),
                },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                    port: i32::from(kubelet_port),
                }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: format!("boot-{name}"),
                container_runtime_version: "simulated://1.0".into(),
                kernel_version: "6.1.0-simulated".into(),
                kube_proxy_version: "v1.26.3".into(),
                kubelet_version: "v1.26.3".into(),
                machine_id: format!("machine-{name}"),
                operating_system: "linux".into(),
                os_image: "e2e simulated node".into(),
                system_uuid: format!("uuid-{name}"),
                ..Default::default()
            }),
            phase: Some("Running".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    api.patch_status(name, &params, &Patch::Apply(&status))
        .await
        .map_err(Error::kube(format!("setting status of node {name}")))?;
    Ok(())
}

fn node_conditions() -> Vec<NodeCondition> {
    let condition = |type_: &str, status: &str, reason: &str| NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(format!("simulated: {reason}")),
        last_heartbeat_time: Some(now()),
        last_transition_time: Some(now()),
    };
    vec![
        condition("Ready", "True", "KubeletReady"),
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID"),
    ]
}

/// Renews node leases every `interval` (a kubelet's 10 s) and Ready heartbeats every sixth, as a kubelet
/// does, for every node that is not `dead`.
async fn heartbeat(
    client: Client,
    nodes: Vec<String>,
    dead: Arc<std::sync::Mutex<HashSet<String>>>,
    interval: Duration,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let node_api: Api<Node> = Api::all(client);
    // A manager of its own: applying only the conditions under the node's manager would drop the addresses
    // and capacity that manager applied before.
    let params = PatchParams::apply("e2e-node-heartbeat").force();
    let mut tick = 0u64;
    loop {
        for node in &nodes {
            if dead.lock().unwrap_or_else(|e| e.into_inner()).contains(node) {
                continue;
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(node.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.clone()),
                    lease_duration_seconds: Some(40),
                    renew_time: Some(MicroTime(Timestamp::now())),
                    ..Default::default()
                }),
            };
            if let Err(error) = leases.patch(node, &params, &Patch::Apply(&lease)).await {
                tracing::debug!(%error, node, "renewing simulated node lease");
            }
            if tick.is_multiple_of(6) {
                let status = Node {
                    metadata: ObjectMeta {
                        name: Some(node.clone()),
                        ..Default::default()
                    },
                    status: Some(NodeStatus {
                        conditions: Some(node_conditions()),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                if let Err(error) = node_api.patch_status(node, &params, &Patch::Apply(&status)).await {
                    tracing::debug!(%error, node, "simulated node heartbeat");
                }
            }
        }
        tick += 1;
        tokio::time::sleep(interval).await;
    }
}

/// The node names a pod's required node affinity pins it to (`matchFields` on `metadata.name`, as the
/// DaemonSet controller writes), if it does.
fn pinned_nodes(pod: &Pod) -> Option<Vec<String>> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let names: Vec<String> = terms
        .iter()
        .flat_map(|term| term.match_fields.iter().flatten())
        .filter(|field| field.key == "metadata.name" && field.operator == "In")
        .flat_map(|field| field.values.iter().flatten().cloned())
        .collect();
    (!names.is_empty()).then_some(names)
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

impl Shared {
    async fn handle(&self, pod: Pod) {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        if node
            .as_ref()
            .is_some_and(|node| self.dead.lock().unwrap_or_else(|e| e.into_inner()).contains(node))
        {
            // A dead node's kubelet does nothing.
            return;
        }
        let result = match (&node, pod.metadata.deletion_timestamp.is_some()) {
            (Some(node), true) if self.nodes.contains(node) => self.finish_deletion(&pod).await,
            (None, false) if self.bind_pods => self.bind(&pod).await,
            (Some(node), false) if self.nodes.contains(node) && !is_running(&pod) && !is_terminal(&pod) => {
                self.run(&pod, node).await
            }
            _ => Ok(()),
        };
        if let Err(error) = result {
            tracing::debug!(error = %error, pod = %pod.name_any(), "node simulator");
        }
    }

    async fn bind(&self, pod: &Pod) -> Result<(), kube::Error> {
        // A pod pinned to named nodes (a DaemonSet's) goes to one of them, as a scheduler would place it;
        // one pinned only to others' nodes is left alone. Every other pod goes round-robin.
        let pinned = pinned_nodes(pod);
        let node = match &pinned {
            Some(names) => match self.node_list.iter().find(|n| names.contains(n)) {
                Some(node) => node,
                None => return Ok(()),
            },
            None => {
                let dead = self.dead.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let live: Vec<&String> = self.node_list.iter().filter(|n| !dead.contains(*n)).collect();
                if live.is_empty() {
                    return Ok(());
                }
                live[self.next_node.fetch_add(1, Ordering::Relaxed) % live.len()]
            }
        };
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": { "name": name, "uid": pod.uid() },
            "target": { "apiVersion": "v1", "kind": "Node", "name": node },
        });
        match api
            .create_subresource::<_, serde_json::Value>("binding", &name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {
                self.counters.bound.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // Already bound, or gone: a later event shows the current state.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn run(&self, pod: &Pod, node: &str) -> Result<(), kube::Error> {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        let loopback = self
            .loopback_ip_label
            .as_ref()
            .is_some_and(|label| pod.labels().contains_key(label));
        let pod_ip = match loopback {
            true => format!("127.{}.{}.{}", 100 + (n >> 16) % 100, (n >> 8) & 255, n & 255),
            false => format!("10.{}.{}.{}", 128 + (n >> 16) % 128, (n >> 8) & 255, n & 255),
        };
        let started = now();
        let spec = pod.spec.clone().unwrap_or_default();
        let container_statuses = spec
            .containers
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                image_id: format!("simulated://{}", c.image.clone().unwrap_or_default()),
                container_id: Some(format!(
                    "simulated://{}-{}",
                    pod.uid().unwrap_or_default(),
                    c.name
                )),
                ready: true,
                started: Some(true),
                restart_count: 0,
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(started.clone()),
                    }),
                    ..Default::default()
                }),
                // As a v1.33 kubelet reports them: apiservers allow in-place resizes only of pods whose
                // running containers show their resources.
                resources: c.resources.clone(),
                ..Default::default()
            })
            .collect();
        let init_container_statuses = spec
            .init_containers
            .unwrap_or_default()
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                image_id: format!("simulated://{}", c.image.clone().unwrap_or_default()),
                ready: true,
                restart_count: 0,
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 0,
                        reason: Some("Completed".into()),
                        started_at: Some(started.clone()),
                        finished_at: Some(started.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let condition = |type_: &str| PodCondition {
            type_: type_.to_owned(),
            status: "True".to_owned(),
            last_transition_time: Some(started.clone()),
            ..Default::default()
        };
        let status = Pod {
            status: Some(PodStatus {
                phase: Some("Running".into()),
                host_ip: Some("127.0.0.1".into()),
                pod_ip: Some(pod_ip.clone()),
                pod_ips: Some(vec![PodIP { ip: pod_ip }]),
                start_time: Some(started.clone()),
                conditions: Some(vec![
                    condition("PodScheduled"),
                    condition("Initialized"),
                    condition("ContainersReady"),
                    condition("Ready"),
                ]),
                container_statuses: Some(container_statuses),
                init_container_statuses: Some(init_container_statuses),
                ..Default::default()
            }),
            ..Default::default()
        };
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
            .await
        {
            Ok(_) => {
                self.counters.started.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(pod = %name, node, "simulated pod running");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// What a kubelet does once a pod's containers stopped: delete it for good.
    async fn finish_deletion(&self, pod: &Pod) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => {
                self.counters.deleted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Lists pods on the given nodes from a cache (what a kubelet's `/pods` shows).
pub(crate) fn pods_on(store: &reflector::Store<Pod>, nodes: &HashSet<String>) -> Vec<Arc<Pod>> {
    store
        .state()
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| nodes.contains(n))
        })
        .collect()
}

/// Waits until every pod matching `selector` in `namespace` is Running.
pub async fn wait_pods_running(
    client: &Client,
    namespace: &str,
    count: usize,
    timeout: Duration,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    wait::until_true(timeout, &format!("{count} running pods in {namespace}"), || {
        let api = api.clone();
        async move {
            api.list(&Default::default())
                .await
                .map(|l| l.items.iter().filter(|p| is_running(p)).count() >= count)
                .unwrap_or(false)
        }
    })
    .await
}
