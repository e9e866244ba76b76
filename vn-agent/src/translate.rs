//! Between a tenant's view and the super cluster: which super pods are the tenant's, the kubelet and
//! apiserver requests for a tenant's pod, and the kubelet's answers cut down to the tenant's pods and
//! translated back.
//!
//! Identity comes from the annotations the syncer writes, never from parsing names: the namespace mapping
//! shortens long names and is therefore not injective (see `crds::naming`).

use std::collections::{HashMap, HashSet};

use crds::{Owner, naming::super_namespace};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;

use crate::{
    response::Refusal,
    route::{Action, PodTarget},
};

/// A super pod that belongs to a tenant, with both sides' names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantPod {
    /// The super-cluster namespace.
    pub super_namespace: String,
    /// The pod name (the same on both sides).
    pub name: String,
    /// The super pod's uid (what the kubelet knows).
    pub super_uid: String,
    /// The tenant namespace.
    pub tenant_namespace: String,
    /// The tenant pod's uid.
    pub tenant_uid: String,
    /// The node the pod is bound to.
    pub node: Option<String>,
}

/// The tenant side of a super pod, when it is `cluster_key`'s by the one ownership rule
/// ([`crds::Owner`]: its cluster and namespace annotations, the namespace they map to) and it names the
/// tenant pod it was made from (its uid annotation).
pub fn tenant_pod(pod: &Pod, cluster_key: &str) -> Option<TenantPod> {
    let owner = Owner::of(&pod.metadata).filter(|owner| owner.is(cluster_key))?;
    Some(TenantPod {
        super_namespace: pod.namespace()?,
        name: pod.name_any(),
        super_uid: pod.uid().unwrap_or_default(),
        tenant_namespace: owner.tenant_namespace.to_owned(),
        tenant_uid: owner.tenant_uid?.to_owned(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
    })
}

/// Checks that the super pod found at the place `target` maps to is the tenant's pod `target`. A pod that
/// is not this tenant's by the ownership rule ([`crds::Owner`]), or names no tenant pod, is forbidden; a
/// pod of this tenant that serves another tenant namespace (whose shortened name collides with this one)
/// or has another uid is not found.
pub fn check_target(pod: &Pod, cluster_key: &str, target: &PodTarget) -> Result<TenantPod, Refusal> {
    let shown = format!("{}/{}", target.namespace, target.name);
    let Some(owner) = Owner::of(&pod.metadata).filter(|owner| owner.is(cluster_key)) else {
        return Err(Refusal::forbidden(format!(
            "pod {shown} is not a pod of this virtual cluster"
        )));
    };
    if owner.tenant_uid.is_none() {
        return Err(Refusal::forbidden(format!(
            "pod {shown} carries no tenant uid annotation"
        )));
    }
    let found = tenant_pod(pod, cluster_key).filter(|p| p.tenant_namespace == target.namespace);
    let Some(found) = found else {
        // Another tenant namespace whose shortened name collides with this one.
        return Err(Refusal::not_found(format!("pod {shown} not found")));
    };
    if let Some(uid) = &target.uid
        && *uid != found.tenant_uid
    {
        return Err(Refusal::not_found(format!(
            "pod {shown} with uid {uid} not found"
        )));
    }
    Ok(found)
}

/// Where a tenant pod lives in the super cluster.
pub fn super_location(cluster_key: &str, target: &PodTarget) -> (String, String) {
    (
        super_namespace(cluster_key, &target.namespace),
        target.name.clone(),
    )
}

/// The kubelet path for `action` on a super pod; a uid in the tenant's path becomes the super pod's uid,
/// which is what the kubelet checks.
pub fn kubelet_path(action: Action, pod: &TenantPod, with_uid: bool, container: Option<&str>) -> String {
    let mut path = format!("/{}/{}/{}", action.as_str(), pod.super_namespace, pod.name);
    if with_uid && action != Action::ContainerLogs {
        path.push('/');
        path.push_str(&pod.super_uid);
    }
    if let Some(container) = container {
        path.push('/');
        path.push_str(container);
    }
    path
}

/// The super-apiserver subresource for `action`.
pub fn apiserver_subresource(action: Action) -> Option<&'static str> {
    match action {
        Action::ContainerLogs => Some("log"),
        Action::Exec => Some("exec"),
        Action::Attach => Some("attach"),
        Action::PortForward => Some("portforward"),
        Action::Run => None,
    }
}

/// Log options that `pods/log` takes under the same names the kubelet uses.
const LOG_PARAMETERS: &[&str] = &[
    "follow",
    "previous",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "tailLines",
    "limitBytes",
];

/// The kubelet's stream flags (`input`, `output`, `error`, `tty`; set only by the value `1`, as the
/// kubelet reads them) as `pods/exec` and `pods/attach` options.
const STREAM_FLAGS: &[(&str, &str)] = &[
    ("input", "stdin"),
    ("output", "stdout"),
    ("error", "stderr"),
    ("tty", "tty"),
];

/// The query of the super-apiserver request equivalent to a kubelet request with `query`.
pub fn apiserver_query(action: Action, container: Option<&str>, query: Option<&str>) -> String {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let first = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let mut out = form_urlencoded::Serializer::new(String::new());
    if let Some(container) = container {
        out.append_pair("container", container);
    }
    match action {
        Action::ContainerLogs => {
            for name in LOG_PARAMETERS {
                if let Some(value) = first(name) {
                    out.append_pair(name, value);
                }
            }
        }
        Action::Exec | Action::Attach => {
            if action == Action::Exec {
                for (_, command) in pairs.iter().filter(|(k, _)| k == "command") {
                    out.append_pair("command", command);
                }
            }
            for (kubelet, apiserver) in STREAM_FLAGS {
                let set = first(kubelet) == Some("1");
                out.append_pair(apiserver, if set { "true" } else { "false" });
            }
        }
        Action::PortForward => {
            for (_, port) in pairs.iter().filter(|(k, _)| k == "port") {
                out.append_pair("ports", port);
            }
        }
        Action::Run => {}
    }
    out.finish()
}

/// The tenant's pods among the super pods, by super namespace and name.
#[derive(Clone, Debug, Default)]
pub struct TenantPods {
    by_super: HashMap<(String, String), TenantPod>,
}

impl TenantPods {
    /// Indexes the pods of `cluster_key` among `pods`.
    pub fn new<'a>(cluster_key: &str, pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        Self {
            by_super: pods
                .into_iter()
                .filter_map(|pod| tenant_pod(pod, cluster_key))
                .map(|p| ((p.super_namespace.clone(), p.name.clone()), p))
                .collect(),
        }
    }

    /// The tenant pod at super namespace and name.
    pub fn get(&self, super_namespace: &str, name: &str) -> Option<&TenantPod> {
        self.by_super.get(&(super_namespace.to_owned(), name.to_owned()))
    }

    /// The tenant pod at super namespace and name with super uid `uid` (when the answer names one).
    fn matching(&self, super_namespace: &str, name: &str, uid: Option<&str>) -> Option<&TenantPod> {
        self.get(super_namespace, name)
            .filter(|p| uid.is_none_or(|uid| uid == p.super_uid))
    }

    /// The nodes the tenant's pods are on.
    pub fn nodes(&self) -> Vec<String> {
        let nodes: HashSet<&String> = self.by_super.values().filter_map(|p| p.node.as_ref()).collect();
        let mut nodes: Vec<String> = nodes.into_iter().cloned().collect();
        nodes.sort();
        nodes
    }

    /// How many pods.
    pub fn len(&self) -> usize {
        self.by_super.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_super.is_empty()
    }

    /// The pods.
    pub fn iter(&self) -> impl Iterator<Item = &TenantPod> {
        self.by_super.values()
    }
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// Keeps the tenant's pods in a kubelet `PodList`, with tenant namespaces and uids.
pub fn filter_pod_list(list: &mut Value, pods: &TenantPods) {
    let Some(items) = list.get_mut("items").and_then(Value::as_array_mut) else {
        return;
    };
    items.retain_mut(|item| {
        let found = pods.matching(
            str_at(item, "/metadata/namespace").unwrap_or(""),
            str_at(item, "/metadata/name").unwrap_or(""),
            str_at(item, "/metadata/uid"),
        );
        let Some(found) = found else {
            return false;
        };
        if let Some(metadata) = item.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.insert("namespace".into(), found.tenant_namespace.clone().into());
            metadata.insert("uid".into(), found.tenant_uid.clone().into());
        }
        true
    });
}

/// A `PodList` of the tenant's pods from super pods, for the super-apiserver backend.
pub fn pod_list_from(super_pods: &[std::sync::Arc<Pod>], pods: &TenantPods) -> Value {
    let items: Vec<Value> = super_pods
        .iter()
        .filter(|p| {
            pods.matching(
                p.namespace().as_deref().unwrap_or(""),
                &p.name_any(),
                p.uid().as_deref(),
            )
            .is_some()
        })
        .filter_map(|p| serde_json::to_value(p.as_ref()).ok())
        .collect();
    let mut list = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items});
    filter_pod_list(&mut list, pods);
    list
}

const NODE_CPU_FIELDS: &[&str] = &["usageNanoCores", "usageCoreNanoSeconds"];
const NODE_MEMORY_FIELDS: &[&str] = &["workingSetBytes", "usageBytes", "rssBytes"];

/// Keeps the tenant's pods in a kubelet stats `Summary`, translated back. The node's CPU and memory become
/// the sums over those pods, and its other figures (file systems, network, system containers) are left
/// out: they describe everybody's use of the node.
pub fn filter_summary(summary: &mut Value, pods: &TenantPods) {
    if let Some(items) = summary.get_mut("pods").and_then(Value::as_array_mut) {
        items.retain_mut(|item| {
            let found = pods.matching(
                str_at(item, "/podRef/namespace").unwrap_or(""),
                str_at(item, "/podRef/name").unwrap_or(""),
                str_at(item, "/podRef/uid"),
            );
            let Some(found) = found else {
                return false;
            };
            if let Some(pod_ref) = item.get_mut("podRef").and_then(Value::as_object_mut) {
                pod_ref.insert("namespace".into(), found.tenant_namespace.clone().into());
                pod_ref.insert("uid".into(), found.tenant_uid.clone().into());
            }
            for volume in item
                .get_mut("volume")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(pvc) = volume.get_mut("pvcRef").and_then(Value::as_object_mut) {
                    pvc.insert("namespace".into(), found.tenant_namespace.clone().into());
                }
            }
            true
        });
    }
    let kept: Vec<Value> = summary
        .get("pods")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sum = |section: &str, field: &str| -> Option<u64> {
        let values: Vec<u64> = kept
            .iter()
            .filter_map(|p| p.get(section)?.get(field)?.as_u64())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    };
    let Some(node) = summary.get_mut("node").and_then(Value::as_object_mut) else {
        return;
    };
    let mut rebuilt = serde_json::Map::new();
    for field in ["nodeName", "startTime"] {
        if let Some(value) = node.get(field) {
            rebuilt.insert(field.into(), value.clone());
        }
    }
    for (section, fields) in [("cpu", NODE_CPU_FIELDS), ("memory", NODE_MEMORY_FIELDS)] {
        let mut stats = serde_json::Map::new();
        if let Some(time) = node.get(section).and_then(|s| s.get("time")) {
            stats.insert("time".into(), time.clone());
        }
        for field in fields {
            stats.insert((*field).into(), sum(section, field).unwrap_or(0).into());
        }
        rebuilt.insert(section.into(), stats.into());
    }
    *node = rebuilt;
}

/// Puts the pods of several summaries into the first one (the super-apiserver backend asks each node).
pub fn merge_summaries(mut summaries: Vec<Value>) -> Value {
    if summaries.is_empty() {
        return serde_json::json!({"node": {"nodeName": "", "cpu": {}, "memory": {}}, "pods": []});
    }
    let mut first = summaries.remove(0);
    let mut all: Vec<Value> = first
        .get("pods")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for other in summaries {
        all.extend(
            other
                .get("pods")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        );
    }
    first["pods"] = all.into();
    first
}

/// One sample line of the Prometheus text format.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: &'a str,
    timestamp: Option<&'a str>,
}

fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        loop {
            // Skip separators.
            while let Some((_, c)) = chars.peek() {
                if *c == ',' || *c == ' ' {
                    chars.next();
                } else {
                    break;
                }
            }
            let (start, c) = *chars.peek()?;
            if c == '}' {
                chars.next();
                rest = &after[start + 1..];
                break;
            }
            let eq = after[start..].find('=')? + start;
            let label = after[start..eq].trim();
            // Advance to the opening quote.
            while let Some((i, _)) = chars.peek() {
                if *i > eq {
                    break;
                }
                chars.next();
            }
            let (_, quote) = chars.next()?;
            if quote != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break,
                    other => value.push(other),
                }
            }
            labels.push((label, value));
        }
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next()?;
    let timestamp = fields.next();
    Some(Sample {
        name,
        labels,
        value,
        timestamp,
    })
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn render_sample(name: &str, labels: &[(&str, String)], value: &str, timestamp: Option<&str>) -> String {
    let mut line = name.to_owned();
    if !labels.is_empty() {
        let rendered: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
            .collect();
        line.push('{');
        line.push_str(&rendered.join(","));
        line.push('}');
    }
    line.push(' ');
    line.push_str(value);
    if let Some(ts) = timestamp {
        line.push(' ');
        line.push_str(ts);
    }
    line
}

/// The labels of a sample of one of the tenant's pods, with the tenant namespace; `None` for other pods.
fn tenant_labels<'a>(sample: &Sample<'a>, pods: &TenantPods) -> Option<Vec<(&'a str, String)>> {
    let label = |name: &str| {
        sample
            .labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    };
    let (namespace, pod) = (label("namespace")?, label("pod")?);
    let found = pods.get(namespace, pod)?;
    Some(
        sample
            .labels
            .iter()
            .map(|(k, v)| match *k {
                "namespace" => (*k, found.tenant_namespace.clone()),
                _ => (*k, v.clone()),
            })
            .collect(),
    )
}

/// Node-level samples that are recomputed from the tenant's containers (or pods): metric, container
/// metric, pod metric.
const NODE_SUMS: &[(&str, &str, &str)] = &[
    (
        "node_cpu_usage_seconds_total",
        "container_cpu_usage_seconds_total",
        "pod_cpu_usage_seconds_total",
    ),
    (
        "node_memory_working_set_bytes",
        "container_memory_working_set_bytes",
        "pod_memory_working_set_bytes",
    ),
];

/// Keeps the tenant's samples in the kubelet's `/metrics/resource` text (one or several nodes' texts
/// concatenated), with tenant namespaces. Node CPU and memory become sums over the tenant's containers;
/// other node samples are left out.
pub fn filter_resource_metrics<'a>(text: &'a str, pods: &TenantPods) -> String {
    let tenant_sample = |sample: &Sample<'a>| tenant_labels(sample, pods);
    let is_per_pod = |sample: &Sample<'a>| {
        sample
            .labels
            .iter()
            .any(|(k, _)| *k == "pod" || *k == "namespace")
    };

    // First pass: sums of the tenant's container and pod samples.
    let mut sums: HashMap<&str, f64> = HashMap::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for sample in text.lines().filter_map(parse_sample) {
        if is_per_pod(&sample) && tenant_sample(&sample).is_some() {
            if let Ok(value) = sample.value.parse::<f64>() {
                *sums.entry(sample.name).or_default() += value;
            }
            seen.insert(sample.name);
        }
    }
    let node_value = |node_metric: &str| -> f64 {
        NODE_SUMS
            .iter()
            .find(|(n, _, _)| *n == node_metric)
            .map(|(_, container, pod)| match seen.contains(container) {
                true => sums.get(container).copied().unwrap_or(0.0),
                false => sums.get(pod).copied().unwrap_or(0.0),
            })
            .unwrap_or(0.0)
    };

    let mut out = String::with_capacity(text.len());
    let mut emitted_comments: HashSet<&str> = HashSet::new();
    let mut emitted_node: HashSet<&str> = HashSet::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with('#') {
            // HELP and TYPE lines, once each (several nodes' texts may be concatenated).
            if emitted_comments.insert(trimmed) {
                out.push_str(trimmed);
                out.push('\n');
            }
            continue;
        }
        let Some(sample) = parse_sample(trimmed) else {
            continue;
        };
        if is_per_pod(&sample) {
            if let Some(labels) = tenant_sample(&sample) {
                out.push_str(&render_sample(
                    sample.name,
                    &labels,
                    sample.value,
                    sample.timestamp,
                ));
                out.push('\n');
            }
        } else if sample.name.starts_with("node_") {
            if NODE_SUMS.iter().any(|(n, _, _)| *n == sample.name) && emitted_node.insert(sample.name) {
                let value = node_value(sample.name).to_string();
                out.push_str(&render_sample(
                    sample.name,
                    &sample.labels,
                    &value,
                    sample.timestamp,
                ));
                out.push('\n');
            }
        } else if emitted_node.insert(sample.name) {
            // Scrape-health samples such as scrape_error, once.
            out.push_str(trimmed);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::core::v1::{Container, PodSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use crds::wellknown::{ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_UID};

    use super::*;

    pub(crate) fn super_pod(key: &str, tenant_ns: &str, name: &str, tenant_uid: &str, node: &str) -> Pod {
        let annotations: BTreeMap<String, String> = [
            (ANNOTATION_CLUSTER, key),
            (ANNOTATION_NAMESPACE, tenant_ns),
            (ANNOTATION_UID, tenant_uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(super_namespace(key, tenant_ns)),
                uid: Some(format!("super-{tenant_uid}")),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers: vec![Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn target(ns: &str, name: &str, uid: Option<&str>) -> PodTarget {
        PodTarget {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.map(Into::into),
        }
    }

    const A: &str = "team-a-1a2b3c-dev";
    const B: &str = "team-b-4d5e6f-dev";

    #[test]
    fn a_tenant_pod_is_recognised_by_its_annotations_and_mapped_namespace() {
        let pod = super_pod(A, "web", "nginx", "t-uid", "node-1");
        let found = tenant_pod(&pod, A).expect("A's pod");
        assert_eq!(found.super_namespace, format!("{A}-web"));
        assert_eq!(
            (found.tenant_namespace.as_str(), found.tenant_uid.as_str()),
            ("web", "t-uid")
        );
        assert_eq!(found.super_uid, "super-t-uid");
        assert_eq!(found.node.as_deref(), Some("node-1"));
        assert!(tenant_pod(&pod, B).is_none());

        // The annotations must agree with the namespace it lives in.
        let mut moved = pod.clone();
        moved.metadata.namespace = Some(format!("{A}-other"));
        assert!(tenant_pod(&moved, A).is_none());
        let mut no_uid = pod;
        no_uid.annotations_mut().remove(ANNOTATION_UID);
        assert!(tenant_pod(&no_uid, A).is_none());
    }

    #[test]
    fn targets_are_checked_against_the_pod_found() {
        let pod = super_pod(A, "web", "nginx", "t-uid", "node-1");
        assert!(check_target(&pod, A, &target("web", "nginx", None)).is_ok());
        assert!(check_target(&pod, A, &target("web", "nginx", Some("t-uid"))).is_ok());
        let wrong_uid = check_target(&pod, A, &target("web", "nginx", Some("old-uid"))).expect_err("uid");
        assert_eq!(wrong_uid.status, http::StatusCode::NOT_FOUND);
        let other_tenant = check_target(&pod, B, &target("web", "nginx", None)).expect_err("B");
        assert_eq!(other_tenant.status, http::StatusCode::FORBIDDEN);
        assert!(!other_tenant.message.contains(A), "{}", other_tenant.message);

        let mut unannotated = pod.clone();
        unannotated.annotations_mut().remove(ANNOTATION_UID);
        assert_eq!(
            check_target(&unannotated, A, &target("web", "nginx", None))
                .expect_err("no uid")
                .status,
            http::StatusCode::FORBIDDEN
        );
    }

    #[test]
    fn the_63_character_rule_is_applied_and_collisions_are_not_found() {
        let long_ns = "n".repeat(63);
        let pod = super_pod(A, &long_ns, "p", "u", "node");
        let (super_ns, name) = super_location(A, &target(&long_ns, "p", None));
        assert_eq!(super_ns.len(), 63);
        assert_eq!(pod.namespace().as_deref(), Some(super_ns.as_str()));
        assert_eq!(name, "p");
        assert!(check_target(&pod, A, &target(&long_ns, "p", None)).is_ok());

        // The tail of the shortened name is a namespace that maps to the same super namespace: a caller
        // naming it must not reach the long namespace's pod.
        let tail = &super_ns[A.len() + 1..];
        assert_eq!(super_location(A, &target(tail, "p", None)).0, super_ns);
        let collision = check_target(&pod, A, &target(tail, "p", None)).expect_err("collision");
        assert_eq!(collision.status, http::StatusCode::NOT_FOUND);
    }

    #[test]
    fn kubelet_paths_use_super_names_and_uids() {
        let pod = tenant_pod(&super_pod(A, "web", "nginx", "t-uid", "n"), A).expect("pod");
        assert_eq!(
            kubelet_path(Action::Exec, &pod, true, Some("app")),
            format!("/exec/{A}-web/nginx/super-t-uid/app")
        );
        assert_eq!(
            kubelet_path(Action::ContainerLogs, &pod, false, Some("app")),
            format!("/containerLogs/{A}-web/nginx/app")
        );
        assert_eq!(
            kubelet_path(Action::PortForward, &pod, false, None),
            format!("/portForward/{A}-web/nginx")
        );
    }

    #[test]
    fn apiserver_queries_translate_the_kubelet_parameters() {
        assert_eq!(
            apiserver_query(
                Action::Exec,
                Some("app"),
                Some("command=sh&command=-c&command=echo+a%26b&input=1&output=1&tty=1")
            ),
            "container=app&command=sh&command=-c&command=echo+a%26b&stdin=true&stdout=true&stderr=false&tty=true"
        );
        // Only "1" sets a flag, as in the kubelet; tty=0 does not turn stdout off.
        assert_eq!(
            apiserver_query(
                Action::Attach,
                Some("app"),
                Some("output=1&error=1&tty=0&input=true")
            ),
            "container=app&stdin=false&stdout=true&stderr=true&tty=false"
        );
        assert_eq!(
            apiserver_query(
                Action::ContainerLogs,
                Some("app"),
                Some(
                    "follow=true&tailLines=5&sinceSeconds=10&timestamps=true&limitBytes=100&previous=false&bogus=1"
                )
            ),
            "container=app&follow=true&previous=false&timestamps=true&sinceSeconds=10&tailLines=5&limitBytes=100"
        );
        assert_eq!(
            apiserver_query(Action::PortForward, None, Some("port=8080&port=9090")),
            "ports=8080&ports=9090"
        );
        assert_eq!(
            apiserver_query(Action::ContainerLogs, Some("c"), None),
            "container=c"
        );
        assert_eq!(apiserver_subresource(Action::PortForward), Some("portforward"));
        assert_eq!(apiserver_subresource(Action::Run), None);
    }

    fn index() -> (TenantPods, Vec<Pod>) {
        let pods = vec![
            super_pod(A, "web", "nginx", "a-1", "node-1"),
            super_pod(A, "db", "pg", "a-2", "node-1"),
            super_pod(B, "web", "nginx", "b-1", "node-1"),
        ];
        (TenantPods::new(A, &pods), pods)
    }

    #[test]
    fn pod_lists_keep_only_the_tenants_pods_translated_back() {
        let (tenant, pods) = index();
        assert_eq!(tenant.len(), 2);
        assert_eq!(tenant.nodes(), ["node-1"]);
        let mut list = serde_json::json!({
            "kind": "PodList",
            "items": pods.iter().map(|p| serde_json::to_value(p).expect("json")).collect::<Vec<_>>()
        });
        // A pod with A's name but another uid (recreated since) is left out too.
        let mut stale = serde_json::to_value(&pods[0]).expect("json");
        stale["metadata"]["uid"] = "stale".into();
        list["items"].as_array_mut().expect("items").push(stale);
        filter_pod_list(&mut list, &tenant);
        let items = list["items"].as_array().expect("items");
        let names: Vec<(&str, &str, &str)> = items
            .iter()
            .map(|i| {
                (
                    i["metadata"]["namespace"].as_str().unwrap_or(""),
                    i["metadata"]["name"].as_str().unwrap_or(""),
                    i["metadata"]["uid"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(names, [("web", "nginx", "a-1"), ("db", "pg", "a-2")]);

        let arcs: Vec<std::sync::Arc<Pod>> = pods.into_iter().map(std::sync::Arc::new).collect();
        let built = pod_list_from(&arcs, &tenant);
        assert_eq!(built["items"].as_array().map(Vec::len), Some(2));
        assert_eq!(built["items"][0]["metadata"]["namespace"], "web");
    }

    #[test]
    fn summaries_keep_the_tenants_pods_and_sum_the_node() {
        let (tenant, _) = index();
        let stats = |ns: &str, name: &str, uid: &str, cpu: u64, mem: u64| {
            serde_json::json!({
                "podRef": {"namespace": ns, "name": name, "uid": uid},
                "cpu": {"time": "t", "usageNanoCores": cpu, "usageCoreNanoSeconds": cpu * 10},
                "memory": {"time": "t", "workingSetBytes": mem, "usageBytes": mem},
                "volume": [{"name": "data", "pvcRef": {"name": "data", "namespace": ns}}]
            })
        };
        let mut summary = serde_json::json!({
            "node": {
                "nodeName": "node-1", "startTime": "s",
                "cpu": {"time": "t", "usageNanoCores": 999_999, "usageCoreNanoSeconds": 1},
                "memory": {"time": "t", "workingSetBytes": 999_999, "availableBytes": 5},
                "network": {"interfaces": []},
                "systemContainers": [{"name": "kubelet"}],
                "fs": {"capacityBytes": 1}
            },
            "pods": [
                stats(&format!("{A}-web"), "nginx", "super-a-1", 10, 100),
                stats(&format!("{A}-db"), "pg", "super-a-2", 20, 200),
                stats(&format!("{B}-web"), "nginx", "super-b-1", 40, 400),
            ]
        });
        filter_summary(&mut summary, &tenant);
        let pods = summary["pods"].as_array().expect("pods");
        assert_eq!(pods.len(), 2);
        assert_eq!(
            pods[0]["podRef"],
            serde_json::json!({"namespace": "web", "name": "nginx", "uid": "a-1"})
        );
        assert_eq!(pods[1]["volume"][0]["pvcRef"]["namespace"], "db");
        assert_eq!(
            summary["node"],
            serde_json::json!({
                "nodeName": "node-1", "startTime": "s",
                "cpu": {"time": "t", "usageNanoCores": 30, "usageCoreNanoSeconds": 300},
                "memory": {"time": "t", "workingSetBytes": 300, "usageBytes": 300, "rssBytes": 0}
            })
        );

        let merged = merge_summaries(vec![
            serde_json::json!({"node": {"nodeName": "n1"}, "pods": [{"a": 1}]}),
            serde_json::json!({"node": {"nodeName": "n2"}, "pods": [{"b": 2}]}),
        ]);
        assert_eq!(merged["node"]["nodeName"], "n1");
        assert_eq!(merged["pods"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn prometheus_samples_parse_with_escapes() {
        let sample = parse_sample(r#"m{a="x",b="q\"uo\\te",c="new\nline"} 1.5 1700"#).expect("sample");
        assert_eq!(sample.name, "m");
        assert_eq!(
            sample.labels,
            [
                ("a", "x".to_owned()),
                ("b", "q\"uo\\te".to_owned()),
                ("c", "new\nline".to_owned())
            ]
        );
        assert_eq!((sample.value, sample.timestamp), ("1.5", Some("1700")));
        let bare = parse_sample("scrape_error 0").expect("bare");
        assert_eq!(
            (bare.name, bare.labels.len(), bare.value, bare.timestamp),
            ("scrape_error", 0, "0", None)
        );
        assert!(parse_sample("garbage").is_none());
        let rendered = render_sample(sample.name, &sample.labels, sample.value, sample.timestamp);
        assert_eq!(parse_sample(&rendered), Some(sample));
    }

    #[test]
    fn resource_metrics_keep_the_tenants_samples() {
        let (tenant, _) = index();
        let a_web = format!("{A}-web");
        let b_web = format!("{B}-web");
        let node_text = format!(
            "# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time\n\
             # TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{{container=\"app\",namespace=\"{a_web}\",pod=\"nginx\"}} 1.5 1000\n\
             container_cpu_usage_seconds_total{{container=\"app\",namespace=\"{b_web}\",pod=\"nginx\"}} 7 1000\n\
             container_memory_working_set_bytes{{container=\"app\",namespace=\"{a_web}\",pod=\"nginx\"}} 100 1000\n\
             container_memory_working_set_bytes{{container=\"app\",namespace=\"{b_web}\",pod=\"nginx\"}} 700 1000\n\
             # TYPE node_cpu_usage_seconds_total counter\n\
             node_cpu_usage_seconds_total 99 1000\n\
             node_memory_working_set_bytes 9999 1000\n\
             node_swap_usage_bytes 5 1000\n\
             pod_memory_working_set_bytes{{namespace=\"{a_web}\",pod=\"nginx\"}} 100 1000\n\
             pod_memory_working_set_bytes{{namespace=\"kube-system\",pod=\"coredns\"}} 50 1000\n\
             scrape_error 0\n"
        );
        // Two nodes' answers concatenated: node samples and comments appear once.
        let text = format!("{node_text}{node_text}");
        let filtered = filter_resource_metrics(&text, &tenant);
        let expected = "# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time\n\
             # TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{container=\"app\",namespace=\"web\",pod=\"nginx\"} 1.5 1000\n\
             container_memory_working_set_bytes{container=\"app\",namespace=\"web\",pod=\"nginx\"} 100 1000\n\
             # TYPE node_cpu_usage_seconds_total counter\n\
             node_cpu_usage_seconds_total 3 1000\n\
             node_memory_working_set_bytes 200 1000\n\
             pod_memory_working_set_bytes{namespace=\"web\",pod=\"nginx\"} 100 1000\n\
             scrape_error 0\n\
             container_cpu_usage_seconds_total{container=\"app\",namespace=\"web\",pod=\"nginx\"} 1.5 1000\n\
             container_memory_working_set_bytes{container=\"app\",namespace=\"web\",pod=\"nginx\"} 100 1000\n\
             pod_memory_working_set_bytes{namespace=\"web\",pod=\"nginx\"} 100 1000\n";
        assert_eq!(filtered, expected);
        assert!(!filtered.contains(B) && !filtered.contains("coredns"));
    }
}
