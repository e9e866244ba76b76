//! Tenants: which tenant a super object belongs to ([`identity`]), what a VirtualCluster's spec may ask
//! ([`settings`]), an attached tenant and its caches ([`tenant`]), attaching and detaching them
//! ([`attach`], its flags in [`attach_flags`]), the attach [`journal`] that holds back a tenant that made a process stop, and the
//! [`shards`] that share tenants across replicas; the tenants' [`metrics`].

pub mod attach;
pub mod attach_flags;
pub mod identity;
pub mod journal;
pub mod metrics;
pub mod settings;
pub mod shards;
pub mod tenant;
