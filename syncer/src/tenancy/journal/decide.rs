//! What the attach journals say, decided by pure functions: which unclean stops a tenant was being
//! attached at, what they count against it, and which tenants may be attached together.

use std::{collections::BTreeMap, time::Duration};

use crds::AttachBackoff;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde::{Deserialize, Serialize};

/// One replica's journal as stored (ConfigMap data key [`super::DATA_KEY`], JSON): the process that wrote
/// it, and the tenants it was attaching then, each with when it entered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The writing process (`<replica>/<nonce>`).
    pub instance: String,
    /// Tenants being attached (cluster key → when it entered), until each has stayed attached for the
    /// probation.
    #[serde(default)]
    pub attaching: BTreeMap<String, Timestamp>,
}

/// A stop that interrupted a tenant's attach: a journal whose process is gone, naming the tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The process that stopped.
    pub instance: String,
    /// When the tenant entered its attach.
    pub entered: Timestamp,
    /// How many tenants that process was attaching, this one included.
    pub attached_with: usize,
}

/// The stops `key` was being attached at: the journals (other than `own`, this process's) whose writer is
/// not `alive` and that name it, oldest first.
pub fn evidence<'a>(
    journals: impl IntoIterator<Item = &'a Record>,
    own: &str,
    key: &str,
    alive: impl Fn(&str) -> bool,
) -> Vec<Evidence> {
    let mut found: Vec<Evidence> = journals
        .into_iter()
        .filter(|record| {
            record.instance != own && record.attaching.contains_key(key) && !alive(&record.instance)
        })
        .filter_map(|record| {
            Some(Evidence {
                instance: record.instance.clone(),
                entered: *record.attaching.get(key)?,
                attached_with: record.attaching.len(),
            })
        })
        .collect();
    found.sort_by_key(|e| e.entered);
    found
}

/// How long a tenant is held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// After the first stop it alone was being attached at.
    pub base: Duration,
    /// At most.
    pub max: Duration,
}

impl Policy {
    /// The wait after `stops` stops in a row: `base`, doubled for each stop after the first, at most `max`.
    pub fn delay(&self, stops: i64) -> Duration {
        let doublings = u32::try_from(stops.saturating_sub(1).clamp(0, 30)).unwrap_or(30);
        self.base.saturating_mul(1u32 << doublings).min(self.max)
    }
}

fn time(at: Timestamp) -> Time {
    Time(at)
}

/// `at` to the whole second: `status.attachBackoff.lastAttachTime` is a `Time`, which the apiserver keeps
/// to the second, while the journals keep when a tenant entered to the nanosecond.
fn whole_second(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

/// The tenant's record with the stops in `evidence` it does not count yet (a stop counts once: only
/// those whose attach began after the last one counted), found at `now`; `None` when nothing is new.
///
/// A stop while the tenant was attached alone holds it back ([`Policy::delay`] from `now`); one while it
/// was attached with others only makes it a suspect, attached again at once in a group half that size, so
/// that the tenant behind repeated stops is found in a few of them and the others go on.
pub fn count(
    record: Option<&AttachBackoff>,
    evidence: &[Evidence],
    now: Timestamp,
    policy: Policy,
) -> Option<AttachBackoff> {
    let mut last = record
        .and_then(|r| r.last_attach_time.as_ref())
        .map(|t| whole_second(t.0));
    let mut counted = record.cloned().unwrap_or_default();
    let mut changed = false;
    for stop in evidence {
        // Compared to the second, as the record comes back from the apiserver (an attach, a stop and the
        // next attach take longer than a second).
        let entered = whole_second(stop.entered);
        if last.is_some_and(|last| entered <= last) {
            continue;
        }
        last = Some(entered);
        counted.stops = counted.stops.max(0).saturating_add(1);
        counted.attached_with = i64::try_from(stop.attached_with.max(1)).unwrap_or(i64::MAX);
        counted.last_attach_time = Some(time(entered));
        counted.instance = Some(stop.instance.clone());
        changed = true;
    }
    if !changed {
        return None;
    }
    counted.not_before = (counted.attached_with <= 1).then(|| {
        let delay = k8s_openapi::jiff::SignedDuration::try_from(policy.delay(counted.stops))
            .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
        time(now.checked_add(delay).unwrap_or(Timestamp::MAX))
    });
    Some(counted)
}

/// How a tenant joins the attach journal.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// No stop counts against it: attached with any other clear tenants.
    Clear,
    /// Stops count against it: attached only with suspects of the same stop, at most `group` at once.
    Suspect {
        /// The stop that made it a suspect.
        instance: String,
        /// How many may be attached together.
        group: usize,
    },
}

/// What a tenant's record says now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Attach it (as `Kind` says).
    Attach(Kind),
    /// Not before `until`.
    HeldBack {
        /// When it may be attached again.
        until: Timestamp,
    },
}

/// The standing of a tenant with `record` at `now`.
pub fn standing(record: Option<&AttachBackoff>, now: Timestamp) -> Standing {
    let Some(record) = record.filter(|r| r.stops > 0) else {
        return Standing::Attach(Kind::Clear);
    };
    if let Some(until) = record
        .not_before
        .as_ref()
        .map(|t| t.0)
        .filter(|until| *until > now)
    {
        return Standing::HeldBack { until };
    }
    let attached_with = usize::try_from(record.attached_with.max(1)).unwrap_or(usize::MAX);
    Standing::Attach(Kind::Suspect {
        instance: record.instance.clone().unwrap_or_default(),
        group: attached_with.div_ceil(2).max(1),
    })
}

/// Whether a tenant of `kind` may join the tenants being attached (`wave`) now, with `waiting` (the kinds
/// of every tenant waiting to, itself included) in mind.
///
/// Tenants are attached in waves of one kind, so that a stop blames only those that were being attached:
/// clear tenants together; suspects only with suspects of the same stop, at most their group. Clear
/// tenants go first (they are likely fine and quick), and a wave takes no newcomers while the other kind
/// waits, so neither waits for ever; of waiting suspects, the larger groups go first.
pub fn admits(wave: &[Kind], waiting: &[Kind], kind: &Kind) -> bool {
    let clear_waiting = waiting.contains(&Kind::Clear);
    let suspect_waiting = waiting.iter().any(|k| *k != Kind::Clear);
    match (wave.first(), kind) {
        (None, Kind::Clear) => true,
        (None, Kind::Suspect { group, .. }) => {
            !clear_waiting
                && !waiting
                    .iter()
                    .any(|k| matches!(k, Kind::Suspect { group: other, .. } if other > group))
        }
        (Some(Kind::Clear), Kind::Clear) => !suspect_waiting,
        (Some(Kind::Clear), Kind::Suspect { .. }) | (Some(Kind::Suspect { .. }), Kind::Clear) => false,
        (
            Some(Kind::Suspect {
                instance: open,
                group: size,
            }),
            Kind::Suspect { instance, group },
        ) => !clear_waiting && open == instance && size == group && wave.len() < *group,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    fn record(instance: &str, attaching: &[(&str, i64)]) -> Record {
        Record {
            instance: instance.into(),
            attaching: attaching.iter().map(|(k, t)| ((*k).to_owned(), at(*t))).collect(),
        }
    }

    const POLICY: Policy = Policy {
        base: Duration::from_secs(60),
        max: Duration::from_secs(3600),
    };

    #[test]
    fn evidence_comes_from_journals_of_processes_that_are_gone() {
        let journals = [
            record("r0/dead", &[("evil", 10), ("good", 11)]),
            record("r1/live", &[("evil", 20)]),
            record("r2/me", &[("evil", 30)]),
            record("r3/dead-too", &[("evil", 5)]),
            record("r4/dead-clean", &[]),
        ];
        let alive = |instance: &str| instance == "r1/live";
        let found = evidence(&journals, "r2/me", "evil", alive);
        assert_eq!(
            found,
            vec![
                Evidence {
                    instance: "r3/dead-too".into(),
                    entered: at(5),
                    attached_with: 1
                },
                Evidence {
                    instance: "r0/dead".into(),
                    entered: at(10),
                    attached_with: 2
                },
            ]
        );
        assert!(evidence(&journals, "r2/me", "other", alive).is_empty());
    }

    #[test]
    fn the_wait_doubles_up_to_its_ceiling() {
        let waits: Vec<u64> = (1..=8).map(|stops| POLICY.delay(stops).as_secs()).collect();
        assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(POLICY.delay(0).as_secs(), 60);
        assert_eq!(POLICY.delay(i64::MAX).as_secs(), 3600);
    }

    #[test]
    fn a_stop_while_attached_alone_holds_the_tenant_back_and_counts_once() {
        let alone = Evidence {
            instance: "r0/a".into(),
            entered: at(10),
            attached_with: 1,
        };
        let first = count(None, std::slice::from_ref(&alone), at(100), POLICY).expect("counted");
        assert_eq!(first.stops, 1);
        assert_eq!(first.attached_with, 1);
        assert_eq!(first.not_before, Some(Time(at(160))));
        assert_eq!(first.instance.as_deref(), Some("r0/a"));
        // Found again (by another replica, or after a restart): nothing new.
        assert_eq!(
            count(Some(&first), std::slice::from_ref(&alone), at(120), POLICY),
            None
        );
        // The journal keeps nanoseconds, the record as the apiserver returns it whole seconds: the same
        // stop, found in the journal again after the record went through the apiserver, counts no more.
        let precise = Evidence {
            entered: at(10)
                .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(750))
                .expect("time"),
            ..alone
        };
        let counted = count(None, std::slice::from_ref(&precise), at(100), POLICY).expect("counted");
        assert_eq!(counted.last_attach_time, Some(Time(at(10))));
        assert_eq!(count(Some(&counted), &[precise], at(120), POLICY), None);
        // It is attached again after the wait and stops the next process too: twice the wait.
        let again = Evidence {
            instance: "r1/b".into(),
            entered: at(170),
            attached_with: 1,
        };
        let second = count(Some(&first), &[again], at(200), POLICY).expect("counted");
        assert_eq!(second.stops, 2);
        assert_eq!(second.not_before, Some(Time(at(320))));
        assert_eq!(
            standing(Some(&second), at(319)),
            Standing::HeldBack { until: at(320) }
        );
        assert_eq!(
            standing(Some(&second), at(320)),
            Standing::Attach(Kind::Suspect {
                instance: "r1/b".into(),
                group: 1
            })
        );
        assert_eq!(standing(None, at(0)), Standing::Attach(Kind::Clear));
    }

    #[test]
    fn a_stop_while_attached_with_others_makes_a_suspect_attached_in_half_the_group() {
        let crowd = Evidence {
            instance: "r0/a".into(),
            entered: at(10),
            attached_with: 7,
        };
        let counted = count(None, &[crowd], at(100), POLICY).expect("counted");
        assert_eq!(
            (counted.stops, counted.attached_with, counted.not_before.clone()),
            (1, 7, None)
        );
        assert_eq!(
            standing(Some(&counted), at(100)),
            Standing::Attach(Kind::Suspect {
                instance: "r0/a".into(),
                group: 4
            })
        );
        // Two stops found at once (nobody looked in between): both count, the latest decides.
        let both = [
            Evidence {
                instance: "r0/a".into(),
                entered: at(10),
                attached_with: 7,
            },
            Evidence {
                instance: "r1/b".into(),
                entered: at(50),
                attached_with: 1,
            },
        ];
        let counted = count(None, &both, at(100), POLICY).expect("counted");
        assert_eq!((counted.stops, counted.attached_with), (2, 1));
        assert_eq!(counted.not_before, Some(Time(at(220))));
    }

    /// Bisection: a process that stops whenever the poisoned tenant is attached, 8 tenants attached at
    /// its start. Each restart attaches the suspects in the groups `admits` allows, one wave at a time;
    /// the poisoned tenant is alone after log2(8) + 1 stops, the others are cleared on the way.
    #[test]
    fn repeated_stops_single_out_the_tenant_behind_them() {
        let tenants: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
        let poisoned = "t5";
        let mut records: BTreeMap<String, AttachBackoff> = BTreeMap::new();
        let mut now = 0;
        let mut stops = 0;
        let mut instance = 0;
        // The first start attaches everyone as clear: it stops.
        let mut wave: Vec<String> = tenants.clone();
        loop {
            now += 100;
            let journal = Record {
                instance: format!("r0/{instance}"),
                attaching: wave.iter().map(|k| (k.clone(), at(now))).collect(),
            };
            if wave.iter().any(|k| k == poisoned) {
                // Stopped; the next process counts it.
                stops += 1;
                instance += 1;
                now += 100;
                for key in &wave {
                    let found = evidence([&journal], "r0/next", key, |_| false);
                    if let Some(counted) = count(records.get(key), &found, at(now), POLICY) {
                        records.insert(key.clone(), counted);
                    }
                }
            } else {
                // Survived the probation: cleared.
                for key in &wave {
                    records.remove(key);
                }
            }
            if records.get(poisoned).is_some_and(|r| r.attached_with == 1) {
                break;
            }
            assert!(stops < 10, "not singled out: {records:?}");
            // The next wave: held-back tenants aside, the kinds of everyone waiting, admitted in turn.
            let mut waiting: Vec<(String, Kind)> = tenants
                .iter()
                .filter_map(|key| match standing(records.get(key), at(now)) {
                    Standing::Attach(kind) if records.contains_key(key) => Some((key.clone(), kind)),
                    _ => None,
                })
                .collect();
            waiting.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
            let kinds: Vec<Kind> = waiting.iter().map(|(_, k)| k.clone()).collect();
            let mut admitted: Vec<Kind> = Vec::new();
            wave = Vec::new();
            for (key, kind) in &waiting {
                if admits(&admitted, &kinds, kind) {
                    admitted.push(kind.clone());
                    wave.push(key.clone());
                }
            }
            assert!(!wave.is_empty(), "nobody admitted: {waiting:?}");
        }
        assert_eq!(stops, 4, "8 tenants: the first stop, then halves of 4, 2 and 1");
        assert_eq!(records.len(), 1, "the others were cleared: {records:?}");
        let singled = &records[poisoned];
        assert_eq!((singled.stops, singled.attached_with), (4, 1));
        assert!(matches!(
            standing(Some(singled), at(now)),
            Standing::HeldBack { .. }
        ));
    }

    #[test]
    fn waves_are_of_one_kind_and_neither_kind_waits_for_ever() {
        let suspect = |instance: &str, group| Kind::Suspect {
            instance: instance.into(),
            group,
        };
        let clear = Kind::Clear;
        // (case, wave, waiting, kind, admitted)
        type Case = (&'static str, Vec<Kind>, Vec<Kind>, Kind, bool);
        let cases: Vec<Case> = vec![
            (
                "an empty journal takes a clear tenant",
                vec![],
                vec![clear.clone()],
                clear.clone(),
                true,
            ),
            (
                "clear tenants go first",
                vec![],
                vec![clear.clone(), suspect("a", 2)],
                suspect("a", 2),
                false,
            ),
            (
                "a suspect goes when no clear one waits",
                vec![],
                vec![suspect("a", 2)],
                suspect("a", 2),
                true,
            ),
            (
                "larger groups first",
                vec![],
                vec![suspect("a", 1), suspect("b", 4)],
                suspect("a", 1),
                false,
            ),
            (
                "clear tenants join clear tenants",
                vec![clear.clone()],
                vec![clear.clone()],
                clear.clone(),
                true,
            ),
            (
                "but not while a suspect waits",
                vec![clear.clone()],
                vec![clear.clone(), suspect("a", 1)],
                clear.clone(),
                false,
            ),
            (
                "no suspect among clear tenants",
                vec![clear.clone()],
                vec![suspect("a", 1)],
                suspect("a", 1),
                false,
            ),
            (
                "no clear tenant among suspects",
                vec![suspect("a", 2)],
                vec![clear.clone()],
                clear.clone(),
                false,
            ),
            (
                "suspects of the same stop, within their group",
                vec![suspect("a", 2)],
                vec![suspect("a", 2)],
                suspect("a", 2),
                true,
            ),
            (
                "not past the group",
                vec![suspect("a", 2), suspect("a", 2)],
                vec![suspect("a", 2)],
                suspect("a", 2),
                false,
            ),
            (
                "not with suspects of another stop",
                vec![suspect("a", 2)],
                vec![suspect("b", 2)],
                suspect("b", 2),
                false,
            ),
            (
                "alone means alone",
                vec![suspect("a", 1)],
                vec![suspect("a", 1)],
                suspect("a", 1),
                false,
            ),
        ];
        for (case, wave, waiting, kind, expected) in cases {
            assert_eq!(admits(&wave, &waiting, &kind), expected, "{case}");
        }
    }
}
