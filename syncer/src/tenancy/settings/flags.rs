//! Flags of how far a VirtualCluster's spec may reach: weight, quota, rate limit and ingress hosts.

use crds::TenantQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{DEFAULT_MAX_WEIGHT, PlatformLimits, quota_dimensions, set_quota_dimension};
use crate::engine::config::values::Blank;

/// Flags of the platform's limits on VirtualClusters' specs.
#[derive(Clone, Debug, clap::Args)]
pub struct LimitFlags {
    /// Highest `spec.weight` honoured (1-100); a greater one is clamped and named on the VirtualCluster.
    #[arg(long, env = "MAX_WEIGHT", default_value_t = DEFAULT_MAX_WEIGHT, value_parser = weight)]
    pub max_weight: u32,
    /// Quota of a VirtualCluster whose `spec.quota` leaves a dimension out, as `dimension=quantity` pairs
    /// (`pods=100,requests.cpu=20,...`; the names of `spec.quota`). Default: none.
    #[arg(long, env = "DEFAULT_QUOTA", value_delimiter = ',', value_parser = quota_pair)]
    pub default_quota: Vec<Option<(String, Quantity)>>,
    /// Highest quota per dimension (same form); a dimension a VirtualCluster leaves unlimited gets it.
    /// Default: none.
    #[arg(long, env = "MAX_QUOTA", value_delimiter = ',', value_parser = quota_pair)]
    pub max_quota: Vec<Option<(String, Quantity)>>,
    /// Rate limit on super writes of a VirtualCluster without `spec.rateLimit`: `qps` or `qps/burst`.
    /// Default: none.
    #[arg(long, env = "DEFAULT_RATE_LIMIT", value_parser = rate_limit)]
    pub default_rate_limit: Option<Blank<(u32, u32)>>,
    /// Highest rate limit honoured (`qps` or `qps/burst`); a VirtualCluster without one gets it. Default:
    /// none.
    #[arg(long, env = "MAX_RATE_LIMIT", value_parser = rate_limit)]
    pub max_rate_limit: Option<Blank<(u32, u32)>>,
    /// The DNS suffix of every tenant's Ingress hosts, with `{name}`, `{namespace}` and `{key}` for the
    /// VirtualCluster's name, namespace and cluster key, e.g. `{name}.{namespace}.apps.example.com`. It
    /// must name the tenant uniquely (`{key}`, or `{name}` and `{namespace}`). Empty: none.
    #[arg(long, env = "INGRESS_HOST_SUFFIX", value_parser = ingress_host_suffix)]
    pub ingress_host_suffix: Option<Blank<String>>,
    /// Domains under which a VirtualCluster's `spec.ingressHostSuffixes` may claim suffixes (default none).
    #[arg(long, env = "INGRESS_GRANTABLE_HOST_SUFFIXES", value_delimiter = ',', value_parser = domain)]
    pub ingress_grantable_host_suffixes: Vec<Option<String>>,
}

impl LimitFlags {
    /// The platform's limits.
    pub fn limits(self) -> PlatformLimits {
        PlatformLimits {
            max_weight: self.max_weight,
            default_quota: quota(self.default_quota),
            max_quota: quota(self.max_quota),
            default_rate_limit: Blank::of(self.default_rate_limit),
            max_rate_limit: Blank::of(self.max_rate_limit),
            ingress_host_suffix: Blank::of(self.ingress_host_suffix),
            grantable_ingress_host_suffixes: self
                .ingress_grantable_host_suffixes
                .into_iter()
                .flatten()
                .collect(),
        }
    }
}

fn weight(value: &str) -> Result<u32, String> {
    match value.trim().parse::<u32>() {
        Ok(weight) if (1..=100).contains(&weight) => Ok(weight),
        _ => Err(format!("must be between 1 and 100, got {value:?}")),
    }
}

/// The quota of these pairs; `None` without any.
fn quota(pairs: Vec<Option<(String, Quantity)>>) -> Option<TenantQuota> {
    let mut quota = TenantQuota::default();
    let mut any = false;
    for (name, quantity) in pairs.into_iter().flatten() {
        // The name was checked by `quota_pair`.
        any |= set_quota_dimension(&mut quota, &name, quantity);
    }
    any.then_some(quota)
}

/// A `dimension=quantity` pair of a quota, by the names of `spec.quota`; empty is `None`.
fn quota_pair(pair: &str) -> Result<Option<(String, Quantity)>, String> {
    let pair = pair.trim();
    if pair.is_empty() {
        return Ok(None);
    }
    let Some((name, value)) = pair.split_once('=') else {
        return Err(format!("{pair:?} is not dimension=quantity"));
    };
    let (name, value) = (name.trim(), value.trim());
    if crds::quantity::parse_quantity(value, 1000.0).is_none_or(|q| q < 0) {
        return Err(format!("{value:?} of {name} is not a quantity"));
    }
    let quantity = Quantity(value.to_owned());
    if !set_quota_dimension(&mut TenantQuota::default(), name, quantity.clone()) {
        return Err(format!(
            "{name:?} is not a quota dimension (one of {})",
            quota_dimensions().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(Some((name.to_owned(), quantity)))
}

/// `qps` or `qps/burst` (burst at least qps); empty is none.
fn rate_limit(value: &str) -> Result<Blank<(u32, u32)>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(Blank(None));
    }
    let number = |text: &str| {
        text.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("{value:?} must be qps or qps/burst, positive whole numbers"))
    };
    let (qps, burst) = match value.split_once('/') {
        Some((qps, burst)) => (number(qps)?, number(burst)?),
        None => (number(value)?, number(value)?),
    };
    if burst < qps {
        return Err(format!("burst must be at least qps, got {value:?}"));
    }
    Ok(Blank(Some((qps, burst))))
}

/// A host suffix pattern that names the tenant; empty is none.
fn ingress_host_suffix(value: &str) -> Result<Blank<String>, String> {
    let pattern = value.trim();
    if pattern.is_empty() {
        return Ok(Blank(None));
    }
    let unique = pattern.contains("{key}") || (pattern.contains("{name}") && pattern.contains("{namespace}"));
    if !unique {
        return Err(format!(
            "must name the tenant ({{key}}, or {{name}} and {{namespace}}), got {pattern:?}"
        ));
    }
    let example = pattern
        .replace("{key}", "ns-0a1b2c-name")
        .replace("{name}", "name")
        .replace("{namespace}", "ns");
    if !is_dns_name(&example) {
        return Err(format!("{pattern:?} is not a DNS name"));
    }
    Ok(Blank(Some(pattern.to_ascii_lowercase())))
}

/// A domain, lower-cased and without a final dot; empty is `None`.
fn domain(value: &str) -> Result<Option<String>, String> {
    let domain = value.trim().trim_end_matches('.').to_ascii_lowercase();
    match (value.trim().is_empty(), is_dns_name(&domain)) {
        (true, _) => Ok(None),
        (false, true) => Ok(Some(domain)),
        (false, false) => Err(format!("{domain:?} is not a DNS name")),
    }
}

/// A lowercase DNS name of labels of letters, digits and `-`.
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}
