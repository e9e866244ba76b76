//! Network isolation between tenants.
//!
//! Every super namespace of a tenant holds an isolating NetworkPolicy the syncer keeps
//! ([`ISOLATION_POLICY_NAME`]): its pods accept traffic only from pods in the same tenant's super
//! namespaces (selected by the `tenancy.x-k8s.io/cluster` label, which only the syncer sets on
//! namespaces), from the tenant's own apiserver pods in its root namespace (a native tenant's apiserver
//! calls the admission webhooks and aggregated APIs the tenant runs as pods, at their pod addresses), and
//! from what the platform lists (`--network-isolation-allow-namespaces`,
//! `--network-isolation-allow-cidrs`). A tenant's pods reach no other tenant's pods, because those accept
//! nothing from them. Their egress is isolated from what the platform keeps for itself: the super
//! cluster's own DNS (`--network-isolation-platform-dns`: its cluster IPs and endpoint addresses, and every
//! pod of its namespace; its answers, PTR records included, name every tenant's Services, and tenants
//! have vc-dns) and the addresses of `--network-isolation-deny-egress-cidrs` (the clouds' instance
//! metadata service by default); everything else they reach as before: vc-dns, their apiserver, the
//! outside. The platform's own components' admin ports are closed to them by the chart's NetworkPolicies.
//! The policy is part of its namespace: it is repaired whenever it changes (the super watch queues its
//! namespace), whenever the platform DNS's addresses change, and by the patrol.
//!
//! Enforcement is the CNI's: on a cluster whose network plugin ignores NetworkPolicies (the e2e harness's
//! bridge plugin among them), these objects exist and change nothing.

pub mod flags;

use crds::wellknown::{
    COMPONENT_APISERVER, LABEL_CLUSTER, LABEL_COMPONENT, LABEL_MANAGED_BY, LABEL_NAMESPACE_NAME,
    LABEL_VC_NAME, LABEL_VC_NAMESPACE, MANAGED_BY_VC_MANAGER,
};
use ipnet::IpNet;
use k8s_openapi::{
    api::networking::v1::{
        IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
        NetworkPolicySpec,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta},
};
use kube::{Api, Resource, runtime::reflector::ObjectRef};
use serde_json::Value;

use super::write::{Kept, keep};
use crate::{
    engine::context::Context,
    error::Result,
    tenancy::{identity, tenant::Tenant},
};

/// Name of the isolating NetworkPolicy in every super namespace of a tenant. A tenant NetworkPolicy of
/// this name is not synced.
pub const ISOLATION_POLICY_NAME: &str = "vc-tenant-isolation";
/// Annotation on an isolating NetworkPolicy: the cluster key of the tenant it isolates. Deliberately not
/// `tenancy.x-k8s.io/cluster`: the policy is no copy of a tenant object, and the downward sync must
/// never take it for one.
pub const ANNOTATION_ISOLATES_CLUSTER: &str = "tenancy.x-k8s.io/isolates-cluster";
/// Annotation on an isolating NetworkPolicy: the tenant namespace whose super namespace it isolates.
pub const ANNOTATION_ISOLATES_NAMESPACE: &str = "tenancy.x-k8s.io/isolates-namespace";

/// The tenant and tenant namespace an isolating NetworkPolicy serves, by its annotations.
pub fn isolates(meta: &ObjectMeta) -> Option<(&str, &str)> {
    let annotations = meta.annotations.as_ref()?;
    Some((
        annotations.get(ANNOTATION_ISOLATES_CLUSTER)?.as_str(),
        annotations.get(ANNOTATION_ISOLATES_NAMESPACE)?.as_str(),
    ))
}

/// The isolating NetworkPolicy of a tenant's super namespace, stamped with its hash.
pub fn isolation_policy(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> NetworkPolicy {
    let identity = &tenant.identity;
    let isolation = &ctx.config.network_isolation;
    let own = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some([(LABEL_CLUSTER.to_owned(), identity.cluster_key.clone())].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    // A native tenant's apiserver runs in the tenant's root namespace and, with endpoint routing
    // (`--enable-aggregator-routing`), calls the tenant's webhooks and aggregated APIs at their pod addresses
    // here. Admitted: only the apiserver pods of this tenant's root namespace, by labels that vc-manager alone
    // sets there (the root namespace's name, which the apiserver sets, and vc-manager's `managed-by`, which
    // the syncer never copies onto a tenant's namespaces or pods), so no other tenant's pods and none of
    // this tenant's workloads gain anything.
    let vc_manager = (LABEL_MANAGED_BY.to_owned(), MANAGED_BY_VC_MANAGER.to_owned());
    let own_apiserver = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(
                [
                    (
                        LABEL_NAMESPACE_NAME.to_owned(),
                        identity.root_namespace().to_owned(),
                    ),
                    vc_manager.clone(),
                ]
                .into(),
            ),
            ..Default::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(
                [
                    (LABEL_COMPONENT.to_owned(), COMPONENT_APISERVER.to_owned()),
                    vc_manager,
                ]
                .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut platform: Vec<NetworkPolicyPeer> = isolation
        .allow_namespaces
        .iter()
        .map(|(key, value)| NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some([(key.clone(), value.clone())].into()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    platform.extend(isolation.allow_cidrs.iter().map(|cidr| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.to_string(),
            except: None,
        }),
        ..Default::default()
    }));
    let egress = isolation.isolates_egress().then(|| {
        let dns_namespace = isolation
            .platform_dns
            .as_ref()
            .map(|(namespace, _)| namespace.as_str());
        let dns_addresses = match isolation.platform_dns {
            Some(_) => ctx.supers.platform_dns.addresses(),
            None => Vec::new(),
        };
        egress_rules(&isolation.deny_egress, &dns_addresses, dns_namespace)
    });
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![own, own_apiserver]),
        ports: None,
    }];
    if !platform.is_empty() {
        ingress.push(NetworkPolicyIngressRule {
            from: Some(platform),
            ports: None,
        });
    }
    let mut policy = NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(ISOLATION_POLICY_NAME.to_owned()),
            namespace: Some(identity.super_namespace(tenant_namespace)),
            labels: Some(
                [
                    (LABEL_VC_NAME.to_owned(), identity.vc_name.clone()),
                    (LABEL_VC_NAMESPACE.to_owned(), identity.vc_namespace.clone()),
                ]
                .into(),
            ),
            annotations: Some(
                [
                    (
                        ANNOTATION_ISOLATES_CLUSTER.to_owned(),
                        identity.cluster_key.clone(),
                    ),
                    (
                        ANNOTATION_ISOLATES_NAMESPACE.to_owned(),
                        tenant_namespace.to_owned(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(match egress {
                Some(_) => vec!["Ingress".to_owned(), "Egress".to_owned()],
                None => vec!["Ingress".to_owned()],
            }),
            ingress: Some(ingress),
            egress,
        }),
    };
    identity::stamp(&mut policy, |p| p.meta_mut());
    policy
}

/// The egress a tenant's pods keep: every address but `deny` and the platform DNS's `dns_addresses` (each
/// family its own block, the denied ones excepted), and the pods of every namespace but the platform DNS's
/// `dns_namespace` (network plugins differ on whether address blocks cover pods' addresses, so the pods of
/// its namespace are left out by name, and its pods' addresses by address).
pub fn egress_rules(
    deny: &[IpNet],
    dns_addresses: &[std::net::IpAddr],
    dns_namespace: Option<&str>,
) -> Vec<NetworkPolicyEgressRule> {
    let denied: Vec<IpNet> = deny
        .iter()
        .copied()
        .chain(dns_addresses.iter().map(|address| IpNet::from(*address)))
        .collect();
    let block = |everything: &str, v4: bool| {
        let mut except: Vec<String> = denied
            .iter()
            .filter(|net| matches!(net, IpNet::V4(_)) == v4)
            .map(ToString::to_string)
            .collect();
        except.sort();
        except.dedup();
        NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: everything.to_owned(),
                except: (!except.is_empty()).then_some(except),
            }),
            ..Default::default()
        }
    };
    let pods = NetworkPolicyPeer {
        namespace_selector: Some(match dns_namespace {
            Some(namespace) => LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: LABEL_NAMESPACE_NAME.to_owned(),
                    operator: "NotIn".to_owned(),
                    values: Some(vec![namespace.to_owned()]),
                }]),
                ..Default::default()
            },
            None => LabelSelector::default(),
        }),
        ..Default::default()
    };
    vec![NetworkPolicyEgressRule {
        to: Some(vec![block("0.0.0.0/0", true), block("::/0", false), pods]),
        ports: None,
    }]
}

/// Brings the isolating NetworkPolicy of a tenant namespace's super namespace in line with the flags:
/// there and as desired when isolation is on, gone when it is off. Returns the writes made.
pub async fn ensure_isolation(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> Result<u32> {
    let super_namespace = tenant.identity.super_namespace(tenant_namespace);
    let existing = ctx
        .supers
        .network_policies
        .get(&ObjectRef::new(ISOLATION_POLICY_NAME).within(&super_namespace));
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.super_client.clone(), &super_namespace);
    let kept = Kept {
        name: ISOLATION_POLICY_NAME,
        existing,
        desired: ctx
            .config
            .network_isolation
            .enabled
            .then(|| isolation_policy(ctx, tenant, tenant_namespace)),
        ours: |policy| isolates(policy.meta()).is_some(),
        in_sync: isolation_in_sync,
        replaced: |_, _| false,
    };
    keep(ctx, &api, kept).await
}

/// Whether the isolating policy as cached is the desired one.
pub fn isolation_in_sync(desired: &NetworkPolicy, existing: &NetworkPolicy) -> bool {
    isolates(existing.meta()) == isolates(desired.meta())
        && identity::recorded_hash(existing.meta()) == identity::recorded_hash(desired.meta())
        && identity::metadata_covers(desired.meta(), existing.meta())
        && policy_view(desired) == policy_view(existing)
}

/// What the syncer compares of a NetworkPolicy, isolating or copied: its spec, normalised.
pub fn policy_view(object: &NetworkPolicy) -> Value {
    let spec = serde_json::to_value(&object.spec).unwrap_or(Value::Null);
    pruned(spec).unwrap_or(Value::Null)
}

/// JSON without empty objects and arrays: an empty selector or rule list means the same whether the
/// apiserver keeps it or drops it, once policy types are spelled out.
fn pruned(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Object(map) => {
            let map: serde_json::Map<String, Value> = map
                .into_iter()
                .filter_map(|(k, v)| Some((k, pruned(v)?)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        Value::Array(items) => {
            let items: Vec<Value> = items
                .into_iter()
                .map(|v| pruned(v).unwrap_or_else(|| Value::Object(Default::default())))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{engine::context::testing, tenancy::settings::TenantSettings};

    #[test]
    fn egress_keeps_everything_but_the_platform_dns_and_the_denied_addresses() {
        let deny: Vec<IpNet> = vec![
            "169.254.169.254/32".parse().expect("cidr"),
            "fd00:ec2::254/128".parse().expect("cidr"),
        ];
        let dns = [
            "10.0.0.10".parse().expect("ip"),
            "10.244.1.7".parse().expect("ip"),
        ];
        let rules = serde_json::to_value(egress_rules(&deny, &dns, Some("kube-system"))).expect("json");
        assert_eq!(
            rules,
            json!([{"to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.10/32", "10.244.1.7/32", "169.254.169.254/32"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}},
                {"namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}},
            ]}])
        );
        // No platform DNS: every namespace's pods, nothing but the denied addresses excepted.
        let rules = serde_json::to_value(egress_rules(&deny[..1], &[], None)).expect("json");
        assert_eq!(
            rules,
            json!([{"to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}},
                {"ipBlock": {"cidr": "::/0"}},
                {"namespaceSelector": {}},
            ]}])
        );
    }

    #[tokio::test]
    async fn isolation_turned_off_removes_the_policies_and_nothing_else() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (mut ctx, mut super_caches) = testing::context(super_client);
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let mut policy = isolation_policy(&ctx, &tenant, "shop");
        policy.metadata.uid = Some("policy-uid".into());
        testing::put(&mut super_caches.network_policies, policy.clone());
        assert_eq!(ensure_isolation(&ctx, &tenant, "shop").await.expect("in sync"), 0);

        ctx.config.network_isolation.enabled = false;
        let super_namespace = tenant.identity.super_namespace("shop");
        let (writes, ()) = tokio::join!(ensure_isolation(&ctx, &tenant, "shop"), async {
            let call = supers
                .expect(
                    "DELETE",
                    &format!(
                        "/apis/networking.k8s.io/v1/namespaces/{super_namespace}/networkpolicies/{ISOLATION_POLICY_NAME}?"
                    ),
                )
                .await;
            assert_eq!(call.body["preconditions"]["uid"], "policy-uid");
            call.echo();
        });
        assert_eq!(writes.expect("deleted"), 1);

        // A tenant's own policy of that name (never synced, but say it were there) is not the syncer's.
        let mut foreign = policy;
        foreign.metadata.annotations = None;
        testing::put(&mut super_caches.network_policies, foreign);
        assert_eq!(ensure_isolation(&ctx, &tenant, "shop").await.expect("nothing"), 0);
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn the_isolating_policy_admits_the_tenant_and_what_the_platform_lists() {
        let (super_client, _supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (mut ctx, _) = testing::context(super_client);
        ctx.config.network_isolation.allow_namespaces =
            vec![("kubernetes.io/metadata.name".into(), "ingress-nginx".into())];
        ctx.config.network_isolation.allow_cidrs = vec!["10.0.0.0/24".parse().expect("cidr")];
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let policy = isolation_policy(&ctx, &tenant, "shop");
        assert_eq!(
            isolates(&policy.metadata),
            Some((tenant.identity.cluster_key.as_str(), "shop"))
        );
        assert!(!identity::belongs_to(
            &policy.metadata,
            &tenant.identity.cluster_key
        ));
        let spec = serde_json::to_value(&policy.spec).expect("json");
        // By default egress is isolated too: from the platform DNS (whose addresses the caches do not
        // have here: its namespace's pods) and the instance metadata service.
        assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(
            spec["egress"][0]["to"][0],
            json!({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}})
        );
        ctx.config.network_isolation.platform_dns = None;
        ctx.config.network_isolation.deny_egress.clear();
        let ingress_only = serde_json::to_value(&isolation_policy(&ctx, &tenant, "shop").spec).expect("json");
        assert_eq!(ingress_only["policyTypes"], json!(["Ingress"]));
        assert!(ingress_only.get("egress").is_none_or(serde_json::Value::is_null));
        assert_eq!(
            spec["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"][LABEL_CLUSTER],
            tenant.identity.cluster_key
        );
        assert_eq!(
            spec["ingress"][1]["from"],
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}},
                   {"ipBlock": {"cidr": "10.0.0.0/24"}}])
        );
        assert!(isolation_in_sync(&policy, &policy));
    }

    #[tokio::test]
    async fn only_the_tenant_s_own_apiserver_pods_reach_its_pods_from_the_root_namespace() {
        let (super_client, _supers) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let (tenant_client, _tenants) = testing::mock();
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let spec = serde_json::to_value(&isolation_policy(&ctx, &tenant, "shop").spec).expect("json");
        assert_eq!(spec["ingress"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            spec["ingress"][0]["from"][1],
            json!({
                "namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": tenant.identity.root_namespace(),
                    "app.kubernetes.io/managed-by": "vc-manager"}},
                "podSelector": {"matchLabels": {
                    "app.kubernetes.io/component": "apiserver",
                    "app.kubernetes.io/managed-by": "vc-manager"}}
            })
        );
        assert!(spec["ingress"][0].get("ports").is_none());

        // Another tenant's policy admits its own apiserver only, never this one's.
        let (other_client, _others) = testing::mock();
        let other_identity = crds::TenantIdentity {
            cluster_key: "elsewhere-def456-other".into(),
            vc_name: "other".into(),
            vc_namespace: "elsewhere".into(),
            vc_uid: "other-uid".into(),
        };
        let (other, _) = Tenant::for_tests(
            other_identity,
            other_client,
            TenantSettings::default(),
            &ctx.queues,
        );
        let other_spec = serde_json::to_value(&isolation_policy(&ctx, &other, "shop").spec).expect("json");
        let admitted = &other_spec["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"];
        assert_eq!(
            admitted["kubernetes.io/metadata.name"],
            other.identity.root_namespace()
        );
        assert_ne!(other.identity.root_namespace(), tenant.identity.root_namespace());
    }
}
