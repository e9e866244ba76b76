//! Pods as the caches keep them: only what sync reads.
//!
//! A full `k8s_openapi` Pod takes 10-15 KiB in memory (every optional field is inline: a `Volume` alone
//! is 3 KiB), and every synced pod is cached twice, in its tenant and in the super cluster. These types
//! read the same watch events but keep a few fields; whatever else is needed (the whole tenant pod when its
//! copy is created, the whole super pod when its mutable fields change) is read from the apiserver then.
//! What they keep, they keep small: requests and limits as sorted pairs rather than B-tree maps, lists
//! without spare room, and the parts most pods share (tolerations, conditions) once for all
//! ([`crate::cache::interned`]); `bench_pod_records` prints what the two records of a pod take.

use std::{borrow::Cow, collections::BTreeMap, fmt};

use crds::usage::Amounts;
use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{ContainerStatus, PodStatus, Toleration},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::cache::{
    interned::{Interned, Pooled},
    meta::{HasTags, PackedMeta, Tagged},
};

/// Quantities by resource name (requests, limits or a pod's overhead) as written, sorted by name.
///
/// A boxed slice rather than the apiserver's `BTreeMap<String, Quantity>`: a B-tree node takes about half
/// a KiB however few keys it holds, and every synced pod is cached twice with a map or two per container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quantities(Box<[(Box<str>, Box<str>)]>);

impl Quantities {
    /// The stated quantities, sorted by resource name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(name, value)| (&**name, &**value))
    }

    /// Whether every quantity stated here is stated alike in `other` (which may state more).
    pub fn covered_by(&self, other: &Quantities) -> bool {
        self.iter().all(|(name, value)| other.amount(name) == Some(value))
    }

    /// As the apiserver writes them: a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        self.iter()
            .map(|(name, value)| (name.to_owned(), serde_json::Value::from(value)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

impl Amounts for Quantities {
    fn amount(&self, resource: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(name, _)| (**name).cmp(resource))
            .ok()
            .map(|i| &*self.0[i].1)
    }
}

impl Serialize for Quantities {
    /// As the apiserver writes them: a map, by resource name.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Quantities {
    /// From the apiserver's map, or `null` (the same as an empty one).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map: Option<BTreeMap<String, Quantity>> = Option::deserialize(deserializer)?;
        Ok(Self::from(map.as_ref()))
    }
}

impl From<Option<&BTreeMap<String, Quantity>>> for Quantities {
    fn from(map: Option<&BTreeMap<String, Quantity>>) -> Self {
        Self(
            map.into_iter()
                .flatten()
                .map(|(name, value)| (name.as_str().into(), value.0.as_str().into()))
                .collect(),
        )
    }
}

/// A container's requests and limits (an absent map reads as an empty one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedResources {
    /// Requests.
    #[serde(default)]
    pub requests: Quantities,
    /// Limits.
    #[serde(default)]
    pub limits: Quantities,
}

impl crds::usage::Requirements for CachedResources {
    fn requests(&self) -> Option<&dyn Amounts> {
        Some(&self.requests)
    }

    fn limits(&self) -> Option<&dyn Amounts> {
        Some(&self.limits)
    }
}

/// A container's name, image and resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerImage {
    /// Container name.
    pub name: String,
    /// Image.
    #[serde(default)]
    pub image: Option<String>,
    /// Requests and limits, for quota and in-place resizes.
    #[serde(default, deserialize_with = "or_default")]
    pub resources: CachedResources,
}

fn gate_types<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Gate {
        condition_type: String,
    }
    let gates: Option<Vec<Gate>> = Option::deserialize(deserializer)?;
    let mut types: Vec<String> = gates
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.condition_type)
        .collect();
    types.shrink_to_fit();
    Ok(types)
}

/// A list read without spare room: a `Vec` grown while reading (serde_json gives no length first) keeps
/// capacity for up to twice its items, and a cached pod holds a handful of lists for as long as it lives.
fn exact_list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Vec<T>, D::Error> {
    let mut list = Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default();
    list.shrink_to_fit();
    Ok(list)
}

/// An [`exact_list`] kept once in its pool ([`crate::cache::interned`]).
fn interned_list<'de, D, T>(deserializer: D) -> Result<Interned<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
    Vec<T>: Pooled,
{
    exact_list(deserializer).map(Interned::new)
}

fn or_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    deserializer: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The parts of a pod spec sync reads after creation: the node, and the rest ([`SharedSpec`]), which pods
/// of one template have alike and is kept once for all of them ([`crate::cache::interned`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    /// Node the pod is bound to.
    pub node_name: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    shared: Interned<SharedSpec>,
}

impl CachedPodSpec {
    /// A spec of these parts. A node read into `shared` is dropped: the pool would otherwise keep the
    /// first pod's node for every pod alike (it does not tell entries apart).
    pub fn new(node_name: Option<String>, mut shared: SharedSpec) -> Self {
        shared.node_name = None;
        Self {
            node_name,
            shared: Interned::new(shared),
        }
    }
}

impl std::ops::Deref for CachedPodSpec {
    type Target = SharedSpec;

    fn deref(&self) -> &SharedSpec {
        &self.shared
    }
}

impl<'de> Deserialize<'de> for CachedPodSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut shared = SharedSpec::deserialize(deserializer)?;
        let node_name = shared.node_name.take();
        Ok(Self::new(node_name, shared))
    }
}

/// The parts of a pod spec sync reads after creation but the node: two pods of one template (the
/// replicas of a Deployment, say) have them alike, so the cache keeps them once
/// ([`CachedPodSpec`]; `bench_pod_records`: 388 bytes of heap and a 184-byte struct per record before).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedSpec {
    /// The node, as read: moved to [`CachedPodSpec::node_name`] at once, so that pods on different nodes
    /// share their spec. Never set here otherwise.
    #[serde(default, skip_serializing)]
    node_name: Option<String>,
    /// Service account (tokens are minted for it).
    #[serde(default)]
    pub service_account_name: Option<String>,
    /// On the host network: its address is the node's, never its own.
    #[serde(default)]
    pub host_network: Option<bool>,
    /// Containers.
    #[serde(default, deserialize_with = "exact_list")]
    pub containers: Vec<ContainerImage>,
    /// Init containers.
    #[serde(default, deserialize_with = "exact_list")]
    pub init_containers: Vec<ContainerImage>,
    /// Ephemeral containers (`kubectl debug`), which a running pod may add to.
    #[serde(default, deserialize_with = "exact_list")]
    pub ephemeral_containers: Vec<ContainerImage>,
    /// Deadline, one of the fields that may change.
    #[serde(default)]
    pub active_deadline_seconds: Option<i64>,
    /// Condition types of the readiness gates.
    #[serde(default, deserialize_with = "gate_types")]
    pub readiness_gates: Vec<String>,
    /// Pod overhead, for quota.
    #[serde(default)]
    pub overhead: Quantities,
    /// Tolerations, which a running pod may add to.
    #[serde(default, deserialize_with = "interned_list")]
    pub tolerations: Interned<Vec<Toleration>>,
}

crate::pooled!(SharedSpec);

/// The pod condition the scheduler, or a binding, sets.
pub const POD_SCHEDULED: &str = "PodScheduled";

/// A condition, without timestamps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedCondition {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// Message.
    #[serde(default)]
    pub message: Option<String>,
}

crate::pooled!(Vec<Toleration>);
crate::pooled!(Vec<CachedCondition>);

/// Hash of container statuses in their k8s-openapi form, so that statuses read from JSON and statuses
/// built in memory compare equal when they carry the same fields.
pub fn container_statuses_hash(statuses: &[ContainerStatus]) -> u64 {
    if statuses.is_empty() {
        return 0;
    }
    let json = serde_json::to_vec(statuses).unwrap_or_default();
    let digest = Sha256::digest(&json);
    u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
}

fn statuses_hash<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let statuses: Option<Vec<ContainerStatus>> = Option::deserialize(deserializer)?;
    Ok(container_statuses_hash(&statuses.unwrap_or_default()))
}

/// The parts of a tenant pod's status sync compares.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantPodStatus {
    /// Phase.
    #[serde(default)]
    pub phase: Option<String>,
    /// Pod IP.
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    /// Host IP.
    #[serde(default, rename = "hostIP")]
    pub host_ip: Option<String>,
    /// Message.
    #[serde(default)]
    pub message: Option<String>,
    /// Reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// Conditions.
    #[serde(default, deserialize_with = "interned_list")]
    pub conditions: Interned<Vec<CachedCondition>>,
    /// Hash of the container statuses.
    #[serde(default, deserialize_with = "statuses_hash")]
    pub container_statuses: u64,
    /// Hash of the init container statuses.
    #[serde(default, deserialize_with = "statuses_hash")]
    pub init_container_statuses: u64,
    /// Hash of the ephemeral container statuses.
    #[serde(default, deserialize_with = "statuses_hash")]
    pub ephemeral_container_statuses: u64,
}

/// A pod in a tenant as its watch reads it (serialized only to weigh it against the tenant's cache limits),
/// before it is cached as a [`TenantPod`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchedTenantPod {
    /// Metadata (managed fields dropped).
    pub metadata: ObjectMeta,
    /// Spec essentials.
    pub spec: CachedPodSpec,
    /// Status essentials.
    pub status: TenantPodStatus,
    /// The whole spec as the watch sent it (compact JSON), kept only while the pod is unbound and not
    /// being deleted, that is until its super copy exists: the copy is made from it rather than from a
    /// read of the pod, a tenant request per pod saved. The binding's watch event replaces it with a
    /// cached pod without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unbound_spec: Option<Box<RawValue>>,
}

impl<'de> Deserialize<'de> for WatchedTenantPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Option<Box<RawValue>>,
            #[serde(default, deserialize_with = "or_default")]
            status: TenantPodStatus,
        }
        let wire = Wire::deserialize(deserializer)?;
        let spec: CachedPodSpec = match &wire.spec {
            Some(raw) => {
                Option::<CachedPodSpec>::deserialize(&mut serde_json::Deserializer::from_str(raw.get()))
                    .map_err(serde::de::Error::custom)?
                    .unwrap_or_default()
            }
            None => CachedPodSpec::default(),
        };
        let unbound = spec.node_name.is_none() && wire.metadata.deletion_timestamp.is_none();
        Ok(Self {
            metadata: wire.metadata,
            spec,
            status: wire.status,
            unbound_spec: wire.spec.filter(|raw| unbound && raw.get() != "null"),
        })
    }
}

/// A pod in a tenant, as cached: its metadata packed ([`crate::cache::meta`]), a few spec and status fields,
/// and its whole spec while it is unbound. Not a kube `Resource`, as [`SuperPod`] is not.
#[derive(Clone, Debug, Default)]
pub struct TenantPod {
    /// Metadata, packed.
    pub metadata: PackedMeta,
    /// Spec essentials.
    pub spec: CachedPodSpec,
    /// Status essentials.
    pub status: TenantPodStatus,
    /// The whole spec as the watch sent it (compact JSON), kept only while the pod is unbound and not
    /// being deleted (see [`WatchedTenantPod::unbound_spec`]).
    pub unbound_spec: Option<Box<RawValue>>,
}

impl From<WatchedTenantPod> for TenantPod {
    fn from(pod: WatchedTenantPod) -> Self {
        Self {
            metadata: PackedMeta::from(pod.metadata),
            spec: pod.spec,
            status: pod.status,
            unbound_spec: pod.unbound_spec,
        }
    }
}

impl<'de> Deserialize<'de> for TenantPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        WatchedTenantPod::deserialize(deserializer).map(Self::from)
    }
}

impl TenantPod {
    /// The whole pod to copy, when the watch's spec is still kept ([`TenantPod::unbound_spec`]): the cached
    /// metadata (all but managed fields and kubectl's last-applied annotation, which no copy carries) and
    /// that spec. `None` when it is not kept, or does not parse as a pod spec.
    pub fn unbound_pod(&self) -> Option<k8s_openapi::api::core::v1::Pod> {
        let spec = serde_json::from_str(self.unbound_spec.as_ref()?.get()).ok()?;
        Some(k8s_openapi::api::core::v1::Pod {
            metadata: self.metadata.to_object_meta(),
            spec: Some(spec),
            status: None,
        })
    }
}

/// The parts of a super pod's status read without parsing it all.
#[derive(Clone, Debug, Default, Deserialize)]
struct PhaseOnly {
    #[serde(default)]
    phase: Option<String>,
}

/// The addresses in a super pod's status, read without parsing it all.
#[derive(Clone, Debug, Default, Deserialize)]
struct AddressesOnly {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pod_ips: Vec<AddressOnly>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct AddressOnly {
    #[serde(default)]
    ip: String,
}

/// A pod in the super cluster as its watch reads it, before it is cached as a [`SuperPod`].
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedSuperPod {
    /// Metadata.
    pub metadata: ObjectMeta,
    /// Spec essentials.
    #[serde(default, deserialize_with = "or_default")]
    pub spec: CachedPodSpec,
    /// The status, as JSON.
    #[serde(default)]
    pub status: Option<Box<serde_json::value::RawValue>>,
}

/// Pod status JSON as the apiserver writes it (field order of the Go types, and sorted, as some clients
/// write it), for [`PackedStatus`] to find its common parts in: field names, condition types, states,
/// runtimes' prefixes. Changing it changes nothing stored outside the process.
const STATUS_DICTIONARY: &str = concat!(
    r#"{"observedGeneration":1,"phase":"Pending","conditions":[{"type":"PodReadyToStartContainers","status":"False","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"},"#,
    r#"{"type":"Initialized","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"},{"type":"Ready","status":"False","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z","reason":"ContainersNotReady","message":"containers with unready status: [main]"},"#,
    r#"{"type":"ContainersReady","status":"False","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z","reason":"ContainersNotReady","message":"containers with unready status: [main]"},"#,
    r#"{"type":"PodScheduled","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"}],"hostIP":"10.0.0.1","hostIPs":[{"ip":"10.0.0.1"}],"podIP":"10.244.0.1","podIPs":[{"ip":"10.244.0.1"}],"#,
    r#""startTime":"2026-01-01T00:00:00Z","initContainerStatuses":[{"name":"init","state":{"terminated":{"exitCode":0,"reason":"Completed","startedAt":"2026-01-01T00:00:00Z","finishedAt":"2026-01-01T00:00:00Z","containerID":"containerd://"}},"#,
    r#""containerStatuses":[{"name":"main","state":{"waiting":{"reason":"ContainerCreating"}},"lastState":{},"ready":false,"restartCount":0,"image":"docker.io/library/busybox:latest","imageID":"","started":false,"#,
    r#""allocatedResources":{"cpu":"100m","memory":"128Mi"},"resources":{"limits":{"cpu":"100m","memory":"128Mi"},"requests":{"cpu":"100m","memory":"128Mi"}},"#,
    r#""volumeMounts":[{"name":"kube-api-access","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount","readOnly":true,"recursiveReadOnly":"Disabled"}],"user":{"linux":{"uid":0,"gid":0,"supplementalGroups":[0]}}}],"qosClass":"BestEffort"}"#,
    r#"{"conditions":[{"lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z","status":"True","type":"PodScheduled"},{"lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z","status":"True","type":"Initialized"},"#,
    r#"{"lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z","status":"True","type":"ContainersReady"},{"lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z","status":"True","type":"Ready"}],"#,
    r#""containerStatuses":[{"containerID":"containerd://","image":"registry.k8s.io/","imageID":"sha256:","lastState":{},"name":"main","ready":true,"resources":{"requests":{"cpu":"10m","memory":"16Mi"}},"restartCount":0,"started":true,"state":{"running":{"startedAt":"2026-01-01T00:00:00Z"}}}],"#,
    r#""hostIP":"10.0.0.1","phase":"Running","podIP":"10.244.0.1","podIPs":[{"ip":"10.244.0.1"}],"qosClass":"Burstable","startTime":"2026-01-01T00:00:00Z"}"#,
    r#"{"phase":"Running","conditions":[{"type":"PodReadyToStartContainers","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"},{"type":"Initialized","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"},"#,
    r#"{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"},{"type":"ContainersReady","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"},"#,
    r#"{"type":"PodScheduled","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:00Z"}],"hostIP":"10.0.0.1","hostIPs":[{"ip":"10.0.0.1"}],"podIP":"10.244.0.1","podIPs":[{"ip":"10.244.0.1"}],"startTime":"2026-01-01T00:00:00Z","#,
    r#""containerStatuses":[{"name":"main","state":{"running":{"startedAt":"2026-01-01T00:00:00Z"}},"lastState":{"terminated":{"exitCode":137,"reason":"OOMKilled"}},"ready":true,"restartCount":0,"image":"docker.io/library/busybox:latest","imageID":"docker.io/library/busybox@sha256:","containerID":"containerd://","started":true}],"qosClass":"Guaranteed"}"#,
);

/// A status JSON compressed (LZ4, with [`STATUS_DICTIONARY`]): a pod's status is mostly field names and
/// values every pod repeats, and is only read when it is copied up, so the cache keeps it compressed
/// (about a quarter of its size). Read back exactly as it was written.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedStatus(Box<[u8]>);

impl PackedStatus {
    /// Compresses a status JSON.
    pub fn new(json: &str) -> Self {
        Self(
            lz4_flex::block::compress_prepend_size_with_dict(json.as_bytes(), STATUS_DICTIONARY.as_bytes())
                .into_boxed_slice(),
        )
    }

    /// The status JSON, as it was written.
    pub fn json(&self) -> String {
        // Only this type's own output is read back: it always decompresses to the string it was made of.
        lz4_flex::block::decompress_size_prepended_with_dict(&self.0, STATUS_DICTIONARY.as_bytes())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .unwrap_or_default()
    }

    /// Its size compressed, in bytes.
    pub fn packed_len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Debug for PackedStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.json())
    }
}

/// A pod in the super cluster, as cached: its metadata packed ([`crate::cache::meta`]), a few spec fields,
/// and its status as compressed JSON (it is only read to be copied up).
///
/// Not a kube `Resource` (that would hand out `ObjectMeta`): the cache finds it by kube's `Lookup`, and
/// identity is read through [`crate::cache::meta::Tagged`], so no code can read its labels or annotations
/// from a map that is not there.
#[derive(Clone, Debug, Default)]
pub struct SuperPod {
    /// Metadata, packed.
    pub metadata: PackedMeta,
    /// Spec essentials.
    pub spec: CachedPodSpec,
    /// The status, compressed.
    pub status: Option<PackedStatus>,
}

impl From<WatchedSuperPod> for SuperPod {
    fn from(pod: WatchedSuperPod) -> Self {
        Self {
            metadata: PackedMeta::from(pod.metadata),
            spec: pod.spec,
            status: pod.status.map(|json| PackedStatus::new(json.get())),
        }
    }
}

impl<'de> Deserialize<'de> for SuperPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        WatchedSuperPod::deserialize(deserializer).map(Self::from)
    }
}

impl SuperPod {
    /// The full status.
    pub fn parsed_status(&self) -> Option<PodStatus> {
        serde_json::from_str(&self.status.as_ref()?.json()).ok()
    }

    /// The pod's addresses in the super cluster, as its status says (also a finished pod's).
    pub fn addresses(&self) -> Vec<String> {
        let Some(status) = self
            .status
            .as_ref()
            .and_then(|s| serde_json::from_str::<AddressesOnly>(&s.json()).ok())
        else {
            return Vec::new();
        };
        let mut addresses: Vec<String> = status.pod_ips.into_iter().map(|a| a.ip).collect();
        addresses.extend(status.pod_ip);
        addresses.retain(|a| !a.is_empty());
        addresses
    }

    /// The addresses a finished pod gave up (none while it runs).
    pub fn given_up_addresses(&self) -> Vec<String> {
        let Some(status) = self
            .status
            .as_ref()
            .and_then(|s| serde_json::from_str::<AddressesOnly>(&s.json()).ok())
        else {
            return Vec::new();
        };
        if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return Vec::new();
        }
        let mut addresses: Vec<String> = status.pod_ips.into_iter().map(|a| a.ip).collect();
        addresses.extend(status.pod_ip);
        addresses.retain(|a| !a.is_empty());
        addresses
    }

    /// The addresses the pod holds as its own ([`crds::addresses::own_addresses`]): none on the host
    /// network or once it finished.
    pub fn own_addresses(&self) -> Vec<std::net::IpAddr> {
        let Some(status) = self
            .status
            .as_ref()
            .and_then(|s| serde_json::from_str::<AddressesOnly>(&s.json()).ok())
        else {
            return Vec::new();
        };
        crds::addresses::own_addresses(
            self.spec.host_network == Some(true),
            status.phase.as_deref(),
            status
                .pod_ips
                .iter()
                .map(|a| a.ip.as_str())
                .chain(status.pod_ip.as_deref()),
        )
    }

    /// The phase.
    pub fn phase(&self) -> Option<String> {
        serde_json::from_str::<PhaseOnly>(&self.status.as_ref()?.json())
            .ok()?
            .phase
    }
}

macro_rules! pod_resource {
    ($type:ty) => {
        impl k8s_openapi::Resource for $type {
            const API_VERSION: &'static str = "v1";
            const GROUP: &'static str = "";
            const KIND: &'static str = "Pod";
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = "pods";
            type Scope = NamespaceResourceScope;
        }

        impl k8s_openapi::Metadata for $type {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pod_resource!(WatchedTenantPod);
pod_resource!(WatchedSuperPod);

/// What a cached pod record is found and named by: kube's `Lookup` (for its cache), [`HasTags`] (for
/// identity), and the few `ResourceExt` methods sync calls on it.
macro_rules! packed_pod {
    ($type:ty) => {
        impl kube::runtime::reflector::Lookup for $type {
            type DynamicType = ();

            fn kind(_: &()) -> Cow<'_, str> {
                "Pod".into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                "".into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                "v1".into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                "pods".into()
            }

            fn name(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(&self.metadata.name))
            }

            fn namespace(&self) -> Option<Cow<'_, str>> {
                self.metadata.object_namespace().map(Cow::Borrowed)
            }

            fn resource_version(&self) -> Option<Cow<'_, str>> {
                self.metadata.resource_version.as_deref().map(Cow::Borrowed)
            }

            fn uid(&self) -> Option<Cow<'_, str>> {
                self.metadata.uid.as_deref().map(Cow::Borrowed)
            }
        }

        impl HasTags for $type {
            fn tags(&self) -> &impl Tagged {
                &self.metadata
            }
        }

        impl $type {
            /// Its metadata (packed: labels and annotations are read through [`Tagged`]).
            pub fn meta(&self) -> &PackedMeta {
                &self.metadata
            }

            /// Its name.
            pub fn name_any(&self) -> String {
                self.metadata.name.to_string()
            }

            /// Its namespace.
            pub fn namespace(&self) -> Option<String> {
                self.metadata.object_namespace().map(str::to_owned)
            }

            /// Its uid.
            pub fn uid(&self) -> Option<String> {
                self.metadata.uid.as_deref().map(str::to_owned)
            }

            /// A reference to it, as kube's `Resource::object_ref` makes one (for events about it).
            pub fn object_ref(&self, _: &()) -> k8s_openapi::api::core::v1::ObjectReference {
                let owned = |s: &Option<Box<str>>| s.as_deref().map(str::to_owned);
                k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(self.name_any()),
                    namespace: self.namespace(),
                    uid: owned(&self.metadata.uid),
                    resource_version: owned(&self.metadata.resource_version),
                    ..Default::default()
                }
            }
        }
    };
}

packed_pod!(TenantPod);
packed_pod!(SuperPod);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn super_pod_addresses_are_read_from_the_status() {
        let pod: SuperPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "podIP": "10.1.0.7", "podIPs": [{"ip": "10.1.0.7"}, {"ip": "fd00::7"}]}
        }))
        .expect("pod");
        let mut addresses = pod.addresses();
        addresses.sort();
        addresses.dedup();
        assert_eq!(addresses, ["10.1.0.7", "fd00::7"]);
    }

    const POD: &str = r#"{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
            "labels": {"app": "web"}, "managedFields": [{"manager": "x"}]},
        "spec": {
            "nodeName": "node-1", "serviceAccountName": "robot",
            "containers": [{"name": "main", "image": "nginx:1", "resources": {"requests": {"cpu": "100m"}},
                "volumeMounts": [{"name": "v", "mountPath": "/v"}], "env": [{"name": "A", "value": "b"}]}],
            "readinessGates": [{"conditionType": "example.com/ready"}],
            "volumes": [{"name": "v", "emptyDir": {}}]
        },
        "status": {"phase": "Running", "podIP": "10.0.0.9", "hostIP": "192.0.2.1",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "containerStatuses": [{"name": "main", "image": "nginx:1", "imageID": "x", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}, "lastState": {}}]}
    }"#;

    #[test]
    fn cached_pods_keep_what_sync_reads() {
        let pod: TenantPod = serde_json::from_str(POD).expect("tenant pod");
        assert_eq!(pod.spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(pod.spec.containers[0].image.as_deref(), Some("nginx:1"));
        assert_eq!(pod.spec.readiness_gates, ["example.com/ready"]);
        assert_eq!(pod.status.pod_ip.as_deref(), Some("10.0.0.9"));
        assert_eq!(pod.status.conditions[0].type_, "Ready");
        let full: k8s_openapi::api::core::v1::Pod = serde_json::from_str(POD).expect("pod");
        let statuses = full.status.and_then(|s| s.container_statuses).expect("statuses");
        assert_eq!(pod.status.container_statuses, container_statuses_hash(&statuses));
        // Metadata packed: identity and labels kept, managed fields gone.
        assert_eq!(pod.meta().label("app"), Some("web"));
        assert_eq!(
            (pod.name_any(), pod.uid().as_deref()),
            ("web".to_owned(), Some("u1"))
        );
        assert_eq!(pod.object_ref(&()).resource_version.as_deref(), Some("7"));

        let super_pod: SuperPod = serde_json::from_str(POD).expect("super pod");
        assert_eq!(super_pod.phase().as_deref(), Some("Running"));
        assert_eq!(
            super_pod.parsed_status().and_then(|s| s.pod_ip).as_deref(),
            Some("10.0.0.9")
        );
    }

    #[test]
    fn a_super_pods_status_is_kept_compressed_and_read_back_exactly() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../../e2e/fixtures/super-pod.json")).expect("fixture");
        let json = fixture["status"].to_string();
        let packed = PackedStatus::new(&json);
        assert_eq!(packed.json(), json);
        assert!(
            packed.packed_len() * 3 < json.len(),
            "{} bytes of status kept in {}",
            json.len(),
            packed.packed_len()
        );
        // Whatever a status holds comes back as it was, however little it shares with the dictionary.
        for odd in [
            "",
            "{}",
            r#"{"message":"\u0000 ünïcödé \"quoted\""}"#,
            &"x".repeat(70_000),
        ] {
            assert_eq!(PackedStatus::new(odd).json(), odd);
        }
        let pod: SuperPod = serde_json::from_value(fixture).expect("pod");
        assert_eq!(pod.status.as_ref().map(PackedStatus::json), Some(json));
        assert_eq!(pod.phase().as_deref(), Some("Running"));
    }

    #[test]
    fn the_whole_spec_is_kept_only_while_the_pod_is_unbound_and_not_deleting() {
        let mut wire: serde_json::Value = serde_json::from_str(POD).expect("json");
        let bound: TenantPod = serde_json::from_value(wire.clone()).expect("bound pod");
        assert!(bound.unbound_spec.is_none() && bound.unbound_pod().is_none());

        wire["spec"].as_object_mut().expect("spec").remove("nodeName");
        let unbound: TenantPod = serde_json::from_str(&wire.to_string()).expect("unbound pod");
        let pod = unbound.unbound_pod().expect("the whole pod");
        let spec = pod.spec.expect("spec");
        // What the cache would otherwise drop is there: volumes, mounts, env.
        assert_eq!(spec.volumes.expect("volumes")[0].name, "v");
        assert_eq!(spec.containers[0].env.as_ref().expect("env")[0].name, "A");
        assert_eq!(pod.metadata.labels.expect("labels")["app"], "web");
        assert!(pod.status.is_none());
        // Weighed against the cache limits (as read) with the spec it keeps.
        let weigh = |value: &serde_json::Value| -> usize {
            let read: WatchedTenantPod = serde_json::from_value(value.clone()).expect("pod");
            serde_json::to_string(&read).expect("serialize").len()
        };
        let mut bound_wire = wire.clone();
        bound_wire["spec"]["nodeName"] = serde_json::json!("node-1");
        assert!(weigh(&wire) > weigh(&bound_wire));

        wire["metadata"]["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
        let deleting: TenantPod = serde_json::from_value(wire).expect("deleting pod");
        assert!(deleting.unbound_spec.is_none());
        let no_spec: TenantPod =
            serde_json::from_str(r#"{"metadata": {"name": "x"}, "spec": null}"#).expect("pod");
        assert!(no_spec.unbound_spec.is_none());
    }

    #[test]
    fn pods_alike_share_their_tolerations_and_conditions() {
        let mut wire: serde_json::Value = serde_json::from_str(POD).expect("json");
        wire["spec"]["tolerations"] = serde_json::json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ]);
        let first: TenantPod = serde_json::from_value(wire.clone()).expect("pod");
        // Another pod, its conditions set at another time.
        wire["metadata"]["name"] = serde_json::json!("other");
        wire["status"]["conditions"][0]["lastTransitionTime"] = serde_json::json!("2026-02-02T00:00:00Z");
        let second: TenantPod = serde_json::from_value(wire.clone()).expect("pod");
        assert!(std::ptr::eq(&*first.spec.tolerations, &*second.spec.tolerations));
        assert!(std::ptr::eq(
            &*first.status.conditions,
            &*second.status.conditions
        ));
        assert_eq!(second.spec.tolerations[0].toleration_seconds, Some(300));
        // A pod whose condition differs has its own.
        wire["status"]["conditions"][0]["status"] = serde_json::json!("False");
        let third: TenantPod = serde_json::from_value(wire).expect("pod");
        assert_ne!(first.status.conditions, third.status.conditions);
        assert_eq!(third.status.conditions[0].status, "False");
        assert_eq!(first.status.conditions[0].status, "True");
    }

    #[test]
    fn pods_of_one_template_share_their_spec_but_the_node() {
        let wire: serde_json::Value = serde_json::from_str(POD).expect("json");
        let on = |node: &str, change: &dyn Fn(&mut serde_json::Value)| -> TenantPod {
            let mut wire = wire.clone();
            wire["spec"]["nodeName"] = serde_json::json!(node);
            change(&mut wire["spec"]);
            serde_json::from_value(wire).expect("pod")
        };
        let first = on("node-1", &|_| {});
        let second = on("node-2", &|_| {});
        assert!(std::ptr::eq::<SharedSpec>(&*first.spec, &*second.spec));
        assert_eq!(
            (first.spec.node_name.as_deref(), second.spec.node_name.as_deref()),
            (Some("node-1"), Some("node-2"))
        );
        assert_eq!(first.spec.service_account_name.as_deref(), Some("robot"));
        // What the cache keeps of a spec but the node, and was never written out before it was pooled,
        // still tells specs apart: requests, limits, overhead, tolerations.
        let changes: [&dyn Fn(&mut serde_json::Value); 4] = [
            &|spec| spec["containers"][0]["resources"]["requests"]["cpu"] = serde_json::json!("200m"),
            &|spec| spec["containers"][0]["resources"]["limits"] = serde_json::json!({"memory": "1Gi"}),
            &|spec| spec["overhead"] = serde_json::json!({"cpu": "10m"}),
            &|spec| spec["tolerations"] = serde_json::json!([{"key": "k", "operator": "Exists"}]),
        ];
        for (i, change) in changes.iter().enumerate() {
            let other = on("node-1", change);
            assert!(
                !std::ptr::eq::<SharedSpec>(&*first.spec, &*other.spec),
                "change {i}"
            );
            assert_ne!(first.spec, other.spec, "change {i}");
        }
        let resized = on("node-1", changes[0]);
        assert_eq!(
            resized.spec.containers[0].resources.requests.amount("cpu"),
            Some("200m")
        );
        assert_eq!(
            first.spec.containers[0].resources.requests.amount("cpu"),
            Some("100m")
        );
        // The node is never read from the shared part.
        assert_eq!(first.spec.shared.node_name, None);
    }

    #[test]
    fn requests_and_limits_are_kept_as_sorted_pairs() {
        let pod: TenantPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"memory": "64Mi", "cpu": "250m"}, "limits": null}},
                    {"name": "b", "resources": null}
                ],
                "overhead": {"cpu": "10m"}
            }
        }))
        .expect("pod");
        let stated = &pod.spec.containers[0].resources;
        assert_eq!(
            stated.requests.iter().collect::<Vec<_>>(),
            [("cpu", "250m"), ("memory", "64Mi")]
        );
        assert_eq!(stated.requests.amount("memory"), Some("64Mi"));
        assert_eq!(stated.requests.amount("nvidia.com/gpu"), None);
        assert_eq!(stated.limits, Quantities::default());
        let unstated = &pod.spec.containers[1].resources;
        assert_eq!(*unstated, CachedResources::default());
        // What states less is covered by what states more, not the other way round.
        assert!(unstated.requests.covered_by(&stated.requests));
        assert!(!stated.requests.covered_by(&unstated.requests));
        assert_eq!(
            stated.requests.to_json(),
            serde_json::json!({"cpu": "250m", "memory": "64Mi"})
        );
        let usage = crate::accounting::quota::pod_usage(&pod.spec);
        assert_eq!((usage.requests_cpu, usage.requests_memory), (260, 64 << 20));
    }

    #[test]
    fn null_and_missing_sections_read_as_empty() {
        let pod: TenantPod =
            serde_json::from_str(r#"{"metadata": {"name": "x"}, "spec": null}"#).expect("pod");
        assert!(pod.spec.containers.is_empty());
        assert_eq!(pod.status.container_statuses, 0);
    }
}
