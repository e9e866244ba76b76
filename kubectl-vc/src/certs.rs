//! Per-user client certificates for a provisioned tenant, signed by its cluster CA (`root-ca`, the tenant
//! apiserver's client CA) with vc-manager's [`CertificateAuthority`]: the tenant apiserver authenticates
//! the holder as the common name, in the organizations as groups, and the tenant's own RBAC decides what
//! they may do.

use std::time::Duration;

use tenant_pki::pki::{CertificateAuthority, CertifiedKey, LeafSpec};

/// The group that bypasses RBAC in every Kubernetes apiserver.
pub const SYSTEM_MASTERS: &str = "system:masters";

/// A minted certificate.
#[derive(Clone, Debug)]
pub struct Minted {
    /// Certificate and private key (PEM).
    pub key: CertifiedKey,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// What the user should know (shortened lifetime, RBAC bypass).
    pub warnings: Vec<String>,
}

/// Why a certificate could not be minted.
#[derive(Debug)]
pub enum MintError {
    /// The stored CA cannot sign (unreadable, expired, key mismatch).
    Authority(String),
    /// A flag is unusable.
    Argument {
        /// The flag.
        flag: &'static str,
        /// Why.
        problem: String,
    },
    /// Signing failed.
    Issue(Box<tenant_pki::Error>),
}

/// Mints a key and a client certificate for `user` in `groups`, valid for `ttl` from `now` (Unix seconds;
/// never beyond the CA), signed by the CA `ca_cert_pem`/`ca_key_pem`.
pub fn mint(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    user: &str,
    groups: &[String],
    ttl: Duration,
    now: i64,
) -> Result<Minted, MintError> {
    if user.trim().is_empty() {
        return Err(MintError::Argument {
            flag: "--user",
            problem: "the user name must not be empty".into(),
        });
    }
    if let Some(empty) = groups.iter().position(|g| g.trim().is_empty()) {
        return Err(MintError::Argument {
            flag: "--group",
            problem: format!("group {} is empty", empty + 1),
        });
    }
    if ttl.is_zero() {
        return Err(MintError::Argument {
            flag: "--ttl",
            problem: "the lifetime must be longer than zero".into(),
        });
    }
    let ca = CertificateAuthority::load(ca_cert_pem, ca_key_pem, now).map_err(MintError::Authority)?;
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    let key = ca
        .issue(&LeafSpec::client(user, &groups), ttl, now)
        .map_err(|e| MintError::Issue(Box::new(e)))?;
    let not_after = tenant_pki::pki::inspect(&key.cert_pem)
        .map(|info| info.not_after)
        .unwrap_or(now);
    let mut warnings = Vec::new();
    let wanted = now.saturating_add(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2));
    if not_after < wanted {
        warnings.push(format!(
            "the certificate expires with the tenant CA after {} instead of the requested {}",
            crate::duration::format(Duration::from_secs(u64::try_from(not_after - now).unwrap_or(0))),
            crate::duration::format(ttl)
        ));
    }
    if groups.contains(&SYSTEM_MASTERS) {
        warnings.push(format!(
            "group {SYSTEM_MASTERS} makes {user:?} a cluster-admin that the tenant's RBAC cannot restrict or revoke until the certificate expires"
        ));
    }
    Ok(Minted {
        key,
        not_after,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenant_pki::pki::{inspect, is_signed_by, key_matches};

    const NOW: i64 = 1_800_000_000;

    fn ca(lifetime_days: u64) -> CertificateAuthority {
        CertificateAuthority::generate(
            "kubernetes",
            "team-0b5c7f-vc-1",
            Duration::from_secs(lifetime_days * 86_400),
            NOW - 86_400,
        )
        .expect("CA")
    }

    #[test]
    fn user_certificates_chain_to_the_tenant_ca_with_user_groups_and_lifetime() {
        let ca = ca(3650);
        let minted = mint(
            ca.cert_pem(),
            &ca.pem().key_pem,
            "alice",
            &["dev".to_owned(), "ops".to_owned()],
            Duration::from_secs(7 * 86_400),
            NOW,
        )
        .expect("minted");
        assert!(minted.warnings.is_empty(), "{:?}", minted.warnings);
        assert!(is_signed_by(&minted.key.cert_pem, ca.cert_pem()));
        let info = inspect(&minted.key.cert_pem).expect("readable");
        assert_eq!(info.common_name.as_deref(), Some("alice"));
        assert_eq!(info.organizations, ["dev".to_owned(), "ops".to_owned()].into());
        assert!(!info.is_ca);
        assert!(info.dns_names.is_empty() && info.ip_addresses.is_empty());
        assert_eq!(info.not_after, NOW + 7 * 86_400);
        assert_eq!(minted.not_after, info.not_after);
        assert!(info.not_before <= NOW);
        assert!(key_matches(&minted.key.key_pem, &info.public_key));
        // Client authentication only.
        let (_, pem) = x509_parser::pem::parse_x509_pem(minted.key.cert_pem.as_bytes()).expect("pem");
        let cert = pem.parse_x509().expect("x509");
        let usage = cert
            .extended_key_usage()
            .expect("readable")
            .expect("extended key usage")
            .value;
        assert!(usage.client_auth && !usage.server_auth);
        // Another CA does not verify it.
        assert!(!is_signed_by(&minted.key.cert_pem, self::ca(10).cert_pem()));
    }

    #[test]
    fn the_ca_bounds_the_lifetime_and_masters_are_flagged() {
        let ca = ca(2);
        let minted = mint(
            ca.cert_pem(),
            &ca.pem().key_pem,
            "root",
            &[SYSTEM_MASTERS.to_owned()],
            Duration::from_secs(30 * 86_400),
            NOW,
        )
        .expect("minted");
        assert_eq!(minted.not_after, ca.info().not_after);
        assert_eq!(minted.warnings.len(), 2, "{:?}", minted.warnings);
        assert!(minted.warnings[0].contains("expires with the tenant CA after 1d"));
        assert!(minted.warnings[1].contains("system:masters"));
    }

    #[test]
    fn unusable_input_is_refused() {
        let ca = ca(10);
        let key = &ca.pem().key_pem;
        let day = Duration::from_secs(86_400);
        assert!(matches!(
            mint(ca.cert_pem(), key, " ", &[], day, NOW),
            Err(MintError::Argument { flag: "--user", .. })
        ));
        assert!(matches!(
            mint(ca.cert_pem(), key, "a", &[String::new()], day, NOW),
            Err(MintError::Argument { flag: "--group", .. })
        ));
        assert!(matches!(
            mint(ca.cert_pem(), key, "a", &[], Duration::ZERO, NOW),
            Err(MintError::Argument { flag: "--ttl", .. })
        ));
        let other = self::ca(10);
        assert!(matches!(
            mint(ca.cert_pem(), &other.pem().key_pem, "a", &[], day, NOW),
            Err(MintError::Authority(problem)) if problem.contains("does not belong")
        ));
        assert!(matches!(
            mint(ca.cert_pem(), key, "a", &[], day, NOW + 20 * 86_400),
            Err(MintError::Authority(problem)) if problem.contains("expired")
        ));
    }
}
