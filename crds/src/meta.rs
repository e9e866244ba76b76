//! Reading an object's name, namespace, labels and annotations by key, whatever holds them: an
//! apiserver's `ObjectMeta`, or a cache's record that keeps them packed (the syncer's pod records).
//! The ownership rule ([`crate::tenant::Owner`]) reads through [`Tagged`], so every component applies it
//! to what it has.

use std::{borrow::Cow, collections::BTreeMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// An object's name and namespace, and its labels and annotations read by key or in key order.
pub trait Tagged {
    /// The object's name.
    fn object_name(&self) -> Option<&str>;
    /// The object's namespace (`None` for a cluster-scoped object).
    fn object_namespace(&self) -> Option<&str>;
    /// The value of a label.
    fn label(&self, key: &str) -> Option<&str>;
    /// The value of an annotation.
    fn annotation(&self, key: &str) -> Option<&str>;
    /// Every label, in key order.
    fn each_label(&self) -> impl Iterator<Item = (Cow<'_, str>, &str)>;
    /// Every annotation, in key order.
    fn each_annotation(&self) -> impl Iterator<Item = (Cow<'_, str>, &str)>;
}

fn pairs(map: &Option<BTreeMap<String, String>>) -> impl Iterator<Item = (Cow<'_, str>, &str)> {
    map.iter()
        .flatten()
        .map(|(k, v)| (Cow::Borrowed(k.as_str()), v.as_str()))
}

impl Tagged for ObjectMeta {
    fn object_name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    fn object_namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }

    fn each_label(&self) -> impl Iterator<Item = (Cow<'_, str>, &str)> {
        pairs(&self.labels)
    }

    fn each_annotation(&self) -> impl Iterator<Item = (Cow<'_, str>, &str)> {
        pairs(&self.annotations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_meta_is_read_by_key_and_in_key_order() {
        let meta = ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            labels: Some([("b".to_owned(), "2".to_owned()), ("a".to_owned(), "1".to_owned())].into()),
            annotations: None,
            ..Default::default()
        };
        assert_eq!(meta.object_name(), Some("web"));
        assert_eq!(meta.object_namespace(), Some("shop"));
        assert_eq!(meta.label("a"), Some("1"));
        assert_eq!(meta.annotation("a"), None);
        let labels: Vec<(String, String)> = meta
            .each_label()
            .map(|(k, v)| (k.into_owned(), v.to_owned()))
            .collect();
        assert_eq!(labels, [("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert_eq!(meta.each_annotation().count(), 0);
    }
}
