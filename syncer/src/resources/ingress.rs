//! Ingresses, when the platform syncs them (`--sync-ingresses`): copied down as they are, and the super
//! cluster's load-balancer addresses copied up into their status.

use k8s_openapi::api::networking::v1::{Ingress, IngressStatus};
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, Patch},
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::Value;

use super::{
    copy::{self, Conversion, Downward},
    outcome::Outcome,
    synced::SyncedKind,
    upward::{matching_super, params, transparent},
};
use crate::{
    context::Context,
    error::{Result, on_tenant},
    findings::Findings,
    items::{DownItem, Item, Kind, UpItem, kinds},
    super_stores::{self, SuperCache, SuperStores, SuperWatch},
    tenant::{Tenant, TenantCache, TenantStores, TenantWatch, namespaced},
};

impl Downward for Ingress {
    const KIND: Kind = Kind::Ingress;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        stores.ingresses.as_ref()
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
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

/// The status patch that gives a tenant ingress its super copy's load-balancer addresses, or `None` when
/// it has them.
pub fn status_patch(tenant: &Ingress, super_ingress: &Ingress) -> Option<Ingress> {
    let load_balancer = |i: &Ingress| {
        i.status
            .as_ref()
            .and_then(|s| s.load_balancer.clone())
            .unwrap_or_default()
    };
    let wanted = load_balancer(super_ingress);
    if wanted == load_balancer(tenant) {
        return None;
    }
    Some(Ingress {
        metadata: ObjectMeta {
            name: tenant.metadata.name.clone(),
            ..Default::default()
        },
        spec: None,
        status: Some(IngressStatus {
            load_balancer: Some(wanted),
        }),
    })
}

/// Copies the super ingress's load-balancer addresses (and transparent metadata) onto the tenant's.
async fn ingress_status(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(tenant_ingress) = tenant
        .stores
        .ingresses
        .as_ref()
        .and_then(|s| s.get(&ObjectRef::new(name).within(namespace)))
    else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace);
    let super_ingress = ctx
        .supers
        .ingresses
        .as_ref()
        .and_then(|s| s.get(&ObjectRef::new(name).within(&super_namespace)));
    let Some(super_ingress) = matching_super(super_ingress, tenant, tenant_ingress.uid()) else {
        return Ok(Outcome::InSync);
    };
    let mut writes = 0;
    if let Some(patch) = status_patch(&tenant_ingress, &super_ingress) {
        let api: Api<Ingress> = Api::namespaced(tenant.client.clone(), namespace);
        api.patch_status(name, &params(), &Patch::Apply(&patch))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating status of ingress {namespace}/{name}"),
            ))?;
        ctx.metrics.tenant_write("ingress", "status");
        writes += 1;
    }
    writes += transparent::<Ingress>(ctx, tenant, tenant_ingress.meta(), super_ingress.meta()).await?;
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

impl TenantCache for kinds::Ingress {
    type Cache = Option<Store<Ingress>>;

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        if !tenant.sync_ingresses {
            return None;
        }
        // Down, and up too: the super status goes back onto the tenant ingress after it changed.
        let (down, up, id) = (tenant.queues.down.clone(), tenant.queues.up.clone(), tenant.id.clone());
        Some(tenant.watch(Self::KIND, None, move |o: &Ingress, _| {
            down.add(&id, namespaced(o, Kind::Ingress));
            up.add(&id, namespaced(o, Kind::Ingress));
        }))
    }
}

impl SuperCache for kinds::Ingress {
    type Cache = Option<Store<Ingress>>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        if !supers.sync_ingresses {
            return None;
        }
        // Drift goes down; the ingress controller's load-balancer addresses go up.
        let (down, up) = (supers.queues.down.clone(), supers.queues.up.clone());
        Some(supers.watch(super_stores::ours(), move |o: &Ingress| {
            if let Some((tenant, namespace, name)) = super_stores::tenant_key(o) {
                down.add(&tenant, DownItem::new(Kind::Ingress, &namespace, &name));
                up.add(&tenant, UpItem::new(Kind::Ingress, &namespace, &name));
            }
        }))
    }
}

impl SyncedKind for kinds::Ingress {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<Ingress>(ctx, tenant, item).await
    }

    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        ingress_status(ctx, tenant, &item.namespace, &item.name).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<Ingress>(ctx, tenant)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ingress(status: Value) -> Ingress {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop"}, "status": status}))
            .expect("ingress")
    }

    #[test]
    fn load_balancer_addresses_go_up_until_the_tenant_has_them() {
        let addressed = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7", "ports": [{"port": 80, "protocol": "TCP"}]}]}});
        let patch = status_patch(&ingress(json!(null)), &ingress(addressed.clone())).expect("patch");
        assert_eq!(
            serde_json::to_value(&patch).expect("json"),
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web"}, "status": addressed})
        );
        assert!(status_patch(&ingress(addressed.clone()), &ingress(addressed.clone())).is_none());
        // An address the super cluster withdrew is withdrawn from the tenant too.
        let withdrawn = status_patch(&ingress(addressed), &ingress(json!({}))).expect("patch");
        assert_eq!(
            withdrawn.status.and_then(|s| s.load_balancer),
            Some(Default::default())
        );
    }
}
