//! Attach's side of the shards' handover: what a replica does to a tenant that changes hands, asked by
//! [`crate::tenancy::shards::handover`] through [`Handover`], which names nothing above the shards.

use std::sync::Arc;

use super::cleanup::{clean_up, detach};
use crate::{engine::context::Context, tenancy::shards::Handover};

/// Stops and cleans up tenants as the shards hand them over, and runs the duties' chore of the attach
/// journal.
#[derive(Clone)]
pub struct AttachHandover {
    ctx: Arc<Context>,
}

impl AttachHandover {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

impl Handover for AttachHandover {
    fn stop(&self, cluster_key: &str) {
        detach(&self.ctx, cluster_key);
    }

    async fn remove(&self, cluster_key: &str) {
        clean_up(&self.ctx, cluster_key).await;
    }

    async fn run_duties(&self) {
        if let Some(journal) = self.ctx.journal.as_ref() {
            crate::tenancy::journal::stops::collect(&self.ctx, journal).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Namespace;
    use serde_json::json;

    use super::*;
    use crate::{
        engine::context::testing::{self, from_json},
        tenancy::settings::TenantSettings,
    };

    /// What the shards ask reaches attach: a stop detaches the tenant, a removal deletes its super
    /// namespaces (pinned to their uid), and without an attach journal the duties' chores write nothing.
    #[tokio::test]
    async fn the_shards_asks_detach_the_tenant_and_delete_its_namespaces() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, _tenants) = testing::mock();
        let (ctx, mut writers) = testing::context(super_client);
        let ctx = Arc::new(ctx);
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let key = tenant.identity.cluster_key.clone();
        let name = crds::naming::super_namespace(&key, "shop");
        let namespace: Namespace = from_json(json!({"metadata": {"name": name, "uid": "ns-uid",
            "annotations": {crds::wellknown::ANNOTATION_CLUSTER: key, crds::wellknown::ANNOTATION_NAMESPACE: "shop"}}}));
        testing::put(&mut writers.namespaces, namespace);
        let hands = AttachHandover::new(ctx.clone());

        hands.stop(&key);
        assert!(ctx.tenants.get(&key).is_none(), "detached");
        let script = async move {
            let delete = supers
                .expect("DELETE", &format!("/api/v1/namespaces/{name}?"))
                .await;
            assert_eq!(delete.body["preconditions"]["uid"], "ns-uid");
            delete.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
            supers.idle().await;
        };
        mock_apiserver::run(script, async {
            hands.remove(&key).await;
            hands.run_duties().await;
        })
        .await;
    }
}
