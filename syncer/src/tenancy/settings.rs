//! Per-tenant settings, taken from the VirtualCluster's spec within the platform's limits.
//!
//! Whoever may edit a VirtualCluster is not trusted with the super cluster, so what its spec asks of the
//! syncer for everyone's shared resources (a share of the queues, a quota, a rate limit, ingress hosts) is
//! bounded by the platform's flags here, where the syncer reads the spec: [`TenantSettings::within`]
//! returns the settings the syncer runs the tenant with and one note per field it limited, which the
//! syncer reports on the VirtualCluster (condition `SpecLimited`).

pub mod flags;

use std::cmp::Ordering;

use crds::{PodPolicy, TenantQuota, VirtualCluster, quantity::parse_quantity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// What the syncer needs to know about a VirtualCluster beyond its identity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantSettings {
    /// DNS domain of the tenant.
    pub cluster_domain: String,
    /// Share of the work queues.
    pub weight: u32,
    /// `(qps, burst)` on writes to the super cluster.
    pub rate_limit: Option<(u32, u32)>,
    /// Aggregate limits on super pods.
    pub quota: Option<TenantQuota>,
    /// RuntimeClass forced onto pods.
    pub runtime_class_name: Option<String>,
    /// Host access allowed to pods.
    pub pod_policy: PodPolicy,
    /// Label/annotation prefixes owned by the super cluster.
    pub opaque_prefixes: Vec<String>,
    /// Label/annotation prefixes copied up from super objects.
    pub transparent_prefixes: Vec<String>,
    /// DNS suffixes the tenant's ingress hosts must be within (empty: no host is).
    pub ingress_host_suffixes: Vec<String>,
}

/// How far a VirtualCluster's spec may reach: the platform's flags ([`flags::LimitFlags`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PlatformLimits {
    /// Highest `spec.weight` honoured (`--max-weight`).
    pub max_weight: u32,
    /// Quota of a VirtualCluster that sets none, per dimension (`--default-quota`).
    pub default_quota: Option<TenantQuota>,
    /// Highest quota per dimension; a dimension the spec leaves unlimited gets this (`--max-quota`).
    pub max_quota: Option<TenantQuota>,
    /// `(qps, burst)` of a VirtualCluster that sets no rate limit (`--default-rate-limit`).
    pub default_rate_limit: Option<(u32, u32)>,
    /// Highest `(qps, burst)` honoured; a VirtualCluster without one gets this (`--max-rate-limit`).
    pub max_rate_limit: Option<(u32, u32)>,
    /// The ingress host suffix every tenant gets (`--ingress-host-suffix`), with `{name}`, `{namespace}`
    /// and `{key}` standing for the VirtualCluster's name, namespace and cluster key.
    pub ingress_host_suffix: Option<String>,
    /// Domains under which a VirtualCluster's `spec.ingressHostSuffixes` may claim suffixes
    /// (`--ingress-grantable-host-suffixes`).
    pub grantable_ingress_host_suffixes: Vec<String>,
}

/// Default of `--max-weight`: a tenant may get at most ten times another's share of the queues.
pub const DEFAULT_MAX_WEIGHT: u32 = 10;

impl Default for PlatformLimits {
    fn default() -> Self {
        Self {
            max_weight: DEFAULT_MAX_WEIGHT,
            default_quota: None,
            max_quota: None,
            default_rate_limit: None,
            max_rate_limit: None,
            ingress_host_suffix: None,
            grantable_ingress_host_suffixes: Vec::new(),
        }
    }
}

impl TenantSettings {
    /// The settings of a VirtualCluster within the default limits, alone.
    pub fn of(vc: &VirtualCluster) -> Self {
        Self::within(vc, &PlatformLimits::default(), &[]).0
    }

    /// The settings the syncer runs a VirtualCluster with, within the platform's `limits`, and a note per
    /// field of its spec that the limits changed (empty: the spec is honoured as it is). `others` are
    /// every VirtualCluster (this one may be among them): ingress host suffixes are exclusive.
    pub fn within(
        vc: &VirtualCluster,
        limits: &PlatformLimits,
        others: &[std::sync::Arc<VirtualCluster>],
    ) -> (Self, Vec<String>) {
        let spec = &vc.spec;
        let mut notes = Vec::new();
        let weight = match spec.weight.cmp(&limits.max_weight) {
            Ordering::Greater => {
                notes.push(format!(
                    "spec.weight {} is above the platform's maximum {} (--max-weight): {} is used",
                    spec.weight, limits.max_weight, limits.max_weight
                ));
                limits.max_weight
            }
            _ => spec.weight.max(1),
        };
        let quota = clamp_quota(
            spec.quota.as_ref(),
            limits.default_quota.as_ref(),
            limits.max_quota.as_ref(),
            &mut notes,
        );
        let rate_limit = clamp_rate_limit(
            spec.rate_limit.as_ref().map(|r| (r.qps, r.effective_burst())),
            limits.default_rate_limit,
            limits.max_rate_limit,
            &mut notes,
        );
        let ingress_host_suffixes = ingress_host_suffixes(vc, limits, others, &mut notes);
        let settings = Self {
            cluster_domain: spec.cluster_domain.clone(),
            weight,
            rate_limit,
            quota,
            runtime_class_name: spec.runtime_class_name.clone(),
            pod_policy: spec.pod_policy.clone().unwrap_or_default(),
            opaque_prefixes: spec.opaque_meta_prefixes.clone(),
            transparent_prefixes: spec.transparent_meta_prefixes.clone(),
            ingress_host_suffixes,
        };
        (settings, notes)
    }
}

/// The quota dimensions, by their names in `spec.quota`, with a getter and a setter.
type Dimension = (
    &'static str,
    fn(&TenantQuota) -> &Option<Quantity>,
    fn(&mut TenantQuota) -> &mut Option<Quantity>,
);

const DIMENSIONS: [Dimension; 10] = [
    ("pods", |q| &q.pods, |q| &mut q.pods),
    ("requests.cpu", |q| &q.requests_cpu, |q| &mut q.requests_cpu),
    (
        "requests.memory",
        |q| &q.requests_memory,
        |q| &mut q.requests_memory,
    ),
    ("limits.cpu", |q| &q.limits_cpu, |q| &mut q.limits_cpu),
    ("limits.memory", |q| &q.limits_memory, |q| &mut q.limits_memory),
    ("services", |q| &q.services, |q| &mut q.services),
    (
        "services.nodeports",
        |q| &q.services_node_ports,
        |q| &mut q.services_node_ports,
    ),
    (
        "services.loadbalancers",
        |q| &q.services_load_balancers,
        |q| &mut q.services_load_balancers,
    ),
    (
        "persistentvolumeclaims",
        |q| &q.persistentvolumeclaims,
        |q| &mut q.persistentvolumeclaims,
    ),
    (
        "requests.storage",
        |q| &q.requests_storage,
        |q| &mut q.requests_storage,
    ),
];

/// The names of the quota dimensions (`pods`, `requests.cpu`, ...), for flags.
pub fn quota_dimensions() -> impl Iterator<Item = &'static str> {
    DIMENSIONS.iter().map(|(name, _, _)| *name)
}

/// Sets dimension `name` of a quota; `false` when there is no such dimension.
pub fn set_quota_dimension(quota: &mut TenantQuota, name: &str, value: Quantity) -> bool {
    match DIMENSIONS.iter().find(|(n, _, _)| *n == name) {
        Some((_, _, set)) => {
            *set(quota) = Some(value);
            true
        }
        None => false,
    }
}

/// A quantity in thousandths, for comparisons (saturating: two huge values compare equal).
fn milli(quantity: &Quantity) -> i64 {
    parse_quantity(&quantity.0, 1000.0).unwrap_or(i64::MAX)
}

/// The quota the tenant runs with: each dimension as the spec sets it, else the platform's default, and
/// never above the platform's maximum (a dimension the spec and the default leave unlimited gets the
/// maximum).
fn clamp_quota(
    spec: Option<&TenantQuota>,
    default: Option<&TenantQuota>,
    max: Option<&TenantQuota>,
    notes: &mut Vec<String>,
) -> Option<TenantQuota> {
    if default.is_none() && max.is_none() {
        return spec.cloned();
    }
    let mut quota = spec.cloned().unwrap_or_default();
    for (name, get, set) in DIMENSIONS {
        let asked = get(&quota).clone();
        let default = default.and_then(|d| get(d).clone());
        let max = max.and_then(|m| get(m).clone());
        let value = match (asked, default, max) {
            (Some(asked), _, Some(max)) if milli(&asked) > milli(&max) => {
                notes.push(format!(
                    "spec.quota[{name}] {} is above the platform's maximum {} (--max-quota): {} is used",
                    asked.0, max.0, max.0
                ));
                Some(max)
            }
            (Some(asked), _, _) => Some(asked),
            (None, Some(default), Some(max)) if milli(&default) > milli(&max) => {
                notes.push(format!(
                    "spec.quota[{name}] is not set: the platform's maximum {} is used (--max-quota; the default {} is above it)",
                    max.0, default.0
                ));
                Some(max)
            }
            (None, Some(default), _) => {
                notes.push(format!(
                    "spec.quota[{name}] is not set: the platform's default {} is used (--default-quota)",
                    default.0
                ));
                Some(default)
            }
            (None, None, Some(max)) => {
                notes.push(format!(
                    "spec.quota[{name}] is not set: the platform's maximum {} is used (--max-quota)",
                    max.0
                ));
                Some(max)
            }
            (None, None, None) => None,
        };
        *set(&mut quota) = value;
    }
    (quota != TenantQuota::default()).then_some(quota)
}

/// The rate limit the tenant runs with: the spec's, else the platform's default, and never above the
/// platform's maximum.
fn clamp_rate_limit(
    spec: Option<(u32, u32)>,
    default: Option<(u32, u32)>,
    max: Option<(u32, u32)>,
    notes: &mut Vec<String>,
) -> Option<(u32, u32)> {
    let show = |(qps, burst): (u32, u32)| format!("{qps} qps, burst {burst}");
    let wanted = match (spec, default) {
        (Some(asked), _) => Some(asked),
        (None, Some(default)) => {
            notes.push(format!(
                "spec.rateLimit is not set: the platform's default {} is used (--default-rate-limit)",
                show(default)
            ));
            Some(default)
        }
        (None, None) => None,
    };
    match (wanted, max) {
        (None, Some(max)) => {
            notes.push(format!(
                "spec.rateLimit is not set: the platform's maximum {} is used (--max-rate-limit)",
                show(max)
            ));
            Some(max)
        }
        (Some((qps, burst)), Some((max_qps, max_burst))) if qps > max_qps || burst > max_burst => {
            let used = (qps.min(max_qps), burst.min(max_burst).max(qps.min(max_qps)));
            if spec.is_some() {
                notes.push(format!(
                    "spec.rateLimit {} is above the platform's maximum {} (--max-rate-limit): {} is used",
                    show((qps, burst)),
                    show((max_qps, max_burst)),
                    show(used)
                ));
            }
            Some(used)
        }
        (wanted, _) => wanted,
    }
}

/// A DNS name as compared: lowercase, without a final dot.
fn normalized(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `name` is `domain` or a name under it.
pub fn within_domain(name: &str, domain: &str) -> bool {
    name == domain || name.ends_with(&format!(".{domain}"))
}

/// Whether two suffixes overlap: one is the other or under it.
fn overlap(a: &str, b: &str) -> bool {
    within_domain(a, b) || within_domain(b, a)
}

/// The suffix the platform's pattern gives a VirtualCluster.
fn assigned_suffix(vc: &VirtualCluster, pattern: &str) -> Option<String> {
    let key = crds::naming::cluster_key_of(vc)?;
    let expanded = pattern
        .replace("{name}", vc.metadata.name.as_deref()?)
        .replace("{namespace}", vc.metadata.namespace.as_deref()?)
        .replace("{key}", &key);
    Some(normalized(&expanded))
}

fn vc_ref(vc: &VirtualCluster) -> String {
    format!(
        "{}/{}",
        vc.metadata.namespace.as_deref().unwrap_or_default(),
        vc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The suffixes a VirtualCluster's ingress hosts must be within: the platform's pattern's, and those of
/// its `spec.ingressHostSuffixes` that lie under a domain the platform grants and overlap no other
/// VirtualCluster's (the pattern's suffixes first, then claims by age: the older VirtualCluster keeps a
/// contested suffix).
fn ingress_host_suffixes(
    vc: &VirtualCluster,
    limits: &PlatformLimits,
    others: &[std::sync::Arc<VirtualCluster>],
    notes: &mut Vec<String>,
) -> Vec<String> {
    let mut suffixes: Vec<String> = limits
        .ingress_host_suffix
        .as_deref()
        .and_then(|pattern| assigned_suffix(vc, pattern))
        .into_iter()
        .collect();
    if vc.spec.ingress_host_suffixes.is_empty() {
        return suffixes;
    }
    let uid = vc.metadata.uid.as_deref();
    let others: Vec<&VirtualCluster> = others
        .iter()
        .map(|o| &**o)
        .filter(|o| o.metadata.uid.as_deref() != uid)
        .collect();
    // Suffixes already taken by others: every pattern suffix, and the claims of older VirtualClusters
    // (their own order decides between them).
    let age = |v: &VirtualCluster| {
        (
            v.metadata.creation_timestamp.as_ref().map(|t| t.0),
            crds::naming::cluster_key_of(v),
        )
    };
    let mut taken: Vec<(String, String)> = Vec::new();
    if let Some(pattern) = &limits.ingress_host_suffix {
        taken.extend(
            others
                .iter()
                .filter_map(|o| Some((assigned_suffix(o, pattern)?, vc_ref(o)))),
        );
    }
    let grantable: Vec<String> = limits
        .grantable_ingress_host_suffixes
        .iter()
        .map(|g| normalized(g))
        .collect();
    let granted = |suffix: &str| grantable.iter().any(|g| suffix.ends_with(&format!(".{g}")));
    let mut older: Vec<&VirtualCluster> = others.iter().copied().filter(|o| age(o) < age(vc)).collect();
    older.sort_by_key(|o| age(o));
    for other in older {
        let mut own = Vec::new();
        for claim in other.spec.ingress_host_suffixes.iter().map(|s| normalized(s)) {
            if granted(&claim) && !taken.iter().any(|(t, _)| overlap(t, &claim)) {
                own.push((claim, vc_ref(other)));
            }
        }
        taken.extend(own);
    }
    for (index, claim) in vc.spec.ingress_host_suffixes.iter().enumerate() {
        let claim = normalized(claim);
        let field = format!("spec.ingressHostSuffixes[{index}] {claim:?}");
        if !granted(&claim) {
            notes.push(format!(
                "{field} is not under a domain the platform grants (--ingress-grantable-host-suffixes: {}): not used",
                match grantable.is_empty() {
                    true => "none".to_owned(),
                    false => grantable.join(", "),
                }
            ));
        } else if let Some((_, holder)) = taken.iter().find(|(t, _)| overlap(t, &claim)) {
            notes.push(format!(
                "{field} overlaps an ingress host suffix of VirtualCluster {holder}: not used"
            ));
        } else if !suffixes.contains(&claim) {
            suffixes.push(claim);
        }
    }
    suffixes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vc(name: &str, created: &str, spec: serde_json::Value) -> VirtualCluster {
        serde_json::from_value(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": name, "namespace": "teams", "uid": format!("{name}-uid"),
                "creationTimestamp": created},
            "spec": spec
        }))
        .expect("vc")
    }

    fn quota(value: serde_json::Value) -> TenantQuota {
        serde_json::from_value(value).expect("quota")
    }

    #[test]
    fn the_spec_is_honoured_within_the_defaults() {
        let greedy = vc(
            "a",
            "2026-01-01T00:00:00Z",
            json!({"weight": 5, "quota": {"pods": "10"}}),
        );
        let (settings, notes) = TenantSettings::within(&greedy, &PlatformLimits::default(), &[]);
        assert_eq!(settings.weight, 5);
        assert_eq!(settings.quota, Some(quota(json!({"pods": "10"}))));
        assert_eq!(settings.rate_limit, None);
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn weight_quota_and_rate_limit_are_clamped_and_each_clamp_is_named() {
        let limits = PlatformLimits {
            max_weight: 10,
            default_quota: Some(quota(json!({"pods": "50", "requests.cpu": "8"}))),
            max_quota: Some(quota(
                json!({"pods": "100", "limits.memory": "64Gi", "requests.cpu": "4"}),
            )),
            default_rate_limit: Some((20, 40)),
            max_rate_limit: Some((50, 100)),
            ..Default::default()
        };
        let greedy = vc(
            "a",
            "2026-01-01T00:00:00Z",
            json!({"weight": 100, "quota": {"pods": "100000", "limits.memory": "1Gi"},
                "rateLimit": {"qps": 1000, "burst": 5000}}),
        );
        let (settings, notes) = TenantSettings::within(&greedy, &limits, &[]);
        assert_eq!(settings.weight, 10);
        assert_eq!(
            settings.quota,
            Some(quota(
                json!({"pods": "100", "limits.memory": "1Gi", "requests.cpu": "4"})
            ))
        );
        assert_eq!(settings.rate_limit, Some((50, 100)));
        let expected = [
            "spec.weight 100 is above the platform's maximum 10",
            "spec.quota[pods] 100000 is above the platform's maximum 100",
            // The default (8) is above the maximum (4): the maximum applies, said once.
            "spec.quota[requests.cpu] is not set",
            "spec.rateLimit 1000 qps, burst 5000 is above the platform's maximum 50 qps, burst 100",
        ];
        for want in expected {
            assert!(
                notes.iter().any(|n| n.starts_with(want)),
                "{want} not in {notes:#?}"
            );
        }
        assert_eq!(notes.len(), expected.len(), "{notes:#?}");

        // Nothing set: the defaults, capped.
        let quiet = vc("b", "2026-01-01T00:00:00Z", json!({}));
        let (settings, notes) = TenantSettings::within(&quiet, &limits, &[]);
        assert_eq!(settings.weight, 1);
        assert_eq!(
            settings.quota,
            Some(quota(
                json!({"pods": "50", "requests.cpu": "4", "limits.memory": "64Gi"})
            ))
        );
        assert_eq!(settings.rate_limit, Some((20, 40)));
        assert_eq!(notes.len(), 4, "{notes:#?}");
    }

    #[test]
    fn a_maximum_alone_bounds_what_the_spec_leaves_unlimited() {
        let limits = PlatformLimits {
            max_quota: Some(quota(json!({"pods": "200"}))),
            max_rate_limit: Some((10, 10)),
            ..Default::default()
        };
        let (settings, notes) =
            TenantSettings::within(&vc("a", "2026-01-01T00:00:00Z", json!({})), &limits, &[]);
        assert_eq!(settings.quota, Some(quota(json!({"pods": "200"}))));
        assert_eq!(settings.rate_limit, Some((10, 10)));
        assert_eq!(notes.len(), 2, "{notes:#?}");
    }

    #[test]
    fn ingress_host_suffixes_are_the_platforms_and_exclusive() {
        let limits = PlatformLimits {
            ingress_host_suffix: Some("{name}.{namespace}.apps.example.com".into()),
            grantable_ingress_host_suffixes: vec!["shops.example.com".into()],
            ..Default::default()
        };
        let first = std::sync::Arc::new(vc(
            "first",
            "2026-01-01T00:00:00Z",
            json!({"ingressHostSuffixes": ["shop.shops.example.com"]}),
        ));
        let hostile = std::sync::Arc::new(vc(
            "late",
            "2026-02-01T00:00:00Z",
            json!({"ingressHostSuffixes": [
                "api.platform.example.com",
                "shops.example.com",
                "www.shop.shops.example.com",
                "first.teams.apps.example.com",
                "mine.shops.example.com"
            ]}),
        ));
        let all = [first.clone(), hostile.clone()];
        let (settings, notes) = TenantSettings::within(&first, &limits, &all);
        assert_eq!(
            settings.ingress_host_suffixes,
            ["first.teams.apps.example.com", "shop.shops.example.com"]
        );
        assert!(notes.is_empty(), "{notes:#?}");
        let (settings, notes) = TenantSettings::within(&hostile, &limits, &all);
        assert_eq!(
            settings.ingress_host_suffixes,
            ["late.teams.apps.example.com", "mine.shops.example.com"]
        );
        let expected = [
            "spec.ingressHostSuffixes[0] \"api.platform.example.com\" is not under a domain the platform grants",
            // The granted domain itself is everyone's.
            "spec.ingressHostSuffixes[1] \"shops.example.com\" is not under a domain the platform grants",
            "spec.ingressHostSuffixes[2] \"www.shop.shops.example.com\" overlaps an ingress host suffix of VirtualCluster teams/first",
            "spec.ingressHostSuffixes[3] \"first.teams.apps.example.com\" is not under a domain",
        ];
        for want in expected {
            assert!(
                notes.iter().any(|n| n.starts_with(want)),
                "{want} not in {notes:#?}"
            );
        }
        assert_eq!(notes.len(), expected.len(), "{notes:#?}");
        // Without a pattern or grants, a tenant has no ingress hosts.
        let (settings, _) = TenantSettings::within(&first, &PlatformLimits::default(), &all);
        assert!(settings.ingress_host_suffixes.is_empty());
    }
}
