//! Services: copied down, where the super cluster allocates their cluster IP and node ports, and those and
//! the load-balancer status copied back up onto the tenant Service.

pub mod flags;

use crds::wellknown::{ANNOTATION_EXTERNAL_NAME, ANNOTATION_SUPER_CLUSTER_IP, ANNOTATION_TENANT_CLUSTER_IP};
use k8s_openapi::{
    api::core::v1::{Service, ServicePort, ServiceSpec},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, Patch},
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};

use super::{
    copy::{self, Conversion, Downward},
    outcome::Outcome,
    synced::SyncedKind,
    upward::{matching_super, params, transparent},
};
use self::flags::ExternalNameServices;
use crate::{
    accounting::quota::{ObjectUsage, needs_node_ports, service_usage},
    cache::super_stores::{EventSubject, SuperCache, SuperStores, SuperWatch},
    engine::{
        context::Context,
        events,
        items::{Item, Kind, UpItem, kinds},
        patrol::findings::Findings,
    },
    error::{Result, on_tenant},
    tenancy::tenant::{Tenant, TenantCache, TenantStores, TenantWatch, namespaced},
};

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

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.services)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
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
            // By the keys the super pods carry (a label not copied as it is is copied encoded).
            selector: spec
                .selector
                .map(|selector| crate::tenancy::identity::map_labels(&selector, cx.meta, false)),
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

    fn quota_usage(super_object: &Self) -> Option<ObjectUsage> {
        Some(service_usage(super_object.spec.as_ref()))
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

    fn write_refusal(tenant: &Self, cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        let class = tenant.spec.as_ref()?.load_balancer_class.as_deref()?;
        let allowed = &cx.ctx.config.allowed_load_balancer_classes;
        (!allowed.iter().any(|a| a == class)).then(|| {
            (
                REASON_LOAD_BALANCER_CLASS_REFUSED,
                format!(
                    "loadBalancerClass {class:?} is not one the platform offers tenants (the syncer's --allowed-load-balancer-classes: {}); the Service is not synced (a copy already there stays as it was)",
                    match allowed.is_empty() {
                        true => "none".to_owned(),
                        false => allowed.join(", "),
                    }
                ),
            )
        })
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

    fn pending_up(tenant: &Self, super_object: &Self) -> Option<UpItem> {
        service_pending(tenant, super_object).then(|| {
            UpItem::new(
                Kind::Service,
                &tenant.namespace().unwrap_or_default(),
                &tenant.name_any(),
            )
        })
    }
}

/// Reason of the event on a tenant Service whose node port the super cluster could not give it.
pub const REASON_NODE_PORT_UNAVAILABLE: &str = "NodePortUnavailable";

/// Reason of the event on a tenant Service naming a `loadBalancerClass` the platform does not offer.
pub const REASON_LOAD_BALANCER_CLASS_REFUSED: &str = "LoadBalancerClassRefused";

/// Reason of the event on a tenant ExternalName Service whose target is not a host name (not synced).
pub const REASON_EXTERNAL_NAME_REFUSED: &str = "ExternalNameRefused";

pub(crate) fn is_external_name(service: &Service) -> bool {
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

/// What the upward sync keeps on a tenant Service's main resource: the super cluster IP as an annotation,
/// and the node ports the super cluster allocated (those are the ones open on the nodes). Applied whole
/// under one field manager: whatever an apply leaves out that the manager set before would be removed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceUp {
    /// The super cluster IP.
    pub super_ip: Option<String>,
    /// Ports as `{port, protocol, nodePort}`, for the tenant ports the super Service has under the same
    /// name, port and protocol.
    pub node_ports: Vec<ServicePort>,
}

fn port_key(port: &ServicePort) -> (&str, i32, &str) {
    (
        port.name.as_deref().unwrap_or_default(),
        port.port,
        port.protocol.as_deref().unwrap_or("TCP"),
    )
}

/// What `tenant` should carry of `super_service`.
pub fn service_up(tenant: &Service, super_service: &Service) -> ServiceUp {
    // An ExternalName Service has no cluster IP: its super stub's `None` is not one.
    let external_name = is_external_name(tenant);
    let super_ip = super_service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && !external_name);
    let mut node_ports = Vec::new();
    // Both must have node ports: while a type change has not reached the super Service, its ports are not
    // the tenant's to take (and a tenant Service without node ports refuses them).
    if needs_node_ports(tenant.spec.as_ref()) && needs_node_ports(super_service.spec.as_ref()) {
        let super_ports = super_service.spec.as_ref().and_then(|s| s.ports.as_ref());
        for port in tenant
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
        {
            let allocated = super_ports
                .into_iter()
                .flatten()
                .find(|p| port_key(p) == port_key(port))
                .and_then(|p| p.node_port)
                .filter(|n| *n != 0);
            if let Some(node_port) = allocated {
                node_ports.push(ServicePort {
                    port: port.port,
                    protocol: Some(port_key(port).2.to_owned()),
                    node_port: Some(node_port),
                    ..Default::default()
                });
            }
        }
    }
    ServiceUp { super_ip, node_ports }
}

/// Whether `tenant` lacks some of `wanted`.
fn lacks(tenant: &Service, wanted: &ServiceUp) -> bool {
    let ip_missing = wanted
        .super_ip
        .as_ref()
        .is_some_and(|ip| tenant.annotations().get(ANNOTATION_SUPER_CLUSTER_IP) != Some(ip));
    let ports = tenant.spec.as_ref().and_then(|s| s.ports.as_ref());
    let port_missing = wanted.node_ports.iter().any(|want| {
        !ports.into_iter().flatten().any(|have| {
            have.port == want.port && port_key(have).2 == port_key(want).2 && have.node_port == want.node_port
        })
    });
    ip_missing || port_missing
}

/// Whether the tenant Service lacks something of its super copy that the upward sync writes (for the
/// patrol). The super copy must be the tenant Service's.
pub fn service_pending(tenant: &Service, super_service: &Service) -> bool {
    lacks(tenant, &service_up(tenant, super_service))
}

/// Applies `wanted` to tenant Service `name`. Node ports are written only onto the version of the tenant
/// Service they were matched against (`resource_version`): applied to a newer one whose ports changed,
/// they could add a port entry the tenant does not have.
async fn apply_service_up(
    api: &Api<Service>,
    name: &str,
    wanted: &ServiceUp,
    resource_version: Option<String>,
) -> kube::Result<()> {
    let with_ports = !wanted.node_ports.is_empty();
    let patch = Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: resource_version.filter(|_| with_ports),
            annotations: wanted
                .super_ip
                .clone()
                .map(|ip| [(ANNOTATION_SUPER_CLUSTER_IP.to_owned(), ip)].into()),
            ..Default::default()
        },
        spec: with_ports.then(|| ServiceSpec {
            ports: Some(wanted.node_ports.clone()),
            ..Default::default()
        }),
        status: None,
    };
    api.patch(name, &params(), &Patch::Apply(&patch))
        .await
        .map(|_| ())
}

/// Reason of the event on a tenant Service whose super node ports its apiserver refuses.
pub const REASON_NODE_PORT_NOT_COPIED: &str = "NodePortNotCopied";

/// Syncs one tenant service up: the super cluster IP as an annotation, the super cluster's node ports, and
/// the load-balancer status.
pub async fn service(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(tenant_service) = tenant
        .stores
        .services
        .get(&ObjectRef::new(name).within(namespace))
    else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace);
    let super_service = ctx
        .supers
        .services
        .get(&ObjectRef::new(name).within(&super_namespace));
    let Some(super_service) = matching_super(super_service, tenant, tenant_service.uid()) else {
        return Ok(Outcome::InSync);
    };
    let api: Api<Service> = Api::namespaced(tenant.client.clone(), namespace);
    let mut writes = 0;
    let mut refused = None;
    let wanted = service_up(&tenant_service, &super_service);
    if lacks(&tenant_service, &wanted) {
        ctx.metrics.resources.tenant_write("service", "apply");
        let resource_version = tenant_service.resource_version();
        match apply_service_up(&api, name, &wanted, resource_version).await {
            Ok(()) => writes += 1,
            // The tenant apiserver refuses a node port: outside its --service-node-port-range, or held by
            // another of its Services (which gets its own super value in turn). The patrol tries again.
            Err(kube::Error::Api(status))
                if status.code == 422
                    && !wanted.node_ports.is_empty()
                    && status.message.contains("nodePort") =>
            {
                tracing::info!(message = %status.message, "the tenant refuses the super cluster's node ports");
                events::warn(
                    tenant,
                    &tenant_service.object_ref(&()),
                    REASON_NODE_PORT_NOT_COPIED,
                    &format!(
                        "the node ports open on the nodes for this Service could not be recorded on it: {}",
                        status.message
                    ),
                )
                .await;
                let without_ports = ServiceUp {
                    node_ports: Vec::new(),
                    ..wanted.clone()
                };
                if lacks(&tenant_service, &without_ports) {
                    ctx.metrics.resources.tenant_write("service", "apply");
                    apply_service_up(&api, name, &without_ports, None)
                        .await
                        .map_err(on_tenant(
                            &tenant.identity.cluster_key,
                            format!("annotating service {namespace}/{name}"),
                        ))?;
                    writes += 1;
                }
                refused = Some(status.message.clone());
            }
            Err(error) => {
                return Err(on_tenant(
                    &tenant.identity.cluster_key,
                    format!("updating service {namespace}/{name} from its super copy"),
                )(error));
            }
        }
    }
    let load_balancer = super_service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone());
    let current = tenant_service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone());
    if load_balancer
        .as_ref()
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
        && load_balancer != current
    {
        let patch = Service {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            status: Some(k8s_openapi::api::core::v1::ServiceStatus {
                load_balancer,
                conditions: None,
            }),
            ..Default::default()
        };
        api.patch_status(name, &params(), &Patch::Apply(&patch))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating status of service {namespace}/{name}"),
            ))?;
        ctx.metrics.resources.tenant_write("service", "status");
        writes += 1;
    }
    writes += transparent::<Service>(ctx, tenant, tenant_service.meta(), super_service.meta()).await?;
    if let Some(reason) = refused {
        return Ok(Outcome::Waiting {
            reason: format!("the tenant refuses the super cluster's node ports: {reason}"),
            retry_after: None,
        });
    }
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

impl TenantCache for kinds::Service {
    type Cache = Store<Service>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        // A tenant Service is synced down, and up too: the super cluster's node ports and IP go back onto
        // it, also after the tenant changed it.
        let (down, up, id) = (
            tenant.queues.down.clone(),
            tenant.queues.up.clone(),
            tenant.id.clone(),
        );
        tenant.watch(Self::KIND, None, move |o: &Service, _| {
            down.add(&id, namespaced(o, Kind::Service));
            up.add(&id, namespaced(o, Kind::Service));
        })
    }
}

impl SuperCache for kinds::Service {
    type Cache = Store<Service>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        // Services count against the tenant's object quotas: the ledger follows them too.
        supers.counted(Self::KIND, |o: &Service| service_usage(o.spec.as_ref()))
    }

    fn event_subject(cache: &Self::Cache, namespace: &str, name: &str) -> EventSubject {
        EventSubject::in_store(cache, namespace, name)
    }
}

impl SyncedKind for kinds::Service {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<Service>(ctx, tenant, item).await
    }

    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        service(ctx, tenant, &item.namespace, &item.name).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<Service>(ctx, tenant)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::{
        engine::{
            context::testing::{self, from_json, put},
            items::DownItem,
        },
        resources::copy::sync_down,
        tenancy::settings::TenantSettings,
    };

    const SUPER_IP: &str = "10.96.0.9";

    fn tenant_service(type_: &str, ports: serde_json::Value, super_ip: Option<&str>) -> Service {
        let mut service: Service = from_json(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "svc-uid", "resourceVersion": "5"},
            "spec": {"type": type_, "clusterIP": "10.32.0.10", "selector": {"app": "web"}, "ports": ports}
        }));
        if let Some(ip) = super_ip {
            service.metadata.annotations =
                Some([(ANNOTATION_SUPER_CLUSTER_IP.to_owned(), ip.to_owned())].into());
        }
        service
    }

    fn super_service(ports: serde_json::Value) -> Service {
        from_json(json!({
            "metadata": {"name": "web", "namespace": "team-abc123-vc-shop", "uid": "super-uid",
                "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/uid": "svc-uid",
                    "tenancy.x-k8s.io/namespace": "shop"}},
            "spec": {"type": "NodePort", "clusterIP": SUPER_IP, "selector": {"app": "web"}, "ports": ports}
        }))
    }

    const APPLY: &str = "/api/v1/namespaces/shop/services/web?&force=true&fieldManager=vc-syncer";

    #[test]
    fn node_ports_are_matched_by_name_port_and_protocol() {
        let tenant = tenant_service(
            "NodePort",
            json!([{"name": "http", "port": 80, "nodePort": 30001}, {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30002},
                {"name": "new", "port": 8080, "nodePort": 30003}]),
            None,
        );
        // The super copy lists them in another order and does not have the new port yet.
        let copy = super_service(json!([
            {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 31002},
            {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 31001}
        ]));
        let wanted = service_up(&tenant, &copy);
        assert_eq!(wanted.super_ip.as_deref(), Some(SUPER_IP));
        let ports: Vec<(i32, Option<&str>, Option<i32>)> = wanted
            .node_ports
            .iter()
            .map(|p| (p.port, p.protocol.as_deref(), p.node_port))
            .collect();
        assert_eq!(
            ports,
            [(80, Some("TCP"), Some(31001)), (53, Some("UDP"), Some(31002))]
        );
        assert!(lacks(&tenant, &wanted));

        // A tenant Service that no longer has node ports takes none (its type change is on its way down).
        let cluster_ip = tenant_service("ClusterIP", json!([{"name": "http", "port": 80}]), Some(SUPER_IP));
        assert_eq!(
            service_up(&cluster_ip, &copy),
            ServiceUp {
                super_ip: Some(SUPER_IP.into()),
                node_ports: Vec::new()
            }
        );
        assert!(!service_pending(&cluster_ip, &copy));
    }

    #[tokio::test]
    async fn the_super_node_ports_are_written_into_the_tenant_service_once() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut super_caches.services,
            super_service(json!([{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31000}])),
        );
        // The tenant apiserver picked 30080; the super cluster allocated 31000.
        put(
            &mut caches.services,
            tenant_service(
                "NodePort",
                json!([{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]),
                None,
            ),
        );
        let (outcome, call) = tokio::join!(service(&ctx, &tenant, "shop", "web"), async {
            let call = tenants.expect("PATCH", APPLY).await;
            let body = call.body.clone();
            call.respond(200, &body);
            body
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        assert_eq!(
            call,
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "resourceVersion": "5", "annotations": {(ANNOTATION_SUPER_CLUSTER_IP): SUPER_IP}},
                "spec": {"ports": [{"port": 80, "protocol": "TCP", "nodePort": 31000}]}})
        );

        // With the values in place nothing is written again (the tenant's own write comes back as an
        // event and queues the service once more).
        put(
            &mut caches.services,
            tenant_service(
                "NodePort",
                json!([{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31000}]),
                Some(SUPER_IP),
            ),
        );
        assert_eq!(
            service(&ctx, &tenant, "shop", "web").await.expect("synced"),
            Outcome::InSync
        );
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_node_port_the_tenant_refuses_is_reported_and_the_ip_still_copied() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut super_caches.services,
            super_service(json!([{"port": 80, "protocol": "TCP", "nodePort": 31000}])),
        );
        put(
            &mut caches.services,
            tenant_service(
                "NodePort",
                json!([{"port": 80, "protocol": "TCP", "nodePort": 30080}]),
                None,
            ),
        );
        let (outcome, ()) = tokio::join!(service(&ctx, &tenant, "shop", "web"), async {
            tenants.expect("PATCH", APPLY).await.fail(
                422,
                "Invalid",
                "Service \"web\" is invalid: spec.ports[0].nodePort: Invalid value: 31000: provided port is already allocated",
            );
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_NODE_PORT_NOT_COPIED);
            assert_eq!(event.body["type"], "Warning");
            event.echo();
            let call = tenants.expect("PATCH", APPLY).await;
            assert_eq!(
                call.body,
                json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "web", "annotations": {(ANNOTATION_SUPER_CLUSTER_IP): SUPER_IP}}})
            );
            call.echo();
        });
        assert!(
            matches!(
                outcome.expect("synced"),
                Outcome::Waiting {
                    retry_after: None,
                    ..
                }
            ),
            "the patrol tries again"
        );
        supers.idle().await;
        tenants.idle().await;
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
        use crate::engine::context::testing::{self, from_json};
        let (super_client, _supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (mut ctx, _) = testing::context(super_client);
        let (tenant, _) = testing::tenant(
            &ctx,
            tenant_client,
            crate::tenancy::settings::TenantSettings::default(),
        );
        let service = |spec: Value| -> Service {
            from_json(
                json!({"metadata": {"name": "ext", "namespace": "shop", "uid": "ext-uid",
                "annotations": {ANNOTATION_EXTERNAL_NAME: "forged.example", "team": "a"}}, "spec": spec}),
            )
        };
        let external = service(json!({"type": "ExternalName", "externalName": "DB.Example.com.",
            "selector": {"app": "x"}, "ports": [{"name": "pg", "port": 5432}]}));
        let convert = |ctx: &crate::engine::context::Context, tenant_service: &Service| {
            let cx = Conversion {
                ctx,
                tenant: &tenant,
                meta: &Default::default(),
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

    mod node_ports {
        use k8s_openapi::api::core::v1::Namespace;

        use super::*;
        use crate::{
            engine::{
                context::testing::{self, from_json, put},
                items::{DownItem, Kind},
            },
            resources::copy::sync_down,
            tenancy::{identity, settings::TenantSettings},
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
        testing::refused_with_event(
            sync_down::<Service>(&ctx, &tenant, &item),
            &mut tenants,
            crate::accounting::quota::REASON_QUOTA_EXCEEDED,
            "tenant quota services.loadbalancers exceeded: 0 in use, 1 asked for, limit 0",
        )
        .await;
        assert_eq!(ctx.quota.used_objects(&tenant.id), Default::default());
        supers.idle().await;
        tenants.idle().await;
    }
}
