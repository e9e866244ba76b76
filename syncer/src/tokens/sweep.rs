//! The sweep, the patrol's part: a gone pod's keys leave its shard with the shard's next write, or here
//! (`syncer_patrol_findings_total{resource="secret",finding="stale-token-keys"}`), and a shard that serves
//! no pod is deleted. The delete path of a pod writes nothing.

use super::{
    Tokens,
    records::{Entry, shard_index},
};
use crate::{engine::context::Context, tenancy::identity};

impl Tokens {
    /// The patrol's part: removes gone pods' keys from every shard of attached tenants, and deletes shards
    /// that serve no pod. Returns how many shards it wrote.
    pub async fn sweep(&self, ctx: &Context) -> usize {
        let mut swept = 0;
        for cached in ctx.supers.pods.token_secrets.state() {
            let (Some(namespace), Some(tenant_namespace), Some(index)) = (
                cached.metadata.namespace.clone(),
                identity::tenant_namespace(&cached.metadata),
                cached.metadata.name.as_deref().and_then(shard_index),
            ) else {
                continue;
            };
            let Some(tenant) = identity::owner_cluster(&cached.metadata).and_then(|c| ctx.tenants.get(c))
            else {
                continue;
            };
            let shard = self.shard(&namespace, tenant_namespace, index);
            let stale = {
                let mut state = shard.load(ctx);
                shard.settle(ctx, &mut state);
                !shard.gone(ctx, &state).is_empty()
            };
            if !stale {
                continue;
            }
            crate::engine::patrol::findings::found(ctx, "secret", "stale-token-keys");
            match shard.submit(ctx, &tenant, Entry::Sweep).await {
                Ok(true) => swept += 1,
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%namespace, shard = %shard.name, %error, "removing gone pods' tokens")
                }
            }
        }
        swept
    }
}
