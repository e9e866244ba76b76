//! How custom resources ride the queues: as items of [`Kind::CustomResource`], whose name carries the
//! CRD's name. A CRD to publish is the item `<crd>` (no namespace); an instance is `<crd>/<name>` in its
//! namespace. Neither CRD nor object names can hold a `/`, so the two never mix up.

use crate::engine::items::{Item, Kind};

/// The item of a CRD to publish into (or remove from) a tenant.
pub fn definition(crd: &str) -> Item {
    Item::cluster(Kind::CustomResource, crd)
}

/// The item of an instance.
pub fn instance(crd: &str, namespace: &str, name: &str) -> Item {
    Item::new(Kind::CustomResource, namespace, &format!("{crd}/{name}"))
}

/// What an item of [`Kind::CustomResource`] is about.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// A CRD, by name.
    Definition(&'a str),
    /// An instance: its CRD, namespace and name.
    Instance {
        /// The CRD's name.
        crd: &'a str,
        /// The tenant namespace.
        namespace: &'a str,
        /// The object's name.
        name: &'a str,
    },
}

/// What an item is about.
pub fn target(item: &Item) -> Target<'_> {
    match item.name.split_once('/') {
        Some((crd, name)) => Target::Instance {
            crd,
            namespace: &item.namespace,
            name,
        },
        None => Target::Definition(&item.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_say_what_they_are_about() {
        assert_eq!(
            target(&definition("widgets.example.com")),
            Target::Definition("widgets.example.com")
        );
        assert_eq!(
            target(&instance("widgets.example.com", "shop", "w1")),
            Target::Instance {
                crd: "widgets.example.com",
                namespace: "shop",
                name: "w1"
            }
        );
    }
}
