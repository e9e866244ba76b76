//! The machinery every kind runs on: the fair [`queue`]s and the one list of kinds their [`items`] name,
//! the per-tenant cache [`budget`], the super-cluster [`write_gate`], the [`group_commit`] of batched writes,
//! the flags ([`config`], the engine's own in [`flags`]), the [`context`] every reconcile gets, the Kubernetes [`events`] the syncer writes
//! and forwards, the [`workers`] that drain the queues and the [`patrol`] that repairs drift, and their
//! [`metrics`].

pub mod budget;
pub mod config;
pub mod context;
pub mod events;
pub mod flags;
pub mod group_commit;
pub mod items;
pub mod metrics;
pub mod patrol;
pub mod queue;
pub mod workers;
pub mod write_gate;
