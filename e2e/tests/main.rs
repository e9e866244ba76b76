//! The end-to-end suite as one test binary: every area is a module, so vc-manager, the syncer and vn-agent
//! are linked once rather than once per area. Run one area with `cargo test -p e2e --test e2e <module>::`,
//! e.g. `cargo test -p e2e --test e2e harness:: -- --nocapture`.
//!
//! Tests run in parallel across areas as within one (the default is one thread per core); tests on real
//! nodes wait for the machine-wide real-node lock, so one set of real nodes runs at a time.

mod kubectl_support;
mod object_support;
mod vc_manager_support;

mod api;
mod chart;
mod crash_backoff;
mod custom_resources;
mod disruption;
mod dns;
mod download;
mod ephemeral_containers;
mod harness;
mod hostile;
mod hostile_limits;
mod hostile_meta;
mod hostile_pods;
mod hostile_round2;
mod hostile_shared;
mod kubectl_vc;
mod native_tenants;
mod network_policies;
mod node_failure;
mod pause;
mod platform;
mod pod_finalizers;
mod pod_updates;
mod real_nodes;
mod sandbox;
mod shards;
mod snapshots;
mod syncer;
mod tenant_extensions;
mod usage;
mod vc_manager;
mod vc_manager_adopt;
mod vn_agent;
mod vn_agent_streaming;
mod vnodes;
