//! vNodes: a tenant's view of the super nodes.
//!
//! A vNode carries the super node's name, labels, taints, capacity, conditions and addresses (or vn-agent's
//! Service address), advertises vn-agent's port as its kubelet port, and follows the super node's status.
//! Which super nodes a tenant sees is the platform's `--vnode-mode`:
//! - `pods`: a vNode appears when a tenant pod is bound to a super node, is unschedulable, and is removed
//!   a grace period after the tenant's last pod left the node;
//! - `usable` and `selected:...`: every super node the tenant's pods may use (and that carries the
//!   selected labels) is a vNode from attach on, schedulable (the tenant may cordon it), and stays while the
//!   super node does; a node outside that set still appears where a pod of the tenant runs, as in `pods`.

pub mod flags;

use std::{collections::BTreeMap, time::Instant};

use crds::wellknown::LABEL_VIRTUAL_NODE;
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, Service,
    Taint,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};

use self::flags::{VNodeAddresses, VNodeMode};
use super::{outcome::Outcome, pod::policy, synced::SyncedKind};
use crate::{
    cache::super_stores::{SuperCache, SuperWatch},
    engine::{
        context::Context,
        items::{Item, Kind, UpItem, kinds},
        patrol::findings::{Findings, found},
    },
    error::{Error, Result, on_super, on_tenant},
    tenancy::tenant::{Tenant, TenantCache, TenantWatch},
};

fn params() -> PatchParams {
    crate::resources::write::apply_params().force()
}

/// Annotation on a vNode: `scheduled` when the tenant sees it by `--vnode-mode` (schedulable; the tenant
/// owns `spec.unschedulable`), `pods` when only because its pods run there (the syncer keeps it
/// unschedulable). A change of mode re-applies the vNode once, which hands `spec.unschedulable` over.
const ANNOTATION_VNODE_KIND: &str = "tenancy.x-k8s.io/vnode";

/// Whether the tenant sees `super_node` by the platform's `--vnode-mode`, pods or not: it is usable (each
/// NoSchedule/NoExecute taint one the tenant's pods may tolerate) and, if selected, carries the labels.
pub fn wanted(ctx: &Context, tenant: &Tenant, super_node: &Node) -> bool {
    let selected = match &ctx.config.vnode_mode {
        VNodeMode::Pods => return false,
        VNodeMode::Usable => true,
        VNodeMode::Selected(labels) => {
            let have = super_node.labels();
            labels.iter().all(|(k, v)| have.get(k) == Some(v))
        }
    };
    if !selected || super_node.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let settings = tenant.settings();
    super_node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|taint| matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute"))
        .all(|taint| policy::may_tolerate(&ctx.config.pod_policy, &settings.pod_policy, taint))
}

/// The address vNodes advertise, per the flag.
async fn addresses(ctx: &Context, super_node: &Node) -> Result<Vec<NodeAddress>> {
    match &ctx.config.vnode_addresses {
        VNodeAddresses::Node => Ok(super_node
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .unwrap_or_default()),
        VNodeAddresses::Service { namespace, name } => {
            let service = Api::<Service>::namespaced(ctx.super_client.clone(), namespace)
                .get(name)
                .await
                .map_err(on_super(format!("reading vn-agent Service {namespace}/{name}")))?;
            let ip = service
                .spec
                .and_then(|s| s.cluster_ip)
                .filter(|ip| !ip.is_empty() && ip != "None")
                .ok_or_else(|| {
                    Error::Conversion(format!("vn-agent Service {namespace}/{name} has no cluster IP"))
                })?;
            Ok(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip,
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: super_node.name_any(),
                },
            ])
        }
    }
}

/// Conditions without heartbeat times: heartbeats alone do not need a write to every tenant.
fn conditions_view(
    conditions: &Option<Vec<NodeCondition>>,
) -> Vec<(String, String, Option<String>, Option<String>)> {
    let mut view: Vec<_> = conditions
        .iter()
        .flatten()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
            )
        })
        .collect();
    view.sort();
    view
}

/// The vNode object (metadata and spec) and status for a super node; `wanted`: seen by `--vnode-mode`.
async fn desired(ctx: &Context, super_node: &Node, wanted: bool) -> Result<(Node, Node)> {
    let name = super_node.name_any();
    let mut labels: BTreeMap<String, String> = super_node.labels().clone();
    labels.insert(LABEL_VIRTUAL_NODE.to_owned(), "true".to_owned());
    let kind = if wanted { "scheduled" } else { "pods" };
    let node = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            annotations: Some([(ANNOTATION_VNODE_KIND.to_owned(), kind.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            // A node seen only for the pods bound to it takes no other: unschedulable. One the platform lets
            // the tenant see is schedulable, and the tenant may cordon it (the field is then its own).
            unschedulable: (!wanted).then_some(true),
            // Taints are kept by `taints`, not applied: see there.
            ..Default::default()
        }),
        status: None,
    };
    let source = super_node.status.clone().unwrap_or_default();
    let status = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            capacity: source.capacity,
            allocatable: source.allocatable,
            conditions: source.conditions,
            addresses: Some(addresses(ctx, super_node).await?),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(ctx.config.vn_agent_port),
                }),
            }),
            node_info: source.node_info,
            phase: source.phase,
            ..Default::default()
        }),
    };
    Ok((node, status))
}

/// Prefix of the taints Kubernetes itself sets for node conditions (`not-ready`, `unreachable`,
/// `unschedulable`, pressure taints).
const CONDITION_TAINT_PREFIX: &str = "node.kubernetes.io/";

/// The taints a vNode should carry, when they differ from what it carries: the super node's, plus the
/// tenant's own (any other key). The tenant apiserver's `TaintNodesByCondition` admission gives every new
/// node `node.kubernetes.io/not-ready`, which only a node lifecycle controller would take off again, and
/// tenants run none for vNodes: condition taints follow the super node alone. Set by a merge patch that
/// replaces the list, since a server-side apply could not take off what admission added.
fn taints(vnode: &Node, super_node: &Node) -> Option<Vec<Taint>> {
    let from_super: Vec<Taint> = super_node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let current: Vec<Taint> = vnode
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut desired = from_super.clone();
    desired.extend(
        current
            .iter()
            .filter(|taint| {
                !taint.key.starts_with(CONDITION_TAINT_PREFIX)
                    && !from_super.iter().any(|s| s.key == taint.key)
            })
            .cloned(),
    );
    let view = |taints: &[Taint]| {
        let mut view: Vec<(String, Option<String>, String)> = taints
            .iter()
            .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
            .collect();
        view.sort();
        view
    };
    (view(&desired) != view(&current)).then_some(desired)
}

/// Brings a vNode's taints in line (see [`taints`]); returns the writes made.
async fn sync_taints(ctx: &Context, tenant: &Tenant, vnode: &Node, super_node: &Node) -> Result<u32> {
    let Some(desired) = taints(vnode, super_node) else {
        return Ok(0);
    };
    let name = vnode.name_any();
    let patch = serde_json::json!({"spec": {"taints": desired}});
    Api::<Node>::all(tenant.client.clone())
        .patch(
            &name,
            &PatchParams {
                field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .map_err(on_tenant(
            &tenant.identity.cluster_key,
            format!("updating the taints of vNode {name}"),
        ))?;
    ctx.metrics.resources.tenant_write("node", "patch");
    Ok(1)
}

/// Makes sure the tenant has a vNode for `node` before a pod is bound to it; returns the writes made.
pub async fn ensure(ctx: &Context, tenant: &Tenant, node: &str) -> Result<u32> {
    if tenant.stores.nodes.get(&ObjectRef::new(node)).is_some() {
        return Ok(0);
    }
    let super_node = ctx
        .supers
        .nodes
        .get(&ObjectRef::new(node))
        .ok_or_else(|| Error::Conversion(format!("super node {node} is not in the cache yet")))?;
    let wanted = wanted(ctx, tenant, &super_node);
    let (object, status) = desired(ctx, &super_node, wanted).await?;
    let api: Api<Node> = Api::all(tenant.client.clone());
    let context = format!("creating vNode {node}");
    let created = api
        .patch(node, &params(), &Patch::Apply(&object))
        .await
        .map_err(on_tenant(&tenant.identity.cluster_key, &context))?;
    api.patch_status(node, &params(), &Patch::Apply(&status))
        .await
        .map_err(on_tenant(&tenant.identity.cluster_key, &context))?;
    ctx.metrics.resources.tenant_write("node", "apply");
    ctx.metrics.resources.tenant_write("node", "status");
    Ok(2 + sync_taints(ctx, tenant, &created, &super_node).await?)
}

/// Whether the tenant still has pods on a node.
fn has_pods(tenant: &Tenant, node: &str) -> bool {
    tenant.stores.pods.state().iter().any(|pod| {
        pod.spec.node_name.as_deref() == Some(node)
            && !matches!(pod.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    })
}

/// What the vNodes keep of each tenant besides their cache: when each vNode last had none of the tenant's
/// pods (it is removed once that lasts `--vnode-grace-seconds`).
pub type IdleSince = std::sync::Mutex<std::collections::HashMap<String, Instant>>;

/// Syncs one vNode: follows the super node, and removes it when the super node is gone or the tenant's
/// pods have been off it for the grace period.
pub async fn sync(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let super_node = ctx.supers.nodes.get(&ObjectRef::new(name));
    let wanted = super_node.as_ref().is_some_and(|node| wanted(ctx, tenant, node));
    let Some(vnode) = tenant.stores.nodes.get(&ObjectRef::new(name)) else {
        tenant
            .state
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if wanted {
            // Seen from the start (and again after the tenant deleted it).
            return Ok(Outcome::Created {
                writes: ensure(ctx, tenant, name).await?,
            });
        }
        return Ok(Outcome::InSync);
    };
    let api: Api<Node> = Api::all(tenant.client.clone());
    let idle_for = {
        let mut idle = tenant.state.nodes.lock().unwrap_or_else(|e| e.into_inner());
        match wanted || has_pods(tenant, name) {
            true => {
                idle.remove(name);
                None
            }
            false => Some(idle.entry(name.to_owned()).or_insert_with(Instant::now).elapsed()),
        }
    };
    let expired = idle_for.is_some_and(|idle| idle >= ctx.config.vnode_grace);
    if super_node.is_none() || expired {
        ctx.metrics.resources.tenant_write("node", "delete");
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => {
                return Err(on_tenant(
                    &tenant.identity.cluster_key,
                    format!("deleting vNode {name}"),
                )(e));
            }
        }
        tenant
            .state
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        return Ok(Outcome::Deleted);
    }
    let super_node = super_node.expect("checked above");
    let (object, status) = desired(ctx, &super_node, wanted).await?;
    let mut writes = 0;
    let current_labels = vnode.labels();
    let labels_match = object
        .labels()
        .iter()
        .all(|(k, v)| current_labels.get(k) == Some(v))
        && vnode.annotations().get(ANNOTATION_VNODE_KIND) == object.annotations().get(ANNOTATION_VNODE_KIND);
    let unschedulable_match = wanted || vnode.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let spec_match = unschedulable_match;
    if !labels_match || !spec_match {
        api.patch(name, &params(), &Patch::Apply(&object))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating vNode {name}"),
            ))?;
        ctx.metrics.resources.tenant_write("node", "apply");
        writes += 1;
    }
    let have = vnode.status.clone().unwrap_or_default();
    let want = status.status.clone().unwrap_or_default();
    let status_match = conditions_view(&have.conditions) == conditions_view(&want.conditions)
        && have.capacity == want.capacity
        && have.allocatable == want.allocatable
        && have.addresses == want.addresses
        && have.daemon_endpoints == want.daemon_endpoints
        && have.node_info == want.node_info;
    writes += sync_taints(ctx, tenant, &vnode, &super_node).await?;
    if !status_match {
        api.patch_status(name, &params(), &Patch::Apply(&status))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating vNode {name} status"),
            ))?;
        ctx.metrics.resources.tenant_write("node", "status");
        writes += 1;
    }
    if let Some(idle) = idle_for {
        // Look again when the grace period ends.
        let remaining = ctx.config.vnode_grace.saturating_sub(idle);
        ctx.queues
            .up
            .add_after(&tenant.id, UpItem::cluster(Kind::Node, name), remaining);
    }
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

impl TenantCache for kinds::Node {
    type Cache = Store<Node>;
    /// When each vNode last had none of the tenant's pods.
    type State = IdleSince;

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.up(Self::KIND, &format!("{LABEL_VIRTUAL_NODE}=true"))
    }
}

impl SuperCache for kinds::Node {
    type Cache = Store<Node>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        let (queue, tenants) = (supers.queues.up.clone(), supers.tenants.clone());
        // Outside `pods` mode every tenant may see every node: each looks at every node's changes.
        let every_tenant = *supers.vnode_mode != VNodeMode::Pods;
        supers.watch_with(watcher::Config::default(), trim_node, move |node: &Node, _| {
            let name = node.name_any();
            for tenant in tenants.all() {
                let has_vnode = tenant.stores.nodes.get(&ObjectRef::new(&name)).is_some();
                if has_vnode || every_tenant {
                    queue.add(&tenant.id, UpItem::cluster(Kind::Node, &name));
                }
            }
        })
    }
}

impl SyncedKind for kinds::Node {
    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        sync(ctx, tenant, &item.name).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        patrol(ctx, tenant)
    }
}

/// Nodes report images and volumes in use, which vNodes do not need and which dominate a node's size.
fn trim_node(node: &mut Node) {
    if let Some(status) = &mut node.status {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}

/// Queues the vNodes a tenant should no longer have, and the nodes it should see but does not.
fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let used: std::collections::HashSet<String> = tenant
        .stores
        .pods
        .state()
        .iter()
        .filter_map(|p| p.spec.node_name.clone())
        .collect();
    for vnode in tenant.stores.nodes.state() {
        let name = vnode.name_any();
        let super_node = ctx
            .supers
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(&name));
        let wanted = super_node.as_ref().is_some_and(|node| wanted(ctx, tenant, node));
        if super_node.is_none() || (!used.contains(&name) && !wanted) {
            findings.stale_vnodes += 1;
            found(ctx, "node", "stale-vnode");
            ctx.queues.up.add(&tenant.id, UpItem::cluster(Kind::Node, &name));
        }
    }
    // Nodes the tenant should see but does not (outside `pods` mode).
    for node in ctx.supers.nodes.state() {
        let name = node.name_any();
        let missing = tenant
            .stores
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(&name))
            .is_none();
        if missing && wanted(ctx, tenant, &node) {
            findings.stale_vnodes += 1;
            found(ctx, "node", "missing-vnode");
            ctx.queues.up.add(&tenant.id, UpItem::cluster(Kind::Node, &name));
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": {"taints": taints}}))
            .expect("node")
    }

    #[test]
    fn vnode_taints_follow_the_super_node_and_keep_the_tenants_own() {
        let super_node = node(serde_json::json!([{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]));
        // Admission's not-ready taint goes, the super node's comes, the tenant's own stays.
        let vnode = node(serde_json::json!([
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
            {"key": "team", "value": "x", "effect": "PreferNoSchedule"}
        ]));
        let desired = taints(&vnode, &super_node).expect("a change");
        let keys: Vec<&str> = desired.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["gpu", "team"]);
        // In line: nothing to write, whatever the order.
        let in_line = node(serde_json::json!([
            {"key": "team", "value": "x", "effect": "PreferNoSchedule"},
            {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
        ]));
        assert!(taints(&in_line, &super_node).is_none());
        // A super taint's value changed: the vNode follows.
        let changed = node(serde_json::json!([{"key": "gpu", "value": "h100", "effect": "NoSchedule"}]));
        assert_eq!(
            taints(&changed, &super_node).expect("a change")[0]
                .value
                .as_deref(),
            Some("a100")
        );
        // A condition taint the super node carries stays.
        let not_ready =
            node(serde_json::json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]));
        assert!(taints(&not_ready, &not_ready).is_none());
    }
}
