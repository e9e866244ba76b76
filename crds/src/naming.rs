//! How a tenant's objects are named in the super cluster.
//!
//! Every component uses these functions, so that vc-manager's root namespace, the syncer's tenant
//! namespaces and vn-agent's lookups always agree, including for names that must be shortened.

use sha2::{Digest, Sha256};

/// Longest name a namespace (a DNS label) may have.
pub const MAX_DNS_LABEL: usize = 63;

/// Hex digits of SHA-256 that end a shortened name: 64 bits, so that nobody can search for a second name
/// that shortens to the same one (the original project's five digits, 20 bits, took a laptop seconds).
const SHORTENED_HASH: usize = 16;

/// How many characters of an over-long name are kept before `-` and the hash suffix.
const SHORTENED_PREFIX: usize = MAX_DNS_LABEL - 1 - SHORTENED_HASH;

fn sha256_hex(input: &str) -> String {
    hex::encode(Sha256::digest(input.as_bytes()))
}

/// Keeps `name` if it fits in a DNS label; otherwise its first 46 characters, `-`, and the first 16 hex
/// digits (64 bits) of the SHA-256 of the whole name, so it stays valid and two long names cannot be made
/// to collide. (The original project kept 57 characters and 5 hex digits; names that fit are the same.)
pub fn fit_dns_label(name: &str) -> String {
    if name.len() <= MAX_DNS_LABEL {
        return name.to_owned();
    }
    let prefix: String = name.chars().take(SHORTENED_PREFIX).collect();
    format!("{prefix}-{}", &sha256_hex(name)[..SHORTENED_HASH])
}

/// The cluster key of a VirtualCluster: `<vc namespace>-<first 6 hex of sha256(vc uid)>-<vc name>`, fitted
/// to a DNS label. It names the tenant's root namespace, prefixes its namespaces, and is the common name of
/// the certificate its apiserver presents to vn-agent.
pub fn cluster_key(vc_namespace: &str, vc_uid: &str, vc_name: &str) -> String {
    let uid_hash = sha256_hex(vc_uid);
    fit_dns_label(&format!("{vc_namespace}-{}-{vc_name}", &uid_hash[..6]))
}

/// The cluster key of a VirtualCluster object; `None` until the apiserver has given it a namespace and uid.
pub fn cluster_key_of(vc: &crate::VirtualCluster) -> Option<String> {
    let meta = &vc.metadata;
    Some(cluster_key(
        meta.namespace.as_deref()?,
        meta.uid.as_deref()?,
        meta.name.as_deref()?,
    ))
}

/// The super-cluster namespace holding tenant namespace `tenant_namespace`: `<cluster key>-<namespace>`,
/// fitted to a DNS label.
pub fn super_namespace(cluster_key: &str, tenant_namespace: &str) -> String {
    fit_dns_label(&format!("{cluster_key}-{tenant_namespace}"))
}

/// Whether `namespace` is the super namespace of `tenant_namespace` of the tenant `cluster_key`
/// ([`super_namespace`]), without building the name when it is not shortened.
pub fn is_super_namespace(namespace: &str, cluster_key: &str, tenant_namespace: &str) -> bool {
    if cluster_key.len() + 1 + tenant_namespace.len() <= MAX_DNS_LABEL {
        return namespace
            .strip_prefix(cluster_key)
            .and_then(|rest| rest.strip_prefix('-'))
            == Some(tenant_namespace);
    }
    namespace == super_namespace(cluster_key, tenant_namespace)
}

/// Whether `value` is a DNS label as Kubernetes names namespaces (RFC 1123: 1 to 63 lower-case letters,
/// digits and `-`, starting and ending with a letter or digit).
pub fn is_dns_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_DNS_LABEL
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

/// Longest DNS name, without the trailing dot (RFC 1035).
pub const MAX_DNS_NAME: usize = 253;

/// The target of an ExternalName Service as a host name (RFC 1123): lower case, without the trailing dot.
/// Tenants write it, so it is hostile input: the reason it is not a host name otherwise. An IP address is
/// refused (RFC 1123 host names never have a numeric top-level label): it would be a CNAME to a name made
/// of digits, which resolves nowhere; an address is what a Service without selector and its Endpoints
/// are for.
pub fn external_name_target(value: &str) -> Result<String, &'static str> {
    let name = value.strip_suffix('.').unwrap_or(value).to_ascii_lowercase();
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_DNS_NAME {
        return Err("it is longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label");
        }
        if label.len() > MAX_DNS_LABEL {
            return Err("it has a label longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err("only letters, digits, '-' and '.' make a host name");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with '-'");
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|top| top.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("it is an IP address (or ends in a numeric label)");
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_name_targets_are_host_names() {
        for (value, target) in [
            ("db.example.com", "db.example.com"),
            ("DB.Example.COM.", "db.example.com"),
            ("localhost", "localhost"),
            ("web.shop.svc.cluster.local", "web.shop.svc.cluster.local"),
            ("1password.example", "1password.example"),
        ] {
            assert_eq!(external_name_target(value).as_deref(), Ok(target), "{value}");
        }
        let longest = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(longest.len(), 253);
        assert!(external_name_target(&longest).is_ok());
        for (value, says) in [
            ("", "empty"),
            (".", "empty"),
            ("a..b", "empty label"),
            (".example.com", "empty label"),
            ("example.com..", "empty label"),
            ("evil\\.name", "only letters"),
            ("x.y\u{0}z", "only letters"),
            ("under_score.example", "only letters"),
            (" padded.example", "only letters"),
            ("-lead.example", "starts or ends"),
            ("trail-.example", "starts or ends"),
            ("10.0.0.1", "IP address"),
            ("192.168.1.1.", "IP address"),
            ("host.123", "IP address"),
        ] {
            let reason = external_name_target(value).expect_err(value);
            assert!(reason.contains(says), "{value:?}: {reason}");
        }
        assert!(
            external_name_target(&format!("{}.example", "l".repeat(64)))
                .expect_err("long label")
                .contains("63")
        );
        assert!(
            external_name_target(&format!("{longest}a"))
                .expect_err("long")
                .contains("253")
        );
    }

    #[test]
    fn cluster_key_matches_the_original_scheme() {
        // sha256("12345678-aaaa-bbbb-cccc-1234567890ab") starts with these six hex digits.
        let uid = "12345678-aaaa-bbbb-cccc-1234567890ab";
        let hash = &sha256_hex(uid)[..6];
        assert_eq!(
            cluster_key("default", uid, "vc-1"),
            format!("default-{hash}-vc-1")
        );
    }

    #[test]
    fn sha256_prefix_is_stable() {
        // Fixed vector: guards against a change of hash or encoding, which would rename every tenant.
        assert_eq!(&sha256_hex("abc")[..12], "ba7816bf8f01");
    }

    #[test]
    fn short_names_are_unchanged() {
        let name = "a".repeat(63);
        assert_eq!(fit_dns_label(&name), name);
    }

    #[test]
    fn long_names_are_cut_and_hashed() {
        let name = "b".repeat(64);
        let fitted = fit_dns_label(&name);
        assert_eq!(fitted.len(), 63);
        assert_eq!(&fitted[..46], &name[..46]);
        assert_eq!(&fitted[46..47], "-");
        assert_eq!(&fitted[47..], &sha256_hex(&name)[..16]);
        // A fixed vector: a change of the rule renames every long-named tenant and namespace.
        assert_eq!(
            fit_dns_label(&"n".repeat(70)),
            "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn-85069ddf41673897"
        );
        // Two long names with the same prefix stay distinct.
        let other = format!("{}c", "b".repeat(63));
        assert_ne!(fit_dns_label(&other), fitted);
    }

    #[test]
    fn super_namespace_prefixes_the_cluster_key() {
        let key = cluster_key("team-a", "uid-1", "dev");
        assert_eq!(super_namespace(&key, "kube-system"), format!("{key}-kube-system"));
    }

    #[test]
    fn sixty_three_character_tenant_namespace_is_shortened() {
        let key = cluster_key("default", "uid-2", "vc");
        let tenant_ns = "n".repeat(63);
        let ns = super_namespace(&key, &tenant_ns);
        assert_eq!(ns.len(), 63);
        assert!(ns.starts_with(&format!("{key}-nnn")));
    }

    #[test]
    fn a_shortened_name_can_equal_another_namespaces_plain_name() {
        // The scheme (kept for compatibility) is not injective: the tail of a shortened name is itself a
        // valid namespace whose plain mapping is the same. This is why components identify super objects by
        // their tenancy.x-k8s.io/namespace and uid annotations, never by parsing names.
        let key = cluster_key("default", "uid-2", "vc");
        let long = super_namespace(&key, &"n".repeat(63));
        let tail = &long[key.len() + 1..];
        assert_eq!(super_namespace(&key, tail), long);
    }

    #[test]
    fn super_namespaces_are_recognised_with_and_without_shortening() {
        let long = "n".repeat(60);
        for (cluster, tenant) in [
            ("team-abc123-vc", "shop"),
            ("team-abc123-vc", long.as_str()),
            ("k", ""),
        ] {
            let name = super_namespace(cluster, tenant);
            assert!(is_super_namespace(&name, cluster, tenant), "{cluster} {tenant}");
            assert!(!is_super_namespace(&format!("{name}x"), cluster, tenant));
            assert!(!is_super_namespace(cluster, cluster, tenant));
        }
        // A tenant namespace whose name begins with `-`-joined parts of another's is no match.
        assert!(!is_super_namespace(
            "team-abc123-vc-shop",
            "team-abc123",
            "vc-shop-x"
        ));
        assert!(is_super_namespace(
            "team-abc123-vc-shop",
            "team-abc123",
            "vc-shop"
        ));
    }

    #[test]
    fn dns_labels_are_what_namespaces_may_be_named() {
        for good in ["a", "shop", "a-1", &"x".repeat(63)] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "a/b", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn long_cluster_keys_still_make_valid_namespaces() {
        let key = cluster_key(&"x".repeat(63), "uid-3", &"y".repeat(63));
        assert_eq!(key.len(), 63);
        assert_eq!(super_namespace(&key, "default").len(), 63);
        assert_ne!(cluster_key(&"x".repeat(63), "uid-4", &"y".repeat(63)), key);
    }
}
