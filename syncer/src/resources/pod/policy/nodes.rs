//! Which nodes a pod may reach: its tolerations, node selector and node affinity, held to allow-lists of
//! the platform's entries and those a VirtualCluster may grant.

use crds::PodPolicy;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration};

use super::input::PolicyInput;
use crate::resources::pod::flags::PlatformPodPolicy;

/// The node label whose value is the node's name: allowing it allows affinity on `metadata.name`.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// An allow-list of `key` or `key=value` entries.
struct Allowed<'a>(Vec<&'a str>);

impl<'a> Allowed<'a> {
    /// The platform's entries, and the tenant's whose key the platform lets VirtualClusters grant.
    fn of(platform: &'a [String], grantable: &'a [String], tenant: &'a [String]) -> Self {
        let mut entries: Vec<&str> = platform.iter().map(String::as_str).collect();
        entries.extend(
            tenant
                .iter()
                .map(String::as_str)
                .filter(|e| grantable.iter().any(|g| g == key_of(e))),
        );
        Self(entries)
    }

    /// Whether every value of `key` is allowed.
    fn any_value(&self, key: &str) -> bool {
        self.0.contains(&key)
    }

    /// Whether `key=value` is allowed.
    fn value(&self, key: &str, value: &str) -> bool {
        self.any_value(key) || self.0.iter().any(|e| e.split_once('=') == Some((key, value)))
    }
}

fn key_of(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(key, _)| key)
}

/// Tolerations, node selector and node affinity.
pub(super) fn placement(spec: &PodSpec, input: &PolicyInput<'_>, found: &mut Vec<String>) {
    let platform = input.platform;
    let taints = Allowed::of(
        &platform.allowed_taints,
        &platform.grantable_taints,
        &input.tenant.allowed_taints,
    );
    for toleration in spec.tolerations.iter().flatten() {
        if !tolerable(toleration, &taints) {
            found.push(format!(
                "toleration of {} (the syncer's --pod-allowed-taints, or podPolicy.allowedTaints for keys in --pod-grantable-taints)",
                describe_toleration(toleration)
            ));
        }
    }
    if input.node_selection_resolved {
        return;
    }
    let labels = Allowed::of(
        &platform.allowed_node_labels,
        &platform.grantable_node_labels,
        &input.tenant.allowed_node_labels,
    );
    let hint = "(the syncer's --pod-allowed-node-labels, or podPolicy.allowedNodeLabels for keys in --pod-grantable-node-labels)";
    for (key, value) in spec.node_selector.iter().flatten() {
        if !labels.value(key, value) {
            found.push(format!("nodeSelector {key}={value} {hint}"));
        }
    }
    let Some(node_affinity) = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()) else {
        return;
    };
    let mut terms: Vec<&NodeSelectorTerm> = node_affinity
        .required_during_scheduling_ignored_during_execution
        .iter()
        .flat_map(|r| &r.node_selector_terms)
        .collect();
    terms.extend(
        node_affinity
            .preferred_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
            .map(|p| &p.preference),
    );
    for term in terms {
        for requirement in term.match_expressions.iter().flatten() {
            if !selectable(requirement, &labels) {
                found.push(format!(
                    "node affinity on label {} {hint}",
                    describe_requirement(requirement)
                ));
            }
        }
        for requirement in term.match_fields.iter().flatten() {
            let by_name = requirement.key == "metadata.name" && labels.any_value(HOSTNAME_LABEL);
            if !by_name {
                found.push(format!(
                    "node affinity on field {} (allowed for metadata.name when {HOSTNAME_LABEL} is an allowed node label)",
                    describe_requirement(requirement)
                ));
            }
        }
    }
}

/// The tolerations of `tolerations` the policy does not allow, each described as in
/// [`violations`](super::violations); what a running pod may add is held to the same rules as what it was
/// created with.
pub fn refused_tolerations<'t>(
    tolerations: impl IntoIterator<Item = &'t Toleration>,
    platform: &PlatformPodPolicy,
    tenant: &PodPolicy,
) -> Vec<(&'t Toleration, String)> {
    let taints = Allowed::of(
        &platform.allowed_taints,
        &platform.grantable_taints,
        &tenant.allowed_taints,
    );
    tolerations
        .into_iter()
        .filter(|t| !tolerable(t, &taints))
        .map(|t| (t, format!("toleration of {}", describe_toleration(t))))
        .collect()
}

/// Whether a tenant's pods may tolerate `taint`: whether a node with it is one they may use.
pub fn may_tolerate(platform: &PlatformPodPolicy, tenant: &PodPolicy, taint: &Taint) -> bool {
    let allowed = Allowed::of(
        &platform.allowed_taints,
        &platform.grantable_taints,
        &tenant.allowed_taints,
    );
    allowed.value(&taint.key, taint.value.as_deref().unwrap_or_default())
}

fn tolerable(toleration: &Toleration, allowed: &Allowed<'_>) -> bool {
    let key = toleration.key.as_deref().unwrap_or_default();
    // An empty key with Exists tolerates every taint: no allow-list entry stands for that.
    if key.is_empty() {
        return false;
    }
    match toleration.operator.as_deref() {
        Some("Exists") => allowed.any_value(key),
        _ => allowed.value(key, toleration.value.as_deref().unwrap_or_default()),
    }
}

fn describe_toleration(toleration: &Toleration) -> String {
    match (toleration.key.as_deref(), toleration.operator.as_deref()) {
        (None | Some(""), _) => "every taint".to_owned(),
        (Some(key), Some("Exists")) => format!("taint {key}"),
        (Some(key), _) => format!("taint {key}={}", toleration.value.as_deref().unwrap_or_default()),
    }
}

fn selectable(requirement: &NodeSelectorRequirement, allowed: &Allowed<'_>) -> bool {
    match requirement.operator.as_str() {
        "In" => requirement
            .values
            .iter()
            .flatten()
            .all(|v| allowed.value(&requirement.key, v)),
        _ => allowed.any_value(&requirement.key),
    }
}

fn describe_requirement(requirement: &NodeSelectorRequirement) -> String {
    match &requirement.values {
        Some(values) if !values.is_empty() => format!(
            "{} {} [{}]",
            requirement.key,
            requirement.operator,
            values.join(", ")
        ),
        _ => format!("{} {}", requirement.key, requirement.operator),
    }
}
