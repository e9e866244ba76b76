//! Endpoints of selector-less Services: copied down with only the addresses that lead to the tenant's own
//! live pods (or its own apiserver, for `default/kubernetes`) or into the platform's allowed CIDRs. Services
//! with a selector get theirs from the super cluster's own controller. A tenant's Endpoints are judged
//! again whenever one of its super pods ends or goes (`requeue_for_pod`), so an address a pod gave up does
//! not keep leading to whoever gets it next.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

use crds::wellknown::{COMPONENT_APISERVER, LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY_VC_MANAGER};
use k8s_openapi::api::core::v1::Endpoints;
use kube::{
    ResourceExt,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde_json::{Value, json};

use super::{
    copy::{self, Conversion, Downward},
    outcome::Outcome,
    synced::SyncedKind,
};
use crate::{
    cache::{
        stores::Cache,
        super_stores::{EventSubject, SuperCache, SuperStores, SuperWatch},
    },
    engine::{
        context::Context,
        items::{DownItem, Item, Kind, kinds},
        patrol::findings::Findings,
    },
    error::Result,
    tenancy::tenant::{Tenant, TenantCache, TenantStores, TenantWatch},
};

/// Reason of the event on tenant Endpoints some of whose addresses are not the tenant's.
pub const REASON_ENDPOINTS_REFUSED: &str = "EndpointsRefused";

/// Whether `ip` lies in one of `cidrs`.
pub fn within(ip: &str, cidrs: &[ipnet::IpNet]) -> bool {
    ip.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| cidrs.iter().any(|net| net.contains(&ip)))
}

/// Who holds each of `candidates`: the cluster key of every live super pod that has it as its own
/// address ([`crate::cache::pods::SuperPod::own_addresses`]; `None` for a pod that names no tenant). Read
/// from the super cluster: a tenant writes its own pods' status, so their tenant copies prove nothing.
fn holders(cx: &Conversion<'_>, candidates: &HashSet<IpAddr>) -> HashMap<IpAddr, Vec<Option<String>>> {
    let mut holders: HashMap<IpAddr, Vec<Option<String>>> = HashMap::new();
    for pod in cx.ctx.supers.pods.copies.state() {
        for ip in pod.own_addresses() {
            if candidates.contains(&ip) {
                let owner = crate::tenancy::identity::owner_cluster(&pod.metadata).map(str::to_owned);
                holders.entry(ip).or_default().push(owner);
            }
        }
    }
    holders
}

/// The addresses that lead to a live pod of the tenant `cluster_key` and of nobody else
/// ([`crds::addresses::sole_holder`], the rule vc-dns applies to sources).
pub fn held_by_tenant(holders: &HashMap<IpAddr, Vec<Option<String>>>, cluster_key: &str) -> HashSet<IpAddr> {
    holders
        .iter()
        .filter(|(_, held)| {
            crds::addresses::sole_holder(held.iter().map(Option::as_deref)) == Some(Some(cluster_key))
        })
        .map(|(ip, _)| *ip)
        .collect()
}

/// Where the tenant's own apiserver is: a provisioned tenant's apiserver pods, from the Endpoints of its
/// apiserver Service in its root namespace (which only vc-manager writes), and the address the syncer's
/// connection to the tenant actually reached (an adopted tenant's kubeconfig server; not every address
/// its host name resolves to).
fn tenant_apiserver_addresses(cx: &Conversion<'_>) -> Vec<IpAddr> {
    let root = &cx.tenant.identity.cluster_key;
    let mut addresses: Vec<IpAddr> = cx
        .ctx
        .supers
        .endpoints
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
        .filter_map(|a| a.ip.parse().ok())
        .collect();
    addresses.extend(
        cx.tenant
            .apiserver_addresses
            .iter()
            .filter_map(|a| a.parse::<IpAddr>().ok()),
    );
    addresses
}

/// The tenant's Endpoints (as queue items) that lead to one of `addresses`.
pub fn leading_to(tenant: &Tenant, addresses: &[String]) -> Vec<DownItem> {
    let addresses: HashSet<IpAddr> = addresses.iter().filter_map(|a| a.parse().ok()).collect();
    tenant
        .stores
        .endpoints
        .state()
        .iter()
        .filter(|endpoints| !endpoint_addresses(endpoints).is_disjoint(&addresses))
        .map(|endpoints| {
            DownItem::new(
                Kind::Endpoints,
                &endpoints.namespace().unwrap_or_default(),
                &endpoints.name_any(),
            )
        })
        .collect()
}

/// The routable addresses of tenant Endpoints, parsed.
fn endpoint_addresses(tenant: &Endpoints) -> HashSet<IpAddr> {
    tenant
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .filter(|a| routable(&a.ip))
        .filter_map(|a| a.ip.parse().ok())
        .collect()
}

/// The addresses of tenant Endpoints that lead outside the tenant: neither its own live pods' (held by no
/// other pod) nor in the platform's allowed CIDRs, as written in the Endpoints.
fn foreign_addresses(tenant: &Endpoints, cx: &Conversion<'_>) -> Vec<String> {
    let candidates = endpoint_addresses(tenant);
    if candidates.is_empty() {
        return Vec::new();
    }
    let mut own = held_by_tenant(&holders(cx, &candidates), &cx.tenant.identity.cluster_key);
    if tenant.namespace().as_deref() == Some("default") && tenant.name_any() == "kubernetes" {
        // The tenant apiserver records itself there, and its pods reach it through that Service.
        own.extend(tenant_apiserver_addresses(cx));
    }
    let allowed = &cx.ctx.config.tenant_allowed_cidrs;
    let mut foreign: Vec<String> = tenant
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
        .filter(|ip| ip.parse::<IpAddr>().is_ok_and(|parsed| !own.contains(&parsed)) && !within(ip, allowed))
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
        Some(&stores.endpoints.copies)
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

/// The super cluster's Endpoints the syncer reads: its copies of tenants' Endpoints, and those of
/// provisioned tenants' apiserver Services.
pub struct SuperEndpoints {
    /// The copies of tenants' Endpoints.
    pub copies: Store<Endpoints>,
    /// Endpoints of provisioned tenants' apiserver Services, in their root namespaces: the only addresses
    /// besides its pods' that a tenant's `default/kubernetes` Endpoints may lead to.
    pub apiservers: Store<Endpoints>,
}

impl Cache for SuperEndpoints {
    async fn wait_ready(&self) {
        self.copies.wait_ready().await;
        self.apiservers.wait_ready().await;
    }

    #[cfg(test)]
    fn empty() -> Self {
        Self {
            copies: Cache::empty(),
            apiservers: Cache::empty(),
        }
    }
}

impl TenantCache for kinds::Endpoints {
    type Cache = Store<Endpoints>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.down(Self::KIND)
    }
}

impl SuperCache for kinds::Endpoints {
    type Cache = SuperEndpoints;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        let copies = supers.down(Self::KIND);
        let queue = supers.queues.down.clone();
        let selector = watcher::Config::default().labels(&format!(
            "{LABEL_MANAGED_BY}={MANAGED_BY_VC_MANAGER},{LABEL_COMPONENT}={COMPONENT_APISERVER}"
        ));
        let apiservers = supers.watch(selector, move |o: &Endpoints| {
            // A tenant's root namespace is its cluster key. Its apiserver moved: the tenant's own record
            // of where its apiserver is may have been refused a moment ago.
            if let Some(root) = o.namespace() {
                queue.add(
                    &Arc::from(root.as_str()),
                    DownItem::new(Kind::Endpoints, "default", "kubernetes"),
                );
            }
        });
        SuperEndpoints { copies, apiservers }
    }

    fn event_subject(cache: &Self::Cache, namespace: &str, name: &str) -> EventSubject {
        EventSubject::in_store(&cache.copies, namespace, name)
    }
}

impl SyncedKind for kinds::Endpoints {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<Endpoints>(ctx, tenant, item).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<Endpoints>(ctx, tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_the_tenants_only_while_no_one_else_holds_it() {
        let ip = |a: &str| a.parse::<IpAddr>().expect("ip");
        let holders: HashMap<IpAddr, Vec<Option<String>>> = [
            ("10.0.0.1", vec![Some("a")]),
            ("10.0.0.2", vec![Some("a"), Some("a")]),
            ("10.0.0.3", vec![Some("a"), Some("b")]),
            ("10.0.0.4", vec![Some("b")]),
            ("10.0.0.5", vec![Some("a"), None]),
        ]
        .into_iter()
        .map(|(address, held)| {
            (
                ip(address),
                held.into_iter().map(|h| h.map(str::to_owned)).collect(),
            )
        })
        .collect();
        let mut own: Vec<IpAddr> = held_by_tenant(&holders, "a").into_iter().collect();
        own.sort();
        assert_eq!(own, [ip("10.0.0.1"), ip("10.0.0.2")]);
        assert_eq!(
            held_by_tenant(&holders, "b").into_iter().collect::<Vec<_>>(),
            [ip("10.0.0.4")]
        );
    }

    /// Selector-less Endpoints lead to the tenant's live pods off the host network whose address no other
    /// tenant's pod holds; `default/kubernetes` also to its own apiserver (the pods vc-manager runs in its
    /// root namespace, and the address the syncer's connection reached) but nowhere else; and a pod that
    /// ends or goes has the Endpoints leading to it judged again.
    #[tokio::test]
    async fn endpoints_lead_only_to_the_tenants_own_live_pods_and_apiserver() {
        use crate::{
            engine::context::testing::{self, from_json, put},
            tenancy::settings::TenantSettings,
        };
        let (super_client, _supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (ctx, mut super_writers) = testing::context(super_client);
        let (mut tenant, mut tenant_writers) = crate::tenancy::tenant::Tenant::for_tests(
            testing::identity(),
            tenant_client,
            TenantSettings::default(),
            &ctx.queues,
        );
        // The syncer's connection to the tenant apiserver reached 10.9.9.9.
        std::sync::Arc::get_mut(&mut tenant)
            .expect("one owner")
            .apiserver_addresses = vec!["10.9.9.9".into()];
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
        let pod = |name: &str,
                   key: &str,
                   ip: &str,
                   phase: &str,
                   host_network: bool|
         -> crate::cache::pods::SuperPod {
            from_json(json!({
                "metadata": {"name": name, "namespace": format!("{key}-shop"), "uid": format!("uid-{name}"),
                    "annotations": {crds::wellknown::ANNOTATION_CLUSTER: key, crds::wellknown::ANNOTATION_NAMESPACE: "shop"}},
                "spec": {"hostNetwork": host_network, "containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}
            }))
        };
        for super_pod in [
            pod("web", &root, "10.244.3.1", "Running", false),
            pod("done", &root, "10.244.3.2", "Succeeded", false),
            pod("host", &root, "192.168.0.10", "Running", true),
            pod("shared-a", &root, "10.244.3.4", "Running", false),
            pod("shared-b", "other-tenant", "10.244.3.4", "Running", false),
            pod("theirs", "other-tenant", "10.244.3.5", "Running", false),
        ] {
            put(&mut super_writers.pods, super_pod);
        }
        let record = |namespace: &str, name: &str, ips: &[&str]| -> Endpoints {
            let addresses: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
            from_json(json!({"metadata": {"name": name, "namespace": namespace},
                "subsets": [{"addresses": addresses, "ports": [{"port": 6443}]}]}))
        };
        for (namespace, name) in [("default", "kubernetes"), ("shop", "relay")] {
            put(
                &mut tenant_writers.services,
                from_json(json!({"metadata": {"name": name, "namespace": namespace},
                    "spec": {"ports": [{"port": 443}]}})),
            );
        }
        let meta = crate::tenancy::identity::MetaPolicy::default();
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
        let everything = [
            "10.244.1.5",
            "10.244.2.9",
            "10.244.3.1",
            "10.244.3.2",
            "192.168.0.10",
            "10.244.3.4",
            "10.244.3.5",
            "10.9.9.9",
        ];
        let relay = record("shop", "relay", &everything);
        assert_eq!(addresses(&relay), ["10.244.3.1"]);
        assert_eq!(
            foreign_addresses(&relay, &cx),
            [
                "10.244.1.5",
                "10.244.2.9",
                "10.244.3.2",
                "10.244.3.4",
                "10.244.3.5",
                "10.9.9.9",
                "192.168.0.10"
            ]
        );
        let kubernetes = record("default", "kubernetes", &everything);
        assert_eq!(addresses(&kubernetes), ["10.244.1.5", "10.244.3.1", "10.9.9.9"]);

        // A pod of the tenant that ends has the Endpoints leading to it judged again.
        put(&mut tenant_writers.endpoints, relay.clone());
        put(
            &mut tenant_writers.endpoints,
            record("shop", "elsewhere", &["10.1.1.1"]),
        );
        let queued = leading_to(&tenant, &["10.244.3.1".to_owned()]);
        assert_eq!(queued, [DownItem::new(Kind::Endpoints, "shop", "relay")]);
        assert!(leading_to(&tenant, &["10.7.7.7".to_owned()]).is_empty());
    }
}
