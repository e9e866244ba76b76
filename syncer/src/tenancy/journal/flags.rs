//! Flags of the attach journal.

use std::time::Duration;

use super::{JournalSettings, decide::Policy};
use crate::engine::config::values;

/// Flags of the attach journal.
#[derive(Clone, Debug, clap::Args)]
pub struct JournalFlags {
    /// Keep an attach journal (a ConfigMap per replica): a tenant being attached when a syncer process
    /// stops without a clean shutdown (a crash, an out-of-memory kill) is held back before any replica
    /// attaches it again, so one poisoned tenant cannot take every replica down in turn.
    #[arg(long, env = "ATTACH_JOURNAL", default_value_t = true, action = clap::ArgAction::Set)]
    pub attach_journal: bool,
    /// Namespace of the attach journals (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default", value_parser = crate::engine::config::values::namespace)]
    pub attach_journal_namespace: String,
    /// Seconds a newly attached tenant stays in the journal after its caches listed: a stop within that
    /// time counts against it.
    #[arg(long = "attach-probation-seconds", env = "ATTACH_PROBATION_SECONDS", default_value = "60", value_parser = values::period)]
    pub attach_probation: Duration,
    /// Seconds a tenant is held back after a syncer process stopped while attaching it alone; doubled for
    /// each further stop in a row.
    #[arg(long = "crash-backoff-seconds", env = "CRASH_BACKOFF_SECONDS", default_value = "60", value_parser = backoff)]
    pub crash_backoff: Duration,
    /// The longest a tenant is held back (at least `--crash-backoff-seconds`).
    #[arg(long = "crash-backoff-max-seconds", env = "CRASH_BACKOFF_MAX_SECONDS", default_value = "3600", value_parser = values::seconds)]
    pub crash_backoff_max: Duration,
}

impl JournalFlags {
    /// The journal's settings; `None` with `--attach-journal=false`.
    pub fn settings(self) -> Option<JournalSettings> {
        self.attach_journal.then(|| JournalSettings {
            namespace: self.attach_journal_namespace,
            probation: self.attach_probation,
            policy: Policy {
                base: self.crash_backoff,
                // A ceiling below the first wait is the first wait.
                max: self.crash_backoff_max.max(self.crash_backoff),
            },
        })
    }
}

fn backoff(value: &str) -> Result<Duration, String> {
    match values::seconds(value)? {
        Duration::ZERO => Err("must be at least 1".into()),
        backoff => Ok(backoff),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<Option<JournalSettings>, String> {
        values::parse_without_env::<JournalFlags>(flags).map(JournalFlags::settings)
    }

    #[test]
    fn the_attach_journal_is_on_by_default_and_its_flags_are_checked() {
        let journal = parse(&[]).expect("defaults").expect("on");
        assert_eq!(journal.probation, Duration::from_secs(60));
        assert_eq!(
            journal.policy,
            Policy {
                base: Duration::from_secs(60),
                max: Duration::from_secs(3600)
            }
        );
        assert!(parse(&["--attach-journal=false"]).expect("off").is_none());
        let set = parse(&[
            "--attach-journal-namespace=vc-system",
            "--attach-probation-seconds=5",
            "--crash-backoff-seconds=10",
            "--crash-backoff-max-seconds=5",
        ])
        .expect("set")
        .expect("on");
        assert_eq!(set.namespace, "vc-system");
        // A ceiling below the first wait is the first wait.
        assert_eq!(set.policy.max, Duration::from_secs(10));
        let refused = parse(&["--crash-backoff-seconds=0"]).expect_err("refused");
        assert!(refused.contains("--crash-backoff-seconds"), "{refused}");
    }
}
