//! Which replica should sync which tenant: weighted rendezvous hashing with bounded loads.
//!
//! Every replica computes the same answer from the same inputs (the live members, the tenants and their
//! weights), whatever order it sees them in. Each tenant ranks the members by a hash of (member, tenant);
//! pure rendezvous hashing gives it to the first. That moves only the tenants of a member that leaves, and
//! about `1/(n+1)` of them to one that joins, but it balances tenant counts, not weights: one heavy tenant
//! plus a share of light ones can leave a member with far more than its share. So tenants are placed
//! heaviest first, each with the first member in its ranking that stays within a load cap of
//! `max(heaviest weight, ⌈total / members⌉, ⌊5/4 · total / members⌋)` (weights): no member holds much more
//! than its weighted share,
//! and a tenant leaves its first choice only when that member is full, which keeps movement close to
//! rendezvous hashing's.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// A tenant to place: its cluster key and its weight (the VirtualCluster's `spec.weight`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Cluster key.
    pub key: String,
    /// Weight, at least 1 (heavier tenants count for more of a member's share).
    pub weight: u64,
}

/// Headroom over an even share, in quarters: a member may hold up to 5/4 of `total / members`.
const CAP_QUARTERS: u64 = 5;

/// The rank of `member` for `key`: higher is preferred. Stable across processes and releases (SHA-256 of
/// both, never a hasher seeded per process).
pub fn score(member: &str, key: &str) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(member.as_bytes());
    hasher.update([0]);
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

/// `members` in `key`'s order of preference.
fn ranking<'m>(members: &[&'m str], key: &str) -> Vec<&'m str> {
    let mut ranked: Vec<(u64, &str)> = members.iter().map(|m| (score(m, key), *m)).collect();
    // Ties (never seen with SHA-256, but possible) break by name, so the order stays total.
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    ranked.into_iter().map(|(_, m)| m).collect()
}

/// The member `key` prefers among `members`, ignoring loads: for a single duty such as the cluster-wide
/// patrol. `None` without members.
pub fn first_choice<'m>(members: &[&'m str], key: &str) -> Option<&'m str> {
    ranking(members, key).into_iter().next()
}

/// The owner of every tenant (cluster key → member). Empty without members. Duplicate members count once;
/// duplicate keys are placed once.
pub fn assign(tenants: &[Placed], members: &[&str]) -> BTreeMap<String, String> {
    let mut members: Vec<&str> = members.to_vec();
    members.sort_unstable();
    members.dedup();
    let mut placed = BTreeMap::new();
    if members.is_empty() {
        return placed;
    }
    let mut order: Vec<&Placed> = tenants.iter().collect();
    order.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.key.cmp(&b.key)));
    order.dedup_by(|a, b| a.key == b.key);
    let weight = |t: &Placed| t.weight.max(1);
    let total: u64 = order.iter().map(|t| weight(t)).sum();
    let heaviest = order.iter().map(|t| weight(t)).max().unwrap_or(1);
    let n = members.len() as u64;
    // An even share rounded up is always allowed, so that few tenants still split evenly (6 over 2 is 3
    // and 3); the headroom (rounded down) only counts once it is at least one whole tenant.
    let cap = heaviest
        .max(total.div_ceil(n))
        .max(total * CAP_QUARTERS / (4 * n));
    let mut loads: BTreeMap<&str, u64> = members.iter().map(|m| (*m, 0)).collect();
    for tenant in order {
        let ranked = ranking(&members, &tenant.key);
        let w = weight(tenant);
        let owner = ranked
            .iter()
            .find(|m| loads[**m] + w <= cap)
            .copied()
            // Every member full (possible with very uneven weights): the least loaded, by preference.
            .unwrap_or_else(|| {
                ranked
                    .iter()
                    .min_by_key(|m| loads[**m])
                    .copied()
                    .unwrap_or(members[0])
            });
        *loads.get_mut(owner).expect("a member") += w;
        placed.insert(tenant.key.clone(), owner.to_owned());
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants(count: usize, weight: impl Fn(usize) -> u64) -> Vec<Placed> {
        (0..count)
            .map(|i| Placed {
                key: format!("team-{i}-0a1b2c-tenant"),
                weight: weight(i),
            })
            .collect()
    }

    fn loads(tenants: &[Placed], placed: &BTreeMap<String, String>) -> BTreeMap<String, u64> {
        let mut loads = BTreeMap::new();
        for t in tenants {
            *loads.entry(placed[&t.key].clone()).or_insert(0) += t.weight;
        }
        loads
    }

    fn moved(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> usize {
        before.iter().filter(|(k, m)| after.get(*k) != Some(m)).count()
    }

    #[test]
    fn every_replica_computes_the_same_owners_whatever_order_it_sees() {
        let all = tenants(50, |i| (i as u64 * 37) % 100 + 1);
        let placed = assign(&all, &["syncer-a", "syncer-b", "syncer-c"]);
        assert_eq!(placed.len(), 50);
        let mut shuffled = all.clone();
        shuffled.reverse();
        shuffled.rotate_left(17);
        assert_eq!(
            assign(&shuffled, &["syncer-c", "syncer-a", "syncer-b", "syncer-a"]),
            placed
        );
        // And the same as yesterday: the hash is fixed, not seeded per process.
        assert_eq!(score("syncer-a", "t"), score("syncer-a", "t"));
        assert_ne!(score("syncer-a", "t"), score("syncer-b", "t"));
    }

    #[test]
    fn few_tenants_split_evenly() {
        let all = tenants(6, |_| 1);
        let placed = assign(&all, &["syncer-0", "syncer-1"]);
        let counts = loads(&all, &placed);
        assert_eq!(counts.values().copied().collect::<Vec<_>>(), [3, 3], "{counts:?}");
    }

    #[test]
    fn no_members_place_nothing_and_one_member_takes_everything() {
        let all = tenants(5, |_| 1);
        assert!(assign(&all, &[]).is_empty());
        assert!(assign(&all, &["only"]).values().all(|m| m == "only"));
    }

    #[test]
    fn each_member_holds_about_its_weighted_share() {
        let all = tenants(300, |i| (i as u64 * 37) % 100 + 1);
        let members = ["syncer-a", "syncer-b", "syncer-c"];
        let placed = assign(&all, &members);
        let total: u64 = all.iter().map(|t| t.weight).sum();
        let share = total / 3;
        for (member, load) in loads(&all, &placed) {
            assert!(load <= share * 5 / 4 + 1, "{member} holds {load} of {total}");
            assert!(load >= share * 3 / 4, "{member} holds only {load} of {total}");
        }
    }

    #[test]
    fn a_heavy_tenant_counts_for_its_weight() {
        // One tenant of weight 100 and 100 of weight 1 on two members: whoever gets the heavy one gets few
        // light ones (by count, rendezvous hashing alone would split the light ones evenly).
        let mut all = tenants(100, |_| 1);
        all.push(Placed {
            key: "big-0a1b2c-tenant".into(),
            weight: 100,
        });
        let placed = assign(&all, &["syncer-a", "syncer-b"]);
        let heavy_owner = &placed["big-0a1b2c-tenant"];
        let light_with_heavy = all
            .iter()
            .filter(|t| t.weight == 1 && &placed[&t.key] == heavy_owner)
            .count();
        // Cap: 5/4 of 200/2 = 125, so at most 25 light tenants join the heavy one.
        assert!(
            light_with_heavy <= 25,
            "{light_with_heavy} light tenants share the heavy one's member"
        );
        let loads = loads(&all, &placed);
        assert!(loads.values().all(|l| *l <= 125), "{loads:?}");
    }

    #[test]
    fn a_member_that_joins_takes_about_its_share_and_others_keep_theirs() {
        let all = tenants(400, |_| 1);
        let before = assign(&all, &["syncer-a", "syncer-b", "syncer-c"]);
        let after = assign(&all, &["syncer-a", "syncer-b", "syncer-c", "syncer-d"]);
        let to_new = after.values().filter(|m| *m == "syncer-d").count();
        let total_moved = moved(&before, &after);
        println!("{total_moved} moved, {to_new} to the new member");
        // Ideal: a quarter (100) move, all to the new member.
        assert!(
            (80..=125).contains(&to_new),
            "{to_new} tenants moved to the new member"
        );
        assert!(
            total_moved <= to_new + 40,
            "{total_moved} moved, {to_new} of them to the new member"
        );
    }

    #[test]
    fn when_a_member_leaves_mostly_its_own_tenants_move() {
        let all = tenants(400, |i| (i as u64 % 7) + 1);
        let before = assign(&all, &["syncer-a", "syncer-b", "syncer-c", "syncer-d"]);
        let after = assign(&all, &["syncer-a", "syncer-b", "syncer-c"]);
        let orphaned = before.values().filter(|m| *m == "syncer-d").count();
        assert!(after.values().all(|m| m != "syncer-d"));
        let others_moved = before
            .iter()
            .filter(|(k, m)| *m != "syncer-d" && after[*k] != **m)
            .count();
        println!("{orphaned} tenants of the departed member moved, {others_moved} others");
        // Rendezvous hashing alone moves none of them; the cap moves a few.
        assert!(
            others_moved <= all.len() / 10,
            "{others_moved} tenants of surviving members moved ({orphaned} had to)"
        );
    }

    #[test]
    fn the_duty_goes_to_one_member_everyone_agrees_on() {
        let a = first_choice(&["x", "y", "z"], "cluster-duties");
        assert_eq!(a, first_choice(&["z", "x", "y"], "cluster-duties"));
        assert!(a.is_some());
        assert_eq!(first_choice(&[], "cluster-duties"), None);
    }
}
