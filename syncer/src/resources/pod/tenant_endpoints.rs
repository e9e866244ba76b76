//! Where super pods reach their tenant's apiserver and DNS: the super copies of the tenant's
//! `default/kubernetes` and `kube-system/kube-dns` Services, read from the caches. Used by the pod's
//! conversion ([`super::create`]) and by ephemeral containers added later ([`super::ephemeral`]).

use kube::{Resource, runtime::reflector::ObjectRef};

use super::convert::TenantEndpoints;
use crate::{engine::context::Context, tenancy::{identity, tenant::Tenant}};

/// The super cluster IP and first port of the tenant Service `namespace/name`: `None` when the tenant has
/// no such Service, `Err` with a reason while it has one that is not yet in the super cluster.
fn synced_service_address(
    ctx: &Context,
    tenant: &Tenant,
    namespace: &str,
    name: &str,
) -> Result<Option<(String, i32)>, String> {
    if tenant
        .stores
        .services
        .get(&ObjectRef::new(name).within(namespace))
        .is_none()
    {
        return Ok(None);
    }
    let super_namespace = tenant.identity.super_namespace(namespace);
    let service = ctx
        .supers
        .services
        .get(&ObjectRef::new(name).within(&super_namespace))
        .filter(|s| identity::belongs_to(s.meta(), &tenant.identity.cluster_key));
    let spec = service.as_ref().and_then(|s| s.spec.as_ref());
    match spec
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != "None")
    {
        Some(ip) => Ok(Some((
            ip,
            spec.and_then(|s| s.ports.as_ref()?.first().map(|p| p.port))
                .unwrap_or(443),
        ))),
        None => Err(format!(
            "waiting for the tenant's {namespace}/{name} Service to reach the super cluster"
        )),
    }
}

/// Where the tenant's apiserver is reachable from super pods (its `default/kubernetes` Service).
pub fn tenant_apiserver(ctx: &Context, tenant: &Tenant) -> Result<Option<(String, i32)>, String> {
    synced_service_address(ctx, tenant, "default", "kubernetes")
}

/// Where the tenant's DNS and apiserver are, from the synced Services (the DNS is `tenant_dns` when the
/// syncer names a tenant DNS Service); `Err` with a reason while a Service the tenant has is not yet in the
/// super cluster.
pub fn tenant_endpoints(
    ctx: &Context,
    tenant: &Tenant,
    tenant_dns: Option<String>,
) -> Result<TenantEndpoints, String> {
    let dns_ip = match tenant_dns {
        Some(ip) => Some(ip),
        None => synced_service_address(ctx, tenant, "kube-system", "kube-dns")?.map(|(ip, _)| ip),
    };
    Ok(TenantEndpoints {
        dns_ip,
        apiserver: tenant_apiserver(ctx, tenant)?,
    })
}
