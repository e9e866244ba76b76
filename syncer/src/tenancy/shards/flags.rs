//! Flags of sharding tenants across replicas (`--shards` and the shard Leases).

use std::time::Duration;

use super::{MIN_LEASE_DURATION, ShardSettings, replica_id};

/// Flags of sharding.
#[derive(Clone, Debug, clap::Args)]
pub struct ShardFlags {
    /// Shard tenants across replicas: every replica is active and syncs only the tenants whose Lease it
    /// holds, placed by weight over the live replicas (whole-process leader election is then off).
    #[arg(long, env = "SHARDS", default_value_t = false, action = clap::ArgAction::Set)]
    pub shards: bool,
    /// This replica's name among the shards (default: the pod name). Checked only with `--shards`: the
    /// chart sets `POD_NAME` for every syncer.
    #[arg(long, env = "POD_NAME")]
    pub replica_id: Option<String>,
    /// Namespace of the shard Leases (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default", value_parser = crate::engine::config::values::namespace)]
    pub shard_namespace: String,
    /// Seconds a replica's membership (and with it every tenant Lease it holds) lasts without renewal. It
    /// renews every third of that and stops syncing after two thirds without renewal; a dead replica's
    /// tenants move after this long.
    #[arg(long = "shard-lease-duration-seconds", env = "SHARD_LEASE_DURATION_SECONDS", default_value = "6", value_parser = lease_duration)]
    pub shard_lease_duration: Duration,
}

impl ShardFlags {
    /// The shards' settings with `--shards`; `None` without.
    pub fn settings(self) -> Result<Option<ShardSettings>, String> {
        if !self.shards {
            return Ok(None);
        }
        let replica = self
            .replica_id
            .filter(|id| !id.trim().is_empty())
            // Outside a pod: host name and pid, made a Lease name.
            .unwrap_or_else(|| {
                vc_runtime::leader::identity()
                    .to_ascii_lowercase()
                    .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '.', "-")
                    .trim_matches(|c: char| !c.is_ascii_alphanumeric())
                    .to_owned()
            });
        Ok(Some(ShardSettings {
            replica_id: replica_id(&replica)?,
            namespace: self.shard_namespace,
            lease_duration: self.shard_lease_duration,
        }))
    }
}

fn lease_duration(value: &str) -> Result<Duration, String> {
    let duration = crate::engine::config::values::seconds(value)?;
    match duration < MIN_LEASE_DURATION {
        true => Err(format!("must be at least {}", MIN_LEASE_DURATION.as_secs())),
        false => Ok(duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<Option<ShardSettings>, String> {
        crate::engine::config::values::parse_without_env::<ShardFlags>(flags)?.settings()
    }

    #[test]
    fn shards_are_off_by_default_and_their_flags_are_checked() {
        assert!(parse(&[]).expect("defaults").is_none());
        let config = parse(&[
            "--shards=true",
            "--replica-id=syncer-7f9c-abcde",
            "--shard-namespace=vc-system",
        ])
        .expect("sharded");
        assert_eq!(
            config,
            Some(ShardSettings {
                replica_id: "syncer-7f9c-abcde".into(),
                namespace: "vc-system".into(),
                lease_duration: Duration::from_secs(6),
            })
        );
        let refused = parse(&["--shards=true", "--replica-id=Bad_Name"]).expect_err("refused");
        assert!(refused.contains("--replica-id"), "{refused}");
        let refused = parse(&[
            "--shards=true",
            "--replica-id=a",
            "--shard-lease-duration-seconds=2",
        ])
        .expect_err("refused");
        assert!(refused.contains("at least 3"), "{refused}");
    }
}
