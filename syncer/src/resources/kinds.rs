//! Conversions of the namespaced kinds copied down with little change.

use crds::wellknown::ANNOTATION_TENANT_CLUSTER_IP;
use k8s_openapi::{
    api::{
        core::v1::{
            ConfigMap, Endpoints, PersistentVolumeClaim, PersistentVolumeClaimSpec, Secret, Service,
            ServiceAccount, ServicePort, ServiceSpec,
        },
        networking::v1::Ingress,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use serde_json::{Value, json};

use super::{Conversion, Downward};
use crate::{error::Result, items::Kind, super_stores::SuperStores, tenant::TenantStores};

/// The ConfigMap every namespace gets from the controller-manager; the super cluster publishes its own
/// under the same name, and tenant pods get the tenant CA through their token Secret instead.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

impl Downward for ConfigMap {
    const KIND: Kind = Kind::ConfigMap;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.config_maps)
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.config_maps)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        if tenant.name_any() == ROOT_CA_CONFIG_MAP {
            return Ok(None);
        }
        Ok(Some(ConfigMap {
            metadata: cx.metadata(&tenant.metadata),
            data: tenant.data.clone(),
            binary_data: tenant.binary_data.clone(),
            immutable: tenant.immutable,
        }))
    }

    fn view(object: &Self) -> Value {
        json!({ "data": object.data, "binaryData": object.binary_data, "immutable": object.immutable.unwrap_or(false) })
    }
}

/// Type of legacy service-account token Secrets; their copies are Opaque (the super cluster's token
/// controller would otherwise rewrite them).
const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";

impl Downward for Secret {
    const KIND: Kind = Kind::Secret;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.secrets)
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.secrets)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        let type_ = match tenant.type_.as_deref() {
            Some(SERVICE_ACCOUNT_TOKEN) => Some("Opaque".to_owned()),
            other => other.map(str::to_owned),
        };
        Ok(Some(Secret {
            metadata: cx.metadata(&tenant.metadata),
            data: tenant.data.clone(),
            string_data: None,
            immutable: tenant.immutable,
            type_,
        }))
    }

    fn view(object: &Self) -> Value {
        json!({
            "data": object.data,
            "type": object.type_.as_deref().unwrap_or("Opaque"),
            "immutable": object.immutable.unwrap_or(false),
        })
    }
}

impl Downward for ServiceAccount {
    const KIND: Kind = Kind::ServiceAccount;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.service_accounts)
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.service_accounts)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        // Pods get tenant tokens from the syncer; a super token for this account would be a super-cluster
        // credential.
        Ok(Some(ServiceAccount {
            metadata: cx.metadata(&tenant.metadata),
            automount_service_account_token: Some(false),
            image_pull_secrets: tenant.image_pull_secrets.clone(),
            secrets: None,
        }))
    }

    fn view(object: &Self) -> Value {
        json!({ "automount": object.automount_service_account_token, "imagePullSecrets": object.image_pull_secrets })
    }
}

fn normalized_ports(ports: &Option<Vec<ServicePort>>) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .flatten()
        .map(|p| {
            let target = match &p.target_port {
                Some(IntOrString::Int(i)) => json!(i),
                Some(IntOrString::String(s)) => json!(s),
                None => json!(p.port),
            };
            json!({
                "name": p.name.clone().unwrap_or_default(),
                "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                "port": p.port,
                "targetPort": target,
                "appProtocol": p.app_protocol,
            })
        })
        .collect();
    Value::Array(ports)
}

impl Downward for Service {
    const KIND: Kind = Kind::Service;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.services)
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.services)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        let mut metadata = cx.metadata(&tenant.metadata);
        let spec = tenant.spec.clone().unwrap_or_default();
        let headless = spec.cluster_ip.as_deref() == Some("None");
        if let Some(ip) = spec
            .cluster_ip
            .as_deref()
            .filter(|ip| !ip.is_empty() && *ip != "None")
        {
            metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(ANNOTATION_TENANT_CLUSTER_IP.to_owned(), ip.to_owned());
        }
        let ports = spec.ports.map(|ports| {
            ports
                .into_iter()
                .map(|p| ServicePort { node_port: None, ..p })
                .collect()
        });
        // The super cluster allocates its own cluster IP and node ports; external IPs would let a tenant
        // capture super-cluster traffic.
        let spec = ServiceSpec {
            type_: spec.type_,
            selector: spec.selector,
            ports,
            cluster_ip: headless.then(|| "None".to_owned()),
            external_name: spec.external_name,
            session_affinity: spec.session_affinity,
            session_affinity_config: spec.session_affinity_config,
            publish_not_ready_addresses: spec.publish_not_ready_addresses,
            external_traffic_policy: spec.external_traffic_policy,
            internal_traffic_policy: spec.internal_traffic_policy,
            load_balancer_source_ranges: spec.load_balancer_source_ranges,
            load_balancer_class: spec.load_balancer_class,
            allocate_load_balancer_node_ports: spec.allocate_load_balancer_node_ports,
            ..Default::default()
        };
        Ok(Some(Service {
            metadata,
            spec: Some(spec),
            status: None,
        }))
    }

    fn view(object: &Self) -> Value {
        let spec = object.spec.clone().unwrap_or_default();
        let type_ = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
        let external = type_ == "NodePort" || type_ == "LoadBalancer";
        json!({
            "type": type_,
            "selector": spec.selector,
            "ports": normalized_ports(&spec.ports),
            "headless": spec.cluster_ip.as_deref() == Some("None"),
            "externalName": spec.external_name,
            "sessionAffinity": spec.session_affinity.unwrap_or_else(|| "None".into()),
            "publishNotReadyAddresses": spec.publish_not_ready_addresses.unwrap_or(false),
            "externalTrafficPolicy": if external { spec.external_traffic_policy.or_else(|| Some("Cluster".into())) } else { None },
            "loadBalancerSourceRanges": spec.load_balancer_source_ranges,
        })
    }
}

impl Downward for Endpoints {
    const KIND: Kind = Kind::Endpoints;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.endpoints)
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
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
        let selector_less = service.is_some_and(|s| {
            s.spec
                .as_ref()
                .and_then(|spec| spec.selector.as_ref())
                .is_none_or(|sel| sel.is_empty())
        });
        if !selector_less {
            return Ok(None);
        }
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
                        addresses.retain(|a| routable(&a.ip));
                        for address in addresses.iter_mut() {
                            // Tenant object references mean nothing in the super cluster.
                            address.target_ref = None;
                        }
                    }
                    subset
                })
                .collect()
        });
        Ok(Some(Endpoints {
            metadata: cx.metadata(&tenant.metadata),
            subsets,
        }))
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

impl Downward for PersistentVolumeClaim {
    const KIND: Kind = Kind::PersistentVolumeClaim;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.claims)
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.claims)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        let spec = tenant.spec.clone().unwrap_or_default();
        // Binding happens in the super cluster: the tenant's volume name refers to a tenant PV.
        let spec = PersistentVolumeClaimSpec {
            volume_name: None,
            ..spec
        };
        Ok(Some(PersistentVolumeClaim {
            metadata: cx.metadata(&tenant.metadata),
            spec: Some(spec),
            status: None,
        }))
    }

    fn view(object: &Self) -> Value {
        let spec = object.spec.clone().unwrap_or_default();
        json!({
            "accessModes": spec.access_modes,
            "requests": spec.resources.and_then(|r| r.requests),
            "storageClassName": spec.storage_class_name,
            "volumeMode": spec.volume_mode.unwrap_or_else(|| "Filesystem".into()),
            "selector": spec.selector,
        })
    }
}

impl Downward for Ingress {
    const KIND: Kind = Kind::Ingress;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        stores.ingresses.as_ref()
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        stores.ingresses.as_ref()
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        Ok(Some(Ingress {
            metadata: cx.metadata(&tenant.metadata),
            spec: tenant.spec.clone(),
            status: None,
        }))
    }

    fn view(object: &Self) -> Value {
        serde_json::to_value(&object.spec).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_views_ignore_what_the_apiserver_defaults() {
        let desired: Service = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
        }))
        .expect("service");
        let stored: Service = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {
                "type": "ClusterIP", "clusterIP": "10.0.0.7", "clusterIPs": ["10.0.0.7"], "selector": {"app": "web"},
                "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}], "sessionAffinity": "None",
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"
            }
        }))
        .expect("service");
        assert_eq!(Service::view(&desired), Service::view(&stored));
        let mut changed = stored.clone();
        changed
            .spec
            .as_mut()
            .expect("spec")
            .ports
            .as_mut()
            .expect("ports")[0]
            .port = 81;
        assert_ne!(Service::view(&desired), Service::view(&changed));
    }

    #[test]
    fn claim_views_ignore_the_default_volume_mode() {
        let desired: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("pvc");
        let mut stored = desired.clone();
        stored.spec.as_mut().expect("spec").volume_mode = Some("Filesystem".into());
        stored.spec.as_mut().expect("spec").volume_name = Some("pv-1".into());
        assert_eq!(
            PersistentVolumeClaim::view(&desired),
            PersistentVolumeClaim::view(&stored)
        );
    }
}
