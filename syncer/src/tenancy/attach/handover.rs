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
