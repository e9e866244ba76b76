//! Which addresses are a pod's own: the one rule vc-dns (which tenant asks) and the syncer (where a
//! tenant's selector-less Endpoints may lead) both apply to super pods.
//!
//! A pod's address is its own only while it is live and off the host network: a host-network pod has the
//! node's address (shared by every such pod there), and a finished pod's address may already be another
//! pod's. An address counts as one tenant's only when every live pod holding it is that tenant's: during
//! the moments an address is reused (the old pod going, the new one started) it is nobody's.

use std::net::IpAddr;

/// The addresses a super pod holds as its own: none for a pod on the host network or a finished one
/// (`Succeeded`, `Failed`), otherwise its valid, specified addresses (`podIP` and `podIPs`), sorted, each
/// once.
pub fn own_addresses<'a>(
    host_network: bool,
    phase: Option<&str>,
    ips: impl IntoIterator<Item = &'a str>,
) -> Vec<IpAddr> {
    if host_network || matches!(phase, Some("Succeeded" | "Failed")) {
        return Vec::new();
    }
    let mut addresses: Vec<IpAddr> = ips
        .into_iter()
        .filter_map(|ip| ip.parse().ok())
        .filter(|ip: &IpAddr| !ip.is_unspecified())
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
}

/// The one holder among every live holder of an address: `None` when there is none, or when two holders
/// differ (an address two tenants claim at once is neither's).
pub fn sole_holder<T: PartialEq>(holders: impl IntoIterator<Item = T>) -> Option<T> {
    let mut sole: Option<T> = None;
    for holder in holders {
        match &sole {
            None => sole = Some(holder),
            Some(known) if *known == holder => {}
            Some(_) => return None,
        }
    }
    sole
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    /// Host network, phase, addresses in the status, and the pod's own addresses.
    type Case<'a> = (bool, Option<&'a str>, &'a [&'a str], &'a [&'a str]);

    #[test]
    fn only_live_pods_off_the_host_network_hold_addresses() {
        let cases: &[Case<'_>] = &[
            (false, Some("Running"), &["10.0.0.5"], &["10.0.0.5"]),
            (
                false,
                Some("Pending"),
                &["10.0.0.5", "fd00::5"],
                &["10.0.0.5", "fd00::5"],
            ),
            (false, None, &["10.0.0.5", "10.0.0.5"], &["10.0.0.5"]),
            (true, Some("Running"), &["192.168.1.10"], &[]),
            (false, Some("Succeeded"), &["10.0.0.5"], &[]),
            (false, Some("Failed"), &["10.0.0.5"], &[]),
            (
                false,
                Some("Running"),
                &["", "0.0.0.0", "not-an-ip", "10.0.0.6"],
                &["10.0.0.6"],
            ),
        ];
        for (host_network, phase, ips, own) in cases {
            let expected: Vec<IpAddr> = own.iter().map(|a| ip(a)).collect();
            assert_eq!(
                own_addresses(*host_network, *phase, ips.iter().copied()),
                expected,
                "{host_network} {phase:?} {ips:?}"
            );
        }
    }

    #[test]
    fn an_address_two_holders_claim_is_neither_ones() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&[], None),
            (&["a"], Some("a")),
            (&["a", "a", "a"], Some("a")),
            (&["a", "b"], None),
            (&["a", "a", "b"], None),
        ];
        for (holders, sole) in cases {
            assert_eq!(sole_holder(holders.iter().copied()), *sole, "{holders:?}");
        }
    }
}
