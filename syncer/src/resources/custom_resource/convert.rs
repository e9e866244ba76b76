//! The pure part of custom resources: the CRD as published into tenants, the API resource the syncer
//! reads and writes instances through, and an instance as copied down (references rewritten) and
//! compared.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition,
};
use kube::{
    api::{ApiResource, DynamicObject, ObjectMeta, TypeMeta},
    core::GroupVersionKind,
};
use serde_json::{Value, json};

use crate::engine::config::custom_kinds::{CustomKind, RefPath, Step};
use crate::{tenancy::{identity, tenant::LABEL_SYNCED_FROM_SUPER}};

/// Reason of the Warning event on a tenant CRD the syncer put back as the platform publishes it.
pub const REASON_DEFINITION_RESTORED: &str = "CustomResourceDefinitionRestored";
/// Reason of the Warning event on a tenant object whose super copy the super cluster refused.
pub const REASON_INVALID: &str = "CustomResourceInvalid";
/// Reason of the Warning event on a tenant object whose super name is held by an object not its own.
pub const REASON_CONFLICT: &str = "CustomResourceConflict";
/// Reason of the Warning event on a tenant object the syncer does not copy (a reference it refuses).
pub const REASON_REFUSED: &str = "CustomResourceRefused";

/// The API resource instances are read and written through: the CRD's storage version when it is
/// served, else its first served version. `None` for a CRD that is not namespaced or serves nothing.
pub fn api_resource(crd: &CustomResourceDefinition) -> Option<ApiResource> {
    let spec = &crd.spec;
    if spec.scope != "Namespaced" {
        return None;
    }
    let version = spec
        .versions
        .iter()
        .find(|v| v.storage && v.served)
        .or_else(|| spec.versions.iter().find(|v| v.served))?;
    Some(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&spec.group, &version.name, &spec.names.kind),
        &spec.names.plural,
    ))
}

/// Whether instances of the CRD's version `version` have a status subresource.
pub fn has_status(crd: &CustomResourceDefinition, version: &str) -> bool {
    crd.spec
        .versions
        .iter()
        .find(|v| v.name == version)
        .and_then(|v| v.subresources.as_ref())
        .is_some_and(|s| s.status.is_some())
}

/// The CRD as it is published into a tenant: the super CRD's spec, without conversion webhooks (they
/// would lead into the super cluster; versions convert as `None` does, by apiVersion alone), without
/// status, labelled as published by the platform.
pub fn published(super_crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    let mut spec = super_crd.spec.clone();
    spec.conversion = Some(CustomResourceConversion {
        strategy: "None".into(),
        webhook: None,
    });
    let mut published = CustomResourceDefinition {
        metadata: ObjectMeta {
            name: super_crd.metadata.name.clone(),
            labels: Some([(LABEL_SYNCED_FROM_SUPER.to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        spec,
        status: None,
    };
    identity::stamp(&mut published, |c| &mut c.metadata);
    published
}

/// What of a CRD must match what was published: the API it defines. Fields the apiserver defaults
/// (`names.singular`, `listKind`, the conversion strategy) are left out.
pub fn definition_view(crd: &CustomResourceDefinition) -> Value {
    let spec = &crd.spec;
    json!({
        "group": spec.group,
        "scope": spec.scope,
        "plural": spec.names.plural,
        "kind": spec.names.kind,
        "shortNames": spec.names.short_names.clone().unwrap_or_default(),
        "categories": spec.names.categories.clone().unwrap_or_default(),
        "versions": spec.versions,
        "preserveUnknownFields": spec.preserve_unknown_fields.unwrap_or(false),
    })
}

/// Whether the CRD in a tenant is the published one: marked as the platform's, recording the hash of
/// what is published now, and defining the same API.
pub fn definition_in_sync(desired: &CustomResourceDefinition, existing: &CustomResourceDefinition) -> bool {
    carries_platform_mark(&existing.metadata)
        && identity::recorded_hash(&existing.metadata) == identity::recorded_hash(&desired.metadata)
        && definition_view(desired) == definition_view(existing)
}

/// Whether a tenant CRD carries the platform's mark (and is the syncer's to update or remove).
pub fn carries_platform_mark(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SYNCED_FROM_SUPER))
        .is_some_and(|v| v == "true")
}

/// What the syncer rewrites and checks in references.
pub struct References<'a> {
    /// The kind's settings (which fields name Secrets and ConfigMaps).
    pub kind: &'a CustomKind,
    /// The super namespace of a tenant namespace.
    pub super_namespace: &'a dyn Fn(&str) -> String,
}

/// The fields of an instance the syncer copies and compares: everything but identity, metadata and
/// status.
pub fn view(object: &DynamicObject) -> Value {
    match &object.data {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(k, _)| !["apiVersion", "kind", "metadata", "status"].contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The status of an instance, if any.
pub fn status(object: &DynamicObject) -> Option<&Value> {
    object.data.get("status").filter(|s| !s.is_null())
}

/// The super copy of a tenant instance: its fields but status, references rewritten, under `metadata`
/// (the sanitised super metadata). `Err` names a reference that cannot be synced.
pub fn to_super(
    tenant_object: &DynamicObject,
    resource: &ApiResource,
    metadata: ObjectMeta,
    references: &References<'_>,
) -> Result<DynamicObject, String> {
    let mut data = view(tenant_object);
    let namespace = tenant_object.metadata.namespace.clone().unwrap_or_default();
    for (paths, what) in [
        (&references.kind.secret_refs, "Secret"),
        (&references.kind.config_map_refs, "ConfigMap"),
    ] {
        for path in paths {
            rewrite(&mut data, &path.steps, &mut |value| {
                reference(value, what, path, &namespace, references.super_namespace)
            })?;
        }
    }
    Ok(DynamicObject {
        types: Some(TypeMeta {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
        }),
        metadata,
        data,
    })
}

/// Calls `at` with every value `steps` lead to (none when a field on the way is missing).
fn rewrite(
    value: &mut Value,
    steps: &[Step],
    at: &mut dyn FnMut(&mut Value) -> Result<(), String>,
) -> Result<(), String> {
    let Some((step, rest)) = steps.split_first() else {
        return at(value);
    };
    match step {
        Step::Field(name) => match value.get_mut(name.as_str()) {
            Some(next) => rewrite(next, rest, at),
            None => Ok(()),
        },
        Step::Each(name) => match value.get_mut(name.as_str()) {
            Some(Value::Array(items)) => items.iter_mut().try_for_each(|item| rewrite(item, rest, at)),
            _ => Ok(()),
        },
    }
}

/// A name of an object in the super cluster: a DNS subdomain, as Secret and ConfigMap names are.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Checks one reference, and maps the namespace it names (a tenant namespace) to its super namespace.
/// Names stay: a super namespace holds the tenant's Secrets and ConfigMaps under their own names.
fn reference(
    value: &mut Value,
    what: &str,
    path: &RefPath,
    namespace: &str,
    super_namespace: &dyn Fn(&str) -> String,
) -> Result<(), String> {
    let name = match value {
        Value::Null => return Ok(()),
        Value::String(name) => name.clone(),
        Value::Object(fields) => {
            if let Some(target) = fields.get_mut("namespace") {
                match target {
                    Value::Null => {}
                    Value::String(target_namespace) if !target_namespace.is_empty() => {
                        // A tenant names its own namespaces only: each maps to its super namespace.
                        *target_namespace = super_namespace(target_namespace);
                    }
                    Value::String(_) => {}
                    _ => return Err(format!("{}: the {what} namespace is not a string", path.text)),
                }
            }
            match fields.get("name") {
                Some(Value::String(name)) => name.clone(),
                None | Some(Value::Null) => return Ok(()),
                Some(_) => return Err(format!("{}: the {what} name is not a string", path.text)),
            }
        }
        _ => return Err(format!("{}: not a {what} name or reference", path.text)),
    };
    if !valid_name(&name) {
        return Err(format!("{}: {name:?} is not a {what} name", path.text));
    }
    if what == "ConfigMap" && name == crds::wellknown::ROOT_CA_CONFIG_MAP {
        // Not copied down: the super cluster's own would be read instead of the tenant's.
        return Err(format!(
            "{}: ConfigMap {name} in namespace {namespace} is the super cluster's own there, not the tenant's",
            path.text
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionNames, CustomResourceDefinitionSpec, CustomResourceDefinitionVersion,
        CustomResourceSubresourceStatus, CustomResourceSubresources, WebhookConversion,
    };

    use super::*;
    use crate::engine::config::custom_kinds::parse;

    fn crd(scope: &str) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some("widgets.example.com".into()),
                labels: Some([("platform/internal".to_owned(), "x".to_owned())].into()),
                uid: Some("super-uid".into()),
                ..Default::default()
            },
            spec: CustomResourceDefinitionSpec {
                group: "example.com".into(),
                names: CustomResourceDefinitionNames {
                    kind: "Widget".into(),
                    plural: "widgets".into(),
                    ..Default::default()
                },
                scope: scope.into(),
                conversion: Some(CustomResourceConversion {
                    strategy: "Webhook".into(),
                    webhook: Some(WebhookConversion {
                        client_config: None,
                        conversion_review_versions: vec!["v1".into()],
                    }),
                }),
                versions: vec![
                    CustomResourceDefinitionVersion {
                        name: "v1alpha1".into(),
                        served: true,
                        storage: false,
                        ..Default::default()
                    },
                    CustomResourceDefinitionVersion {
                        name: "v1".into(),
                        served: true,
                        storage: true,
                        subresources: Some(CustomResourceSubresources {
                            status: Some(CustomResourceSubresourceStatus(Value::Object(Default::default()))),
                            scale: None,
                        }),
                        ..Default::default()
                    },
                ],
                preserve_unknown_fields: None,
            },
            status: None,
        }
    }

    #[test]
    fn the_published_crd_has_no_webhook_no_status_and_the_platform_mark() {
        let published = published(&crd("Namespaced"));
        assert_eq!(published.metadata.name.as_deref(), Some("widgets.example.com"));
        assert!(carries_platform_mark(&published.metadata));
        assert!(published.metadata.uid.is_none());
        assert!(
            !published.metadata.labels.as_ref().expect("labels").contains_key("platform/internal"),
            "the super CRD's own labels stay in the super cluster"
        );
        let conversion = published.spec.conversion.as_ref().expect("conversion");
        assert_eq!(conversion.strategy, "None");
        assert!(conversion.webhook.is_none());
        assert!(published.status.is_none());
        assert!(identity::recorded_hash(&published.metadata).is_some());
        assert!(definition_in_sync(&published, &published));

        // A tenant that edits the schema, or takes the mark off, is out of sync.
        let mut edited = published.clone();
        edited.spec.versions[1].served = false;
        assert!(!definition_in_sync(&published, &edited));
        let mut unmarked = published.clone();
        unmarked.metadata.labels = None;
        assert!(!definition_in_sync(&published, &unmarked));
        // Defaults the tenant apiserver fills in are no difference.
        let mut defaulted = published.clone();
        defaulted.spec.names.singular = Some("widget".into());
        defaulted.spec.names.list_kind = Some("WidgetList".into());
        assert!(definition_in_sync(&published, &defaulted));
    }

    #[test]
    fn instances_go_through_the_served_storage_version_of_namespaced_crds_only() {
        let resource = api_resource(&crd("Namespaced")).expect("namespaced");
        assert_eq!(resource.api_version, "example.com/v1");
        assert_eq!(resource.plural, "widgets");
        assert_eq!(resource.kind, "Widget");
        assert!(has_status(&crd("Namespaced"), "v1"));
        assert!(!has_status(&crd("Namespaced"), "v1alpha1"));
        assert!(api_resource(&crd("Cluster")).is_none());
    }

    fn widget(spec: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "shop", "uid": "u1"},
            "spec": spec,
            "status": {"ready": true}
        }))
        .expect("widget")
    }

    fn convert(kind: &str, spec: Value) -> Result<DynamicObject, String> {
        let kind = parse(kind).expect("kind");
        let resource = api_resource(&crd("Namespaced")).expect("resource");
        let mapped = |ns: &str| format!("key-{ns}");
        to_super(
            &widget(spec),
            &resource,
            ObjectMeta::default(),
            &References {
                kind: &kind,
                super_namespace: &mapped,
            },
        )
    }

    #[test]
    fn references_keep_names_map_namespaces_and_refuse_what_is_not_a_name() {
        let kind = "widgets.example.com;secrets=spec.credentials,spec.volumes[].secret;configmaps=spec.config";
        let copy = convert(
            kind,
            json!({
                "size": 3,
                "credentials": "db-password",
                "volumes": [{"secret": {"name": "tls", "namespace": "other"}}, {"secret": {"name": "plain"}}, {"other": 1}],
                "config": {"name": "settings", "namespace": "shop"}
            }),
        )
        .expect("synced");
        assert_eq!(copy.data["spec"]["credentials"], "db-password");
        assert_eq!(copy.data["spec"]["volumes"][0]["secret"], json!({"name": "tls", "namespace": "key-other"}));
        assert_eq!(copy.data["spec"]["volumes"][1]["secret"], json!({"name": "plain"}));
        assert_eq!(copy.data["spec"]["config"]["namespace"], "key-shop");
        assert_eq!(copy.data["spec"]["size"], 3);
        assert!(copy.data.get("status").is_none(), "status flows up, never down");
        assert_eq!(copy.types.as_ref().map(|t| t.kind.as_str()), Some("Widget"));

        for (spec, says) in [
            (json!({"credentials": "../etc"}), "is not a Secret name"),
            (json!({"credentials": 7}), "not a Secret name or reference"),
            (json!({"config": {"name": "kube-root-ca.crt"}}), "super cluster's own"),
            (json!({"config": {"name": "c", "namespace": 3}}), "namespace is not a string"),
        ] {
            let error = convert(kind, spec.clone()).expect_err(&spec.to_string());
            assert!(error.contains(says), "{spec}: {error}");
        }
        // Fields not listed are copied as they are.
        let unlisted = convert("widgets.example.com", json!({"credentials": "../etc"})).expect("copied");
        assert_eq!(unlisted.data["spec"]["credentials"], "../etc");
    }

    #[test]
    fn the_view_leaves_out_status_and_metadata() {
        let object = widget(json!({"size": 1}));
        assert_eq!(view(&object), json!({"spec": {"size": 1}}));
        assert_eq!(status(&object), Some(&json!({"ready": true})));
    }
}
