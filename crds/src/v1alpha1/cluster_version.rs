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
    /// `apiVersion` and `kind` may be left out (they default to `apps/v1` and `StatefulSet`).
    #[serde(deserialize_with = "embedded::lenient")]
    #[schemars(schema_with = "schema::embedded_stateful_set")]
    pub statefulset: StatefulSet,
    /// The full Service in front of the StatefulSet. `apiVersion` and `kind` may be left out (they default
    /// to `v1` and `Service`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "embedded::lenient_option"
    )]
    #[schemars(schema_with = "schema::embedded_service")]
    pub service: Option<Service>,
}

/// The observed state of a ClusterVersion.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterVersionStatus {
    /// VirtualClusters provisioned from this ClusterVersion. While any remain it cannot be deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::object_references::<VirtualClusterRef>")]
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

impl ClusterVersionSpec {
    /// Names of the etcd Services: the client Service (its bundle's Service, else the StatefulSet's name,
    /// else `etcd`) and the StatefulSet's governing (peer) Service (else the client Service). vc-manager
    /// issues etcd's certificates for them; `kubectl vc snapshot` reaches etcd through the first.
    pub fn etcd_service_names(&self) -> (String, String) {
        let bundle = &self.etcd;
        let sts_name = bundle
            .statefulset
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| "etcd".into());
        let client = bundle
            .service
            .as_ref()
            .and_then(|s| s.metadata.name.clone())
            .unwrap_or_else(|| sts_name.clone());
        let peer = bundle
            .statefulset
            .spec
            .as_ref()
            .and_then(|s| s.service_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| client.clone());
        (client, peer)
    }
}

#[cfg(test)]
mod tests {
    use kube::{CustomResourceExt, core::cel::Validator};
    use serde_json::{Value, json};

    use super::*;

    const BUNDLES: [&str; 3] = ["etcd", "apiServer", "controllerManager"];

    /// The CRD's `openAPIV3Schema`.
    fn schema() -> Value {
        let crd = serde_json::to_value(ClusterVersion::crd()).expect("crd as JSON");
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    }

    /// The original project's sample, as the apiserver receives it.
    fn original_sample() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../e2e/fixtures/original-clusterversion-v1-nodeport.yaml"
        );
        let yaml = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        serde_saphyr::from_str(&yaml).expect("the sample is YAML")
    }

    #[test]
    fn embedded_objects_default_their_api_version_and_kind() {
        let schema = schema();
        for bundle in BUNDLES {
            let properties = &schema["properties"]["spec"]["properties"][bundle]["properties"];
            for (field, api_version, kind) in [
                ("statefulset", "apps/v1", "StatefulSet"),
                ("service", "v1", "Service"),
            ] {
                let object = &properties[field];
                assert_eq!(
                    object["x-kubernetes-embedded-resource"],
                    json!(true),
                    "{bundle}.{field}"
                );
                assert_eq!(
                    object["x-kubernetes-preserve-unknown-fields"],
                    json!(true),
                    "{bundle}.{field}"
                );
                assert_eq!(object["type"], "object", "{bundle}.{field}");
                let type_meta = &object["properties"];
                assert_eq!(
                    (
                        &type_meta["apiVersion"]["type"],
                        &type_meta["apiVersion"]["default"]
                    ),
                    (&json!("string"), &json!(api_version)),
                    "{bundle}.{field}.apiVersion"
                );
                assert_eq!(
                    (&type_meta["kind"]["type"], &type_meta["kind"]["default"]),
                    (&json!("string"), &json!(kind)),
                    "{bundle}.{field}.kind"
                );
                // Nothing else is spelled out: every other field is kept as given.
                assert_eq!(
                    type_meta.as_object().map(|m| m.len()),
                    Some(2),
                    "{bundle}.{field}"
                );
                assert_eq!(object.get("required"), None, "{bundle}.{field}");
            }
            // The kinds are still checked when given.
            let rules = &schema["properties"]["spec"]["properties"][bundle]["x-kubernetes-validations"];
            assert_eq!(
                rules,
                &json!([
                    {"rule": "self.statefulset.kind == 'StatefulSet'", "message": "statefulset.kind must be StatefulSet"},
                    {"rule": "!has(self.service) || self.service.kind == 'Service'", "message": "service.kind must be Service"},
                ]),
                "{bundle}"
            );
        }
    }

    #[test]
    fn the_original_sample_has_no_type_meta_and_is_valid_once_defaulted() {
        let sample = original_sample();
        for bundle in BUNDLES {
            let spec = &sample["spec"][bundle];
            assert_eq!(spec["statefulset"].get("kind"), None, "{bundle}");
            assert_eq!(spec["statefulset"].get("apiVersion"), None, "{bundle}");
            if let Some(service) = spec.get("service") {
                assert_eq!(service.get("kind"), None, "{bundle}");
                assert_eq!(service.get("apiVersion"), None, "{bundle}");
            }
        }
        let schema = schema();
        let defaulted = kube::core::cel::apply_defaults(&schema, &sample);
        for bundle in BUNDLES {
            let spec = &defaulted["spec"][bundle];
            assert_eq!(
                (&spec["statefulset"]["apiVersion"], &spec["statefulset"]["kind"]),
                (&json!("apps/v1"), &json!("StatefulSet")),
                "{bundle}"
            );
        }
        for bundle in ["etcd", "apiServer"] {
            let service = &defaulted["spec"][bundle]["service"];
            assert_eq!(
                (&service["apiVersion"], &service["kind"]),
                (&json!("v1"), &json!("Service")),
                "{bundle}"
            );
        }
        // No service is invented where the sample has none.
        assert_eq!(defaulted["spec"]["controllerManager"].get("service"), None);
        // Given type meta wins over the defaults.
        let mut given = sample.clone();
        given["spec"]["apiServer"]["service"]["apiVersion"] = json!("apps/v1");
        let defaulted_given = kube::core::cel::apply_defaults(&schema, &given);
        assert_eq!(
            defaulted_given["spec"]["apiServer"]["service"]["apiVersion"],
            "apps/v1"
        );

        Validator::new()
            .validate(&schema, &sample, None)
            .expect("the original sample passes the rules");

        // The typed API reads it too.
        let cv: ClusterVersion = serde_json::from_value(sample).expect("typed");
        assert_eq!(
            cv.spec
                .api_server
                .service
                .and_then(|s| s.spec)
                .and_then(|s| s.type_)
                .as_deref(),
            Some("NodePort")
        );
        assert!(cv.spec.controller_manager.service.is_none());
    }

    #[test]
    fn a_wrong_kind_is_still_refused_naming_the_field() {
        let schema = schema();
        for (bundle, field, kind, message) in [
            (
                "etcd",
                "statefulset",
                "Deployment",
                "statefulset.kind must be StatefulSet",
            ),
            (
                "controllerManager",
                "statefulset",
                "Pod",
                "statefulset.kind must be StatefulSet",
            ),
            ("apiServer", "service", "Ingress", "service.kind must be Service"),
        ] {
            let mut sample = original_sample();
            sample["spec"][bundle][field]["kind"] = json!(kind);
            let errors = Validator::new()
                .validate(&schema, &sample, None)
                .expect_err("a wrong kind is refused")
                .into_vec();
            assert_eq!(errors.len(), 1, "{bundle}.{field}: {errors:?}");
            assert_eq!(errors[0].message, message, "{bundle}.{field}");
            assert_eq!(errors[0].field_path, format!("spec.{bundle}"), "{bundle}.{field}");
        }
    }
}
