//! Tenant NetworkPolicies, copied down with every namespace selector confined to the tenant's own super
//! namespaces (the cluster label is added to it, and `kubernetes.io/metadata.name` values are mapped to
//! super names), so that no selector of a tenant ever matches another tenant's or the platform's
//! namespaces. Rules with an ipBlock outside `--tenant-allowed-cidrs` are refused (left out, with an
//! event); leaving a rule out only ever allows less. The isolating policies beside them are
//! [`super::isolation`]'s.

use std::{collections::BTreeMap, sync::Arc};

use crds::wellknown::{LABEL_CLUSTER, LABEL_NAMESPACE_NAME};
use k8s_openapi::{
    api::networking::v1::{
        NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
        NetworkPolicyPort, NetworkPolicySpec,
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{Resource, ResourceExt, runtime::reflector::Store};
use serde_json::Value;

use super::{
    copy::{self, Conversion, Downward},
    isolation::{ISOLATION_POLICY_NAME, isolates, policy_view},
    outcome::Outcome,
    synced::SyncedKind,
};
use crate::{
    cache::super_stores::{EventSubject, SuperCache, SuperStores, SuperWatch, ours, tenant_key},
    engine::{
        context::Context,
        items::{Item, Kind, kinds},
        patrol::findings::Findings,
    },
    error::Result,
    tenancy::tenant::{Tenant, TenantCache, TenantStores, TenantWatch},
};

/// Reason of the event on a tenant NetworkPolicy some of whose rules are not synced.
pub const REASON_NETWORK_POLICY_REFUSED: &str = "NetworkPolicyRefused";

/// A namespace selector of a tenant, confined to that tenant's super namespaces.
fn confine(selector: &LabelSelector, cx: &Conversion<'_>) -> LabelSelector {
    let identity = cx.identity();
    // By the keys the super namespaces carry: a tenant's namespace labels are copied encoded.
    let mut confined = crate::tenancy::identity::map_selector(selector, cx.meta, true);
    let labels = confined.match_labels.get_or_insert_with(BTreeMap::new);
    if let Some(name) = labels.get_mut(LABEL_NAMESPACE_NAME) {
        *name = identity.super_namespace(name);
    }
    // Whatever the tenant said about this key, only its own namespaces carry this value.
    labels.insert(LABEL_CLUSTER.to_owned(), identity.cluster_key.clone());
    for expression in confined.match_expressions.iter_mut().flatten() {
        if expression.key == LABEL_NAMESPACE_NAME {
            for value in expression.values.iter_mut().flatten() {
                *value = identity.super_namespace(value);
            }
        }
    }
    confined
}

/// A peer of a tenant rule as the super cluster gets it, or `Err(cidr)` for an ipBlock the platform does
/// not allow.
fn peer(peer: &NetworkPolicyPeer, cx: &Conversion<'_>) -> std::result::Result<NetworkPolicyPeer, String> {
    if let Some(block) = &peer.ip_block {
        let allowed = block.cidr.parse::<ipnet::IpNet>().is_ok_and(|net| {
            cx.ctx
                .config
                .tenant_allowed_cidrs
                .iter()
                .any(|a| a.contains(&net))
        });
        if !allowed {
            return Err(block.cidr.clone());
        }
    }
    Ok(NetworkPolicyPeer {
        ip_block: peer.ip_block.clone(),
        namespace_selector: peer.namespace_selector.as_ref().map(|s| confine(s, cx)),
        pod_selector: peer
            .pod_selector
            .as_ref()
            .map(|s| crate::tenancy::identity::map_selector(s, cx.meta, false)),
    })
}

fn peers(
    list: &Option<Vec<NetworkPolicyPeer>>,
    cx: &Conversion<'_>,
) -> std::result::Result<Option<Vec<NetworkPolicyPeer>>, String> {
    list.as_ref()
        .map(|peers| peers.iter().map(|p| peer(p, cx)).collect())
        .transpose()
}

/// Ports with the protocol the apiserver would default, so that copies compare equal.
fn ports(list: &Option<Vec<NetworkPolicyPort>>) -> Option<Vec<NetworkPolicyPort>> {
    list.as_ref().map(|ports| {
        ports
            .iter()
            .map(|p| NetworkPolicyPort {
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".to_owned())),
                ..p.clone()
            })
            .collect()
    })
}

/// The super spec of a tenant NetworkPolicy, and the ipBlocks of the rules left out.
fn translate(spec: &NetworkPolicySpec, cx: &Conversion<'_>) -> (NetworkPolicySpec, Vec<String>) {
    let mut refused = Vec::new();
    let ingress = spec.ingress.as_ref().map(|rules| {
        rules
            .iter()
            .filter_map(|rule| match peers(&rule.from, cx) {
                Ok(from) => Some(NetworkPolicyIngressRule {
                    from,
                    ports: ports(&rule.ports),
                }),
                Err(cidr) => {
                    refused.push(cidr);
                    None
                }
            })
            .collect::<Vec<_>>()
    });
    let egress = spec.egress.as_ref().map(|rules| {
        rules
            .iter()
            .filter_map(|rule| match peers(&rule.to, cx) {
                Ok(to) => Some(NetworkPolicyEgressRule {
                    to,
                    ports: ports(&rule.ports),
                }),
                Err(cidr) => {
                    refused.push(cidr);
                    None
                }
            })
            .collect::<Vec<_>>()
    });
    // Spelled out: the apiserver derives policy types from which rules are there, and a policy whose only
    // egress rules were left out must still isolate egress.
    let policy_types = spec.policy_types.clone().unwrap_or_else(|| {
        let mut types = vec!["Ingress".to_owned()];
        if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
            types.push("Egress".to_owned());
        }
        types
    });
    (
        NetworkPolicySpec {
            pod_selector: Some(crate::tenancy::identity::map_selector(
                &spec.pod_selector.clone().unwrap_or_default(),
                cx.meta,
                false,
            )),
            policy_types: Some(policy_types),
            ingress,
            egress,
        },
        refused,
    )
}

impl Downward for NetworkPolicy {
    const KIND: Kind = Kind::NetworkPolicy;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.network_policies)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        Some(&stores.network_policies)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        if tenant.name_any() == ISOLATION_POLICY_NAME {
            return Ok(None);
        }
        let (spec, _) = translate(&tenant.spec.clone().unwrap_or_default(), cx);
        Ok(Some(NetworkPolicy {
            metadata: cx.metadata(&tenant.metadata),
            spec: Some(spec),
        }))
    }

    fn refusal(tenant: &Self, cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        if tenant.name_any() == ISOLATION_POLICY_NAME {
            return Some((
                REASON_NETWORK_POLICY_REFUSED,
                format!(
                    "the name {ISOLATION_POLICY_NAME} is the platform's isolating policy; rename this policy"
                ),
            ));
        }
        let (_, refused) = translate(&tenant.spec.clone().unwrap_or_default(), cx);
        (!refused.is_empty()).then(|| {
            (
                REASON_NETWORK_POLICY_REFUSED,
                format!(
                    "rules with ipBlock {} are not synced: the platform allows ipBlocks only within its allowed CIDRs",
                    refused.join(", ")
                ),
            )
        })
    }

    fn view(object: &Self) -> Value {
        policy_view(object)
    }
}

impl TenantCache for kinds::NetworkPolicy {
    type Cache = Store<NetworkPolicy>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.down(Self::KIND)
    }
}

impl SuperCache for kinds::NetworkPolicy {
    type Cache = Store<NetworkPolicy>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        let queue = supers.queues.down.clone();
        supers.watch(ours(), move |policy: &NetworkPolicy| {
            // An isolating policy is part of its namespace: repairing it means syncing that.
            if let Some((tenant, namespace)) = isolates(policy.meta()) {
                queue.add(&Arc::from(tenant), Item::namespace(namespace));
            } else if let Some((tenant, namespace, name)) = tenant_key(policy) {
                queue.add(&tenant, Item::new(Kind::NetworkPolicy, &namespace, &name));
            }
        })
    }

    fn event_subject(cache: &Self::Cache, namespace: &str, name: &str) -> EventSubject {
        EventSubject::in_store(cache, namespace, name)
    }
}

impl SyncedKind for kinds::NetworkPolicy {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<NetworkPolicy>(ctx, tenant, item).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<NetworkPolicy>(ctx, tenant)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        engine::context::testing::{self, from_json},
        resources::endpoints::within,
        tenancy::settings::TenantSettings,
    };

    fn convert(ctx: &Context, tenant: &Tenant, policy: Value) -> (Option<NetworkPolicy>, Option<String>) {
        let policy: NetworkPolicy = from_json(policy);
        let super_namespace = tenant.identity.super_namespace("shop");
        let cx = Conversion {
            ctx,
            tenant,
            meta: &Default::default(),
            super_namespace: &super_namespace,
        };
        (
            NetworkPolicy::to_super(&policy, &cx).expect("convert"),
            NetworkPolicy::refusal(&policy, &cx).map(|(_, m)| m),
        )
    }

    #[tokio::test]
    async fn namespace_selectors_are_confined_to_the_tenant() {
        let (super_client, _supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let key = tenant.identity.cluster_key.clone();
        let (copy, refusal) = convert(
            &ctx,
            &tenant,
            json!({"metadata": {"name": "allow", "namespace": "shop"}, "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [
                    {"from": [{"namespaceSelector": {}}]},
                    {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system",
                        "tenancy.x-k8s.io/cluster": "someone-else"}}}]},
                    {"from": [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                        "operator": "In", "values": ["db"]}]}, "podSelector": {"matchLabels": {"role": "client"}}}]},
                    {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": 80}]}
                ]
            }}),
        );
        assert_eq!(refusal, None);
        let spec = serde_json::to_value(copy.expect("synced").spec).expect("json");
        let rules = &spec["ingress"];
        assert_eq!(
            rules[0]["from"][0]["namespaceSelector"]["matchLabels"][LABEL_CLUSTER],
            key
        );
        let named = &rules[1]["from"][0]["namespaceSelector"]["matchLabels"];
        assert_eq!(named[LABEL_CLUSTER], key);
        assert_eq!(
            named[LABEL_NAMESPACE_NAME],
            tenant.identity.super_namespace("kube-system")
        );
        let expression = &rules[2]["from"][0]["namespaceSelector"];
        assert_eq!(expression["matchLabels"][LABEL_CLUSTER], key);
        assert_eq!(
            expression["matchExpressions"][0]["values"][0],
            tenant.identity.super_namespace("db")
        );
        assert_eq!(
            rules[2]["from"][0]["podSelector"]["matchLabels"]["role"],
            "client"
        );
        // A pod selector alone means the policy's own namespace: kept as it is.
        assert!(rules[3]["from"][0].get("namespaceSelector").is_none());
        assert_eq!(rules[3]["ports"][0]["protocol"], "TCP");
        assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    }

    #[tokio::test]
    async fn ip_blocks_outside_the_allowed_cidrs_are_left_out() {
        let (super_client, _supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (mut ctx, _) = testing::context(super_client);
        ctx.config.tenant_allowed_cidrs = vec!["203.0.113.0/24".parse().expect("cidr")];
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let (copy, refusal) = convert(
            &ctx,
            &tenant,
            json!({"metadata": {"name": "out", "namespace": "shop"}, "spec": {
                "podSelector": {},
                "egress": [
                    {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]},
                    {"to": [{"ipBlock": {"cidr": "203.0.113.8/29"}}]}
                ]
            }}),
        );
        assert!(refusal.expect("refused").contains("0.0.0.0/0"));
        let spec = serde_json::to_value(copy.expect("synced").spec).expect("json");
        assert_eq!(spec["egress"].as_array().map(Vec::len), Some(1));
        assert_eq!(spec["egress"][0]["to"][0]["ipBlock"]["cidr"], "203.0.113.8/29");
        // Egress stays isolated although a rule was left out.
        assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
        assert!(within("203.0.113.9", &ctx.config.tenant_allowed_cidrs));
        assert!(!within("10.0.0.1", &ctx.config.tenant_allowed_cidrs));
    }
}
