//! What a tenant's pods use in the super cluster, counted as the syncer's quota counts it (containers
//! summed, the largest init container if more, plus overhead; pods that are not Succeeded or Failed), and
//! shown against `spec.quota`.

use crds::{TenantQuota, quantity::parse_quantity};
use k8s_openapi::{
    api::core::v1::{Pod, PodSpec},
    apimachinery::pkg::api::resource::Quantity,
};

pub use crds::usage::Usage;

/// What one pod counts against quota (see [`crds::usage::pod_usage`]).
pub fn pod_usage(spec: &PodSpec) -> Usage {
    crds::usage::pod_usage(
        spec.containers.iter().map(|c| c.resources.as_ref()),
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| c.resources.as_ref()),
        spec.overhead.as_ref(),
    )
}

/// Whether a pod still counts (it is not Succeeded or Failed).
pub fn counts(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The sum over the pods that count.
pub fn total<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Usage {
    let mut sum = Usage::default();
    for pod in pods.into_iter().filter(|p| counts(p)) {
        if let Some(spec) = &pod.spec {
            sum += pod_usage(spec);
        }
    }
    sum
}

/// Millicores as kubectl writes CPU: `2`, `500m`.
pub fn format_cpu(millis: i64) -> String {
    if millis % 1000 == 0 {
        format!("{}", millis / 1000)
    } else {
        format!("{millis}m")
    }
}

/// Bytes in the largest binary unit that divides them: `1Gi`, `512Mi`, `1000`.
pub fn format_memory(bytes: i64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    for (suffix, size) in [
        ("Ti", 1i64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if bytes % size == 0 {
            return format!("{}{suffix}", bytes / size);
        }
    }
    bytes.to_string()
}

/// One line of usage against quota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The quota key: `pods`, `requests.cpu`, ...
    pub resource: &'static str,
    /// Used, formatted.
    pub used: String,
    /// The limit as written in the spec, or `-` without one.
    pub limit: String,
    /// Used as a share of the limit, e.g. `25%`, or empty without one.
    pub percent: String,
}

/// A quota dimension: key, amount used, limit, parse scale, formatter.
type Dimension = (&'static str, i64, Option<Quantity>, f64, fn(i64) -> String);

/// Usage against every quota dimension (all five, unlimited ones with `-`).
pub fn against(usage: &Usage, quota: Option<&TenantQuota>) -> Vec<Line> {
    let quota = quota.cloned().unwrap_or_default();
    let dimensions: [Dimension; 5] = [
        ("pods", usage.pods, quota.pods, 1.0, |n| n.to_string()),
        (
            "requests.cpu",
            usage.requests_cpu,
            quota.requests_cpu,
            1000.0,
            format_cpu,
        ),
        (
            "requests.memory",
            usage.requests_memory,
            quota.requests_memory,
            1.0,
            format_memory,
        ),
        (
            "limits.cpu",
            usage.limits_cpu,
            quota.limits_cpu,
            1000.0,
            format_cpu,
        ),
        (
            "limits.memory",
            usage.limits_memory,
            quota.limits_memory,
            1.0,
            format_memory,
        ),
    ];
    dimensions
        .into_iter()
        .map(|(resource, used, limit, scale, format)| {
            let parsed = limit.as_ref().and_then(|q| parse_quantity(&q.0, scale));
            let percent = match parsed {
                Some(0) => "-".to_owned(),
                Some(limit) => format!("{}%", (used as f64 * 100.0 / limit as f64).round() as i64),
                None => String::new(),
            };
            Line {
                resource,
                used: format(used),
                limit: limit.map_or_else(|| "-".to_owned(), |q| q.0),
                percent,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, containers: serde_json::Value, init: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {"containers": containers, "initContainers": init, "overhead": {"cpu": "10m"}},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    #[test]
    fn usage_sums_running_pods_as_the_syncer_counts_them() {
        let web = pod(
            "Running",
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}},
            ]),
            serde_json::json!([{"name": "init", "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}}]),
        );
        let usage = pod_usage(web.spec.as_ref().expect("spec"));
        // Init container's 2 CPUs beat the containers' 500m; overhead on top.
        assert_eq!(usage.requests_cpu, 2010);
        assert_eq!(usage.requests_memory, 256 << 20);
        assert_eq!(usage.limits_cpu, 1000);
        assert_eq!(usage.limits_memory, 256 << 20);
        let done = pod(
            "Succeeded",
            serde_json::json!([{"name": "a"}]),
            serde_json::json!([]),
        );
        let pending = pod(
            "Pending",
            serde_json::json!([{"name": "a"}]),
            serde_json::json!([]),
        );
        let sum = total([&web, &done, &pending]);
        assert_eq!(sum.pods, 2);
        assert_eq!(sum.requests_cpu, 2020);
    }

    #[test]
    fn usage_reads_against_the_quota() {
        let usage = Usage {
            pods: 3,
            requests_cpu: 1500,
            requests_memory: 3 << 30,
            limits_cpu: 0,
            limits_memory: 0,
        };
        let quota = TenantQuota {
            pods: Some(Quantity("10".into())),
            requests_cpu: Some(Quantity("2".into())),
            requests_memory: Some(Quantity("4Gi".into())),
            ..Default::default()
        };
        let lines = against(&usage, Some(&quota));
        let text: Vec<(&str, &str, &str, &str)> = lines
            .iter()
            .map(|l| (l.resource, l.used.as_str(), l.limit.as_str(), l.percent.as_str()))
            .collect();
        assert_eq!(
            text,
            [
                ("pods", "3", "10", "30%"),
                ("requests.cpu", "1500m", "2", "75%"),
                ("requests.memory", "3Gi", "4Gi", "75%"),
                ("limits.cpu", "0", "-", ""),
                ("limits.memory", "0", "-", ""),
            ]
        );
        assert_eq!(against(&usage, None)[0].limit, "-");
    }

    #[test]
    fn quantities_format_like_kubectl() {
        assert_eq!(format_cpu(2000), "2");
        assert_eq!(format_cpu(250), "250m");
        assert_eq!(format_memory(1 << 30), "1Gi");
        assert_eq!(format_memory(3 << 19), "1536Ki");
        assert_eq!(format_memory(1000), "1000");
        assert_eq!(format_memory(0), "0");
    }
}
