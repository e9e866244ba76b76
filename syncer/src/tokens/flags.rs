//! Flags of the service-account tokens minted for tenant pods and the token Secrets that carry them.

/// Flags of pods' tokens.
#[derive(Clone, Debug, clap::Args)]
pub struct TokenFlags {
    /// Lifetime of the service-account tokens minted for tenant pods (refreshed at 80%), at least 600
    /// seconds (the apiserver's minimum).
    #[arg(long, default_value_t = 3600, value_parser = token_ttl)]
    pub token_ttl_seconds: i64,
    /// Most pods whose tokens share one token Secret of a super namespace (1-256): every kubelet running
    /// one of them receives the whole Secret on each write.
    #[arg(long, env = "PODS_PER_TOKEN_SECRET", default_value_t = 32, value_parser = pods_per_secret)]
    pub pods_per_token_secret: usize,
}

fn token_ttl(value: &str) -> Result<i64, String> {
    match value.trim().parse::<i64>() {
        Ok(seconds) if seconds >= 600 => Ok(seconds),
        _ => Err(format!(
            "must be at least 600 seconds (the apiserver's minimum), got {value:?}"
        )),
    }
}

fn pods_per_secret(value: &str) -> Result<usize, String> {
    match value.trim().parse::<usize>() {
        Ok(pods) if (1..=256).contains(&pods) => Ok(pods),
        _ => Err(format!(
            "must be between 1 and 256 (a Secret holds at most 1 MiB), got {value:?}"
        )),
    }
}
