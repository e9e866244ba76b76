//! Reading embedded objects whatever `apiVersion`/`kind` they claim.
//!
//! The original project's samples declare the apiserver Service as `apps/v1`; the apiserver stores that as
//! given, and k8s-openapi would refuse to read it. The bundle field already says what the object is, so the
//! claimed type is dropped before parsing.

use serde::{Deserialize, Deserializer, de::DeserializeOwned};

fn without_type_meta<T: DeserializeOwned, E: serde::de::Error>(mut value: serde_json::Value) -> Result<T, E> {
    if let Some(object) = value.as_object_mut() {
        object.remove("apiVersion");
        object.remove("kind");
    }
    serde_json::from_value(value).map_err(E::custom)
}

pub(crate) fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    deserializer: D,
) -> Result<T, D::Error> {
    without_type_meta(serde_json::Value::deserialize(deserializer)?)
}

pub(crate) fn lenient_option<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    match Option::<serde_json::Value>::deserialize(deserializer)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => without_type_meta(value).map(Some),
    }
}
