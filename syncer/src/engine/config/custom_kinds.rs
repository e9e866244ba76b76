//! Which custom resource kinds the platform syncs (`--custom-resources`), to which tenants, and which of
//! their fields name Secrets and ConfigMaps.

use std::collections::BTreeMap;

/// Groups whose kinds are never synced as custom resources: Kubernetes' own (whose CRDs need API
/// approval anyway) and this project's, whose VirtualClusters must never reach a tenant.
const RESERVED_GROUP_SUFFIXES: &[&str] = &["k8s.io", "kubernetes.io", "x-k8s.io"];

/// Most kinds one syncer syncs: each costs a watch per tenant, and the metric label and caches stay
/// bounded by the platform's list.
const MAX_KINDS: usize = 32;

/// One step of a reference path: a field, or every element of a list field (`volumes[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The field of this name.
    Field(String),
    /// Every element of the list field of this name.
    Each(String),
}

/// Where a reference lies in an object: `spec.credentials`, `spec.volumes[].secretName`. The value
/// there is either a name (of an object in the same namespace) or an object with `name` and, optionally,
/// `namespace`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefPath {
    /// The steps, from the object's top level.
    pub steps: Vec<Step>,
    /// As written in the flag, for messages.
    pub text: String,
}

/// A namespaced custom resource kind the platform syncs: its CRD is published into the tenants it
/// admits, their objects are copied down and their status up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomKind {
    /// The CRD's name: `<plural>.<group>`.
    pub name: String,
    /// VirtualCluster labels (`key=value`, all of them) a tenant needs to get the kind; `None`: every
    /// tenant. A super CRD labelled `tenancy.x-k8s.io/super.public=true` reaches every tenant anyway.
    pub tenants: Option<Vec<(String, String)>>,
    /// Fields naming Secrets.
    pub secret_refs: Vec<RefPath>,
    /// Fields naming ConfigMaps.
    pub config_map_refs: Vec<RefPath>,
}

impl CustomKind {
    /// Whether a VirtualCluster with these labels gets the kind by the flag's selector.
    pub fn selects(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        match &self.tenants {
            None => true,
            Some(wanted) => wanted
                .iter()
                .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value)),
        }
    }
}

fn dns_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

fn ref_path(flag: &str, text: &str) -> Result<RefPath, String> {
    let steps = text
        .split('.')
        .map(|segment| {
            let (name, each) = match segment.strip_suffix("[]") {
                Some(name) => (name, true),
                None => (segment, false),
            };
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return Err(format!(
                    "--custom-resources {flag}: {text:?} is not a field path (fields separated by dots, `[]` after a list field)"
                ));
            }
            Ok(match each {
                true => Step::Each(name.to_owned()),
                false => Step::Field(name.to_owned()),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    match steps.first() {
        Some(Step::Field(top) | Step::Each(top))
            if ["metadata", "status", "apiVersion", "kind"].contains(&top.as_str()) =>
        {
            Err(format!(
                "--custom-resources {flag}: {text:?} is not in the object's spec (metadata, status, apiVersion and kind are not references)"
            ))
        }
        _ => Ok(RefPath {
            steps,
            text: text.to_owned(),
        }),
    }
}

/// One `--custom-resources` value: `<plural>.<group>`, then optionally, separated by `;`,
/// `tenants=key=value[,key=value]`, `secrets=path[,path]` and `configmaps=path[,path]`.
pub fn parse(value: &str) -> Result<CustomKind, String> {
    let mut parts = value.split(';').map(str::trim);
    let name = parts.next().unwrap_or_default();
    let Some((plural, group)) = name.split_once('.') else {
        return Err(format!(
            "--custom-resources: {name:?} is not <plural>.<group> (e.g. certificates.cert-manager.io)"
        ));
    };
    if !dns_label(plural) || !group.contains('.') || !group.split('.').all(dns_label) {
        return Err(format!(
            "--custom-resources: {name:?} is not <plural>.<group> with a lower-case plural and a dotted group (e.g. certificates.cert-manager.io)"
        ));
    }
    if RESERVED_GROUP_SUFFIXES
        .iter()
        .any(|s| group == *s || group.ends_with(&format!(".{s}")))
    {
        return Err(format!(
            "--custom-resources: {name:?} is in a group Kubernetes or virtualcluster reserves ({})",
            RESERVED_GROUP_SUFFIXES.join(", ")
        ));
    }
    let mut kind = CustomKind {
        name: name.to_owned(),
        tenants: None,
        secret_refs: Vec::new(),
        config_map_refs: Vec::new(),
    };
    for part in parts.filter(|p| !p.is_empty()) {
        let Some((key, list)) = part.split_once('=') else {
            return Err(format!(
                "--custom-resources {name}: {part:?} is not tenants=..., secrets=... or configmaps=..."
            ));
        };
        let items = list.split(',').map(str::trim).filter(|i| !i.is_empty());
        match key.trim() {
            "tenants" => {
                let labels = items
                    .map(|pair| match pair.split_once('=') {
                        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
                        _ => Err(format!(
                            "--custom-resources {name}: tenants: {pair:?} is not a key=value VirtualCluster label"
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if labels.is_empty() {
                    return Err(format!(
                        "--custom-resources {name}: tenants= needs at least one key=value label"
                    ));
                }
                kind.tenants = Some(labels);
            }
            "secrets" => {
                for path in items {
                    kind.secret_refs.push(ref_path(name, path)?);
                }
            }
            "configmaps" => {
                for path in items {
                    kind.config_map_refs.push(ref_path(name, path)?);
                }
            }
            other => {
                return Err(format!(
                    "--custom-resources {name}: unknown setting {other:?} (tenants, secrets, configmaps)"
                ));
            }
        }
    }
    Ok(kind)
}

/// Every `--custom-resources` value; each kind at most once.
pub fn parse_all(values: &[String]) -> Result<Vec<CustomKind>, String> {
    let kinds = values
        .iter()
        .filter(|v| !v.trim().is_empty())
        .map(|v| parse(v))
        .collect::<Result<Vec<_>, _>>()?;
    if kinds.len() > MAX_KINDS {
        return Err(format!(
            "--custom-resources: at most {MAX_KINDS} kinds, got {}",
            kinds.len()
        ));
    }
    for (i, kind) in kinds.iter().enumerate() {
        if kinds[..i].iter().any(|k| k.name == kind.name) {
            return Err(format!("--custom-resources: {} is listed twice", kind.name));
        }
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_entry_is_parsed() {
        let kind = parse(
            "widgets.example.com; tenants=tier=gold,team=a; secrets=spec.credentials,spec.volumes[].secretName; configmaps=spec.config",
        )
        .expect("valid");
        assert_eq!(kind.name, "widgets.example.com");
        assert_eq!(
            kind.tenants,
            Some(vec![("tier".into(), "gold".into()), ("team".into(), "a".into())])
        );
        assert_eq!(kind.secret_refs.len(), 2);
        assert_eq!(
            kind.secret_refs[1].steps,
            vec![
                Step::Field("spec".into()),
                Step::Each("volumes".into()),
                Step::Field("secretName".into())
            ]
        );
        assert_eq!(kind.config_map_refs[0].text, "spec.config");
        let plain = parse("certificates.cert-manager.io").expect("valid");
        assert_eq!(plain.tenants, None);
        assert!(plain.selects(None));
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        for (value, says) in [
            ("widgets", "<plural>.<group>"),
            ("Widgets.example.com", "lower-case"),
            ("widgets.example", "dotted group"),
            ("virtualclusters.tenancy.x-k8s.io", "reserves"),
            ("things.apps.k8s.io", "reserves"),
            ("widgets.example.com;owner=me", "unknown setting"),
            ("widgets.example.com;tenants=", "at least one"),
            ("widgets.example.com;tenants=gold", "key=value"),
            (
                "widgets.example.com;secrets=metadata.name",
                "not in the object's spec",
            ),
            ("widgets.example.com;secrets=spec..x", "not a field path"),
            ("widgets.example.com;nonsense", "is not tenants="),
        ] {
            let error = parse(value).expect_err(value);
            assert!(error.contains(says), "{value}: {error}");
        }
        let twice = parse_all(&["a.example.com".into(), "a.example.com".into()]).expect_err("twice");
        assert!(twice.contains("twice"), "{twice}");
    }

    #[test]
    fn the_selector_needs_every_label() {
        let kind = parse("widgets.example.com;tenants=tier=gold,team=a").expect("valid");
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(kind.selects(Some(&labels(&[("tier", "gold"), ("team", "a"), ("x", "y")]))));
        assert!(!kind.selects(Some(&labels(&[("tier", "gold")]))));
        assert!(!kind.selects(Some(&labels(&[("tier", "silver"), ("team", "a")]))));
        assert!(!kind.selects(None));
    }

    #[test]
    fn the_flag_is_repeatable_and_checked_at_start() {
        use clap::Parser;
        let parse = |flags: &[&str]| {
            let args = crate::engine::config::Args::try_parse_from(["syncer"].iter().chain(flags))
                .map_err(|e| e.to_string())?;
            crate::engine::config::SyncerConfig::try_from(args.syncer)
        };
        let config = parse(&[
            "--custom-resources=widgets.example.com;tenants=tier=gold",
            "--custom-resources=certificates.cert-manager.io;secrets=spec.secretName",
        ])
        .expect("valid");
        let names: Vec<&str> = config.custom_resources.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["widgets.example.com", "certificates.cert-manager.io"]);
        assert!(parse(&[]).expect("defaults").custom_resources.is_empty());
        let error = parse(&["--custom-resources=virtualclusters.tenancy.x-k8s.io"]).expect_err("reserved");
        assert!(error.contains("reserves"), "{error}");
    }
}
