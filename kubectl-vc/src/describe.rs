//! `kubectl vc describe`: a VirtualCluster's settings, status and conditions, its recent events, its super
//! namespaces with their pods, and what those pods use against `spec.quota`.

use crds::{
    VirtualCluster,
    v1alpha1::Adoption,
    wellknown::{ANNOTATION_ADMIN_KUBECONFIG, LABEL_VC_NAME, LABEL_VC_NAMESPACE},
};
use k8s_openapi::{
    api::core::v1::{Event, Namespace, Pod},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{Api, Client, ResourceExt, api::ListParams};

use serde_json::{Value, json};

use crate::{
    Error, Result, Streams,
    args::DescribeArgs,
    duration,
    kubeconfig::get_virtual_cluster,
    list::{self, super_namespaces},
    output, table,
    usage::{self, Usage},
};

/// How many events `describe` shows (the most recent).
pub const MAX_EVENTS: usize = 20;

/// A super namespace of the tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperNamespace {
    /// Its name in the super cluster.
    pub name: String,
    /// The tenant namespace it holds (annotation `tenancy.x-k8s.io/namespace`).
    pub tenant_namespace: String,
    /// Pods in it.
    pub pods: usize,
}

/// The super namespaces of `vc` among `namespaces`, with their pods counted.
pub fn super_namespace_rows(
    vc: &VirtualCluster,
    namespaces: &[ObjectMeta],
    pods: &[Pod],
) -> Vec<SuperNamespace> {
    let owned = super_namespaces(vc, namespaces);
    owned
        .iter()
        .map(|name| SuperNamespace {
            name: name.clone(),
            tenant_namespace: namespaces
                .iter()
                .find(|m| m.name.as_deref() == Some(name))
                .and_then(crds::Owner::of)
                .map(|owner| owner.tenant_namespace.to_owned())
                .unwrap_or_default(),
            pods: pods
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(name))
                .count(),
        })
        .collect()
}

/// When an event last happened: its series' last observation, else `lastTimestamp`, `eventTime`,
/// `firstTimestamp`, creation.
pub fn event_time(event: &Event) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| event.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The events sorted by time, the last [`MAX_EVENTS`].
pub fn recent_events(mut events: Vec<Event>) -> Vec<Event> {
    events.sort_by_key(event_time);
    let skip = events.len().saturating_sub(MAX_EVENTS);
    events.split_off(skip)
}

fn age_since(time: Option<Timestamp>, now: Timestamp) -> String {
    time.map(|t| duration::age(now.as_second() - t.as_second()))
        .unwrap_or_else(|| "<unknown>".into())
}

fn or_none(value: Option<String>) -> String {
    value.filter(|v| !v.is_empty()).unwrap_or_else(|| "<none>".into())
}

/// Where the tenant's control plane comes from.
pub fn origin(vc: &VirtualCluster) -> (&'static str, String) {
    match vc.adoption() {
        Some(Adoption::Secret(reference)) => (
            "Adopted from",
            format!(
                "Secret {}/{} key {}",
                vc.namespace().unwrap_or_default(),
                reference.name,
                reference.key
            ),
        ),
        Some(Adoption::InlineBase64(_)) => (
            "Adopted from",
            format!("annotation {ANNOTATION_ADMIN_KUBECONFIG} (inline)"),
        ),
        None => ("Cluster version", or_none(vc.spec.cluster_version_name.clone())),
    }
}

/// Everything `describe` shows besides the VirtualCluster.
#[derive(Clone, Debug, Default)]
pub struct Related {
    /// Its super namespaces.
    pub namespaces: Vec<SuperNamespace>,
    /// What their pods use.
    pub usage: Usage,
    /// Events about it.
    pub events: Vec<Event>,
}

/// The text of `describe`.
pub fn render(vc: &VirtualCluster, related: &Related, now: Timestamp) -> String {
    let status = vc.status.clone().unwrap_or_default();
    let spec = &vc.spec;
    let (origin_label, origin) = origin(vc);
    let quota = spec.quota.as_ref().map(|q| {
        let parts: Vec<String> = [
            ("pods", &q.pods),
            ("requests.cpu", &q.requests_cpu),
            ("requests.memory", &q.requests_memory),
            ("limits.cpu", &q.limits_cpu),
            ("limits.memory", &q.limits_memory),
            ("services", &q.services),
            ("services.nodeports", &q.services_node_ports),
            ("services.loadbalancers", &q.services_load_balancers),
            ("persistentvolumeclaims", &q.persistentvolumeclaims),
            ("requests.storage", &q.requests_storage),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", v.0)))
        .collect();
        parts.join(", ")
    });
    let rate_limit = spec
        .rate_limit
        .as_ref()
        .map(|r| format!("{} writes/s, burst {}", r.qps, r.effective_burst()));
    let pod_policy = spec.pod_policy.as_ref().map(|p| {
        let mut allowed: Vec<String> = [
            (p.host_network, "hostNetwork"),
            (p.host_pid, "hostPID"),
            (p.host_ipc, "hostIPC"),
            (p.privileged, "privileged"),
            (p.host_path, "hostPath"),
            (p.host_ports, "hostPorts"),
            (p.unconfined, "unconfined profiles"),
            (p.localhost_profiles, "Localhost profiles"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| name.to_owned())
        .collect();
        for (what, list) in [
            ("capabilities", &p.capabilities),
            ("taints", &p.allowed_taints),
            ("node labels", &p.allowed_node_labels),
        ] {
            if !list.is_empty() {
                allowed.push(format!("{what} {}", list.join(" ")));
            }
        }
        allowed.join(", ")
    });
    let created = vc
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| format!("{} ({} ago)", t.0, list::age(&vc.metadata, now)));
    let mut text = table::fields(&[
        ("Name", vc.name_any()),
        ("Namespace", vc.namespace().unwrap_or_default()),
        ("Created", or_none(created)),
        ("Phase", or_none(status.phase.map(|p| p.to_string()))),
        ("Reason", or_none(status.reason.clone())),
        ("Message", or_none(status.message.clone())),
        ("Cluster namespace", or_none(status.cluster_namespace.clone())),
        (origin_label, origin),
        ("Weight", spec.weight.to_string()),
        ("Quota", or_none(quota)),
        ("Rate limit", or_none(rate_limit)),
        ("Runtime class", or_none(spec.runtime_class_name.clone())),
        (
            "Pod policy",
            pod_policy.filter(|p| !p.is_empty()).map_or_else(
                || "nothing beyond the platform's defaults".into(),
                |p| format!("allows {p}"),
            ),
        ),
    ]);

    text.push_str("\nConditions:\n");
    if status.conditions.is_empty() {
        text.push_str("  <none>\n");
    } else {
        let mut conditions = status.conditions.clone();
        conditions.sort_by_key(|c| {
            crds::wellknown::NATIVE_CONDITIONS
                .iter()
                .position(|t| *t == c.type_)
                .unwrap_or(usize::MAX)
        });
        let rows: Vec<Vec<String>> = conditions
            .iter()
            .map(|c| {
                vec![
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    age_since(Some(c.last_transition_time.0), now),
                    table::truncate(&c.message, 120),
                ]
            })
            .collect();
        text.push_str(&table::render(
            &["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
            &rows,
            2,
        ));
    }

    text.push_str("\nUsage (non-terminated pods in the super cluster):\n");
    let rows: Vec<Vec<String>> = usage::against(&related.usage, spec.quota.as_ref())
        .into_iter()
        .map(|l| vec![l.resource.to_owned(), l.used, l.limit, l.percent])
        .collect();
    text.push_str(&table::render(&["RESOURCE", "USED", "QUOTA", "%"], &rows, 2));

    text.push_str(&consumption(vc, now));
    text.push_str(&snapshots(vc, now));

    text.push_str("\nSuper namespaces:\n");
    if related.namespaces.is_empty() {
        text.push_str("  <none>\n");
    } else {
        let rows: Vec<Vec<String>> = related
            .namespaces
            .iter()
            .map(|n| vec![n.name.clone(), n.tenant_namespace.clone(), n.pods.to_string()])
            .collect();
        text.push_str(&table::render(
            &["NAMESPACE", "TENANT NAMESPACE", "PODS"],
            &rows,
            2,
        ));
    }

    text.push_str("\nEvents:\n");
    if related.events.is_empty() {
        text.push_str("  <none>\n");
    } else {
        let rows: Vec<Vec<String>> = related
            .events
            .iter()
            .map(|e| {
                let count = e
                    .series
                    .as_ref()
                    .and_then(|s| s.count)
                    .or(e.count)
                    .filter(|c| *c > 1);
                let age = age_since(event_time(e), now);
                let from = e
                    .reporting_component
                    .clone()
                    .filter(|c| !c.is_empty())
                    .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                    .unwrap_or_default();
                vec![
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    match count {
                        Some(count) => format!("{age} (x{count})"),
                        None => age,
                    },
                    from,
                    table::truncate(e.message.as_deref().unwrap_or_default(), 160),
                ]
            })
            .collect();
        text.push_str(&table::render(
            &["TYPE", "REASON", "AGE", "FROM", "MESSAGE"],
            &rows,
            2,
        ));
    }
    text
}

/// What the tenant consumes, as the syncer last measured it (`status.usage`, the figures of `kubectl vc
/// top`).
fn consumption(vc: &VirtualCluster, now: Timestamp) -> String {
    let row = crate::top::row(vc, now);
    if row.measured == crate::top::UNKNOWN {
        return "\nConsumption:\n  <not measured: the syncer measures attached tenants every --usage-interval-seconds>\n"
            .into();
    }
    let rows: Vec<Vec<String>> = [
        ("cpu", row.cpu),
        ("memory", row.memory),
        ("pods", row.pods),
        ("storage requested", row.storage),
        ("load balancers", row.load_balancers),
        ("node ports", row.node_ports),
        ("apiserver requests/s", row.requests),
    ]
    .into_iter()
    .map(|(what, value)| vec![what.to_owned(), value])
    .collect();
    format!(
        "\nConsumption (measured by the syncer {} ago):\n{}",
        row.measured,
        table::render(&["RESOURCE", "USED"], &rows, 2)
    )
}

/// The snapshot schedule and what the snapshot scheduler last did (`status.snapshots`); nothing when
/// neither is set.
fn snapshots(vc: &VirtualCluster, now: Timestamp) -> String {
    let schedule = vc.spec.snapshots.as_ref();
    let status = vc.status.as_ref().and_then(|s| s.snapshots.as_ref());
    if schedule.is_none() && status.is_none() {
        return String::new();
    }
    let mut text = String::from("\nSnapshots:\n");
    let mut line = |label: &str, value: String| text.push_str(&format!("  {label:<14}{value}\n"));
    line(
        "Schedule:",
        schedule.map_or("<none>".into(), |s| {
            format!("every {} minutes, keeping {}", s.interval_minutes, s.retain)
        }),
    );
    if let Some(status) = status {
        line("Store:", or_none(status.store.clone()));
        line(
            "Last:",
            match (&status.last_snapshot, &status.last_snapshot_time) {
                (Some(path), Some(time)) => format!("{path} ({} ago)", age_since(Some(time.0), now)),
                _ => "<none>".into(),
            },
        );
        line("Checksum:", or_none(status.last_checksum.clone()));
        line("Retained:", or_none(status.retained.map(|r| r.to_string())));
        if let (Some(time), Some(failure)) = (&status.last_failure_time, &status.last_failure) {
            line(
                "Last failure:",
                format!(
                    "{} ago: {}",
                    age_since(Some(time.0), now),
                    table::truncate(failure, 160)
                ),
            );
        }
    }
    text
}

/// Reads the super namespaces, pods and events of `vc`.
pub async fn related(client: &Client, vc: &VirtualCluster) -> Result<Related> {
    let namespace = vc.namespace().unwrap_or_default();
    let name = vc.name_any();
    let selector = format!("{LABEL_VC_NAME}={name},{LABEL_VC_NAMESPACE}={namespace}");
    let params = ListParams::default().labels(&selector);
    let namespaces: Vec<ObjectMeta> = Api::<Namespace>::all(client.clone())
        .list_metadata(&params)
        .await
        .map_err(|e| Error::api("listing the syncer's tenant namespaces", e))?
        .items
        .into_iter()
        .map(|n| n.metadata)
        .collect();
    let owned = super_namespaces(vc, &namespaces);
    let pods: Vec<Pod> = Api::<Pod>::all(client.clone())
        .list(&params)
        .await
        .map_err(|e| Error::api("listing tenant pods", e))?
        .items
        .into_iter()
        .filter(|p| p.metadata.namespace.as_ref().is_some_and(|ns| owned.contains(ns)))
        .collect();
    let mut fields = format!("involvedObject.kind=VirtualCluster,involvedObject.name={name}");
    if let Some(uid) = vc.uid() {
        fields.push_str(&format!(",involvedObject.uid={uid}"));
    }
    let events = Api::<Event>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().fields(&fields))
        .await
        .map_err(|e| Error::api(format!("listing events of VirtualCluster {namespace}/{name}"), e))?
        .items;
    Ok(Related {
        namespaces: super_namespace_rows(vc, &namespaces, &pods),
        usage: usage::total(&pods),
        events: recent_events(events),
    })
}

/// What `describe -o json|yaml` prints: the VirtualCluster (without managed fields) and what `describe`
/// shows beside it — super namespaces, usage against quota (`limit` null when unlimited) and events.
pub fn document(vc: &VirtualCluster, related: &Related) -> Result<Value> {
    let namespaces: Vec<Value> = related
        .namespaces
        .iter()
        .map(|n| json!({"name": n.name, "tenantNamespace": n.tenant_namespace, "pods": n.pods}))
        .collect();
    let usage: Vec<Value> = usage::against(&related.usage, vc.spec.quota.as_ref())
        .into_iter()
        .map(|line| {
            let limited = line.limit != "-";
            json!({
                "resource": line.resource,
                "used": line.used,
                "limit": limited.then_some(line.limit),
            })
        })
        .collect();
    let events = related
        .events
        .iter()
        .map(output::without_managed_fields)
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({
        "virtualCluster": output::without_managed_fields(vc)?,
        "superNamespaces": namespaces,
        "usage": usage,
        "consumption": vc.status.as_ref().and_then(|s| s.usage.as_ref()),
        "events": events,
    }))
}

/// `kubectl vc describe`.
pub async fn command(
    client: &Client,
    namespace: &str,
    args: &DescribeArgs,
    io: &mut Streams<'_>,
) -> Result<()> {
    let vc = get_virtual_cluster(client, namespace, &args.name).await?;
    let related = related(client, &vc).await?;
    let text = match args.output.output {
        Some(format) => output::serialize(&document(&vc, &related)?, format, "the description")?,
        None => render(&vc, &related, Timestamp::now()),
    };
    io.out.write_all(text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crds::{ClusterPhase, PodPolicy, RateLimit, TenantQuota, VirtualClusterSpec, VirtualClusterStatus};
    use k8s_openapi::apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{Condition, MicroTime, Time},
    };

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn at(seconds_ago: i64) -> Timestamp {
        Timestamp::from_second(NOW - seconds_ago).expect("time")
    }

    fn vc() -> VirtualCluster {
        let mut vc = VirtualCluster::new(
            "vc-1",
            VirtualClusterSpec {
                cluster_version_name: Some("cv-1".into()),
                weight: 3,
                quota: Some(TenantQuota {
                    pods: Some(Quantity("10".into())),
                    requests_cpu: Some(Quantity("2".into())),
                    ..Default::default()
                }),
                rate_limit: Some(RateLimit { qps: 50, burst: None }),
                pod_policy: Some(PodPolicy {
                    host_network: true,
                    allowed_taints: vec!["dedicated=team".into()],
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        vc.metadata.namespace = Some("team".into());
        vc.metadata.uid = Some("uid-1".into());
        vc.metadata.creation_timestamp = Some(Time(at(2 * 86_400)));
        vc.status = Some(VirtualClusterStatus {
            phase: Some(ClusterPhase::Running),
            reason: Some("TenantControlPlaneRunning".into()),
            message: Some("etcd, apiserver and controller-manager are ready".into()),
            cluster_namespace: Some(crds::naming::cluster_key_of(&vc).expect("key")),
            mode: Some(crds::ControlPlaneMode::Provisioned),
            conditions: vec![
                Condition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: "TenantControlPlaneRunning".into(),
                    message: "ready".into(),
                    observed_generation: Some(1),
                    last_transition_time: Time(at(3600)),
                },
                Condition {
                    type_: "PKIReady".into(),
                    status: "True".into(),
                    reason: "CertificatesValid".into(),
                    message: "12 Secrets".into(),
                    observed_generation: Some(1),
                    last_transition_time: Time(at(7200)),
                },
            ],
            observed_generation: Some(1),
            usage: None,
            snapshots: None,
            attach_backoff: None,
        });
        vc
    }

    fn event(reason: &str, seconds_ago: i64, series: Option<i32>) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(format!("vc-1.{reason}")),
                namespace: Some("team".into()),
                ..Default::default()
            },
            type_: Some("Normal".into()),
            reason: Some(reason.into()),
            message: Some(format!("{reason} happened")),
            reporting_component: Some("vc-manager".into()),
            event_time: Some(MicroTime(at(seconds_ago + 100))),
            series: series.map(|count| k8s_openapi::api::core::v1::EventSeries {
                count: Some(count),
                last_observed_time: Some(MicroTime(at(seconds_ago))),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn events_are_sorted_and_cut_to_the_latest() {
        let mut events: Vec<Event> = (0..25)
            .map(|i| event(&format!("E{i}"), 1000 - i * 10, None))
            .collect();
        events.reverse();
        let recent = recent_events(events);
        assert_eq!(recent.len(), MAX_EVENTS);
        assert_eq!(recent[0].reason.as_deref(), Some("E5"));
        assert_eq!(recent[MAX_EVENTS - 1].reason.as_deref(), Some("E24"));
        // A series counts from its last observation.
        let series = event("Series", 10, Some(4));
        assert_eq!(event_time(&series), Some(at(10)));
    }

    #[test]
    fn describe_shows_settings_conditions_usage_namespaces_and_events() {
        let vc = vc();
        let key = crds::naming::cluster_key_of(&vc).expect("key");
        let ns = |tenant: &str| ObjectMeta {
            name: Some(crds::naming::super_namespace(&key, tenant)),
            labels: Some(
                [
                    (LABEL_VC_NAME.to_owned(), "vc-1".to_owned()),
                    (LABEL_VC_NAMESPACE.to_owned(), "team".to_owned()),
                ]
                .into(),
            ),
            annotations: Some(
                [
                    (crds::wellknown::ANNOTATION_CLUSTER.to_owned(), key.clone()),
                    (
                        crds::wellknown::ANNOTATION_NAMESPACE.to_owned(),
                        tenant.to_owned(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let namespaces = vec![ns("default"), ns("web")];
        let pod = |namespace: &str, cpu: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": namespace},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
                "status": {"phase": "Running"},
            }))
            .expect("pod")
        };
        let web = crds::naming::super_namespace(&key, "web");
        let pods = vec![pod(&web, "500m"), pod(&web, "1")];
        let related = Related {
            namespaces: super_namespace_rows(&vc, &namespaces, &pods),
            usage: usage::total(&pods),
            events: recent_events(vec![
                event("Running", 60, None),
                event("Provisioning", 3600, Some(2)),
            ]),
        };
        assert_eq!(
            related.namespaces,
            [
                SuperNamespace {
                    name: crds::naming::super_namespace(&key, "default"),
                    tenant_namespace: "default".into(),
                    pods: 0,
                },
                SuperNamespace {
                    name: web.clone(),
                    tenant_namespace: "web".into(),
                    pods: 2,
                },
            ]
        );
        let text = render(&vc, &related, Timestamp::from_second(NOW).expect("now"));
        for expected in [
            "Name:               vc-1\n",
            "Phase:              Running\n",
            &format!("Cluster namespace:  {key}\n"),
            "Cluster version:    cv-1\n",
            "Weight:             3\n",
            "Quota:              pods=10, requests.cpu=2\n",
            "Rate limit:         50 writes/s, burst 50\n",
            "Runtime class:      <none>\n",
            "Pod policy:         allows hostNetwork, taints dedicated=team\n",
            "  TYPE       STATUS   REASON                      SINCE   MESSAGE\n  PKIReady   True     CertificatesValid           120m    12 Secrets\n  Ready      True     TenantControlPlaneRunning   60m     ready\n",
            "  pods              2       10      20%\n",
            "  requests.cpu      1500m   2       75%\n",
            "  requests.memory   0       -\n",
            &format!("  {web}       web                2\n"),
            "  Normal   Provisioning   60m (x2)   vc-manager   Provisioning happened\n",
            "  Normal   Running        2m40s      vc-manager   Running happened\n",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        assert!(text.contains("Consumption:\n  <not measured"), "{text}");

        // Once the syncer measured the tenant, its figures show, as `kubectl vc top` writes them.
        let mut measured = vc.clone();
        if let Some(status) = measured.status.as_mut() {
            status.usage = Some(crds::TenantUsage {
                time: Some(Time(at(45))),
                cpu: Some(Quantity("250m".into())),
                memory: Some(Quantity(format!("{}", 96 << 20))),
                pods: Some(2),
                storage: Some(Quantity(format!("{}", 5u64 << 30))),
                load_balancers: Some(1),
                node_ports: Some(2),
                apiserver_requests_per_second: Some(Quantity("2500m".into())),
                ..Default::default()
            });
        }
        let text = render(&measured, &related, Timestamp::from_second(NOW).expect("now"));
        assert!(
            text.contains(
                "Consumption (measured by the syncer 45s ago):\n  RESOURCE               USED\n  cpu                    250m\n  memory                 96Mi\n  pods                   2\n  storage requested      5Gi\n  load balancers         1\n  node ports             2\n  apiserver requests/s   2.5\n"
            ),
            "{text}"
        );
        let document = document(&measured, &related).expect("document");
        assert_eq!(document["consumption"]["cpu"], "250m");
    }

    #[test]
    fn describe_shows_the_snapshot_schedule_and_the_last_snapshot_and_failure() {
        let mut tenant = vc();
        assert!(!render(&tenant, &Related::default(), at(0)).contains("Snapshots:"));
        tenant.spec.snapshots = Some(crds::SnapshotSchedule {
            interval_minutes: 60,
            retain: 7,
        });
        let status = tenant.status.get_or_insert_with(Default::default);
        status.snapshots = Some(crds::SnapshotStatus {
            store: Some("pvc/vc-snapshots".into()),
            last_snapshot_time: Some(Time(at(120))),
            last_snapshot: Some("team/vc-1-20261125T010000Z".into()),
            last_checksum: Some("sha256:abc".into()),
            retained: Some(3),
            last_failure_time: Some(Time(at(30))),
            last_failure: Some("etcd did not answer".into()),
        });
        let text = render(&tenant, &Related::default(), at(0));
        assert!(
            text.contains(
                "Snapshots:\n  Schedule:     every 60 minutes, keeping 7\n  Store:        pvc/vc-snapshots\n  Last:         team/vc-1-20261125T010000Z (2m ago)\n  Checksum:     sha256:abc\n  Retained:     3\n  Last failure: 30s ago: etcd did not answer\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn adopted_tenants_name_their_kubeconfig() {
        let mut vc = vc();
        vc.spec.cluster_version_name = None;
        vc.spec.kubeconfig_secret_ref = Some(crds::KubeconfigSecretRef {
            name: "kc".into(),
            key: "value".into(),
        });
        assert_eq!(origin(&vc), ("Adopted from", "Secret team/kc key value".into()));
        vc.spec.kubeconfig_secret_ref = None;
        vc.metadata.annotations = Some([(ANNOTATION_ADMIN_KUBECONFIG.to_owned(), "YQ==".to_owned())].into());
        // This one was provisioned: an annotation added later changes nothing.
        assert_eq!(origin(&vc).0, "Cluster version");
        vc.status.as_mut().expect("status").mode = Some(crds::ControlPlaneMode::Adopted);
        assert_eq!(
            origin(&vc).1,
            "annotation tenancy.x-k8s.io/admin-kubeconfig (inline)"
        );
    }
}
