//! A ClusterVersion as vc-manager watches and caches it: the spec behind a `Box`.
//!
//! The full type holds three StatefulSets and Services inline (about 12 kB); kube-runtime's watcher keeps
//! several objects in its stack frames, which then grow to hundreds of kilobytes and overflow 2 MiB thread
//! stacks in debug builds. Boxed, the object is a few hundred bytes.

use std::borrow::Cow;

use crds::{ClusterVersion, ClusterVersionSpec, ClusterVersionStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Serialize};

/// A ClusterVersion with its spec boxed; same API resource, same JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CachedClusterVersion {
    /// Metadata.
    pub metadata: ObjectMeta,
    /// The templates.
    pub spec: Box<ClusterVersionSpec>,
    /// The status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ClusterVersionStatus>,
}

impl Resource for CachedClusterVersion {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        ClusterVersion::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        ClusterVersion::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        ClusterVersion::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        ClusterVersion::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl CachedClusterVersion {
    /// The full ClusterVersion (a copy).
    pub fn to_cluster_version(&self) -> ClusterVersion {
        ClusterVersion {
            metadata: self.metadata.clone(),
            spec: (*self.spec).clone(),
            status: self.status.clone(),
        }
    }
}

impl From<ClusterVersion> for CachedClusterVersion {
    fn from(cv: ClusterVersion) -> Self {
        Self {
            metadata: cv.metadata,
            spec: Box::new(cv.spec),
            status: cv.status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_resource_same_json_smaller_object() {
        assert_eq!(
            CachedClusterVersion::url_path(&(), None),
            ClusterVersion::url_path(&(), None)
        );
        assert_eq!(
            CachedClusterVersion::api_version(&()),
            "tenancy.x-k8s.io/v1alpha1"
        );
        let path = format!(
            "{}/../examples/clusterversion-clusterip.yaml",
            env!("CARGO_MANIFEST_DIR")
        );
        let cv: ClusterVersion =
            serde_saphyr::from_str(&std::fs::read_to_string(path).expect("example")).expect("parse");
        let json = serde_json::to_value(&cv).expect("json");
        let cached: CachedClusterVersion = serde_json::from_value(json).expect("cached");
        assert_eq!(cached.to_cluster_version().spec, cv.spec);
        assert_eq!(cached.to_cluster_version().metadata, cv.metadata);
        assert_eq!(CachedClusterVersion::from(cv.clone()), cached);
        assert!(std::mem::size_of::<CachedClusterVersion>() * 10 < std::mem::size_of::<ClusterVersion>());
    }
}
