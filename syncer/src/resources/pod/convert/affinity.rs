//! A pod's affinity and spread constraints scoped to its tenant: they only ever match pods of the same
//! tenant, by the keys the super pods carry.

use k8s_openapi::{
    api::core::v1::{Affinity, PodAffinityTerm},
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement},
};

use crate::tenancy::identity::{self, TenantIdentity};

/// Label keys a pod names (`matchLabelKeys`), as the super pods carry them.
pub(super) fn map_keys(keys: &mut Option<Vec<String>>, meta: &identity::MetaPolicy) {
    for key in keys.iter_mut().flatten() {
        *key = identity::selector_key(key, meta, false).into_owned();
    }
}

/// Pod (anti-)affinity terms only ever match pods of the same tenant, by the keys the super pods and
/// namespaces carry.
pub(super) fn scope_affinity(affinity: &mut Affinity, identity: &TenantIdentity, meta: &identity::MetaPolicy) {
    let mut terms: Vec<&mut PodAffinityTerm> = Vec::new();
    if let Some(a) = &mut affinity.pod_affinity {
        terms.extend(
            a.required_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten(),
        );
        terms.extend(
            a.preferred_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten()
                .map(|w| &mut w.pod_affinity_term),
        );
    }
    if let Some(a) = &mut affinity.pod_anti_affinity {
        terms.extend(
            a.required_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten(),
        );
        terms.extend(
            a.preferred_during_scheduling_ignored_during_execution
                .iter_mut()
                .flatten()
                .map(|w| &mut w.pod_affinity_term),
        );
    }
    for term in terms {
        if let Some(selector) = &mut term.label_selector {
            *selector = crate::tenancy::identity::map_selector(selector, meta, false);
            require_cluster(selector, identity);
        }
        map_keys(&mut term.match_label_keys, meta);
        map_keys(&mut term.mismatch_label_keys, meta);
        if let Some(namespaces) = &mut term.namespaces {
            for namespace in namespaces.iter_mut() {
                *namespace = identity.super_namespace(namespace);
            }
        }
        if let Some(selector) = &mut term.namespace_selector {
            *selector = crate::tenancy::identity::map_selector(selector, meta, true);
            require_cluster(selector, identity);
        }
    }
}

pub(super) fn require_cluster(selector: &mut LabelSelector, identity: &TenantIdentity) {
    selector
        .match_expressions
        .get_or_insert_with(Vec::new)
        .push(LabelSelectorRequirement {
            key: crds::wellknown::LABEL_CLUSTER.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![identity.cluster_key.clone()]),
        });
}
