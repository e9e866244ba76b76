//! RuntimeClasses labelled `tenancy.x-k8s.io/super.public=true`: copied into every tenant, and the only
//! ones a tenant pod's super copy may name. The handler a RuntimeClass names picks the container runtime
//! on shared nodes, so a tenant cannot bring its own: a RuntimeClass the tenant made itself is honoured
//! when its handler is one a published class names, and the copy names that published class. Overhead
//! and scheduling are the published class's (the super cluster's admission sets them), never the tenant's.

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::{Api, Resource, runtime::reflector::Store};

use super::{
    outcome::Outcome,
    public::{copy_metadata, get, is_published, reconcile_copy},
    synced::SyncedKind,
};
use crate::{
    context::Context,
    error::{Result, on_tenant},
    items::{Item, kinds},
    super_stores::{SuperCache, SuperWatch},
    tenant::{LABEL_SYNCED_FROM_SUPER, Tenant, TenantCache, TenantWatch},
};

/// Syncs a public super RuntimeClass into the tenant.
pub async fn runtime_class(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let desired = get(&ctx.supers.runtime_classes, name)
        .filter(|class| is_published(class.meta()))
        .map(|class| RuntimeClass {
            metadata: copy_metadata(&class.metadata),
            ..(*class).clone()
        });
    reconcile_copy(
        ctx,
        tenant,
        name,
        get(&tenant.stores.runtime_classes, name),
        desired,
    )
    .await
}

/// The RuntimeClass a tenant pod's super copy names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeClassChoice {
    /// The pod names none (or the VirtualCluster forces one: the pod policy compares them).
    Unnamed,
    /// This published super RuntimeClass.
    Published(String),
    /// None may be used: why, for the tenant.
    Refused(String),
}

/// The published super RuntimeClass a tenant pod may run with: the one of the name it asks for, else, for
/// a RuntimeClass of the tenant's own, the published one with the same handler (the first by name when
/// several have it).
pub async fn choose(ctx: &Context, tenant: &Tenant, asked: Option<&str>) -> Result<RuntimeClassChoice> {
    let Some(asked) = asked.filter(|name| !name.is_empty()) else {
        return Ok(RuntimeClassChoice::Unnamed);
    };
    if tenant.settings().runtime_class_name.is_some() {
        return Ok(RuntimeClassChoice::Unnamed);
    }
    if get(&ctx.supers.runtime_classes, asked).is_some_and(|class| is_published(class.meta())) {
        return Ok(RuntimeClassChoice::Published(asked.to_owned()));
    }
    // The tenant's own RuntimeClass: read when a pod names it (rare, and not cached).
    let api: Api<RuntimeClass> = Api::all(tenant.client.clone());
    let own = api.get_opt(asked).await.map_err(on_tenant(
        &tenant.identity.cluster_key,
        format!("reading RuntimeClass {asked}"),
    ))?;
    let Some(own) = own else {
        return Ok(RuntimeClassChoice::Refused(format!(
            "runtimeClassName {asked:?} (no such RuntimeClass)"
        )));
    };
    Ok(match published_with_handler(&ctx.supers.runtime_classes, &own.handler) {
        Some(published) => RuntimeClassChoice::Published(published),
        None => RuntimeClassChoice::Refused(format!(
            "runtimeClassName {asked:?} (handler {:?}: the platform publishes no RuntimeClass with that handler; published: {})",
            own.handler,
            published_summary(&ctx.supers.runtime_classes)
        )),
    })
}

/// The first published RuntimeClass, by name, whose handler is `handler`.
fn published_with_handler(classes: &Store<RuntimeClass>, handler: &str) -> Option<String> {
    let mut names: Vec<String> = classes
        .state()
        .iter()
        .filter(|class| class.handler == handler && is_published(class.meta()))
        .filter_map(|class| class.metadata.name.clone())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// The published RuntimeClasses as `name (handler)`, for messages.
fn published_summary(classes: &Store<RuntimeClass>) -> String {
    let mut published: Vec<String> = classes
        .state()
        .iter()
        .filter(|class| is_published(class.meta()))
        .map(|class| {
            format!(
                "{} ({})",
                class.metadata.name.as_deref().unwrap_or_default(),
                class.handler
            )
        })
        .collect();
    published.sort();
    match published.is_empty() {
        true => "none".to_owned(),
        false => published.join(", "),
    }
}

impl TenantCache for kinds::RuntimeClass {
    type Cache = Store<RuntimeClass>;

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.up(Self::KIND, &format!("{LABEL_SYNCED_FROM_SUPER}=true"))
    }
}

impl SuperCache for kinds::RuntimeClass {
    type Cache = Store<RuntimeClass>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        supers.public(Self::KIND)
    }
}

impl SyncedKind for kinds::RuntimeClass {
    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        runtime_class(ctx, tenant, &item.name).await
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store;
    use serde_json::json;

    use super::*;
    use crate::context::testing::{from_json, put};

    fn class(name: &str, handler: &str, public: bool) -> RuntimeClass {
        let labels = match public {
            true => json!({crds::wellknown::LABEL_SUPER_PUBLIC: "true"}),
            false => json!({}),
        };
        from_json(json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": name, "labels": labels}, "handler": handler}))
    }

    #[test]
    fn a_handler_leads_to_the_first_published_class_that_names_it() {
        let (reader, mut writer) = store::<RuntimeClass>();
        put(&mut writer, class("sandboxed", "runsc", true));
        put(&mut writer, class("gvisor", "runsc", true));
        put(&mut writer, class("unlisted", "kata", false));
        assert_eq!(published_with_handler(&reader, "runsc").as_deref(), Some("gvisor"));
        // A class that lost its label between the list and now is not published.
        assert_eq!(published_with_handler(&reader, "kata"), None);
        assert_eq!(published_summary(&reader), "gvisor (runsc), sandboxed (runsc)");
    }
}
