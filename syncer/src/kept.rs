//! The objects the syncer alone keeps beside the tenants' copies in their super namespaces, and which
//! tenant object each serves, by its annotations: the caches map their changes to the tenant's items.

use crds::wellknown::{ANNOTATION_GRANTS_CLUSTER, ANNOTATION_GRANTS_NAMESPACE, ANNOTATION_TOKEN_FOR_POD};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The tenant and tenant namespace a vn-agent binding serves, by its annotations.
pub fn grants(meta: &ObjectMeta) -> Option<(&str, &str)> {
    let annotations = meta.annotations.as_ref()?;
    Some((
        annotations.get(ANNOTATION_GRANTS_CLUSTER)?.as_str(),
        annotations.get(ANNOTATION_GRANTS_NAMESPACE)?.as_str(),
    ))
}

/// The pod a token Secret serves.
pub fn pod_of_token_secret(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(ANNOTATION_TOKEN_FOR_POD)
        .map(String::as_str)
}
