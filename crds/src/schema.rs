//! Hand-written OpenAPI fragments for fields whose Rust type cannot describe the Kubernetes schema we want.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// An embedded StatefulSet (`apps/v1`); see [`embedded_resource`].
pub fn embedded_stateful_set(_: &mut SchemaGenerator) -> Schema {
    embedded_resource("apps/v1", "StatefulSet")
}

/// An embedded Service (`v1`); see [`embedded_resource`].
pub fn embedded_service(_: &mut SchemaGenerator) -> Schema {
    embedded_resource("v1", "Service")
}

/// A full embedded Kubernetes object of one kind.
///
/// The apiserver checks `apiVersion`, `kind` and `metadata` of embedded resources itself and requires the
/// first two; they default to `api_version` and `kind`, so that the original project's samples, whose
/// embedded objects often leave them out, apply unchanged. Whatever is given is kept (and checked by the
/// bundle's rules). The rest is kept as given so that any field of the embedded kind survives (the full
/// StatefulSet schema would make the CRD larger than etcd accepts).
fn embedded_resource(api_version: &str, kind: &str) -> Schema {
    json_schema!({
        "type": "object",
        "properties": {
            "apiVersion": {
                "description": format!("Defaults to {api_version}."),
                "type": "string",
                "default": api_version,
            },
            "kind": {
                "description": format!("Defaults to {kind}."),
                "type": "string",
                "default": kind,
            },
        },
        "x-kubernetes-embedded-resource": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Free-form object metadata, kept as given.
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A Kubernetes quantity (`500m`, `2Gi`, `10`), validated like core's ResourceList values.
pub fn quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        "x-kubernetes-int-or-string": true,
    })
}

/// Standard `metav1.Condition` list, merged by `type` under server-side apply.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = <Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    schema
}

/// A list of `{namespace, name}` references (`T`), merged by both keys under server-side apply.
pub fn object_references<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = <Vec<T>>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["namespace", "name"]),
    );
    schema
}
