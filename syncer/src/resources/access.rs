//! vn-agent's rights on tenant pods, granted namespace by namespace.
//!
//! vn-agent's super-apiserver backend reads logs of, executes in, attaches to and port-forwards to tenant
//! pods through the super apiserver. Granted cluster-wide, a vn-agent on any node (every node runs one)
//! could do that to every pod of the platform. Instead the syncer keeps one RoleBinding in each super
//! namespace of a tenant that binds the ClusterRole naming those subresources
//! (`--vn-agent-cluster-role`) to vn-agent's ServiceAccount (`--vn-agent-service-account`): what vn-agent
//! can reach is exactly what the syncer created for tenants. The binding is the syncer's alone; it is
//! forced back when changed and goes with its namespace.

pub mod flags;

use crds::wellknown::{
    ANNOTATION_GRANTS_CLUSTER, ANNOTATION_GRANTS_NAMESPACE, LABEL_VC_NAME, LABEL_VC_NAMESPACE,
};
use k8s_openapi::{
    api::rbac::v1::{RoleBinding, RoleRef, Subject},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, Resource, runtime::reflector::ObjectRef};

use super::write::{Kept, keep};
use crate::{
    engine::context::Context,
    error::Result,
    tenancy::{
        identity::{self, grants},
        tenant::Tenant,
    },
};

/// Name of the RoleBinding in every super namespace of a tenant.
pub const VN_AGENT_BINDING_NAME: &str = "vc-vn-agent";

/// The vn-agent binding of a tenant namespace's super namespace, stamped with its hash; `None` when the
/// syncer binds nothing.
pub fn vn_agent_binding(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> Option<RoleBinding> {
    let access = ctx.config.vn_agent_access.as_ref()?;
    let identity = &tenant.identity;
    let mut binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(VN_AGENT_BINDING_NAME.to_owned()),
            namespace: Some(identity.super_namespace(tenant_namespace)),
            labels: Some(
                [
                    (LABEL_VC_NAME.to_owned(), identity.vc_name.clone()),
                    (LABEL_VC_NAMESPACE.to_owned(), identity.vc_namespace.clone()),
                ]
                .into(),
            ),
            annotations: Some(
                [
                    (ANNOTATION_GRANTS_CLUSTER.to_owned(), identity.cluster_key.clone()),
                    (
                        ANNOTATION_GRANTS_NAMESPACE.to_owned(),
                        tenant_namespace.to_owned(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: access.cluster_role.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: access.service_account.clone(),
            namespace: Some(access.namespace.clone()),
            api_group: None,
        }]),
    };
    identity::stamp(&mut binding, |b| b.meta_mut());
    Some(binding)
}

/// Brings the vn-agent binding of a tenant namespace's super namespace in line with the flags: there and
/// as desired when set, gone when not. Returns the writes made.
pub async fn ensure_vn_agent_access(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> Result<u32> {
    let super_namespace = tenant.identity.super_namespace(tenant_namespace);
    let existing = ctx
        .supers
        .namespaces
        .role_bindings
        .get(&ObjectRef::new(VN_AGENT_BINDING_NAME).within(&super_namespace));
    let api: Api<RoleBinding> = Api::namespaced(ctx.super_client.clone(), &super_namespace);
    let kept = Kept {
        name: VN_AGENT_BINDING_NAME,
        existing,
        desired: vn_agent_binding(ctx, tenant, tenant_namespace),
        ours: |binding| grants(binding.meta()).is_some(),
        in_sync,
        // A binding's role cannot change; it is replaced.
        replaced: |desired, existing| existing.role_ref != desired.role_ref,
    };
    keep(ctx, &api, kept).await
}

/// Whether the binding as cached is the desired one.
fn in_sync(desired: &RoleBinding, existing: &RoleBinding) -> bool {
    grants(existing.meta()) == grants(desired.meta())
        && identity::recorded_hash(existing.meta()) == identity::recorded_hash(desired.meta())
        && identity::metadata_covers(desired.meta(), existing.meta())
        && existing.role_ref == desired.role_ref
        && existing.subjects == desired.subjects
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::context::testing::{self, put},
        resources::access::flags::VnAgentAccess,
        tenancy::settings::TenantSettings,
    };

    fn access() -> VnAgentAccess {
        VnAgentAccess {
            namespace: "vc-system".into(),
            service_account: "vn-agent".into(),
            cluster_role: "vc-vn-agent-tenant-pods".into(),
        }
    }

    #[tokio::test]
    async fn every_super_namespace_binds_vn_agent_to_the_tenant_pods_role_only() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (mut ctx, mut writers) = testing::context(super_client);
        ctx.config.vn_agent_access = Some(access());
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let super_namespace = tenant.identity.super_namespace("shop");

        let binding = vn_agent_binding(&ctx, &tenant, "shop").expect("binding");
        assert_eq!(
            binding.metadata.namespace.as_deref(),
            Some(super_namespace.as_str())
        );
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.name, "vc-vn-agent-tenant-pods");
        let subjects = binding.subjects.clone().expect("subjects");
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (
                subjects[0].kind.as_str(),
                subjects[0].namespace.as_deref(),
                subjects[0].name.as_str()
            ),
            ("ServiceAccount", Some("vc-system"), "vn-agent")
        );

        // Missing: applied (forced).
        let (writes, ()) = tokio::join!(ensure_vn_agent_access(&ctx, &tenant, "shop"), async {
            let applied = supers
                .expect(
                    "PATCH",
                    &format!(
                        "/apis/rbac.authorization.k8s.io/v1/namespaces/{super_namespace}/rolebindings/vc-vn-agent?"
                    ),
                )
                .await;
            assert!(applied.uri.contains("force=true"), "{}", applied.uri);
            assert_eq!(applied.body["roleRef"]["name"], "vc-vn-agent-tenant-pods");
            applied.echo();
        });
        assert_eq!(writes.expect("applied"), 1);

        // In the cache as desired: nothing to do.
        put(&mut writers.role_bindings, binding.clone());
        assert_eq!(
            ensure_vn_agent_access(&ctx, &tenant, "shop")
                .await
                .expect("in sync"),
            0
        );

        // Someone widened it to another subject: forced back.
        let mut widened = binding.clone();
        widened.subjects.as_mut().expect("subjects").push(Subject {
            kind: "ServiceAccount".into(),
            name: "intruder".into(),
            namespace: Some("elsewhere".into()),
            api_group: None,
        });
        put(&mut writers.role_bindings, widened);
        let (writes, ()) = tokio::join!(ensure_vn_agent_access(&ctx, &tenant, "shop"), async {
            supers
                .expect("PATCH", "/apis/rbac.authorization.k8s.io/v1/")
                .await
                .echo();
        });
        assert_eq!(writes.expect("repaired"), 1);

        // Turned off: the syncer's binding is deleted.
        put(&mut writers.role_bindings, binding);
        ctx.config.vn_agent_access = None;
        let (writes, ()) = tokio::join!(ensure_vn_agent_access(&ctx, &tenant, "shop"), async {
            supers
                .expect(
                    "DELETE",
                    &format!(
                        "/apis/rbac.authorization.k8s.io/v1/namespaces/{super_namespace}/rolebindings/vc-vn-agent"
                    ),
                )
                .await
                .echo();
        });
        assert_eq!(writes.expect("deleted"), 1);
    }

    #[test]
    fn bindings_are_recognised_only_by_their_annotations() {
        let meta = ObjectMeta {
            annotations: Some(
                [
                    (ANNOTATION_GRANTS_CLUSTER.to_owned(), "key".to_owned()),
                    (ANNOTATION_GRANTS_NAMESPACE.to_owned(), "shop".to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(grants(&meta), Some(("key", "shop")));
        assert_eq!(grants(&ObjectMeta::default()), None);
    }
}
