//! Applying YAML manifests the way `kubectl apply --server-side` does.

use kube::{
    Client,
    api::{Api, DynamicObject, Patch, PatchParams, ValidationDirective},
    core::GroupVersionKind,
    discovery::{self, Scope},
};

use crate::{Error, Result};

/// Parses a multi-document YAML string into objects.
pub fn parse_documents(yaml: &str) -> Result<Vec<DynamicObject>> {
    let values: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| Error::Kubeconfig {
            context: "parsing YAML documents".into(),
            source: Box::new(e),
        })?;
    values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|v| {
            serde_json::from_value(v).map_err(|e| Error::Kubeconfig {
                context: "reading a Kubernetes object".into(),
                source: Box::new(e),
            })
        })
        .collect()
}

/// Applies every object in `yaml` with strict field validation (unknown fields are errors, as with
/// kubectl's default), putting namespaced objects without a namespace into `default_namespace`.
pub async fn apply_yaml(client: &Client, yaml: &str, default_namespace: &str) -> Result<Vec<DynamicObject>> {
    let mut applied = Vec::new();
    for object in parse_documents(yaml)? {
        applied.push(apply_object(client, object, default_namespace).await?);
    }
    Ok(applied)
}

/// Applies one object with strict field validation.
pub async fn apply_object(
    client: &Client,
    object: DynamicObject,
    default_namespace: &str,
) -> Result<DynamicObject> {
    let types = object.types.clone().ok_or_else(|| Error::Kubeconfig {
        context: "an object without apiVersion/kind".into(),
        source: "missing type information".into(),
    })?;
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| Error::Kubeconfig {
        context: format!("reading {}", types.api_version),
        source: Box::new(e),
    })?;
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
        .await
        .map_err(Error::kube(format!("discovering {}", types.kind)))?;
    let name = object.metadata.name.clone().unwrap_or_default();
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = object
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| default_namespace.to_owned());
            Api::namespaced_with(client.clone(), &namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply("e2e").force();
    params.field_validation = Some(ValidationDirective::Strict);
    api.patch(&name, &params, &Patch::Apply(&object))
        .await
        .map_err(Error::kube(format!("applying {} {name}", types.kind)))
}

/// Creates one object with a plain POST and strict field validation, as `kubectl create` and client-side
/// `kubectl apply` do for a new object. Apiservers before 1.27 report unknown fields in server-side apply as
/// internal errors; a POST gets the proper `unknown field` message.
pub async fn create_strict(
    client: &Client,
    object: DynamicObject,
    default_namespace: &str,
) -> Result<DynamicObject> {
    use kube::Resource;
    let types = object.types.clone().ok_or_else(|| Error::Kubeconfig {
        context: "an object without apiVersion/kind".into(),
        source: "missing type information".into(),
    })?;
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| Error::Kubeconfig {
        context: format!("reading {}", types.api_version),
        source: Box::new(e),
    })?;
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
        .await
        .map_err(Error::kube(format!("discovering {}", types.kind)))?;
    let namespace = match capabilities.scope {
        Scope::Namespaced => Some(
            object
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| default_namespace.to_owned()),
        ),
        Scope::Cluster => None,
    };
    let url = DynamicObject::url_path(&resource, namespace.as_deref());
    let body = serde_json::to_vec(&object).map_err(|e| Error::Kubeconfig {
        context: "serializing an object".into(),
        source: Box::new(e),
    })?;
    let request = http::Request::post(format!("{url}?fieldValidation=Strict"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|e| Error::Http {
            context: format!("POST {url}"),
            source: Box::new(e),
        })?;
    let name = object.metadata.name.clone().unwrap_or_default();
    client
        .request(request)
        .await
        .map_err(Error::kube(format!("creating {} {name}", types.kind)))
}
