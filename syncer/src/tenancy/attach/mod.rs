//! Attaching tenants: one supervisor per VirtualCluster reads its kubeconfig, checks the tenant apiserver,
//! starts the tenant's watches, reports on the VirtualCluster, and detaches it when it goes away — without
//! disturbing any other tenant.
//!
//! - [`supervisor`]: the loop that follows every VirtualCluster, and each one's lifecycle (attach, wait,
//!   pause, back off, detach);
//! - [`attempt`]: one attempt of that loop: attach the tenant (again) or check that it still answers;
//! - [`eligibility`]: the pure rules of whether a VirtualCluster is attached, and what its status says
//!   about pauses and the identity it was first synced with;
//! - [`connect`]: reading the kubeconfig, building the tenant client and the checks made on connect
//!   (version, credentials, which cluster it is);
//! - [`report`]: the conditions and events written on the VirtualCluster;
//! - [`cleanup`]: what is stopped and removed when a tenant is detached, paused or deleted;
//! - [`handover`]: the same asked by the shards as tenants change hands between replicas.

pub mod attempt;
pub mod cleanup;
pub mod connect;
pub mod eligibility;
pub mod handover;
pub mod report;
pub mod supervisor;

#[cfg(test)]
mod fixtures;

pub use attempt::update_settings;
pub use cleanup::{clean_up, delete_namespaces, detach, orphaned, remove_paused_pods};
pub use connect::{Answer, Failure, REASON_IDENTITY_CHANGED, REASON_RESPONSE_TOO_LARGE, load_kubeconfig};
pub use eligibility::{REASON_TENANT_PAUSED, eligible, identity_of};
pub use handover::AttachHandover;
pub use report::{CONDITION_SPEC_LIMITED, REASON_PLATFORM_LIMITS, limited_settings, recorder};
pub use supervisor::supervise;
