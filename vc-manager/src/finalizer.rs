//! Adding and removing vc-manager's finalizers.
//!
//! A merge patch of `metadata.finalizers` carrying the object's `resourceVersion`: the apiserver rejects
//! it (409) if the object changed since it was read, so no other finalizer is lost, and it never
//! creates an object that is already gone (a server-side apply would).

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;

use crds::wellknown::FIELD_MANAGER_VC_MANAGER;

use crate::{Error, Result};

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER_VC_MANAGER.to_owned()),
        ..Default::default()
    }
}

fn display<K: Resource>(object: &K) -> String {
    match object.meta().namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// Whether `object` carries `finalizer`.
pub fn has<K: Resource>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// Adds `finalizer` unless present. Returns whether it was added.
pub async fn ensure<K>(api: &Api<K>, object: &K, finalizer: &str, kind: &'static str) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if has(object, finalizer) {
        return Ok(false);
    }
    let mut finalizers = object.finalizers().to_vec();
    finalizers.push(finalizer.to_owned());
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": object.resource_version(),
            "finalizers": finalizers,
        }
    });
    api.patch(&object.name_any(), &params(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Finalizer {
            action: "adding",
            kind,
            name: display(object),
            source,
        })?;
    Ok(true)
}

/// Removes `finalizer` if present. An object that is already gone is fine.
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str, kind: &'static str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if !has(object, finalizer) {
        return Ok(());
    }
    let finalizers: Vec<&String> = object.finalizers().iter().filter(|f| *f != finalizer).collect();
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": object.resource_version(),
            "finalizers": finalizers,
        }
    });
    match api
        .patch(&object.name_any(), &params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(source) => Err(Error::Finalizer {
            action: "removing",
            kind,
            name: display(object),
            source,
        }),
    }
}
