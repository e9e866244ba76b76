//! `-o yaml|json`: objects as kubectl prints them (without managed fields; several objects as a `List`).

use serde::Serialize;
use serde_json::{Value, json};

use crate::{Error, Result, args::Format};

/// `value` as YAML or pretty JSON (with a final newline).
pub fn serialize<T: Serialize>(value: &T, format: Format, what: &str) -> Result<String> {
    let failed = |message: String| Error::Serialize {
        what: what.to_owned(),
        message,
    };
    match format {
        Format::Yaml => serde_saphyr::to_string(value).map_err(|e| failed(e.to_string())),
        Format::Json => serde_json::to_string_pretty(value)
            .map(|text| text + "\n")
            .map_err(|e| failed(e.to_string())),
    }
}

/// An object as JSON without `metadata.managedFields`.
pub fn without_managed_fields<T: Serialize>(object: &T) -> Result<Value> {
    let mut value = serde_json::to_value(object).map_err(|e| Error::Serialize {
        what: "an object".into(),
        message: e.to_string(),
    })?;
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    Ok(value)
}

/// Objects as a `v1` `List`, the way `kubectl get -o yaml` prints several.
pub fn list<T: Serialize>(objects: &[T]) -> Result<Value> {
    let items = objects
        .iter()
        .map(without_managed_fields)
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": items,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_drop_managed_fields_and_read_back() {
        let mut vc = crds::VirtualCluster::new("vc-1", Default::default());
        vc.metadata.managed_fields = Some(vec![Default::default()]);
        let list = list(&[vc]).expect("list");
        assert!(list["items"][0]["metadata"].get("managedFields").is_none());
        for format in [Format::Yaml, Format::Json] {
            let text = serialize(&list, format, "list").expect("text");
            let back: Value = match format {
                Format::Yaml => serde_saphyr::from_str(&text).expect("yaml"),
                Format::Json => serde_json::from_str(&text).expect("json"),
            };
            assert_eq!(back, list);
            assert!(text.ends_with('\n'));
        }
    }
}
