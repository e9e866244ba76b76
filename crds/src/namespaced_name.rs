//! `namespace/name`: how a flag names one object in a namespace (a ConfigMap, a Service, a
//! ServiceAccount), parsed the same way by every component.

use std::{fmt, str::FromStr};

/// An object's namespace and name, written `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl NamespacedName {
    /// From its parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl FromStr for NamespacedName {
    type Err = String;

    /// `namespace/name` (surrounding blanks ignored): both parts present, and one `/` only.
    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim().split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self::new(namespace, name))
            }
            _ => Err(format!("expected namespace/name, got {value:?}")),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_and_name_parse_and_print_back() {
        let parsed: NamespacedName = " platform/kubelet-client-cas ".parse().expect("parses");
        assert_eq!(parsed, NamespacedName::new("platform", "kubelet-client-cas"));
        assert_eq!(parsed.to_string(), "platform/kubelet-client-cas");
        for bad in ["", "name", "/name", "ns/", "a/b/c", "/"] {
            let error = bad.parse::<NamespacedName>().expect_err(bad);
            assert_eq!(error, format!("expected namespace/name, got {bad:?}"));
        }
    }
}
