//! Super-cluster objects turned into index records. Tenants wrote most of what these objects hold (names,
//! ports, hostnames, external names), so every value is checked as hostile input: a name that is not a
//! valid DNS label or name is left out, never escaped into a record.

use std::net::IpAddr;

use crds::wellknown::{ANNOTATION_EXTERNAL_NAME, LABEL_CLUSTER};
use hickory_proto::rr::Name;
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::Deserialize;

use crate::index::{
    Endpoint, Key, NamespaceOwner, PodAddresses, Port, Protocol, ServiceKind, ServiceRecord, Slice,
};

/// Label of an EndpointSlice naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// Whether `value` is a DNS label as Kubernetes names are (RFC 1123).
pub use crds::naming::is_dns_label as is_label;

/// A port name as Kubernetes allows it (IANA service name: at most 15 lower-case letters, digits and `-`).
fn is_port_name(value: &str) -> bool {
    is_label(value) && value.len() <= 15
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// The tenant and tenant namespace a super object belongs to, by the one ownership rule
/// ([`crds::Owner`]): its annotations name them and it sits in the super namespace they map to. Root
/// namespaces serve no tenant namespace.
fn owner(meta: &ObjectMeta) -> Option<NamespaceOwner> {
    let owner = crds::Owner::of(meta)?;
    Some(NamespaceOwner {
        cluster: Key::from(owner.cluster),
        tenant_namespace: owner.tenant_namespace.into(),
    })
}

/// Who a super namespace serves: the tenant namespace its annotations name (root namespaces serve none).
pub fn namespace_owner(namespace: &Namespace) -> Option<NamespaceOwner> {
    owner(&namespace.metadata)
}

fn ports<'a>(ports: impl Iterator<Item = (Option<&'a str>, Option<&'a str>, i32)>) -> Vec<Port> {
    ports
        .filter_map(|(name, protocol, port)| {
            let name = name.filter(|n| is_port_name(n))?;
            Some(Port {
                name: name.into(),
                protocol: Protocol::parse(protocol)?,
                port: u16::try_from(port).ok().filter(|p| *p > 0)?,
            })
        })
        .collect()
}

/// A super Service as a record, when it belongs to a tenant.
pub fn service_record(service: &Service) -> Option<ServiceRecord> {
    let owner = owner(&service.metadata)?;
    let spec = service.spec.as_ref()?;
    let headless = spec.cluster_ip.as_deref() == Some("None");
    // A real ExternalName Service (`--external-name-services=synced`), or the syncer's stub of one: a
    // headless Service carrying the target in an annotation that nothing else reads.
    let external_name = match spec.type_.as_deref() {
        Some("ExternalName") => Some(spec.external_name.as_deref().unwrap_or_default()),
        _ if headless => annotation(&service.metadata, ANNOTATION_EXTERNAL_NAME),
        _ => None,
    };
    let kind = match external_name {
        Some(target) => {
            let target = crds::naming::external_name_target(target).ok()?;
            ServiceKind::ExternalName(Name::from_ascii(format!("{target}.")).ok()?)
        }
        None if headless => ServiceKind::Headless,
        None => {
            let mut ips: Vec<IpAddr> = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .filter_map(|ip| ip.parse().ok())
                .collect();
            ips.sort();
            ips.dedup();
            if ips.is_empty() {
                // Not allocated yet: the name appears with its address.
                return None;
            }
            ServiceKind::ClusterIp(ips)
        }
    };
    let ports = ports(
        spec.ports
            .iter()
            .flatten()
            .map(|p| (p.name.as_deref(), p.protocol.as_deref(), p.port)),
    );
    Some(ServiceRecord { owner, kind, ports })
}

/// An EndpointSlice as a record: its Service, endpoints and named ports.
pub fn slice_record(slice: &EndpointSlice) -> Option<Slice> {
    let service = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
    if !is_label(service) || !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return None;
    }
    let endpoints = slice
        .endpoints
        .iter()
        .map(|endpoint| Endpoint {
            addresses: endpoint.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
            hostname: endpoint
                .hostname
                .as_deref()
                .filter(|h| is_label(h))
                .map(Into::into),
            ready: endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
        })
        .filter(|e| !e.addresses.is_empty())
        .collect();
    let ports = ports(
        slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| Some((p.name.as_deref(), p.protocol.as_deref(), p.port?))),
    );
    Some(Slice {
        service: service.as_str().into(),
        endpoints,
        ports,
    })
}

/// A super pod as the DNS server reads it: metadata, whether it uses the host network, its phase and
/// addresses. Everything else of a pod is skipped while parsing.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodView {
    /// Metadata.
    pub metadata: ObjectMeta,
    /// The little of the spec that matters.
    #[serde(default)]
    pub spec: Option<PodViewSpec>,
    /// The little of the status that matters.
    #[serde(default)]
    pub status: Option<PodViewStatus>,
}

/// [`PodView`]'s spec.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodViewSpec {
    /// `hostNetwork`.
    #[serde(default)]
    pub host_network: Option<bool>,
}

/// [`PodView`]'s status.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodViewStatus {
    /// `phase`.
    #[serde(default)]
    pub phase: Option<String>,
    /// `podIP`.
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    /// `podIPs`.
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Option<Vec<PodViewIp>>,
}

/// One of `podIPs`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodViewIp {
    /// The address.
    #[serde(default)]
    pub ip: String,
}

impl k8s_openapi::Resource for PodView {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for PodView {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A super pod's addresses, when it is a live tenant pod with addresses of its own: it is a tenant's by
/// the ownership rule ([`crds::Owner`]) and its cluster label agrees, it does not use the host network
/// (whose address is the node's, shared by every pod there), and it has not finished (a finished pod's
/// address may already be another pod's).
pub fn pod_addresses(pod: &PodView) -> Option<PodAddresses> {
    let label = pod.metadata.labels.as_ref()?.get(LABEL_CLUSTER)?;
    if !crds::Owner::of(&pod.metadata).is_some_and(|owner| owner.is(label)) {
        return None;
    }
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    let status = pod.status.as_ref()?;
    let addresses = crds::addresses::own_addresses(
        host_network,
        status.phase.as_deref(),
        status
            .pod_ips
            .iter()
            .flatten()
            .map(|p| p.ip.as_str())
            .chain(status.pod_ip.as_deref()),
    );
    (!addresses.is_empty()).then(|| PodAddresses {
        cluster: Key::from(label.as_str()),
        addresses,
    })
}

/// The cluster key and cluster domain of a VirtualCluster.
pub fn tenant_domain(vc: &crds::VirtualCluster) -> Option<(Key, String)> {
    let key = crds::naming::cluster_key_of(vc)?;
    Some((Key::from(key.as_str()), vc.spec.cluster_domain.clone()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(extra: serde_json::Value) -> serde_json::Value {
        let mut meta = json!({
            "name": "web", "namespace": "default-aaaaaa-a-shop",
            "labels": {"tenancy.x-k8s.io/vcname": "a", "tenancy.x-k8s.io/cluster": "default-aaaaaa-a"},
            "annotations": {"tenancy.x-k8s.io/cluster": "default-aaaaaa-a", "tenancy.x-k8s.io/namespace": "shop"}
        });
        if let (Some(meta), Some(extra)) = (meta.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                meta.insert(k.clone(), v.clone());
            }
        }
        meta
    }

    #[test]
    fn services_become_records_and_hostile_values_are_left_out() {
        let service: Service = serde_json::from_value(json!({
            "metadata": meta(json!({})),
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"], "ports": [
                {"name": "http", "port": 80}, {"port": 81}, {"name": "Bad.Name", "port": 82},
                {"name": "dns", "port": 53, "protocol": "UDP"}
            ]}
        }))
        .expect("service");
        let record = service_record(&service).expect("record");
        assert_eq!(record.owner.tenant_namespace.as_ref(), "shop");
        assert_eq!(
            record.kind,
            ServiceKind::ClusterIp(vec![
                "10.96.0.10".parse().expect("ip"),
                "fd00::10".parse().expect("ip")
            ])
        );
        let names: Vec<&str> = record.ports.iter().map(|p| &*p.name).collect();
        assert_eq!(names, ["http", "dns"]);

        for external in [
            "evil\\.name",
            "a..b",
            "",
            "x.y\u{0}z",
            "under_score.example",
            "10.0.0.1",
        ] {
            let service: Service = serde_json::from_value(json!({
                "metadata": meta(json!({})),
                "spec": {"type": "ExternalName", "externalName": external}
            }))
            .expect("service");
            assert_eq!(service_record(&service), None, "{external:?}");
        }
        // A real ExternalName Service and the syncer's stub of one are the same CNAME; the annotation on
        // anything but a headless Service is not read.
        let external = |spec: serde_json::Value| -> Option<ServiceRecord> {
            let mut metadata = meta(json!({}));
            metadata["annotations"]["tenancy.x-k8s.io/external-name"] = json!("DB.example.com.");
            service_record(
                &serde_json::from_value(json!({"metadata": metadata, "spec": spec})).expect("service"),
            )
        };
        let cname = ServiceKind::ExternalName(Name::from_ascii("db.example.com.").expect("name"));
        assert_eq!(
            external(json!({"type": "ExternalName", "externalName": "db.example.com"})).map(|r| r.kind),
            Some(cname.clone())
        );
        assert_eq!(
            external(json!({"clusterIP": "None"})).map(|r| r.kind),
            Some(cname)
        );
        assert_eq!(
            external(json!({"clusterIP": "10.96.0.7"})).map(|r| r.kind),
            Some(ServiceKind::ClusterIp(vec!["10.96.0.7".parse().expect("ip")]))
        );
        // Without the syncer's annotations: nobody's.
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "kube-system"},
            "spec": {"clusterIP": "10.96.0.10"}
        }))
        .expect("service");
        assert_eq!(service_record(&service), None);
    }

    #[test]
    fn slices_keep_valid_hostnames_and_readiness() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "db-x", "namespace": "n", "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "hostname": "Evil.Host", "conditions": {"ready": false}},
                {"addresses": ["not-an-ip"]}
            ],
            "ports": [{"name": "pg", "port": 5432}]
        }))
        .expect("slice");
        let record = slice_record(&slice).expect("record");
        assert_eq!(record.endpoints.len(), 2);
        assert_eq!(record.endpoints[0].hostname.as_deref(), Some("db-0"));
        assert_eq!(record.endpoints[1].hostname, None);
        assert!(!record.endpoints[1].ready);
        assert_eq!(record.ports[0].port, 5432);
    }

    #[test]
    fn only_live_pods_off_the_host_network_with_agreeing_identity_have_addresses() {
        let pod =
            |spec: serde_json::Value, status: serde_json::Value, metadata: serde_json::Value| -> PodView {
                serde_json::from_value(json!({"metadata": metadata, "spec": spec, "status": status}))
                    .expect("pod")
            };
        let running = json!({"phase": "Running", "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}]});
        let found = pod_addresses(&pod(json!({}), running.clone(), meta(json!({})))).expect("addresses");
        assert_eq!(found.cluster.as_ref(), "default-aaaaaa-a");
        assert_eq!(found.addresses, vec!["10.244.0.5".parse::<IpAddr>().expect("ip")]);
        assert_eq!(
            pod_addresses(&pod(
                json!({"hostNetwork": true}),
                running.clone(),
                meta(json!({}))
            )),
            None
        );
        assert_eq!(
            pod_addresses(&pod(
                json!({}),
                json!({"phase": "Succeeded", "podIP": "10.244.0.5"}),
                meta(json!({}))
            )),
            None
        );
        let disagreeing = meta(json!({"labels": {"tenancy.x-k8s.io/cluster": "default-bbbbbb-b"}}));
        assert_eq!(pod_addresses(&pod(json!({}), running, disagreeing)), None);
    }
}
