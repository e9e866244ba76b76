//! Conversions of the namespaced kinds copied down with little change.

use crds::wellknown::{ANNOTATION_EXTERNAL_NAME, ANNOTATION_TENANT_CLUSTER_IP, LABEL_SUPER_PUBLIC};
use k8s_openapi::{
    api::{
        core::v1::{
            ConfigMap, Endpoints, PersistentVolumeClaim, PersistentVolumeClaimSpec, Secret, Service,
            ServiceAccount, ServicePort, ServiceSpec,
        },
        networking::v1::Ingress,
        policy::v1::PodDisruptionBudget,
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use serde_json::{Value, json};

use super::{Conversion, Downward};
use crate::config::ExternalNameServices;
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
        let mut spec = tenant.spec.clone().unwrap_or_default();
        if is_external_name(tenant) {
            let Ok(target) = external_name_target(tenant) else {
                return Ok(None);
            };
            if cx.ctx.config.external_name_services == ExternalNameServices::DnsOnly {
                return Ok(Some(external_name_stub(cx.metadata(&tenant.metadata), target)));
            }
            spec.external_name = Some(target);
        }
        let mut metadata = cx.metadata(&tenant.metadata);
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
        // Node ports are the super cluster's: they are copied up into the tenant Service (see
        // `up::service`), so the tenant's values are not pushed down, except as a request when the copy is
        // created (`with_creation_hints`). Leaving them out on update keeps the allocated ones: the
        // apiserver fills in a Service's node ports that an update leaves out.
        let ports = spec.ports.map(|ports| {
            ports
                .into_iter()
                .map(|p| ServicePort { node_port: None, ..p })
                .collect()
        });
        // The super cluster allocates its own cluster IP; external IPs would let a tenant capture
        // super-cluster traffic.
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

    fn quota_usage(super_object: &Self) -> Option<crate::quota::ObjectUsage> {
        Some(crate::quota::service_usage(super_object.spec.as_ref()))
    }

    fn refusal(tenant: &Self, _cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        if !is_external_name(tenant) {
            return None;
        }
        let reason = external_name_target(tenant).err()?;
        Some((
            REASON_EXTERNAL_NAME_REFUSED,
            format!(
                "ExternalName Service {}: {:?} is not a host name: {reason}; it is not synced and its name does not resolve",
                tenant.name_any(),
                tenant
                    .spec
                    .as_ref()
                    .and_then(|s| s.external_name.as_deref())
                    .unwrap_or_default()
            ),
        ))
    }

    fn replaced(desired: &Self, existing: &Self) -> bool {
        service_shape(desired) != service_shape(existing)
    }

    fn with_creation_hints(tenant: &Self, desired: &Self) -> Option<Self> {
        let spec = tenant.spec.as_ref();
        if !needs_node_ports(spec) {
            return None;
        }
        // The node ports the tenant Service has: asked for by the tenant, or allocated by its apiserver.
        // Where the super cluster has them free, the tenant keeps them and nothing needs copying up.
        let requested: Vec<Option<i32>> = spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .map(|p| p.node_port.filter(|n| *n != 0))
            .collect();
        if requested.iter().all(Option::is_none) {
            return None;
        }
        let mut hinted = desired.clone();
        let ports = hinted.spec.as_mut()?.ports.as_mut()?;
        for (port, node_port) in ports.iter_mut().zip(requested) {
            port.node_port = node_port;
        }
        Some(hinted)
    }

    fn refused_hints(error: &crate::Error) -> Option<(&'static str, String)> {
        let message = error.status_message()?;
        if !error.is_status(422) || !message.contains("nodePort") {
            return None;
        }
        let detail = message
            .split_once("nodePort: ")
            .map_or(message, |(_, detail)| detail);
        Some((
            REASON_NODE_PORT_UNAVAILABLE,
            format!(
                "the super cluster cannot give this Service the node port it has ({detail}); it allocated another, which this Service shows"
            ),
        ))
    }

    fn pending_up(tenant: &Self, super_object: &Self) -> Option<crate::items::UpItem> {
        super::up::service_pending(tenant, super_object).then(|| crate::items::UpItem::Service {
            namespace: tenant.namespace().unwrap_or_default(),
            name: tenant.name_any(),
        })
    }
}

/// Reason of the event on a tenant Service whose node port the super cluster could not give it.
pub const REASON_NODE_PORT_UNAVAILABLE: &str = "NodePortUnavailable";

/// Whether a Service of this spec has node ports: `NodePort`, and `LoadBalancer` unless it opts out.
pub fn needs_node_ports(spec: Option<&ServiceSpec>) -> bool {
    spec.is_some_and(|s| match s.type_.as_deref() {
        Some("NodePort") => true,
        Some("LoadBalancer") => s.allocate_load_balancer_node_ports != Some(false),
        _ => false,
    })
}

/// Reason of the event on a tenant ExternalName Service whose target is not a host name (not synced).
pub const REASON_EXTERNAL_NAME_REFUSED: &str = "ExternalNameRefused";
/// Reason of the event on tenant Endpoints some of whose addresses are not the tenant's.
pub const REASON_ENDPOINTS_REFUSED: &str = "EndpointsRefused";

fn is_external_name(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName")
}

/// The target of an ExternalName Service as a host name, or why it is none (tenant input: hostile).
fn external_name_target(service: &Service) -> std::result::Result<String, &'static str> {
    let value = service.spec.as_ref().and_then(|s| s.external_name.as_deref());
    crds::naming::external_name_target(value.unwrap_or_default())
}

/// The super-cluster stub of a tenant ExternalName Service (`--external-name-services=dns-only`): a
/// selector-less headless Service, so no controller gives it endpoints and no cluster IP is spent, with
/// the target in an annotation only vc-dns reads. Ingress controllers and gateways of the super cluster
/// see a Service that leads nowhere; the tenant's pods get the CNAME from vc-dns. Ports are left out:
/// they mean nothing without endpoints.
pub fn external_name_stub(mut metadata: ObjectMeta, target: String) -> Service {
    metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_EXTERNAL_NAME.to_owned(), target);
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: Some("None".to_owned()),
            ..Default::default()
        }),
        status: None,
    }
}

/// What a Service is, as far as changing it in place goes: a cluster IP is fixed once allocated (or
/// `None`), so a Service that turns headless or stops being headless is replaced; ExternalName Services
/// have none, and a change to or from one is replaced too, which keeps the rules the apiserver applies to
/// such changes out of the way.
fn service_shape(service: &Service) -> (bool, bool) {
    let spec = service.spec.as_ref();
    (
        is_external_name(service),
        spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None"),
    )
}

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
        // An ExternalName Service has no endpoints (its super stub must lead nowhere).
        let selector_less = service.is_some_and(|s| {
            !is_external_name(&s)
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
        // A claim without a class gets the published default one by name, never whatever default the
        // super cluster has (which may be a class the platform keeps to itself).
        let storage_class_name = spec
            .storage_class_name
            .clone()
            .or_else(|| published_default_class(&cx.ctx.supers));
        // Binding happens in the super cluster: the tenant's volume name refers to a tenant PV.
        let spec = PersistentVolumeClaimSpec {
            volume_name: None,
            storage_class_name,
            ..spec
        };
        Ok(Some(PersistentVolumeClaim {
            metadata: cx.metadata(&tenant.metadata),
            spec: Some(spec),
            status: None,
        }))
    }

    fn creation_refusal(tenant: &Self, cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        let class = tenant.spec.as_ref().and_then(|s| s.storage_class_name.as_deref());
        let why = match class {
            Some("") => {
                "storageClassName \"\" binds pre-made volumes without a class, which belong to the platform"
                    .to_owned()
            }
            Some(class) if !is_published_class(&cx.ctx.supers, class) => format!(
                "StorageClass {class:?} is not published to tenants (label {LABEL_SUPER_PUBLIC}=true)"
            ),
            Some(_) => return None,
            None if published_default_class(&cx.ctx.supers).is_some() => return None,
            None => format!(
                "the claim names no StorageClass and no published StorageClass (label {LABEL_SUPER_PUBLIC}=true) is the default"
            ),
        };
        Some((
            REASON_STORAGE_CLASS_NOT_PUBLISHED,
            format!("{why}; the claim is not synced (use a StorageClass this cluster lists)"),
        ))
    }

    fn quota_usage(super_object: &Self) -> Option<crate::quota::ObjectUsage> {
        Some(crate::quota::claim_usage(super_object.spec.as_ref()))
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

/// Reason of the event on a tenant claim whose StorageClass is not published.
pub const REASON_STORAGE_CLASS_NOT_PUBLISHED: &str = "StorageClassNotPublished";

/// Annotation marking a StorageClass as the default.
const ANNOTATION_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

fn is_published_class(supers: &SuperStores, name: &str) -> bool {
    supers
        .storage_classes
        .get(&ObjectRef::new(name))
        .is_some_and(|class| super::public::is_published(&class.metadata))
}

/// The published StorageClass marked default, when exactly one is (the apiserver's own rule picks the
/// newest of several; the syncer does not guess).
fn published_default_class(supers: &SuperStores) -> Option<String> {
    let defaults: Vec<String> = supers
        .storage_classes
        .state()
        .iter()
        .filter(|class| super::public::is_published(&class.metadata))
        .filter(|class| {
            class
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_DEFAULT_CLASS))
                .is_some_and(|v| v == "true")
        })
        .map(|class| class.name_any())
        .collect();
    match defaults.as_slice() {
        [only] => Some(only.clone()),
        _ => None,
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

impl Downward for PodDisruptionBudget {
    const KIND: Kind = Kind::PodDisruptionBudget;

    fn tenant_store(stores: &TenantStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.disruption_budgets)
    }

    fn super_store(stores: &SuperStores) -> Option<&kube::runtime::reflector::Store<Self>> {
        Some(&stores.disruption_budgets)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        // The selector matches the super pods as it matches the tenant's: super pods carry the tenant
        // pods' labels, and a namespaced budget only ever selects pods of its own (super) namespace. The
        // status is the super cluster's disruption controller's; the tenant's own computes the tenant's.
        if !cx.ctx.config.sync_disruption_budgets {
            return Ok(None);
        }
        Ok(Some(PodDisruptionBudget {
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
        let opaque = Vec::new();
        let cx = Conversion {
            ctx: &ctx,
            tenant: &tenant,
            opaque_prefixes: &opaque,
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

    /// Under the default, a tenant ExternalName Service becomes a stub super controllers cannot follow,
    /// with the target for vc-dns alone; `synced` makes it a real one; a target that is not a host name
    /// gets no copy in either mode, and says why.
    #[tokio::test]
    async fn external_name_services_become_inert_stubs_unless_synced() {
        use crate::context::testing::{self, from_json};
        let (super_client, _supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (mut ctx, _) = testing::context(super_client);
        let (tenant, _) = testing::tenant(&ctx, tenant_client, crate::settings::TenantSettings::default());
        let service = |spec: Value| -> Service {
            from_json(
                json!({"metadata": {"name": "ext", "namespace": "shop", "uid": "ext-uid",
                "annotations": {ANNOTATION_EXTERNAL_NAME: "forged.example", "team": "a"}}, "spec": spec}),
            )
        };
        let external = service(json!({"type": "ExternalName", "externalName": "DB.Example.com.",
            "selector": {"app": "x"}, "ports": [{"name": "pg", "port": 5432}]}));
        let convert = |ctx: &crate::context::Context, tenant_service: &Service| {
            let cx = Conversion {
                ctx,
                tenant: &tenant,
                opaque_prefixes: &[],
                super_namespace: "team-abc123-vc-shop",
            };
            (
                Service::to_super(tenant_service, &cx).expect("converted"),
                Service::refusal(tenant_service, &cx),
            )
        };

        let (stub, refusal) = convert(&ctx, &external);
        let stub = stub.expect("a stub");
        assert_eq!(refusal, None);
        let spec = stub.spec.clone().expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(
            (spec.selector, spec.ports, spec.external_name),
            (None, None, None)
        );
        let annotations = stub.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations[ANNOTATION_EXTERNAL_NAME], "db.example.com");
        assert_eq!(annotations["team"], "a");
        // The stub and its stored form (what the apiserver defaults) are in sync.
        let stored: Service = from_json(json!({"metadata": {"name": "ext"}, "spec": {"type": "ClusterIP",
            "clusterIP": "None", "clusterIPs": ["None"], "sessionAffinity": "None",
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"}}));
        assert_eq!(Service::view(&stub), Service::view(&stored));

        // A tenant cannot make another kind of Service a CNAME: the annotation is the syncer's.
        let (plain, refusal) = convert(
            &ctx,
            &service(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]})),
        );
        let plain = plain.expect("a copy");
        assert_eq!(refusal, None);
        assert!(!plain.annotations().contains_key(ANNOTATION_EXTERNAL_NAME));

        // A stub cannot become a Service with a cluster IP in place, nor a real ExternalName one.
        let allocated: Service = from_json(json!({"metadata": {"name": "ext"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.9"}}));
        assert!(Service::replaced(&stub, &allocated));
        assert!(Service::replaced(&plain, &stored));
        assert!(!Service::replaced(&stub, &stored));
        assert!(!Service::replaced(&plain, &allocated));

        ctx.config.external_name_services = ExternalNameServices::Synced;
        let (real, refusal) = convert(&ctx, &external);
        let real = real.expect("synced");
        assert_eq!(refusal, None);
        let spec = real.spec.clone().expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
        assert_eq!(spec.external_name.as_deref(), Some("db.example.com"));
        assert!(!real.annotations().contains_key(ANNOTATION_EXTERNAL_NAME));
        assert!(Service::replaced(&real, &stored));

        for mode in [ExternalNameServices::Synced, ExternalNameServices::DnsOnly] {
            ctx.config.external_name_services = mode;
            for (target, says) in [
                ("10.0.0.1", "IP address"),
                ("under_score.example", "only letters"),
                ("", "empty"),
            ] {
                let (copy, refusal) = convert(
                    &ctx,
                    &service(json!({"type": "ExternalName", "externalName": target})),
                );
                assert_eq!(copy, None, "{mode:?} {target:?}");
                let (reason, message) = refusal.expect("refused");
                assert_eq!(reason, REASON_EXTERNAL_NAME_REFUSED);
                assert!(message.contains("ExternalName Service ext"), "{message}");
                assert!(message.contains(says), "{message}");
            }
        }
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

    mod node_ports {
        use k8s_openapi::api::core::v1::Namespace;

        use super::*;
        use crate::{
            context::testing::{self, from_json, put},
            identity,
            items::{DownItem, Kind},
            resources::{Outcome, sync_down},
            settings::TenantSettings,
        };

        const APPLY: &str = "/api/v1/namespaces/team-abc123-vc-shop/services/web?&fieldManager=vc-syncer";

        fn tenant_service(node_port: i32) -> Service {
            from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "svc-uid", "resourceVersion": "5"},
                "spec": {"type": "NodePort", "clusterIP": "10.32.0.10", "selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": node_port}]}
            }))
        }

        fn node_port(body: &Value) -> &Value {
            &body["spec"]["ports"][0]["nodePort"]
        }

        fn hash(body: &Value) -> &Value {
            &body["metadata"]["annotations"][identity::ANNOTATION_SYNC_HASH]
        }

        fn super_namespace() -> Namespace {
            from_json(
                json!({"metadata": {"name": "team-abc123-vc-shop", "annotations": {
                "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "shop"}}}),
            )
        }

        #[tokio::test]
        async fn the_tenant_node_port_is_asked_for_on_creation_only() {
            let (super_client, mut supers) = testing::mock();
            let (tenant_client, mut tenants) = testing::mock();
            let (ctx, mut super_caches) = testing::context(super_client);
            let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
            put(&mut super_caches.namespaces, super_namespace());
            put(&mut caches.services, tenant_service(30080));
            let item = DownItem::new(Kind::Service, "shop", "web");

            let (outcome, created) = tokio::join!(sync_down::<Service>(&ctx, &tenant, &item), async {
                let call = supers.expect("PATCH", APPLY).await;
                assert_eq!(node_port(&call.body), 30080);
                call.echo()
            });
            assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 1 });

            // The copy as the super cluster keeps it. The tenant Service, whether it still shows its own
            // port or the super cluster's copied up, is in sync with it: nothing is written.
            let mut copy: Service = from_json(created);
            copy.spec.as_mut().expect("spec").cluster_ip = Some("10.96.0.9".into());
            put(&mut super_caches.services, copy.clone());
            assert_eq!(
                sync_down::<Service>(&ctx, &tenant, &item).await.expect("synced"),
                Outcome::InSync
            );
            copy.spec.as_mut().expect("spec").ports.as_mut().expect("ports")[0].node_port = Some(31000);
            put(&mut super_caches.services, copy);
            let mut copied_up = tenant_service(31000);
            copied_up.metadata.annotations = Some(
                [(
                    crds::wellknown::ANNOTATION_SUPER_CLUSTER_IP.to_owned(),
                    "10.96.0.9".to_owned(),
                )]
                .into(),
            );
            put(&mut caches.services, copied_up.clone());
            assert_eq!(
                sync_down::<Service>(&ctx, &tenant, &item).await.expect("synced"),
                Outcome::InSync
            );

            // A change of the tenant Service goes down without any node port: the super cluster keeps its own.
            copied_up.metadata.labels = Some([("tier".to_owned(), "front".to_owned())].into());
            put(&mut caches.services, copied_up);
            let (outcome, ()) = tokio::join!(sync_down::<Service>(&ctx, &tenant, &item), async {
                let call = supers.expect("PATCH", APPLY).await;
                assert_eq!(node_port(&call.body), &Value::Null);
                assert_eq!(call.body["metadata"]["labels"]["tier"], "front");
                call.echo();
            });
            assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
            supers.idle().await;
            tenants.idle().await;
        }

        #[tokio::test]
        async fn a_node_port_the_super_cluster_refuses_is_left_to_it() {
            let (super_client, mut supers) = testing::mock();
            let (tenant_client, mut tenants) = testing::mock();
            let (ctx, mut super_caches) = testing::context(super_client);
            let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
            put(&mut super_caches.namespaces, super_namespace());
            put(&mut caches.services, tenant_service(30080));
            let item = DownItem::new(Kind::Service, "shop", "web");

            let (outcome, ()) = tokio::join!(sync_down::<Service>(&ctx, &tenant, &item), async {
                let hinted = supers.expect("PATCH", APPLY).await;
                let hinted_hash = hash(&hinted.body).clone();
                hinted.fail(
                    422,
                    "Invalid",
                    "Service \"web\" is invalid: spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated",
                );
                let event = tenants
                    .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                    .await;
                assert_eq!(event.body["reason"], REASON_NODE_PORT_UNAVAILABLE);
                assert!(
                    event.body["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("provided port is already allocated")),
                    "{}",
                    event.body
                );
                event.echo();
                let plain = supers.expect("PATCH", APPLY).await;
                assert_eq!(node_port(&plain.body), &Value::Null);
                // The hash covers what every later sync applies, not the request.
                assert_eq!(hash(&plain.body), &hinted_hash);
                plain.echo();
            });
            assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 2 });

            // Other refusals are errors, retried as usual.
            let mut other = tenant_service(30081);
            other.metadata.uid = Some("svc-uid-2".into());
            put(&mut caches.services, other);
            let (outcome, ()) = tokio::join!(sync_down::<Service>(&ctx, &tenant, &item), async {
                supers.expect("PATCH", APPLY).await.fail(
                    422,
                    "Invalid",
                    "Service \"web\" is invalid: metadata.labels: Invalid value",
                );
            });
            assert!(outcome.is_err());
            supers.idle().await;
            tenants.idle().await;
        }

        /// A tenant Service turned ExternalName: its copy's cluster IP cannot go in place, so the copy is
        /// deleted, and the stub created when the deletion shows.
        #[tokio::test]
        async fn a_service_turned_external_name_is_replaced_by_its_stub() {
            let (super_client, mut supers) = testing::mock();
            let (tenant_client, mut tenants) = testing::mock();
            let (ctx, mut super_caches) = testing::context(super_client);
            let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
            put(&mut super_caches.namespaces, super_namespace());
            put(&mut caches.services, tenant_service(30080));
            let item = DownItem::new(Kind::Service, "shop", "web");
            let (outcome, created) = tokio::join!(sync_down::<Service>(&ctx, &tenant, &item), async {
                supers.expect("PATCH", APPLY).await.echo()
            });
            assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 1 });
            let mut copy: Service = from_json(created);
            copy.metadata.uid = Some("copy-uid".into());
            copy.spec.as_mut().expect("spec").cluster_ip = Some("10.96.0.9".into());
            put(&mut super_caches.services, copy.clone());

            let mut external = tenant_service(30080);
            external.spec = Some(from_json(
                json!({"type": "ExternalName", "externalName": "db.example.com"}),
            ));
            put(&mut caches.services, external);
            let (outcome, ()) = tokio::join!(sync_down::<Service>(&ctx, &tenant, &item), async {
                let call = supers
                    .expect("DELETE", "/api/v1/namespaces/team-abc123-vc-shop/services/web?")
                    .await;
                assert_eq!(call.body["preconditions"]["uid"], "copy-uid");
                call.echo();
            });
            assert_eq!(outcome.expect("synced"), Outcome::Deleted);

            super_caches
                .services
                .apply_watcher_event(&kube::runtime::watcher::Event::Delete(copy));
            let (outcome, ()) = tokio::join!(sync_down::<Service>(&ctx, &tenant, &item), async {
                let call = supers.expect("PATCH", APPLY).await;
                assert_eq!(call.body["spec"]["clusterIP"], "None");
                assert_eq!(call.body["spec"]["externalName"], Value::Null);
                assert_eq!(
                    call.body["metadata"]["annotations"][ANNOTATION_EXTERNAL_NAME],
                    "db.example.com"
                );
                call.echo();
            });
            assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 1 });
            supers.idle().await;
            tenants.idle().await;
        }

        #[test]
        fn only_services_with_node_ports_ask_for_them() {
            let spec = |value: Value| -> ServiceSpec { from_json(value) };
            assert!(needs_node_ports(Some(&spec(json!({"type": "NodePort"})))));
            assert!(needs_node_ports(Some(&spec(json!({"type": "LoadBalancer"})))));
            assert!(!needs_node_ports(Some(&spec(
                json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false})
            ))));
            assert!(!needs_node_ports(Some(&spec(json!({"type": "ClusterIP"})))));
            assert!(!needs_node_ports(None));
        }
    }

    /// Claims and Services the syncer must not write: a refused class or a quota exceeded gives an event on
    /// the tenant object and not one request to the super cluster.
    mod refusals {
        use k8s_openapi::{api::storage::v1::StorageClass, apimachinery::pkg::api::resource::Quantity};

        use super::*;
        use crate::{
            context::testing::{self, from_json, put},
            items::{DownItem, Kind},
            resources::{Outcome, sync_down},
            settings::TenantSettings,
        };

        fn claim(name: &str, class: Value) -> PersistentVolumeClaim {
            let mut claim = json!({"metadata": {"name": name, "namespace": "shop", "uid": format!("{name}-uid")},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
            if !class.is_null() {
                claim["spec"]["storageClassName"] = class;
            }
            from_json(claim)
        }

        async fn refused_with_event(
            sync: impl std::future::Future<Output = crate::Result<Outcome>>,
            tenants: &mut testing::ApiServer,
            reason: &str,
            says: &str,
        ) {
            let (outcome, ()) = tokio::join!(sync, async {
                let event = tenants
                    .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                    .await;
                assert_eq!(event.body["reason"], reason);
                let note = event.body["note"].as_str().unwrap_or_default().to_owned();
                assert!(note.contains(says), "{note}");
                event.echo();
            });
            assert!(
                matches!(outcome.expect("synced"), Outcome::Waiting { .. }),
                "not refused"
            );
        }

        #[tokio::test]
        async fn claims_of_unpublished_classes_are_not_written() {
            let (super_client, mut supers) = testing::mock();
            let (tenant_client, mut tenants) = testing::mock();
            let (ctx, mut super_caches) = testing::context(super_client);
            let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
            // The cache lists only published classes; one that lost its label meanwhile does not count.
            put(
                &mut super_caches.storage_classes,
                from_json::<StorageClass>(json!({"metadata": {"name": "stale"}, "provisioner": "x"})),
            );
            for (name, class, says) in [
                (
                    "private",
                    json!("private"),
                    "StorageClass \"private\" is not published",
                ),
                ("stale", json!("stale"), "StorageClass \"stale\" is not published"),
                ("premade", json!(""), "binds pre-made volumes"),
                ("default", Value::Null, "no published StorageClass"),
            ] {
                put(&mut caches.claims, claim(name, class));
                let item = DownItem::new(Kind::PersistentVolumeClaim, "shop", name);
                refused_with_event(
                    sync_down::<PersistentVolumeClaim>(&ctx, &tenant, &item),
                    &mut tenants,
                    REASON_STORAGE_CLASS_NOT_PUBLISHED,
                    says,
                )
                .await;
            }
            supers.idle().await;
            tenants.idle().await;

            // A published default class is named explicitly on a claim without one.
            put(
                &mut super_caches.storage_classes,
                from_json::<StorageClass>(json!({"metadata": {"name": "shared",
                    "labels": {LABEL_SUPER_PUBLIC: "true"},
                    "annotations": {ANNOTATION_DEFAULT_CLASS: "true"}}, "provisioner": "x"})),
            );
            let cx = Conversion {
                tenant: &tenant,
                ctx: &ctx,
                opaque_prefixes: &[],
                super_namespace: "team-abc123-vc-shop",
            };
            let desired = PersistentVolumeClaim::to_super(&claim("default", Value::Null), &cx)
                .expect("converted")
                .expect("synced");
            assert_eq!(
                desired.spec.and_then(|s| s.storage_class_name).as_deref(),
                Some("shared")
            );
            assert_eq!(
                PersistentVolumeClaim::refusal(&claim("default", Value::Null), &cx),
                None
            );
        }

        #[tokio::test]
        async fn a_service_over_the_object_quota_is_not_written() {
            let (super_client, mut supers) = testing::mock();
            let (tenant_client, mut tenants) = testing::mock();
            let (ctx, _) = testing::context(super_client);
            let settings = TenantSettings {
                quota: Some(crds::TenantQuota {
                    services_load_balancers: Some(Quantity("0".into())),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, settings);
            put(
                &mut caches.services,
                from_json(
                    json!({"metadata": {"name": "lb", "namespace": "shop", "uid": "lb-uid"},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
                ),
            );
            let item = DownItem::new(Kind::Service, "shop", "lb");
            refused_with_event(
                sync_down::<Service>(&ctx, &tenant, &item),
                &mut tenants,
                crate::resources::pod::REASON_QUOTA_EXCEEDED,
                "tenant quota services.loadbalancers exceeded: 0 in use, 1 asked for, limit 0",
            )
            .await;
            assert_eq!(ctx.quota.used_objects(&tenant.id), Default::default());
            supers.idle().await;
            tenants.idle().await;
        }
    }
}
