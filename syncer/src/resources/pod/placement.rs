//! Node selection in the tenant's own view.
//!
//! Outside `--vnode-mode pods`, a tenant sees as vNodes exactly the super nodes its pods may use, and labels
//! them as it likes (its view; the super nodes keep theirs). A pod that selects nodes (a node name, a node
//! selector, node affinity) selects among those vNodes, as a scheduler of its own cluster would: the
//! syncer evaluates the selection against the vNodes' labels and the super copy asks for the matching
//! super nodes by name. A selection can therefore never reach a node the tenant does not see, whatever
//! labels it names, and labels a tenant puts on its vNodes work as on its own nodes (DaemonSets with node
//! selectors, tests that label a node and select it). A selection nothing matches asks for a label no node
//! has, so the super scheduler reports it as unschedulable (`FailedScheduling`), as the tenant's own would.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
    PreferredSchedulingTerm,
};

pub use crds::wellknown::LABEL_NO_MATCHING_VNODE as NO_MATCHING_VNODE_LABEL;
/// The taint key of a cordoned node.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// A vNode the tenant's pods may be placed on, as the tenant sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Node name (the super node's).
    pub name: String,
    /// Labels of the vNode (the tenant's view).
    pub labels: BTreeMap<String, String>,
    /// Cordoned by the tenant.
    pub unschedulable: bool,
}

/// Where a pod may go, resolved against the tenant's vNodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The vNodes the pod's required selection matches (possibly none).
    pub required: Vec<Candidate>,
    /// Whether the copy must ask for exactly those: the pod names a node, or its required selection
    /// leaves out a vNode. (A selection every vNode matches, `kubernetes.io/os: linux` most often, lets
    /// the pod go wherever one without a selection may, and the copy carries no list of every node.)
    pub narrowed: bool,
    /// Each preferred term's weight and the vNodes it matches (terms matching none are left out).
    pub preferred: Vec<(i32, Vec<Candidate>)>,
}

/// Whether the pod selects nodes at all: a node name, a node selector or node affinity.
pub fn selects(spec: &PodSpec) -> bool {
    spec.node_name.as_deref().is_some_and(|n| !n.is_empty())
        || spec.node_selector.as_ref().is_some_and(|s| !s.is_empty())
        || node_affinity(spec).is_some_and(|a| {
            a.required_during_scheduling_ignored_during_execution.is_some()
                || a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
                    .is_some_and(|p| !p.is_empty())
        })
}

fn node_affinity(spec: &PodSpec) -> Option<&NodeAffinity> {
    spec.affinity.as_ref()?.node_affinity.as_ref()
}

/// Resolves a pod's node selection against the tenant's vNodes.
pub fn resolve(spec: &PodSpec, candidates: &[Candidate]) -> Resolved {
    let tolerates_cordon = spec.tolerations.iter().flatten().any(|t| {
        (t.key.as_deref() == Some(UNSCHEDULABLE_TAINT) && t.operator.as_deref() == Some("Exists"))
            || (t.key.is_none() && t.operator.as_deref() == Some("Exists"))
    });
    let affinity = node_affinity(spec);
    let required: Vec<Candidate> = candidates
        .iter()
        .filter(|c| !c.unschedulable || tolerates_cordon)
        .filter(|c| match spec.node_name.as_deref().filter(|n| !n.is_empty()) {
            Some(name) => c.name == name,
            None => true,
        })
        .filter(|c| {
            spec.node_selector
                .iter()
                .flatten()
                .all(|(key, value)| c.labels.get(key) == Some(value))
        })
        .filter(|c| {
            affinity
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
                .is_none_or(|required| required.node_selector_terms.iter().any(|term| term_matches(term, c)))
        })
        .cloned()
        .collect();
    let preferred = affinity
        .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let matching: Vec<Candidate> = candidates
                .iter()
                .filter(|c| term_matches(&p.preference, c))
                .cloned()
                .collect();
            (!matching.is_empty()).then_some((p.weight, matching))
        })
        .collect();
    let named = spec.node_name.as_deref().is_some_and(|n| !n.is_empty());
    let narrowed = named || required.len() < candidates.len();
    Resolved {
        required,
        narrowed,
        preferred,
    }
}

/// Whether a node selector term matches a vNode: every expression and field does (a term with neither
/// matches nothing, as in the scheduler).
fn term_matches(term: &NodeSelectorTerm, candidate: &Candidate) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, candidate.labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            r.key == "metadata.name" && requirement_matches(r, Some(candidate.name.as_str()))
        })
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<i64>().ok());
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|w| w == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((number(value), number(values.first().map(String::as_str))), (Some(v), Some(w)) if v > w),
        "Lt" => matches!((number(value), number(values.first().map(String::as_str))), (Some(v), Some(w)) if v < w),
        _ => false,
    }
}

/// The terms asking for exactly these vNodes' super nodes, by name (a field term names one node; terms
/// are alternatives). Names, not the hostname label: a node's name is exact, its hostname label need
/// not equal it.
fn terms_for(nodes: &[Candidate]) -> Vec<NodeSelectorTerm> {
    let mut names: Vec<&str> = nodes.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_owned(),
                operator: "In".to_owned(),
                values: Some(vec![name.to_owned()]),
            }]),
        })
        .collect()
}

/// The super copy's node selection: the resolved vNodes by name in place of the tenant's node name,
/// selector and node affinity.
pub fn rewrite(spec: &mut PodSpec, resolved: &Resolved) {
    spec.node_name = None;
    spec.node_selector = None;
    let mut required = match resolved.narrowed {
        true => terms_for(&resolved.required),
        false => Vec::new(),
    };
    if resolved.narrowed && required.is_empty() {
        required.push(NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: NO_MATCHING_VNODE_LABEL.to_owned(),
                operator: "Exists".to_owned(),
                values: None,
            }]),
            match_fields: None,
        });
    }
    let preferred: Vec<PreferredSchedulingTerm> = resolved
        .preferred
        .iter()
        .flat_map(|(weight, nodes)| {
            terms_for(nodes).into_iter().map(|preference| PreferredSchedulingTerm {
                preference,
                weight: *weight,
            })
        })
        .collect();
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    affinity.node_affinity = (!required.is_empty() || !preferred.is_empty()).then(|| NodeAffinity {
        required_during_scheduling_ignored_during_execution: (!required.is_empty()).then_some(NodeSelector {
            node_selector_terms: required,
        }),
        preferred_during_scheduling_ignored_during_execution: (!preferred.is_empty()).then_some(preferred),
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn candidate(name: &str, labels: serde_json::Value) -> Candidate {
        Candidate {
            name: name.to_owned(),
            labels: serde_json::from_value(labels).expect("labels"),
            unschedulable: false,
        }
    }

    fn spec(value: serde_json::Value) -> PodSpec {
        let mut value = value;
        value["containers"] = json!([{"name": "c", "image": "busybox"}]);
        serde_json::from_value(value).expect("spec")
    }

    fn names(nodes: &[Candidate]) -> Vec<&str> {
        nodes.iter().map(|c| c.name.as_str()).collect()
    }

    fn vnodes() -> Vec<Candidate> {
        vec![
            candidate("a", json!({"color": "blue", "zone": "1", "cpus": "8"})),
            candidate("b", json!({"color": "green", "zone": "2", "cpus": "64"})),
            candidate("c", json!({"zone": "2"})),
        ]
    }

    #[test]
    fn selectors_and_required_terms_match_as_in_the_scheduler() {
        let vnodes = vnodes();
        let resolve_names = |value| {
            names(&resolve(&spec(value), &vnodes).required)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(resolve_names(json!({"nodeSelector": {"color": "blue"}})), ["a"]);
        assert_eq!(resolve_names(json!({"nodeName": "b"})), ["b"]);
        assert!(resolve_names(json!({"nodeSelector": {"label": "nonempty"}})).is_empty());
        // Terms are alternatives; a term's requirements all hold.
        let terms = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["2"]}, {"key": "color", "operator": "DoesNotExist"}]},
            {"matchExpressions": [{"key": "cpus", "operator": "Lt", "values": ["16"]}]}
        ]}}}});
        assert_eq!(resolve_names(terms), ["a", "c"]);
        let mixed = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "color", "operator": "NotIn", "values": ["blue"]}, {"key": "cpus", "operator": "Gt", "values": ["16"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]},
            {}
        ]}}}});
        assert_eq!(resolve_names(mixed), ["b", "c"]);
        // A DaemonSet pod: pinned by name, and the template's selector on a label the tenant set.
        let daemon = json!({"nodeSelector": {"color": "blue"}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]}}}});
        assert_eq!(resolve_names(daemon), ["a"]);
    }

    #[test]
    fn cordoned_vnodes_take_only_pods_that_tolerate_it() {
        let mut vnodes = vnodes();
        vnodes[0].unschedulable = true;
        let any_zone = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]}}}});
        assert_eq!(names(&resolve(&spec(any_zone.clone()), &vnodes).required), ["b", "c"]);
        let mut tolerant = any_zone;
        tolerant["tolerations"] = json!([{"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
        assert_eq!(names(&resolve(&spec(tolerant), &vnodes).required), ["a", "b", "c"]);
    }

    #[test]
    fn the_copy_asks_for_the_matching_nodes_by_name_or_for_none() {
        let vnodes = vnodes();
        let mut pod = spec(json!({"nodeName": "x", "nodeSelector": {"zone": "2"},
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [{"key": "color", "operator": "In", "values": ["green"]}]}},
                {"weight": 9, "preference": {"matchExpressions": [{"key": "color", "operator": "In", "values": ["red"]}]}}
            ]}}}));
        pod.node_name = None;
        let resolved = resolve(&pod, &vnodes);
        rewrite(&mut pod, &resolved);
        assert_eq!(pod.node_selector, None);
        let affinity = serde_json::to_value(pod.affinity.and_then(|a| a.node_affinity)).expect("json");
        assert_eq!(
            affinity,
            json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}
                ]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 5, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}}
                ]
            })
        );

        let mut lost = spec(json!({"nodeSelector": {"label": "nonempty"}}));
        let resolved = resolve(&lost, &vnodes);
        rewrite(&mut lost, &resolved);
        let affinity = serde_json::to_value(lost.affinity.and_then(|a| a.node_affinity)).expect("json");
        assert_eq!(
            affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            json!([{"matchExpressions": [{"key": NO_MATCHING_VNODE_LABEL, "operator": "Exists"}]}])
        );
        // A selection every vNode matches leaves the copy unconstrained.
        let mut linux = spec(json!({"nodeSelector": {"zone": "2"}}));
        let resolved = resolve(&linux, &vnodes[1..]);
        assert!(!resolved.narrowed);
        rewrite(&mut linux, &resolved);
        assert_eq!(linux.node_selector, None);
        assert_eq!(linux.affinity.and_then(|a| a.node_affinity), None);
        assert!(!selects(&spec(json!({}))));
        assert!(selects(&spec(json!({"nodeSelector": {"a": "b"}}))));
    }
}
