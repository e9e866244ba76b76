//! RuntimeClasses labelled `tenancy.x-k8s.io/super.public=true`: copied into every tenant, and the only
//! ones a tenant pod's super copy may name. The handler a RuntimeClass names picks the container runtime
//! on shared nodes, so a tenant cannot bring its own: a RuntimeClass the tenant made itself is honoured
//! when its handler is one a published class names, and the copy names that published class. Overhead
//! and scheduling are the published class's (the super cluster's admission sets them), never the tenant's.
//!
//! A VirtualCluster may force a class on every pod of its tenant (`spec.runtimeClassName`); whoever edits
//! it is not trusted with the super cluster, so that class too must be published, or listed by the
//! platform (`--pod-forcible-runtime-classes`). Whichever class a pod runs with, the super cluster's
//! admission adds its `scheduling.tolerations` to the pod: they are judged like the pod's own.

use k8s_openapi::api::{core::v1::Toleration, node::v1::RuntimeClass};
use kube::{Api, Resource, runtime::reflector::Store};

use super::{
    outcome::Outcome,
    public::{copy_metadata, get, is_published, reconcile_copy},
    synced::SyncedKind,
};
use crate::{
    cache::super_stores::{SuperCache, SuperWatch},
    engine::{
        context::Context,
        items::{Item, kinds},
    },
    error::{Result, on_tenant},
    tenancy::tenant::{LABEL_SYNCED_FROM_SUPER, Tenant, TenantCache, TenantWatch},
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

/// A super RuntimeClass a tenant pod may run with.
#[derive(Clone, Debug, PartialEq)]
pub struct ChosenClass {
    /// Its name.
    pub name: String,
    /// The tolerations the super cluster's admission adds to pods of the class (`scheduling.tolerations`).
    pub tolerations: Vec<Toleration>,
}

impl ChosenClass {
    fn of(class: &RuntimeClass) -> Self {
        Self {
            name: class.metadata.name.clone().unwrap_or_default(),
            tolerations: class
                .scheduling
                .as_ref()
                .and_then(|s| s.tolerations.clone())
                .unwrap_or_default(),
        }
    }
}

/// The RuntimeClass a tenant pod's super copy names.
#[derive(Clone, Debug, PartialEq)]
pub enum RuntimeClassChoice {
    /// The pod names none, and none is forced.
    Unnamed,
    /// This super RuntimeClass: published (or, forced, listed by the platform).
    Published(ChosenClass),
    /// None may be used: why, for the tenant.
    Refused(String),
}

/// The super RuntimeClass a tenant pod runs with: the one its VirtualCluster forces, when that is
/// published or listed by the platform; else the published one of the name the pod asks for, else, for a
/// RuntimeClass of the tenant's own, the published one with the same handler (the first by name when
/// several have it).
pub async fn choose(ctx: &Context, tenant: &Tenant, asked: Option<&str>) -> Result<RuntimeClassChoice> {
    if let Some(forced) = tenant.settings().runtime_class_name.clone() {
        return forced_class(ctx, &forced).await;
    }
    let Some(asked) = asked.filter(|name| !name.is_empty()) else {
        return Ok(RuntimeClassChoice::Unnamed);
    };
    if let Some(class) = get(&ctx.supers.runtime_classes, asked).filter(|class| is_published(class.meta())) {
        return Ok(RuntimeClassChoice::Published(ChosenClass::of(&class)));
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
    Ok(
        match published_with_handler(&ctx.supers.runtime_classes, &own.handler) {
            Some(published) => RuntimeClassChoice::Published(published),
            None => RuntimeClassChoice::Refused(format!(
                "runtimeClassName {asked:?} (handler {:?}: the platform publishes no RuntimeClass with that handler; published: {})",
                own.handler,
                published_summary(&ctx.supers.runtime_classes)
            )),
        },
    )
}

/// Whether a VirtualCluster may force this class: published, or listed by the platform.
pub fn forcible(ctx: &Context, name: &str) -> bool {
    get(&ctx.supers.runtime_classes, name).is_some_and(|class| is_published(class.meta()))
        || ctx
            .config
            .pod_policy
            .forcible_runtime_classes
            .iter()
            .any(|c| c == name)
}

/// The class a VirtualCluster forces, as [`choose`] gives it. A listed class that is not published is not
/// cached: it is read from the super cluster.
async fn forced_class(ctx: &Context, forced: &str) -> Result<RuntimeClassChoice> {
    if let Some(class) = get(&ctx.supers.runtime_classes, forced).filter(|class| is_published(class.meta())) {
        return Ok(RuntimeClassChoice::Published(ChosenClass::of(&class)));
    }
    if !forcible(ctx, forced) {
        return Ok(RuntimeClassChoice::Refused(format!(
            "the VirtualCluster's spec.runtimeClassName {forced:?}, which the platform neither publishes (label {}=true) nor lists (the syncer's --pod-forcible-runtime-classes)",
            crds::wellknown::LABEL_SUPER_PUBLIC
        )));
    }
    let api: Api<RuntimeClass> = Api::all(ctx.super_client.clone());
    let class = api
        .get_opt(forced)
        .await
        .map_err(crate::error::on_super(format!("reading RuntimeClass {forced}")))?;
    Ok(match class {
        Some(class) => RuntimeClassChoice::Published(ChosenClass::of(&class)),
        None => RuntimeClassChoice::Refused(format!(
            "the VirtualCluster's spec.runtimeClassName {forced:?}, which the super cluster does not have"
        )),
    })
}

/// The first published RuntimeClass, by name, whose handler is `handler`.
fn published_with_handler(classes: &Store<RuntimeClass>, handler: &str) -> Option<ChosenClass> {
    let mut published: Vec<ChosenClass> = classes
        .state()
        .iter()
        .filter(|class| class.handler == handler && is_published(class.meta()))
        .map(|class| ChosenClass::of(class))
        .collect();
    published.sort_by(|a, b| a.name.cmp(&b.name));
    published.into_iter().next()
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
    type State = ();

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
    use crate::engine::context::testing::{from_json, put};

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
        assert_eq!(
            published_with_handler(&reader, "runsc")
                .map(|c| c.name)
                .as_deref(),
            Some("gvisor")
        );
        // A class that lost its label between the list and now is not published.
        assert_eq!(published_with_handler(&reader, "kata"), None);
        assert_eq!(published_summary(&reader), "gvisor (runsc), sandboxed (runsc)");
    }
}
