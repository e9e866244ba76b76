use k8s_openapi::{
    api::{apps::v1::StatefulSet, core::v1::Service},
    apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta},
};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::embedded;
use crate::schema;

/// Templates for the three components of a provisioned tenant control plane.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "tenancy.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterVersion",
    shortname = "cv",
    category = "tenancy",
    status = "ClusterVersionStatus",
    doc = "A template for tenant control planes: etcd, kube-apiserver and kube-controller-manager as StatefulSets with their Services.",
    printcolumn(name = "InUse", type_ = "integer", json_path = ".status.virtualClusterCount"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterVersionSpec {
    /// The etcd StatefulSet and its (headless) Service. `--initial-cluster` is filled in from the replica
    /// count when the bundle is applied.
    pub etcd: StatefulSetSvcBundle,
    /// The kube-apiserver StatefulSet and the Service that exposes it (ClusterIP, NodePort or LoadBalancer).
    pub api_server: StatefulSetSvcBundle,
    /// The kube-controller-manager StatefulSet; its Service is optional.
    pub controller_manager: StatefulSetSvcBundle,
}

/// A StatefulSet and the Service in front of it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.statefulset.kind == 'StatefulSet'").message("statefulset.kind must be StatefulSet"),
    validation = Rule::new("!has(self.service) || self.service.kind == 'Service'").message("service.kind must be Service"),
)]
pub struct StatefulSetSvcBundle {
    /// Ignored; accepted so that the original project's samples apply unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Ignored; accepted so that the original project's samples apply unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Metadata of the bundle (its name identifies the component in logs).
    #[serde(default)]
    #[schemars(schema_with = "schema::free_form_object")]
    pub metadata: ObjectMeta,
    /// The full StatefulSet to run; namespace, labels and secret hashes are added when it is applied.
    #[serde(deserialize_with = "embedded::lenient")]
    #[schemars(schema_with = "schema::embedded_resource")]
    pub statefulset: StatefulSet,
    /// The full Service in front of the StatefulSet.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "embedded::lenient_option"
    )]
    #[schemars(schema_with = "schema::embedded_resource")]
    pub service: Option<Service>,
}

/// The observed state of a ClusterVersion.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterVersionStatus {
    /// VirtualClusters provisioned from this ClusterVersion. While any remain it cannot be deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::object_references")]
    pub virtual_clusters: Vec<VirtualClusterRef>,
    /// Number of VirtualClusters using this ClusterVersion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_cluster_count: Option<i64>,
    /// Standard conditions, e.g. `InUse` while deletion is blocked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// A reference to a VirtualCluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VirtualClusterRef {
    /// Namespace of the VirtualCluster.
    pub namespace: String,
    /// Name of the VirtualCluster.
    pub name: String,
}
