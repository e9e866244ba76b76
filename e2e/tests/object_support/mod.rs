//! Objects for the tests that write them as JSON: create one (typed back), and wait on one by name.

use std::time::Duration;

use anyhow::Context as _;
use kube::{Api, Client, Resource, ResourceExt, api::PostParams};
use local_cluster::wait;
use serde::de::DeserializeOwned;
use serde_json::json;

/// How long [`until`] waits.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Creates an object from JSON (`namespace` for namespaced kinds); `apiVersion` and `kind` come from `K`.
pub async fn create<K>(
    client: &Client,
    namespace: Option<&str>,
    mut object: serde_json::Value,
) -> anyhow::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::Serialize + DeserializeOwned + std::fmt::Debug,
{
    object["apiVersion"] = json!(K::api_version(&()));
    object["kind"] = json!(K::kind(&()));
    let resource = kube::discovery::ApiResource::erase::<K>(&());
    let api: Api<kube::api::DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let object: kube::api::DynamicObject = serde_json::from_value(object)?;
    let name = object.name_any();
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {} {name}", K::kind(&())))?;
    Ok(created.try_parse::<K>()?)
}

/// Waits until `check` holds for the named object (given `None` when it does not exist).
pub async fn until<K, F>(api: &Api<K>, name: &str, what: &str, check: F) -> anyhow::Result<Option<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    F: Fn(Option<&K>) -> bool,
{
    Ok(wait::until(PATIENCE, what, || {
        let (api, name, check) = (api.clone(), name.to_owned(), &check);
        async move {
            let object = api.get_opt(&name).await.ok()?;
            check(object.as_ref()).then_some(object)
        }
    })
    .await?)
}

/// The syncer's series as Prometheus scrapes them: `name{label="..."}` to value.
pub fn syncer_series(syncer: &syncer::Syncer) -> anyhow::Result<std::collections::BTreeMap<String, f64>> {
    let mut registry = prometheus_client::registry::Registry::default();
    syncer.context.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect())
}
