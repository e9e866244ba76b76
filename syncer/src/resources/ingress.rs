//! Ingresses, when the platform syncs them (`--sync-ingresses`): copied down, and the super cluster's
//! load-balancer addresses copied up into their status.
//!
//! The super cluster's ingress controllers serve what the copies say with the platform's authority, so a
//! copy names only a published IngressClass (one without a class gets the published default by name,
//! never the super cluster's default), and only hosts within the suffixes the platform assigns the tenant
//! ([`crate::tenancy::settings`]); a rule without a host and a default backend, which would catch every other
//! host, are refused. Annotations that make super-cluster controllers issue certificates or publish DNS
//! records are not copied ([`crate::tenancy::identity::DEFAULT_OPAQUE_PREFIXES`]).

use k8s_openapi::api::networking::v1::{Ingress, IngressSpec, IngressStatus};
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
    cache::super_stores::{self, EventSubject, SuperCache, SuperStores, SuperWatch},
    engine::{
        context::Context,
        items::{DownItem, Item, Kind, UpItem, kinds},
        patrol::findings::Findings,
    },
    error::{Result, on_tenant},
    tenancy::tenant::{Tenant, TenantCache, TenantStores, TenantWatch, namespaced},
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
        let mut spec = tenant.spec.clone().unwrap_or_default();
        // The class by name, so that it is never whatever the super cluster's default is.
        spec.ingress_class_name = class_of(tenant).or_else(|| published_default_class(cx.ctx));
        Ok(Some(Ingress {
            metadata: cx.metadata(&tenant.metadata),
            spec: Some(spec),
            status: None,
        }))
    }

    fn write_refusal(tenant: &Self, cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        let published = |class: &str| is_published_class(cx.ctx, class);
        let default = published_default_class(cx.ctx);
        let refused = refusals(
            &tenant.spec.clone().unwrap_or_default(),
            class_of(tenant).as_deref(),
            &published,
            default.as_deref(),
            &cx.tenant.settings().ingress_host_suffixes,
        );
        (!refused.is_empty()).then(|| {
            (
                REASON_INGRESS_REFUSED,
                format!(
                    "{}; the ingress is not synced (a copy already there stays as it was)",
                    refused.join("; ")
                ),
            )
        })
    }

    fn view(object: &Self) -> Value {
        serde_json::to_value(&object.spec).unwrap_or(Value::Null)
    }
}

/// Reason of the event on a tenant Ingress that is not synced for its class or hosts.
pub const REASON_INGRESS_REFUSED: &str = "IngressRefused";

/// The annotation that named an Ingress's class before `spec.ingressClassName`.
const ANNOTATION_INGRESS_CLASS: &str = "kubernetes.io/ingress.class";

/// Annotation marking an IngressClass as the default.
const ANNOTATION_DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";

/// The class a tenant Ingress names: `spec.ingressClassName`, else the older annotation (ingress
/// controllers still read it; the copy carries the field instead).
fn class_of(ingress: &Ingress) -> Option<String> {
    ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| {
            ingress
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_INGRESS_CLASS).cloned())
        })
}

fn is_published_class(ctx: &Context, name: &str) -> bool {
    ctx.supers
        .ingress_classes
        .as_ref()
        .and_then(|classes| classes.get(&ObjectRef::new(name)))
        .is_some_and(|class| super::public::is_published(&class.metadata))
}

/// The published IngressClass marked default, when exactly one is.
fn published_default_class(ctx: &Context) -> Option<String> {
    let classes = ctx.supers.ingress_classes.as_ref()?.state();
    let defaults: Vec<String> = classes
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

/// Whether an ingress host is within one of the tenant's suffixes (a wildcard `*.x` as `x`).
pub fn host_allowed(host: &str, suffixes: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let host = host.strip_prefix("*.").unwrap_or(&host);
    suffixes
        .iter()
        .any(|suffix| crate::tenancy::settings::within_domain(host, suffix))
}

/// What of a tenant Ingress the platform does not allow, each naming the field: a class that is not
/// published (or none while no published class is the default), hosts outside the tenant's suffixes,
/// rules without a host and a default backend (both catch every host no other Ingress claims).
pub fn refusals(
    spec: &IngressSpec,
    class: Option<&str>,
    published: &dyn Fn(&str) -> bool,
    published_default: Option<&str>,
    suffixes: &[String],
) -> Vec<String> {
    let mut refused = Vec::new();
    match class {
        Some(class) if !published(class) => refused.push(format!(
            "IngressClass {class:?} is not published to tenants (label {}=true)",
            crds::wellknown::LABEL_SUPER_PUBLIC
        )),
        None if published_default.is_none() => refused.push(format!(
            "the ingress names no IngressClass and no published IngressClass (label {}=true) is the default",
            crds::wellknown::LABEL_SUPER_PUBLIC
        )),
        _ => {}
    }
    let allowed = match suffixes.is_empty() {
        true => "the platform assigns this cluster no ingress host suffix".to_owned(),
        false => format!("this cluster's ingress hosts end in {}", suffixes.join(", ")),
    };
    if spec.default_backend.is_some() {
        refused.push(format!(
            "spec.defaultBackend (it would serve every host; name hosts in rules: {allowed})"
        ));
    }
    for (index, rule) in spec.rules.iter().flatten().enumerate() {
        match rule.host.as_deref().filter(|h| !h.is_empty()) {
            None => refused.push(format!(
                "spec.rules[{index}] without a host (it would serve every host; {allowed})"
            )),
            Some(host) if !host_allowed(host, suffixes) => {
                refused.push(format!("spec.rules[{index}].host {host:?} ({allowed})"))
            }
            Some(_) => {}
        }
    }
    for (index, tls) in spec.tls.iter().flatten().enumerate() {
        for host in tls.hosts.iter().flatten().filter(|h| !host_allowed(h, suffixes)) {
            refused.push(format!("spec.tls[{index}].hosts {host:?} ({allowed})"));
        }
    }
    refused
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
        ctx.metrics.resources.tenant_write("ingress", "status");
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
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        if !tenant.sync_ingresses {
            return None;
        }
        // Down, and up too: the super status goes back onto the tenant ingress after it changed.
        let (down, up, id) = (
            tenant.queues.down.clone(),
            tenant.queues.up.clone(),
            tenant.id.clone(),
        );
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

    fn event_subject(cache: &Self::Cache, namespace: &str, name: &str) -> EventSubject {
        cache.as_ref().map_or(EventSubject::Missing, |store| {
            EventSubject::in_store(store, namespace, name)
        })
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

    /// The attack: hosts of other tenants and of the platform, a catch-all, and classes the platform keeps.
    #[test]
    fn only_published_classes_and_the_tenants_hosts_pass() {
        let suffixes = vec!["shop.apps.example.com".to_owned()];
        let published = |class: &str| class == "public";
        let spec = |value: Value| -> IngressSpec { serde_json::from_value(value).expect("spec") };
        let backend = json!({"service": {"name": "web", "port": {"number": 80}}});
        let rule = |host: &str| json!({"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}});
        let ok = spec(
            json!({"rules": [rule("shop.apps.example.com"), rule("www.shop.apps.example.com"),
            rule("*.shop.apps.example.com")], "tls": [{"hosts": ["shop.apps.example.com"], "secretName": "tls"}]}),
        );
        assert_eq!(
            refusals(&ok, Some("public"), &published, None, &suffixes),
            Vec::<String>::new()
        );
        assert_eq!(
            refusals(&ok, None, &published, Some("public"), &suffixes),
            Vec::<String>::new()
        );

        let hostile = spec(json!({"defaultBackend": backend,
            "rules": [rule("login.platform.example"), rule("evilshop.apps.example.com"),
                {"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}],
            "tls": [{"hosts": ["other.apps.example.com"], "secretName": "tls"}]}));
        let found = refusals(&hostile, Some("internal"), &published, Some("public"), &suffixes);
        let expected = [
            "IngressClass \"internal\" is not published",
            "spec.defaultBackend",
            "spec.rules[0].host \"login.platform.example\"",
            "spec.rules[1].host \"evilshop.apps.example.com\"",
            "spec.rules[2] without a host",
            "spec.tls[0].hosts \"other.apps.example.com\"",
        ];
        for want in expected {
            assert!(
                found.iter().any(|f| f.starts_with(want)),
                "{want} not in {found:#?}"
            );
        }
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        // No class and no published default; no suffix at all.
        let found = refusals(&ok, None, &published, None, &[]);
        assert!(found[0].contains("no published IngressClass"), "{found:#?}");
        assert!(
            found[1].contains("assigns this cluster no ingress host suffix"),
            "{found:#?}"
        );
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
