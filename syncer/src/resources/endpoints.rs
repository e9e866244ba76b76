//! Endpoints of selector-less Services: copied down with only the addresses that lead to the tenant's own
//! pods (or its own apiserver, for `default/kubernetes`) or into the platform's allowed CIDRs. Services with
//! a selector get theirs from the super cluster's own controller.

use k8s_openapi::api::core::v1::Endpoints;
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};

use super::copy::{Conversion, Downward, copied_kind};
use crate::{error::Result, items::Kind, super_stores::SuperStores, tenant::TenantStores};

/// Reason of the event on tenant Endpoints some of whose addresses are not the tenant's.
pub const REASON_ENDPOINTS_REFUSED: &str = "EndpointsRefused";

/// Whether `ip` lies in one of `cidrs`.
pub fn within(ip: &str, cidrs: &[ipnet::IpNet]) -> bool {
    ip.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| cidrs.iter().any(|net| net.contains(&ip)))
}

/// The addresses a tenant's selector-less Endpoints may lead to: its own pods' super addresses, read from
/// the super cluster (a tenant writes its own pods' status, so their tenant copies prove nothing).
fn tenant_pod_addresses(cx: &Conversion<'_>) -> std::collections::HashSet<String> {
    cx.ctx
        .supers
        .pods
        .state()
        .iter()
        .filter(|pod| crate::identity::belongs_to(&pod.metadata, &cx.tenant.identity.cluster_key))
        .flat_map(|pod| pod.addresses())
        .collect()
}

/// Where the tenant's own apiserver is: a provisioned tenant's apiserver pods, from the Endpoints of its
/// apiserver Service in its root namespace (which only vc-manager writes), and the addresses the syncer
/// itself reaches the tenant at (an adopted tenant's kubeconfig server).
fn tenant_apiserver_addresses(cx: &Conversion<'_>) -> Vec<String> {
    let root = &cx.tenant.identity.cluster_key;
    let mut addresses: Vec<String> = cx
        .ctx
        .supers
        .apiservers
        .state()
        .iter()
        .filter(|endpoints| endpoints.namespace().as_deref() == Some(root.as_str()))
        .flat_map(|endpoints| endpoints.subsets.iter().flatten())
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .map(|a| a.ip.clone())
        .collect();
    addresses.extend(cx.tenant.apiserver_addresses.iter().cloned());
    addresses
}

/// The addresses of tenant Endpoints that lead outside the tenant: neither its pods' nor in the
/// platform's allowed CIDRs.
fn foreign_addresses(tenant: &Endpoints, cx: &Conversion<'_>) -> Vec<String> {
    let mut addresses = tenant
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .map(|a| a.ip.clone())
        .filter(|ip| routable(ip))
        .peekable();
    if addresses.peek().is_none() {
        return Vec::new();
    }
    let mut own = tenant_pod_addresses(cx);
    if tenant.namespace().as_deref() == Some("default") && tenant.name_any() == "kubernetes" {
        // The tenant apiserver records itself there, and its pods reach it through that Service.
        own.extend(tenant_apiserver_addresses(cx));
    }
    let allowed = &cx.ctx.config.tenant_allowed_cidrs;
    let mut foreign: Vec<String> = addresses
        .filter(|ip| !own.contains(ip) && !within(ip, allowed))
        .collect();
    foreign.sort();
    foreign.dedup();
    foreign
}

impl Downward for Endpoints {
    const KIND: Kind = Kind::Endpoints;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.endpoints)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        Some(&stores.endpoints)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        // Services with a selector get their endpoints from the super cluster's own controller, which sees
        // the super pods; only selector-less services need theirs copied.
        let service = cx
            .tenant
            .stores
            .services
            .get(&ObjectRef::new(&tenant.name_any()).within(&tenant.namespace().unwrap_or_default()));
        // An ExternalName Service has no endpoints (its super stub must lead nowhere).
        let selector_less = service.is_some_and(|s| {
            !super::service::is_external_name(&s)
                && s.spec
                    .as_ref()
                    .and_then(|spec| spec.selector.as_ref())
                    .is_none_or(|sel| sel.is_empty())
        });
        if !selector_less {
            return Ok(None);
        }
        let foreign = foreign_addresses(tenant, cx);
        let subsets = tenant.subsets.clone().map(|subsets| {
            subsets
                .into_iter()
                .map(|mut subset| {
                    for addresses in [&mut subset.addresses, &mut subset.not_ready_addresses]
                        .into_iter()
                        .flatten()
                    {
                        // Loopback and link-local addresses are refused by the super apiserver and
                        // unreachable from super pods anyway.
                        addresses.retain(|a| routable(&a.ip) && !foreign.contains(&a.ip));
                        for address in addresses.iter_mut() {
                            // Tenant object references mean nothing in the super cluster.
                            address.target_ref = None;
                        }
                    }
                    subset
                })
                // A subset left without addresses is invalid, and means nothing.
                .filter(|subset| {
                    subset.addresses.as_ref().is_some_and(|a| !a.is_empty())
                        || subset.not_ready_addresses.as_ref().is_some_and(|a| !a.is_empty())
                })
                .collect()
        });
        Ok(Some(Endpoints {
            metadata: cx.metadata(&tenant.metadata),
            subsets,
        }))
    }

    fn refusal(tenant: &Self, cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        let foreign = foreign_addresses(tenant, cx);
        (!foreign.is_empty()).then(|| {
            (
                REASON_ENDPOINTS_REFUSED,
                format!(
                    "addresses {} are neither this tenant's pods nor in the platform's allowed CIDRs; they are not synced",
                    foreign.join(", ")
                ),
            )
        })
    }

    fn view(object: &Self) -> Value {
        let subsets: Vec<Value> = object
            .subsets
            .iter()
            .flatten()
            .map(|s| {
                let addresses = |list: &Option<Vec<k8s_openapi::api::core::v1::EndpointAddress>>| -> Vec<String> {
                    list.iter().flatten().map(|a| a.ip.clone()).collect()
                };
                let ports: Vec<Value> = s
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| json!({ "name": p.name, "port": p.port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()) }))
                    .collect();
                json!({ "addresses": addresses(&s.addresses), "notReady": addresses(&s.not_ready_addresses), "ports": ports })
            })
            .collect();
        Value::Array(subsets)
    }
}

fn routable(ip: &str) -> bool {
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => !v4.is_loopback() && !v4.is_link_local(),
        Ok(std::net::IpAddr::V6(v6)) => !v6.is_loopback() && !v6.is_unicast_link_local(),
        Err(_) => false,
    }
}

copied_kind!(Endpoints);

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's `default/kubernetes` leads to its own apiserver (the pods vc-manager runs in its root
    /// namespace) but nowhere else; any other selector-less Service may not lead there.
    #[tokio::test]
    async fn only_default_kubernetes_leads_to_the_tenants_own_apiserver() {
        use crate::{
            context::testing::{self, from_json, put},
            settings::TenantSettings,
        };
        let (super_client, _supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (ctx, mut super_writers) = testing::context(super_client);
        let (tenant, mut tenant_writers) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let root = tenant.identity.cluster_key.clone();
        let apiserver_endpoints = |namespace: &str, ip: &str| -> Endpoints {
            from_json(
                json!({"metadata": {"name": "apiserver-svc", "namespace": namespace},
                "subsets": [{"notReadyAddresses": [{"ip": ip}], "ports": [{"port": 6443}]}]}),
            )
        };
        put(
            &mut super_writers.apiservers,
            apiserver_endpoints(&root, "10.244.1.5"),
        );
        put(
            &mut super_writers.apiservers,
            apiserver_endpoints("other-tenant-root", "10.244.2.9"),
        );
        let record = |namespace: &str, name: &str| -> Endpoints {
            from_json(json!({"metadata": {"name": name, "namespace": namespace},
                "subsets": [{"addresses": [{"ip": "10.244.1.5"}, {"ip": "10.244.2.9"}],
                    "ports": [{"port": 6443}]}]}))
        };
        for (namespace, name) in [("default", "kubernetes"), ("shop", "relay")] {
            put(
                &mut tenant_writers.services,
                from_json(json!({"metadata": {"name": name, "namespace": namespace},
                    "spec": {"ports": [{"port": 443}]}})),
            );
        }
        let meta = crate::identity::MetaPolicy::default();
        let cx = Conversion {
            ctx: &ctx,
            tenant: &tenant,
            meta: &meta,
            super_namespace: "irrelevant",
        };
        let addresses = |endpoints: &Endpoints| -> Vec<String> {
            Endpoints::to_super(endpoints, &cx)
                .expect("converted")
                .expect("selector-less")
                .subsets
                .into_iter()
                .flatten()
                .flat_map(|s| s.addresses.into_iter().flatten())
                .map(|a| a.ip)
                .collect()
        };
        assert_eq!(addresses(&record("default", "kubernetes")), ["10.244.1.5"]);
        assert_eq!(
            foreign_addresses(&record("default", "kubernetes"), &cx),
            ["10.244.2.9"]
        );
        assert!(addresses(&record("shop", "relay")).is_empty());
        assert_eq!(
            foreign_addresses(&record("shop", "relay"), &cx),
            ["10.244.1.5", "10.244.2.9"]
        );
    }
}
