//! What tenants consume, measured every `--usage-interval-seconds`: CPU and memory their super pods use
//! (each node's stats summary through the super apiserver's node proxy), what they hold (pods, claims and
//! the storage they request, LoadBalancer Services, node ports) from the syncer's caches, and for native
//! tenants the request rate of their apiserver (`apiserver_request_total` of its `/metrics`, through the
//! syncer's admin client of the tenant).
//!
//! The figures become per-tenant series ([`metrics::UsageMetrics`]) and the VirtualCluster's
//! `status.usage`, applied under the field manager `vc-syncer-usage` when it changed, so `kubectl vc top`
//! and `describe` read them without scraping anything.

pub mod figures;
pub mod metrics;
pub mod settings;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use crds::{ControlPlaneMode, TenantUsage, VirtualCluster, wellknown::FIELD_MANAGER_SYNCER_USAGE};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::{
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::reflector::ObjectRef,
};

use crate::{
    engine::{context::Context, queue::TenantId},
    error::{Error, Result, on_super, on_tenant},
    tenancy::tenant::Tenant,
};
use figures::{Consumption, Holdings, MetricsText, RequestCounter, Summary};
use metrics::UsageLabels;
pub use settings::UsageSettings;

/// How long one node's summary or one tenant's `/metrics` may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes of a tenant apiserver's `/metrics` read (they are a few MiB; more is not an apiserver's).
const MAX_METRICS_BYTES: usize = 64 << 20;

/// One tenant's figures of one measurement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measurement {
    /// CPU and memory, when node stats are read.
    pub consumption: Option<Consumption>,
    /// What it holds.
    pub holdings: Holdings,
    /// Apiserver requests per second, when known (native tenants, from the second reading on).
    pub requests_per_second: Option<f64>,
}

impl Measurement {
    /// The figures as `status.usage` (without the time).
    pub fn status(&self) -> TenantUsage {
        let quantity = |text: String| Some(Quantity(text));
        let count = |n: u64| Some(i64::try_from(n).unwrap_or(i64::MAX));
        TenantUsage {
            time: None,
            cpu: self
                .consumption
                .and_then(|c| quantity(figures::cpu_quantity(c.cpu_nano_cores))),
            memory: self
                .consumption
                .and_then(|c| quantity(c.memory_bytes.to_string())),
            measured_pods: self.consumption.and_then(|c| count(c.measured_pods)),
            pods: count(self.holdings.pods),
            persistent_volume_claims: count(self.holdings.claims),
            storage: quantity(self.holdings.storage_bytes.to_string()),
            load_balancers: count(self.holdings.load_balancers),
            node_ports: count(self.holdings.node_ports),
            apiserver_requests_per_second: self
                .requests_per_second
                .and_then(|r| quantity(figures::rate_quantity(r))),
        }
    }
}

/// What the loop keeps between measurements.
#[derive(Default)]
pub struct Measurer {
    /// The last request counter read from each native tenant and when.
    counters: HashMap<TenantId, (RequestCounter, Instant)>,
    /// VirtualClusters (uid) whose stale `status.usage` this syncer already tried to clear.
    cleared: HashSet<String>,
    /// Since when each VirtualCluster (uid) with a `status.usage` has not been attached: it is cleared only
    /// after a grace period, so a restarting syncer does not clear every tenant's figures before it has
    /// attached them again.
    unattached_since: HashMap<String, Instant>,
    /// When this syncer last wrote each VirtualCluster's (uid) `status.usage`.
    written: HashMap<String, Instant>,
    /// Nodes whose summary could not be read last time: warned about once, not every interval.
    failing_nodes: HashSet<String>,
}

/// Measures every attached tenant every interval until the syncer stops.
pub async fn run(ctx: Arc<Context>) {
    let Some(interval) = ctx.config.usage.interval else {
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut measurer = Measurer::default();
    loop {
        ticker.tick().await;
        let started = Instant::now();
        measurer.measure(&ctx).await;
        ctx.metrics
            .usage
            .duration
            .observe(started.elapsed().as_secs_f64());
    }
}

fn read_failed(ctx: &Context, source: &'static str) {
    ctx.metrics
        .usage
        .failures
        .get_or_create(&metrics::SourceLabels { source })
        .inc();
}

/// A node's stats summary through the super apiserver's node proxy.
pub async fn read_summary(client: &Client, node: &str) -> Result<Summary> {
    let path = format!("/api/v1/nodes/{node}/proxy/stats/summary?only_cpu_and_memory=true");
    let what = format!("reading the stats summary of node {node}");
    let request = http::Request::get(&path)
        .body(Vec::new())
        .map_err(|e| Error::Measure {
            what: what.clone(),
            reason: e.to_string(),
        })?;
    match tokio::time::timeout(READ_TIMEOUT, client.request::<Summary>(request)).await {
        Ok(answer) => answer.map_err(on_super(what)),
        Err(_) => Err(Error::Measure {
            what,
            reason: format!("no answer within {}s", READ_TIMEOUT.as_secs()),
        }),
    }
}

/// The request counter of a tenant apiserver's `/metrics`, read a chunk at a time (never the whole body
/// in memory).
pub async fn read_request_counter(client: &Client, tenant: &str) -> Result<RequestCounter> {
    let what = "reading the apiserver's /metrics";
    let failed = |reason: String| Error::Measure {
        what: format!("tenant {tenant}: {what}"),
        reason,
    };
    let read = async {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| failed(e.to_string()))?;
        let body = client
            .request_stream(request)
            .await
            .map_err(on_tenant(tenant, what))?;
        let mut body = Box::pin(body);
        let mut text = MetricsText::default();
        let mut total = 0usize;
        loop {
            let chunk = body.fill_buf().await.map_err(|e| failed(e.to_string()))?;
            if chunk.is_empty() {
                break;
            }
            let length = chunk.len();
            text.feed(chunk);
            body.consume_unpin(length);
            total += length;
            if total > MAX_METRICS_BYTES {
                return Err(failed(format!("more than {MAX_METRICS_BYTES} bytes")));
            }
        }
        text.finish()
            .ok_or_else(|| failed("no apiserver_request_total in it".into()))
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| Err(failed(format!("no answer within {}s", READ_TIMEOUT.as_secs()))))
}

fn virtual_cluster_of(ctx: &Context, tenant: &Tenant) -> Option<Arc<VirtualCluster>> {
    let identity = &tenant.identity;
    ctx.virtual_clusters
        .get(&ObjectRef::new(&identity.vc_name).within(&identity.vc_namespace))
        .filter(|vc| vc.uid().as_deref() == Some(identity.vc_uid.as_str()))
}

/// `status.usage` differs from `desired` in a figure (the time aside).
fn usage_changed(vc: &VirtualCluster, desired: &TenantUsage) -> bool {
    let current = vc.status.as_ref().and_then(|s| s.usage.clone());
    current.is_none_or(|current| {
        TenantUsage {
            time: None,
            ..current
        } != *desired
    })
}

impl Measurer {
    /// Measures every attached tenant once: series, and `status.usage` where it changed.
    pub async fn measure(&mut self, ctx: &Context) {
        let tenants = ctx.tenants.all();
        let ids: HashSet<TenantId> = tenants.iter().map(|t| t.id.clone()).collect();
        let pods = ctx.supers.pods.copies.state();
        let consumption = match ctx.config.usage.node_stats {
            true => Some(self.consumption(ctx, &ids, &pods).await),
            false => None,
        };
        let holdings = figures::holdings(
            &ids,
            pods.iter().map(|p| &**p),
            ctx.supers.claims.state().iter().map(|c| &**c),
            ctx.supers.services.state().iter().map(|s| &**s),
        );
        let rates = self.request_rates(ctx, &tenants).await;
        let now = Time(Timestamp::now());
        for tenant in &tenants {
            let measurement = Measurement {
                consumption: consumption
                    .as_ref()
                    .map(|sums| sums.get(&tenant.id).copied().unwrap_or_default()),
                holdings: holdings.get(&tenant.id).copied().unwrap_or_default(),
                requests_per_second: rates.get(&tenant.id).copied(),
            };
            self.publish(ctx, tenant, &measurement);
            self.write_status(ctx, tenant, &measurement, &now).await;
        }
        self.clear_detached(ctx, &ids).await;
        self.counters.retain(|id, _| ids.contains(id));
    }

    async fn consumption(
        &mut self,
        ctx: &Context,
        tenants: &HashSet<TenantId>,
        pods: &[Arc<crate::cache::pods::SuperPod>],
    ) -> HashMap<TenantId, Consumption> {
        let owned = figures::owned_pods(pods.iter().map(|p| &**p), tenants);
        let nodes = figures::nodes_of(&owned);
        let answers: Vec<(String, Result<Summary>)> = futures::stream::iter(nodes)
            .map(|node| async move {
                let summary = read_summary(&ctx.super_client, &node).await;
                (node, summary)
            })
            .buffer_unordered(ctx.config.usage.concurrency.max(1))
            .collect()
            .await;
        let mut summaries = Vec::with_capacity(answers.len());
        let mut failing = HashSet::new();
        for (node, answer) in answers {
            match answer {
                Ok(summary) => {
                    if self.failing_nodes.contains(&node) {
                        tracing::info!(node = %node, "usage: stats summary read again");
                    }
                    summaries.push((node, summary));
                }
                Err(error) => {
                    read_failed(ctx, "node");
                    let error = &error as &dyn std::error::Error;
                    match self.failing_nodes.contains(&node) {
                        true => {
                            tracing::debug!(node = %node, error, "usage: still no stats summary from node")
                        }
                        false => tracing::warn!(
                            node = %node,
                            error,
                            "usage: no stats summary from node; its pods' CPU and memory are left out until it answers"
                        ),
                    }
                    failing.insert(node);
                }
            }
        }
        self.failing_nodes = failing;
        figures::consumption(summaries.iter().map(|(n, s)| (n.as_str(), s)), &owned)
    }

    /// Requests per second of every native tenant, from the second reading on.
    async fn request_rates(&mut self, ctx: &Context, tenants: &[Arc<Tenant>]) -> HashMap<TenantId, f64> {
        let native: Vec<Arc<Tenant>> = tenants
            .iter()
            .filter(|t| {
                virtual_cluster_of(ctx, t).is_some_and(|vc| vc.mode() == ControlPlaneMode::Provisioned)
            })
            .cloned()
            .collect();
        let readings: Vec<(TenantId, Result<RequestCounter>, Instant)> = futures::stream::iter(native)
            .map(|tenant| async move {
                let counter = read_request_counter(&tenant.client, &tenant.id).await;
                (tenant.id.clone(), counter, Instant::now())
            })
            .buffer_unordered(ctx.config.usage.concurrency.max(1))
            .collect()
            .await;
        let mut rates = HashMap::new();
        for (id, counter, at) in readings {
            let counter = match counter {
                Ok(counter) => counter,
                Err(error) => {
                    read_failed(ctx, "apiserver");
                    tracing::warn!(tenant = %id, error = &error as &dyn std::error::Error, "usage: no request counter from the tenant apiserver");
                    self.counters.remove(&id);
                    continue;
                }
            };
            if let Some((before, then)) = self.counters.get(&id)
                && let Some(rate) =
                    figures::request_rate(before, &counter, at.duration_since(*then).as_secs_f64())
            {
                rates.insert(id.clone(), rate);
                if let Some(tenant) = ctx.tenants.get(&id) {
                    ctx.metrics
                        .usage
                        .apiserver_requests
                        .get_or_create(&UsageLabels {
                            tenant: tenant.identity.vc_ref(),
                        })
                        .inc_by(counter.total - before.total);
                }
            }
            self.counters.insert(id, (counter, at));
        }
        rates
    }

    fn publish(&self, ctx: &Context, tenant: &Tenant, measurement: &Measurement) {
        let usage = &ctx.metrics.usage;
        let labels = UsageLabels {
            tenant: tenant.identity.vc_ref(),
        };
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        if let Some(consumption) = measurement.consumption {
            usage
                .cpu_cores
                .get_or_create(&labels)
                .set(consumption.cpu_nano_cores as f64 / 1e9);
            usage
                .memory_bytes
                .get_or_create(&labels)
                .set(gauge(consumption.memory_bytes));
            usage
                .measured_pods
                .get_or_create(&labels)
                .set(gauge(consumption.measured_pods));
        }
        let held = &measurement.holdings;
        usage.claims.get_or_create(&labels).set(gauge(held.claims));
        usage
            .storage_bytes
            .get_or_create(&labels)
            .set(gauge(held.storage_bytes));
        usage
            .load_balancers
            .get_or_create(&labels)
            .set(gauge(held.load_balancers));
        usage
            .node_ports
            .get_or_create(&labels)
            .set(gauge(held.node_ports));
    }

    /// Applies `status.usage` when a figure changed.
    async fn write_status(&mut self, ctx: &Context, tenant: &Tenant, measurement: &Measurement, now: &Time) {
        let Some(vc) = virtual_cluster_of(ctx, tenant) else {
            return;
        };
        self.cleared.remove(&tenant.identity.vc_uid);
        let desired = measurement.status();
        let uid = &tenant.identity.vc_uid;
        let recently = self
            .written
            .get(uid)
            .is_some_and(|at| at.elapsed() < ctx.config.usage.status_interval);
        if recently || !usage_changed(&vc, &desired) {
            return;
        }
        let usage = TenantUsage {
            time: Some(now.clone()),
            ..desired
        };
        self.written.insert(uid.clone(), Instant::now());
        if let Err(error) = apply_usage(ctx, &vc, Some(&usage)).await {
            tracing::warn!(
                tenant = %tenant.identity.vc_ref(),
                error = &error as &dyn std::error::Error,
                "usage: writing status.usage"
            );
        }
    }

    /// Removes `status.usage` (once) from VirtualClusters no longer measured: detached, paused, or measured
    /// by a syncer before this one, so that no stale figures read as current.
    async fn clear_detached(&mut self, ctx: &Context, attached: &HashSet<TenantId>) {
        let interval = ctx.config.usage.interval.unwrap_or_default();
        let grace = ctx.config.usage.status_interval.max(interval * 2);
        let attached_uids: HashSet<String> = attached
            .iter()
            .filter_map(|id| ctx.tenants.get(id))
            .map(|t| t.identity.vc_uid.clone())
            .collect();
        let virtual_clusters = ctx.virtual_clusters.state();
        let existing: HashSet<String> = virtual_clusters.iter().filter_map(|vc| vc.uid()).collect();
        self.unattached_since.retain(|uid, _| existing.contains(uid));
        self.cleared.retain(|uid| existing.contains(uid));
        self.written.retain(|uid, _| existing.contains(uid));
        for vc in virtual_clusters {
            let Some(uid) = vc.uid() else {
                continue;
            };
            let has_usage = vc.status.as_ref().is_some_and(|s| s.usage.is_some());
            // Sharded: another replica measures the tenants it holds.
            let ours = crds::naming::cluster_key_of(&vc).is_some_and(|key| ctx.owns(&key));
            if !ours || attached_uids.contains(&uid) || !has_usage || self.cleared.contains(&uid) {
                self.unattached_since.remove(&uid);
                continue;
            }
            let since = *self
                .unattached_since
                .entry(uid.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < grace {
                continue;
            }
            self.unattached_since.remove(&uid);
            self.written.remove(&uid);
            self.cleared.insert(uid);
            if let Err(error) = apply_usage(ctx, &vc, None).await {
                tracing::warn!(
                    namespace = %vc.namespace().unwrap_or_default(),
                    name = %vc.name_any(),
                    error = &error as &dyn std::error::Error,
                    "usage: removing status.usage of a tenant no longer measured"
                );
            }
        }
    }
}

/// Server-side applies `status.usage` (`None`: gives it up, which removes it) under the usage field
/// manager, which owns nothing else.
pub async fn apply_usage(ctx: &Context, vc: &VirtualCluster, usage: Option<&TenantUsage>) -> Result<()> {
    let status = match usage {
        Some(usage) => serde_json::json!({ "usage": usage }),
        None => serde_json::json!({}),
    };
    let patch = serde_json::json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "VirtualCluster",
        "status": status,
    });
    let namespace = vc.namespace().unwrap_or_default();
    let name = vc.name_any();
    let api: Api<VirtualCluster> = Api::namespaced(ctx.super_client.clone(), &namespace);
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER_SYNCER_USAGE).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(on_super(format!(
        "applying status.usage of VirtualCluster {namespace}/{name}"
    )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::engine::context::testing::{self, from_json, put};

    const KEY: &str = "team-abc123-vc";

    fn super_pod(name: &str, cluster: &str) -> crate::cache::pods::SuperPod {
        from_json(json!({
            "metadata": {"name": name, "namespace": format!("{cluster}-apps"), "uid": format!("uid-{name}"),
                "annotations": {"tenancy.x-k8s.io/cluster": cluster, "tenancy.x-k8s.io/namespace": "apps"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        }))
    }

    fn summary() -> Value {
        let entry = |name: &str, cluster: &str, cpu: u64, memory: u64| {
            json!({"podRef": {"name": name, "namespace": format!("{cluster}-apps"), "uid": format!("uid-{name}")},
                "cpu": {"usageNanoCores": cpu}, "memory": {"workingSetBytes": memory}})
        };
        json!({"node": {"nodeName": "n1"}, "pods": [
            entry("web", KEY, 250_000_000, 64 << 20),
            entry("theirs", "other-def456-vc", 900_000_000, 900 << 20),
        ]})
    }

    use serde_json::Value;

    /// One measurement reads the node's summary and applies `status.usage` under the usage field manager;
    /// the next one, with the same figures, writes nothing.
    #[tokio::test]
    async fn status_usage_is_applied_under_its_own_manager_and_only_when_a_figure_changed() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, _tenant_apiserver) = testing::mock();
        let (mut ctx, mut writers) = testing::context(super_client);
        ctx.config.usage.status_interval = Duration::ZERO;
        let (virtual_clusters, mut vc_writer) = kube::runtime::reflector::store();
        ctx.virtual_clusters = virtual_clusters;
        let (_tenant, _) = testing::tenant(&ctx, tenant_client, Default::default());
        let vc: VirtualCluster = from_json(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": "vc", "namespace": "team", "uid": "vc-uid"},
            "spec": {"kubeconfigSecretRef": {"name": "kc"}},
        }));
        put(&mut vc_writer, vc.clone());
        put(&mut writers.pods, super_pod("web", KEY));
        put(&mut writers.pods, super_pod("theirs", "other-def456-vc"));
        put(
            &mut writers.services,
            from_json(
                json!({"metadata": {"name": "lb", "namespace": format!("{KEY}-apps"),
                "annotations": {"tenancy.x-k8s.io/cluster": KEY, "tenancy.x-k8s.io/namespace": "apps"}},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]}}),
            ),
        );

        let mut measurer = Measurer::default();
        let script = async move {
            supers
                .expect(
                    "GET",
                    "/api/v1/nodes/n1/proxy/stats/summary?only_cpu_and_memory=true",
                )
                .await
                .ok(summary());
            let call = supers
                .expect(
                    "PATCH",
                    "/apis/tenancy.x-k8s.io/v1alpha1/namespaces/team/virtualclusters/vc/status?",
                )
                .await;
            assert!(call.uri.contains("fieldManager=vc-syncer-usage"), "{}", call.uri);
            assert!(call.uri.contains("force=true"), "{}", call.uri);
            let usage = call.body["status"]["usage"].clone();
            assert_eq!(usage["cpu"], "250m");
            assert_eq!(usage["memory"], (64u64 << 20).to_string());
            assert_eq!(usage["pods"], 1);
            assert_eq!(usage["measuredPods"], 1);
            assert_eq!(usage["loadBalancers"], 1);
            assert_eq!(usage["nodePorts"], 1);
            assert_eq!(usage["storage"], "0");
            assert!(usage["time"].is_string());
            assert!(
                usage.get("apiserverRequestsPerSecond").is_none(),
                "adopted: not metered"
            );
            assert_eq!(
                call.body["status"].as_object().map(|s| s.len()),
                Some(1),
                "usage only"
            );
            call.echo();
        };
        mock_apiserver::run(script, measurer.measure(&ctx)).await;
        let labels = UsageLabels {
            tenant: "team/vc".into(),
        };
        let cores = ctx.metrics.usage.cpu_cores.get(&labels).map(|g| g.get());
        assert_eq!(cores, Some(0.25));
        assert_eq!(
            ctx.metrics.usage.load_balancers.get(&labels).map(|g| g.get()),
            Some(1)
        );

        // The VirtualCluster now shows these figures: the same measurement writes nothing.
        let mut measured = vc;
        measured.status = Some(crds::VirtualClusterStatus {
            usage: Some(TenantUsage {
                time: Some(Time(Timestamp::now())),
                ..Measurement {
                    consumption: Some(Consumption {
                        cpu_nano_cores: 250_000_000,
                        memory_bytes: 64 << 20,
                        measured_pods: 1,
                    }),
                    holdings: Holdings {
                        pods: 1,
                        load_balancers: 1,
                        node_ports: 1,
                        ..Default::default()
                    },
                    requests_per_second: None,
                }
                .status()
            }),
            ..Default::default()
        });
        put(&mut vc_writer, measured);
        let (super_client, mut supers) = testing::mock();
        ctx.super_client = super_client;
        let script = async move {
            supers
                .expect("GET", "/api/v1/nodes/n1/proxy/stats/summary")
                .await
                .ok(summary());
            supers.idle().await;
        };
        mock_apiserver::run(script, measurer.measure(&ctx)).await;
    }
}
