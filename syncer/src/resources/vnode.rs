//! vNodes: a tenant's view of the super nodes its pods run on.
//!
//! A vNode appears when a tenant pod is bound to a super node, carries the super node's name, capacity,
//! conditions and addresses (or vn-agent's Service address), is unschedulable, advertises vn-agent's port
//! as its kubelet port, follows the super node's status, and is removed a grace period after the tenant's
//! last pod left the node.

use std::{collections::BTreeMap, time::Instant};

use crds::wellknown::LABEL_VIRTUAL_NODE;
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, Service,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::reflector::ObjectRef,
};

use super::Outcome;
use crate::{
    config::VNodeAddresses,
    context::Context,
    error::{Error, Result, on_super, on_tenant},
    tenant::Tenant,
};

fn params() -> PatchParams {
    PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER).force()
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

/// The vNode object (metadata and spec) and status for a super node.
async fn desired(ctx: &Context, super_node: &Node) -> Result<(Node, Node)> {
    let name = super_node.name_any();
    let mut labels: BTreeMap<String, String> = super_node.labels().clone();
    labels.insert(LABEL_VIRTUAL_NODE.to_owned(), "true".to_owned());
    let node = Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            // Tenants have no scheduler of their own for these nodes: pods land on them by binding only.
            unschedulable: Some(true),
            taints: super_node.spec.as_ref().and_then(|s| s.taints.clone()),
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

/// Makes sure the tenant has a vNode for `node` before a pod is bound to it; returns the writes made.
pub async fn ensure(ctx: &Context, tenant: &Tenant, node: &str) -> Result<u32> {
    if tenant.stores.vnodes.get(&ObjectRef::new(node)).is_some() {
        return Ok(0);
    }
    let super_node = ctx
        .supers
        .nodes
        .get(&ObjectRef::new(node))
        .ok_or_else(|| Error::Conversion(format!("super node {node} is not in the cache yet")))?;
    let (object, status) = desired(ctx, &super_node).await?;
    let api: Api<Node> = Api::all(tenant.client.clone());
    let context = format!("creating vNode {node}");
    api.patch(node, &params(), &Patch::Apply(&object))
        .await
        .map_err(on_tenant(&tenant.identity.cluster_key, &context))?;
    api.patch_status(node, &params(), &Patch::Apply(&status))
        .await
        .map_err(on_tenant(&tenant.identity.cluster_key, &context))?;
    ctx.metrics.tenant_write("node", "apply");
    ctx.metrics.tenant_write("node", "status");
    Ok(2)
}

/// Whether the tenant still has pods on a node.
fn has_pods(tenant: &Tenant, node: &str) -> bool {
    tenant.stores.pods.state().iter().any(|pod| {
        pod.spec.node_name.as_deref() == Some(node)
            && !matches!(pod.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    })
}

/// Syncs one vNode: follows the super node, and removes it when the super node is gone or the tenant's
/// pods have been off it for the grace period.
pub async fn sync(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let Some(vnode) = tenant.stores.vnodes.get(&ObjectRef::new(name)) else {
        tenant
            .vnode_idle_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        return Ok(Outcome::InSync);
    };
    let api: Api<Node> = Api::all(tenant.client.clone());
    let super_node = ctx.supers.nodes.get(&ObjectRef::new(name));
    let idle_for = {
        let mut idle = tenant.vnode_idle_since.lock().unwrap_or_else(|e| e.into_inner());
        match has_pods(tenant, name) {
            true => {
                idle.remove(name);
                None
            }
            false => Some(idle.entry(name.to_owned()).or_insert_with(Instant::now).elapsed()),
        }
    };
    let expired = idle_for.is_some_and(|idle| idle >= ctx.config.vnode_grace);
    if super_node.is_none() || expired {
        ctx.metrics.tenant_write("node", "delete");
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
            .vnode_idle_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        return Ok(Outcome::Deleted);
    }
    let super_node = super_node.expect("checked above");
    let (object, status) = desired(ctx, &super_node).await?;
    let mut writes = 0;
    let current_labels = vnode.labels();
    let labels_match = object
        .labels()
        .iter()
        .all(|(k, v)| current_labels.get(k) == Some(v));
    let spec_match = vnode.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
        && vnode.spec.as_ref().and_then(|s| s.taints.clone())
            == object.spec.as_ref().and_then(|s| s.taints.clone());
    if !labels_match || !spec_match {
        api.patch(name, &params(), &Patch::Apply(&object))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating vNode {name}"),
            ))?;
        ctx.metrics.tenant_write("node", "apply");
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
    if !status_match {
        api.patch_status(name, &params(), &Patch::Apply(&status))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating vNode {name} status"),
            ))?;
        ctx.metrics.tenant_write("node", "status");
        writes += 1;
    }
    if let Some(idle) = idle_for {
        // Look again when the grace period ends.
        let remaining = ctx.config.vnode_grace.saturating_sub(idle);
        ctx.queues.up.add_after(
            &tenant.id,
            crate::items::UpItem::Node {
                name: name.to_owned(),
            },
            remaining,
        );
    }
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}
