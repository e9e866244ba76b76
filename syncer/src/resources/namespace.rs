//! Tenant namespaces as `<cluster key>-<namespace>` in the super cluster.
//!
//! A super namespace serves exactly one tenant namespace of one tenant, as its annotations say
//! (`tenancy.x-k8s.io/cluster` and `tenancy.x-k8s.io/namespace`), and nothing is written into it for any
//! other. Names alone cannot guarantee that: a shortened name can equal another namespace's plain one, a
//! VirtualCluster's namespace can start with another tenant's cluster key, and the super cluster holds
//! namespaces the syncer never made (root namespaces, the platform's own). So before a super namespace is
//! created its name is looked up — in the cache, and in the apiserver for namespaces the cache does not
//! hold — and it is created with `create`, which fails rather than taking over a namespace that appeared
//! meanwhile. A tenant namespace whose super name is taken is refused with a `NameCollision` event and a
//! log line, and none of its objects is synced.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use crds::wellknown::{
    ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_ROOT_NAMESPACE, ANNOTATION_UID, ANNOTATION_VC_NAME,
    ANNOTATION_VC_NAMESPACE, ANNOTATION_VC_UID, LABEL_CLUSTER, LABEL_VC_NAME, LABEL_VC_NAMESPACE,
};
use k8s_openapi::{
    api::{core::v1::Namespace, rbac::v1::RoleBinding},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Resource, ResourceExt,
    api::PostParams,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};

use super::{
    access, isolation,
    outcome::Outcome,
    synced::SyncedKind,
    write::{apply_copy, delete},
};
use crate::{
    cache::{
        stores::{Cache, Change},
        super_stores::{SuperCache, SuperWatch, ours},
    },
    engine::{
        context::Context,
        events,
        items::{DownItem, Item, kinds},
        patrol::findings::{Findings, found},
    },
    error::{Result, on_super},
    resources::pod::flags::POD_SECURITY_PREFIX,
    tenancy::{
        identity,
        tenant::{Tenant, TenantCache, TenantWatch},
    },
};

/// The super namespace for a tenant namespace object.
fn desired(ctx: &Context, tenant: &Tenant, namespace: &Namespace) -> Namespace {
    let settings = tenant.settings();
    let meta = ctx.meta_policy(&settings.opaque_prefixes);
    let mut desired = Namespace {
        metadata: identity::super_namespace_metadata(&namespace.metadata, &tenant.identity, &meta),
        ..Default::default()
    };
    // The platform's Pod Security labels, never the tenant's: the super apiserver's own admission then
    // holds pods to the platform's level whatever a VirtualCluster's podPolicy allows.
    let labels = desired.metadata.labels.get_or_insert_with(Default::default);
    labels.retain(|key, _| !key.starts_with(POD_SECURITY_PREFIX));
    labels.extend(ctx.config.pod_security.labels());
    // The labels the isolating NetworkPolicies admit platform namespaces by: a tenant namespace carrying
    // one would be let into every tenant.
    if let Some(labels) = desired.metadata.labels.as_mut() {
        for (key, _) in &ctx.config.network_isolation.allow_namespaces {
            labels.remove(key);
        }
    }
    identity::stamp(&mut desired, |n| n.meta_mut());
    desired
}

/// The part of a super namespace that claims it: name and identity labels and annotations, which never
/// change for as long as it exists. Created first; everything else is applied onto it.
fn claim(desired: &Namespace) -> Namespace {
    let pick = |map: &Option<BTreeMap<String, String>>, keys: &[&str]| {
        Some(
            map.iter()
                .flatten()
                .filter(|(k, _)| keys.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    };
    Namespace {
        metadata: ObjectMeta {
            name: desired.metadata.name.clone(),
            // The Pod Security labels come with the claim, so that no pod lands in the namespace before
            // they are there.
            labels: Some(
                desired
                    .metadata
                    .labels
                    .iter()
                    .flatten()
                    .filter(|(k, _)| {
                        [LABEL_VC_NAME, LABEL_VC_NAMESPACE, LABEL_CLUSTER].contains(&k.as_str())
                            || k.starts_with(POD_SECURITY_PREFIX)
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            annotations: pick(
                &desired.metadata.annotations,
                &[
                    ANNOTATION_CLUSTER,
                    ANNOTATION_NAMESPACE,
                    ANNOTATION_UID,
                    ANNOTATION_VC_NAME,
                    ANNOTATION_VC_NAMESPACE,
                    ANNOTATION_VC_UID,
                ],
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Whether a super namespace serves tenant namespace `tenant_namespace` of `tenant`, by its annotations.
pub fn serves(meta: &ObjectMeta, tenant: &Tenant, tenant_namespace: &str) -> bool {
    identity::belongs_to(meta, &tenant.identity.cluster_key)
        && identity::tenant_namespace(meta) == Some(tenant_namespace)
        && !is_root(meta)
}

fn is_root(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_ROOT_NAMESPACE))
}

/// Who holds a super namespace, for messages.
pub fn holder(meta: &ObjectMeta) -> String {
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let vc = || {
        format!(
            "{}/{}",
            annotation(ANNOTATION_VC_NAMESPACE).unwrap_or("?"),
            annotation(ANNOTATION_VC_NAME).unwrap_or("?")
        )
    };
    if is_root(meta) {
        return format!("the root namespace of VirtualCluster {}", vc());
    }
    // What its annotations claim, for the message: whether the claim holds is for `serves`.
    match (annotation(ANNOTATION_CLUSTER), identity::tenant_namespace(meta)) {
        (Some(cluster), Some(namespace)) => {
            format!(
                "tenant namespace {namespace} of VirtualCluster {} (cluster {cluster})",
                vc()
            )
        }
        _ => "a namespace the syncer did not create".to_owned(),
    }
}

/// A tenant namespace that cannot have its super namespace: a Warning `NameCollision` event on it and a
/// log line with every name. Nothing of it is synced.
async fn collision(
    tenant: &Tenant,
    tenant_namespace: Option<&Namespace>,
    name: &str,
    super_name: &str,
    holder: &str,
) -> Outcome {
    let message = format!(
        "super namespace {super_name} already holds {holder}; namespace {name} is not synced (rename it)"
    );
    tracing::warn!(
        namespace = name,
        super_namespace = super_name,
        holder,
        "NameCollision: the super namespace is taken; this namespace is not synced"
    );
    if let Some(namespace) = tenant_namespace {
        events::warn(tenant, &namespace.object_ref(&()), "NameCollision", &message).await;
    }
    Outcome::Waiting {
        reason: message,
        retry_after: None,
    }
}

/// Syncs one tenant namespace.
pub async fn sync(ctx: &Context, tenant: &Tenant, item: &DownItem) -> Result<Outcome> {
    let super_name = tenant.identity.super_namespace(&item.name);
    let tenant_namespace = tenant.stores.namespaces.get(&ObjectRef::new(&item.name));
    let super_namespace = ctx.supers.namespaces.store.get(&ObjectRef::new(&super_name));
    let api: Api<Namespace> = Api::all(ctx.super_client.clone());

    if let Some(existing) = &super_namespace
        && !serves(existing.meta(), tenant, &item.name)
    {
        return Ok(collision(
            tenant,
            tenant_namespace.as_deref(),
            &item.name,
            &super_name,
            &holder(existing.meta()),
        )
        .await);
    }

    let live = tenant_namespace.filter(|ns| ns.meta().deletion_timestamp.is_none());
    match (live, super_namespace) {
        (None, None) => Ok(Outcome::InSync),
        (None, Some(existing)) => {
            delete(ctx, &api, &super_name, existing.uid(), None).await?;
            Ok(Outcome::Deleted)
        }
        (Some(namespace), existing) => {
            let desired = desired(ctx, tenant, &namespace);
            match existing {
                Some(existing) if identity::tenant_uid(existing.meta()) != namespace.uid().as_deref() => {
                    delete(ctx, &api, &super_name, existing.uid(), None).await?;
                    Ok(Outcome::Deleted)
                }
                Some(existing) if existing.meta().deletion_timestamp.is_some() => Ok(Outcome::Waiting {
                    reason: "the previous super namespace is still terminating".into(),
                    retry_after: Some(std::time::Duration::from_secs(2)),
                }),
                Some(existing)
                    if identity::recorded_hash(existing.meta())
                        == identity::recorded_hash(desired.meta())
                        && identity::metadata_covers(desired.meta(), existing.meta()) =>
                {
                    Ok(match guard(ctx, tenant, &item.name).await? {
                        0 => Outcome::InSync,
                        writes => Outcome::Updated { writes },
                    })
                }
                Some(existing) => {
                    let reference = namespace.object_ref(&());
                    apply_copy(ctx, tenant, Some(&reference), &api, desired, existing.uid()).await?;
                    let isolation = guard(ctx, tenant, &item.name).await?;
                    Ok(Outcome::Updated {
                        writes: 1 + isolation,
                    })
                }
                None => create(ctx, tenant, &namespace, desired).await,
            }
        }
    }
}

/// What the syncer keeps in every super namespace besides the copies: the isolating NetworkPolicy and
/// vn-agent's RoleBinding. Returns the writes made.
async fn guard(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> Result<u32> {
    Ok(isolation::ensure_isolation(ctx, tenant, tenant_namespace).await?
        + access::ensure_vn_agent_access(ctx, tenant, tenant_namespace).await?)
}

/// Creates the super namespace of a tenant namespace the cache does not show one for: refused when a
/// namespace of that name exists and serves something else (the cache holds only the syncer's namespaces,
/// so the apiserver is asked), created otherwise — the claim with `create`, then the rest applied onto it.
async fn create(
    ctx: &Context,
    tenant: &Tenant,
    namespace: &Namespace,
    desired: Namespace,
) -> Result<Outcome> {
    let api: Api<Namespace> = Api::all(ctx.super_client.clone());
    let name = namespace.name_any();
    let super_name = desired.name_any();
    let found = api
        .get_opt(&super_name)
        .await
        .map_err(on_super(format!("reading namespace {super_name}")))?;
    let uid = match found {
        Some(found) if serves(found.meta(), tenant, &name) => {
            // Created a moment ago; the cache has not seen it yet.
            if identity::tenant_uid(found.meta()) != namespace.uid().as_deref()
                || found.meta().deletion_timestamp.is_some()
            {
                return Ok(Outcome::Waiting {
                    reason: format!("super namespace {super_name} is being replaced"),
                    retry_after: Some(std::time::Duration::from_secs(1)),
                });
            }
            apply_copy(
                ctx,
                tenant,
                Some(&namespace.object_ref(&())),
                &api,
                desired,
                found.uid(),
            )
            .await?;
            let isolation = guard(ctx, tenant, &name).await?;
            return Ok(Outcome::Updated {
                writes: 1 + isolation,
            });
        }
        Some(found) => {
            return Ok(collision(tenant, Some(namespace), &name, &super_name, &holder(found.meta())).await);
        }
        None => {
            let params = PostParams {
                field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
                ..Default::default()
            };
            ctx.metrics.resources.super_write("namespace", "create");
            match api.create(&params, &claim(&desired)).await {
                Ok(created) => created.uid(),
                // Someone else created it between the read and the create: look again.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Ok(Outcome::Waiting {
                        reason: format!("super namespace {super_name} appeared meanwhile"),
                        retry_after: Some(std::time::Duration::from_secs(1)),
                    });
                }
                Err(e) => return Err(on_super(format!("creating namespace {super_name}"))(e)),
            }
        }
    };
    apply_copy(ctx, tenant, Some(&namespace.object_ref(&())), &api, desired, uid).await?;
    // Before anything runs in the namespace: its pods are never reachable from other tenants.
    let isolation = guard(ctx, tenant, &name).await?;
    Ok(Outcome::Created {
        writes: 2 + isolation,
    })
}

/// Whether the super namespace of `tenant_namespace`, as the cache shows it, serves something else: then
/// nothing of that tenant namespace may be written, and the namespace's own item reports the collision.
pub fn taken(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> Option<Outcome> {
    let super_name = tenant.identity.super_namespace(tenant_namespace);
    let existing = ctx.supers.namespaces.store.get(&ObjectRef::new(&super_name))?;
    (!serves(existing.meta(), tenant, tenant_namespace)).then(|| Outcome::Waiting {
        reason: format!(
            "super namespace {super_name} holds {}, not tenant namespace {tenant_namespace}",
            holder(existing.meta())
        ),
        retry_after: None,
    })
}

/// Makes sure the super namespace of `tenant_namespace` exists and serves it before an object is created
/// in it: `Ok(writes)` made (0 to 2), or `Err(outcome)` to return instead — while the tenant namespace is
/// not in the cache yet (right after a tenant attaches, caches fill in any order), or when its super name
/// is taken.
pub async fn ensure(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> Result<Result<u32, Outcome>> {
    let super_name = tenant.identity.super_namespace(tenant_namespace);
    if let Some(existing) = ctx.supers.namespaces.store.get(&ObjectRef::new(&super_name)) {
        return Ok(match serves(existing.meta(), tenant, tenant_namespace) {
            true => Ok(0),
            false => Err(taken(ctx, tenant, tenant_namespace).unwrap_or(Outcome::InSync)),
        });
    }
    let Some(namespace) = tenant.stores.namespaces.get(&ObjectRef::new(tenant_namespace)) else {
        return Ok(Err(waiting_for_namespace(tenant_namespace)));
    };
    Ok(
        match create(ctx, tenant, &namespace, desired(ctx, tenant, &namespace)).await? {
            outcome @ (Outcome::Created { .. } | Outcome::Updated { .. }) => Ok(outcome.writes()),
            other => Err(other),
        },
    )
}

/// The outcome of an object that waits for its namespace.
pub fn waiting_for_namespace(namespace: &str) -> Outcome {
    Outcome::Waiting {
        reason: format!("tenant namespace {namespace} is not in the cache yet"),
        retry_after: Some(std::time::Duration::from_millis(500)),
    }
}

impl TenantCache for kinds::Namespace {
    type Cache = Store<Namespace>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        let (queue, id, doubt, uid) = (
            tenant.queues.down.clone(),
            tenant.id.clone(),
            tenant.doubt_identity(),
            tenant.kube_system_uid.to_owned(),
        );
        tenant.watch(Self::KIND, None, move |ns: &Namespace, change| {
            // A watch that resumed on a replaced etcd may show another kube-system, or its deletion
            // (which a real apiserver refuses), without relisting.
            if ns.name_any() == "kube-system"
                && (change == Change::Deleted || ns.uid().as_deref() != Some(uid.as_str()))
            {
                doubt();
            }
            queue.add(&id, DownItem::namespace(&ns.name_any()))
        })
    }
}

/// The super cluster's namespaces the syncer made for tenants, and what it keeps in them besides the copies
/// of tenant objects.
pub struct SuperNamespaces {
    /// The super namespaces.
    pub store: Store<Namespace>,
    /// The RoleBindings the syncer keeps in tenant super namespaces (vn-agent's access, [`access`]).
    pub role_bindings: Store<RoleBinding>,
}

impl Cache for SuperNamespaces {
    async fn wait_ready(&self) {
        self.store.wait_ready().await;
        self.role_bindings.wait_ready().await;
    }

    #[cfg(test)]
    fn empty() -> Self {
        Self {
            store: Cache::empty(),
            role_bindings: Cache::empty(),
        }
    }
}

impl SuperCache for kinds::Namespace {
    type Cache = SuperNamespaces;

    /// The super namespaces are watched before every kind, which consult them (see
    /// [`crate::cache::super_stores::SuperStores::start`]).
    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        // Only kept when vn-agent reads pods through the super apiserver (`--vn-agent-service-account`);
        // otherwise the platform grants no access to RoleBindings, and an empty store stands in.
        let role_bindings = if supers.vn_agent_access {
            let queue = supers.queues.down.clone();
            supers.watch(ours(), move |binding: &RoleBinding| {
                // A binding is part of its namespace: repairing it means syncing that.
                if let Some((tenant, namespace)) = identity::grants(binding.meta()) {
                    queue.add(&Arc::from(tenant), DownItem::namespace(namespace));
                }
            })
        } else {
            let (store, mut writer) = kube::runtime::reflector::store();
            writer.apply_watcher_event(&watcher::Event::InitDone);
            store
        };
        SuperNamespaces {
            store: supers.namespaces.clone(),
            role_bindings,
        }
    }
}

impl SyncedKind for kinds::Namespace {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        sync(ctx, tenant, item).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        patrol(ctx, tenant)
    }
}

/// Compares a tenant's namespaces with their super namespaces, and the isolating NetworkPolicy in each.
fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let mut supers: HashMap<String, Arc<Namespace>> = ctx
        .supers
        .namespaces
        .store
        .state()
        .into_iter()
        .filter(|ns| identity::belongs_to(ns.meta(), &tenant.identity.cluster_key))
        .filter_map(|ns| Some((identity::tenant_namespace(ns.meta())?.to_owned(), ns)))
        .collect();
    for namespace in tenant.stores.namespaces.state() {
        let name = namespace.name_any();
        let live = namespace.meta().deletion_timestamp.is_none();
        match supers.remove(&name) {
            None if live => {
                findings.missing += 1;
                found(ctx, "namespace", "missing");
                ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
            }
            Some(existing)
                if identity::tenant_uid(existing.meta()) != namespace.uid().as_deref() || !live =>
            {
                findings.drifted += 1;
                found(ctx, "namespace", "drifted");
                ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
            }
            Some(_) if live && isolation_drifted(ctx, tenant, &name) => {
                findings.drifted += 1;
                found(ctx, "networkpolicy", "drifted");
                ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
            }
            _ => {}
        }
    }
    for (name, namespace) in supers {
        if namespace.meta().deletion_timestamp.is_none() {
            findings.orphaned += 1;
            found(ctx, "namespace", "orphaned");
            ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
        }
    }
    findings
}

/// Whether the isolating NetworkPolicy of a tenant namespace's super namespace is missing, changed, or
/// there although isolation is off.
fn isolation_drifted(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> bool {
    let super_namespace = tenant.identity.super_namespace(tenant_namespace);
    let existing = ctx.supers.network_policies.get(
        &kube::runtime::reflector::ObjectRef::new(isolation::ISOLATION_POLICY_NAME).within(&super_namespace),
    );
    match (ctx.config.network_isolation.enabled, existing) {
        (true, None) => true,
        (true, Some(existing)) => !isolation::isolation_in_sync(
            &isolation::isolation_policy(ctx, tenant, tenant_namespace),
            &existing,
        ),
        (false, existing) => existing.is_some_and(|e| isolation::isolates(e.meta()).is_some()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    use super::*;
    use crate::{
        engine::{
            context::testing::{self, from_json, put},
            items::Kind,
        },
        tenancy::settings::TenantSettings,
    };

    const KEY: &str = "team-abc123-vc";

    fn tenant_namespace(name: &str) -> Namespace {
        from_json(json!({"metadata": {"name": name, "uid": format!("{name}-uid")}}))
    }

    /// A super namespace with these annotations.
    fn super_namespace(name: &str, annotations: serde_json::Value) -> Namespace {
        from_json(json!({"metadata": {"name": name, "uid": "super-uid", "annotations": annotations}}))
    }

    fn reason(outcome: &Outcome) -> &str {
        match outcome {
            Outcome::Waiting { reason, .. } => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    /// The tenant's namespace `prod` maps onto a super namespace that exists but is not the syncer's (a
    /// platform namespace, another tenant's root namespace): refused, with an event, and nothing written.
    #[tokio::test]
    async fn a_super_name_held_by_a_namespace_that_is_not_ours_is_refused() {
        for (found, holder) in [
            (
                json!({"team": "platform"}),
                "a namespace the syncer did not create",
            ),
            (
                json!({"tenancy.x-k8s.io/vcrootns": "true", "tenancy.x-k8s.io/cluster": format!("{KEY}-prod"),
                    "tenancy.x-k8s.io/vcname": "victim", "tenancy.x-k8s.io/vcnamespace": "other"}),
                "the root namespace of VirtualCluster other/victim",
            ),
            (
                json!({"tenancy.x-k8s.io/cluster": "another-tenant", "tenancy.x-k8s.io/namespace": "prod",
                    "tenancy.x-k8s.io/vcname": "b", "tenancy.x-k8s.io/vcnamespace": "team"}),
                "tenant namespace prod of VirtualCluster team/b (cluster another-tenant)",
            ),
        ] {
            let (super_client, mut supers) = testing::mock();
            let (tenant_client, mut tenants) = testing::mock();
            let (ctx, _) = testing::context(super_client);
            let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
            put(&mut caches.namespaces, tenant_namespace("prod"));
            let item = DownItem::namespace("prod");
            let (outcome, ()) = tokio::join!(sync(&ctx, &tenant, &item), async {
                let get = supers
                    .expect("GET", &format!("/api/v1/namespaces/{KEY}-prod"))
                    .await;
                get.respond(
                    200,
                    &super_namespace(&format!("{KEY}-prod"), found.clone()).metadata_json(),
                );
                let event = tenants
                    // Events about cluster-scoped objects go to namespace default.
                    .expect("POST", "/apis/events.k8s.io/v1/namespaces/default/events")
                    .await;
                assert_eq!(event.body["reason"], "NameCollision");
                assert!(
                    event.body["note"].as_str().unwrap_or_default().contains(holder),
                    "{}",
                    event.body
                );
                event.echo();
            });
            let outcome = outcome.expect("synced");
            assert!(reason(&outcome).contains(holder), "{outcome:?}");
            supers.idle().await;
            tenants.idle().await;
        }
    }

    #[tokio::test]
    async fn a_free_super_name_is_claimed_with_create_then_applied() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let mut namespace = tenant_namespace("prod");
        namespace.metadata.labels = Some(
            [
                ("team".to_owned(), "a".to_owned()),
                (
                    "pod-security.kubernetes.io/enforce".to_owned(),
                    "privileged".to_owned(),
                ),
            ]
            .into(),
        );
        put(&mut caches.namespaces, namespace);
        let item = DownItem::namespace("prod");
        let (outcome, ()) = tokio::join!(sync(&ctx, &tenant, &item), async {
            supers
                .expect("GET", &format!("/api/v1/namespaces/{KEY}-prod"))
                .await
                .fail(404, "NotFound", "not found");
            let created = supers.expect("POST", "/api/v1/namespaces?").await;
            assert_eq!(created.body["metadata"]["name"], format!("{KEY}-prod"));
            let annotations = &created.body["metadata"]["annotations"];
            assert_eq!(annotations["tenancy.x-k8s.io/cluster"], KEY);
            assert_eq!(annotations["tenancy.x-k8s.io/namespace"], "prod");
            assert_eq!(annotations["tenancy.x-k8s.io/uid"], "prod-uid");
            // Only the claim: what the tenant may change later is applied, so that it can be removed later.
            assert!(annotations.get("tenancy.x-k8s.io/sync-hash").is_none());
            assert!(created.body["metadata"]["labels"].get("team").is_none());
            // The platform's Pod Security labels come with the claim; the tenant's never.
            let labels = &created.body["metadata"]["labels"];
            assert_eq!(labels["pod-security.kubernetes.io/enforce"], "baseline");
            assert_eq!(labels["pod-security.kubernetes.io/enforce-version"], "latest");
            assert_eq!(labels["pod-security.kubernetes.io/warn"], "restricted");
            assert!(labels.get("pod-security.kubernetes.io/audit").is_none());
            assert!(created.uri.contains("fieldManager=vc-syncer"), "{}", created.uri);
            created.echo();
            let applied = supers
                .expect("PATCH", &format!("/api/v1/namespaces/{KEY}-prod?"))
                .await;
            assert_eq!(applied.body["metadata"]["uid"], "uid-of-object");
            // The tenant's labels are copied encoded (identity::fate), out of the platform's selectors' reach.
            assert_eq!(
                applied.body["metadata"]["labels"]["label.tenancy.x-k8s.io/team"],
                "a"
            );
            assert!(applied.body["metadata"]["labels"].get("team").is_none());
            assert_eq!(
                applied.body["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
                "baseline"
            );
            applied.echo();
            // The namespace is isolated before anything can run in it.
            let isolation = supers
                .expect(
                    "PATCH",
                    &format!(
                        "/apis/networking.k8s.io/v1/namespaces/{KEY}-prod/networkpolicies/{}?&force=true&fieldManager=vc-syncer",
                        isolation::ISOLATION_POLICY_NAME
                    ),
                )
                .await;
            assert_eq!(
                isolation.body["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["tenancy.x-k8s.io/cluster"],
                KEY
            );
            isolation.echo();
        });
        assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 3 });
        supers.idle().await;
        tenants.idle().await;
    }

    /// A short namespace named like the tail of a shortened one maps to the same super namespace: the
    /// first keeps it; the other, and every object in it, is refused without a request to the super cluster.
    #[tokio::test]
    async fn a_namespace_colliding_with_another_of_the_same_tenant_syncs_nothing() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let long = "n".repeat(63);
        let super_name = tenant.identity.super_namespace(&long);
        let tail = super_name[KEY.len() + 1..].to_owned();
        assert_eq!(tenant.identity.super_namespace(&tail), super_name);
        put(&mut caches.namespaces, tenant_namespace(&long));
        put(&mut caches.namespaces, tenant_namespace(&tail));
        put(
            &mut super_caches.namespaces,
            super_namespace(
                &super_name,
                json!({"tenancy.x-k8s.io/cluster": KEY, "tenancy.x-k8s.io/namespace": long, "tenancy.x-k8s.io/uid": format!("{long}-uid")}),
            ),
        );
        // The objects first: refused from the cache alone.
        for kind in [Kind::ConfigMap, Kind::Pod] {
            let item = DownItem::new(kind, &tail, "x");
            let outcome = match kind {
                Kind::Pod => crate::resources::pod::down::sync(&ctx, &tenant, &item).await,
                _ => crate::resources::copy::sync_down::<ConfigMap>(&ctx, &tenant, &item).await,
            }
            .expect("synced");
            assert!(
                reason(&outcome).contains(&format!("not tenant namespace {tail}")),
                "{outcome:?}"
            );
        }
        assert!(ensure(&ctx, &tenant, &tail).await.expect("ensured").is_err());
        // Then the namespace: an event says why.
        let item = DownItem::namespace(&tail);
        let (outcome, ()) = tokio::join!(sync(&ctx, &tenant, &item), async {
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/default/events")
                .await;
            assert_eq!(event.body["reason"], "NameCollision");
            event.echo();
        });
        assert!(reason(&outcome.expect("synced")).contains(&format!("tenant namespace {long}")));
        // The first one is in sync with its super namespace and keeps it.
        assert!(ensure(&ctx, &tenant, &long).await.expect("ensured").is_ok());
        supers.idle().await;
        tenants.idle().await;
    }

    trait MetadataJson {
        fn metadata_json(&self) -> serde_json::Value;
    }

    impl MetadataJson for Namespace {
        fn metadata_json(&self) -> serde_json::Value {
            let mut value = serde_json::to_value(self).expect("json");
            value["apiVersion"] = json!("v1");
            value["kind"] = json!("Namespace");
            value
        }
    }
}
