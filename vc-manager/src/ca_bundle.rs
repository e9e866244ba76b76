//! Keeps the kubelet-client CA bundle: one ConfigMap, in the platform's namespace, holding the public CA of
//! every tenant's `kubelet-client` Secret by cluster key (see [`crds::kubelet_client`]). vn-agent, which
//! runs on every node, reads this ConfigMap instead of holding read access to every Secret.

use std::{collections::BTreeMap, time::Duration};

use crds::{
    kubelet_client::bundle_entry,
    wellknown::{FIELD_MANAGER_VC_MANAGER, KUBELET_CLIENT_CA_KEY, LABEL_KUBELET_CLIENT},
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};

use crate::leader::LeaderFlag;

/// Where the bundle lives: the platform's namespace and the ConfigMap's name (`namespace/name`).
pub use crds::NamespacedName as BundleRef;

/// How often the bundle is written again even without a change (a lost leadership regained, an edit).
const REWRITE_INTERVAL: Duration = Duration::from_secs(60);

/// Keeps only the CA of a `kubelet-client` Secret in memory: the client key is never needed here.
fn keep_only_the_ca(secret: &mut Secret) {
    secret.managed_fields_mut().clear();
    secret
        .annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
    if let Some(data) = secret.data.as_mut() {
        data.retain(|key, _| key == KUBELET_CLIENT_CA_KEY);
    }
    secret.string_data = None;
}

/// The bundle's entries from the cached Secrets, and the Secrets left out with the reason.
pub fn entries<'a>(
    secrets: impl IntoIterator<Item = &'a Secret>,
) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let mut entries = BTreeMap::new();
    let mut refused = Vec::new();
    for secret in secrets {
        match bundle_entry(secret) {
            Ok((key, pem)) => {
                entries.insert(key, pem);
            }
            Err(reason) => refused.push((
                format!("{}/{}", secret.namespace().unwrap_or_default(), secret.name_any()),
                reason,
            )),
        }
    }
    (entries, refused)
}

/// The bundle ConfigMap with `entries`.
pub fn bundle(reference: &BundleRef, entries: BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(reference.name.clone()),
            namespace: Some(reference.namespace.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                FIELD_MANAGER_VC_MANAGER.to_owned(),
            )])),
            ..Default::default()
        },
        data: Some(entries),
        ..Default::default()
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches the `kubelet-client` Secrets and, while this replica leads, writes their CAs into the bundle
/// whenever they change. Runs until `shutdown` resolves.
pub async fn maintain(
    client: Client,
    reference: BundleRef,
    leader: LeaderFlag,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let (store, writer) = reflector::store::<Secret>();
    let secrets = watcher(
        Api::<Secret>::all(client.clone()),
        watcher::Config::default().labels(&format!("{LABEL_KUBELET_CLIENT}=true")),
    )
    .default_backoff()
    .modify(keep_only_the_ca)
    .reflect(writer)
    .touched_objects();
    // The watch runs on a task of its own: the store fills only while its stream is polled.
    let changed = std::sync::Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn({
        let changed = changed.clone();
        async move {
            let mut secrets = std::pin::pin!(secrets);
            while let Some(event) = secrets.next().await {
                match event {
                    Ok(_) => changed.notify_one(),
                    Err(error) => {
                        tracing::debug!(%error, "kubelet-client Secret watch interrupted; retrying")
                    }
                }
            }
        }
    });
    let _stop_watch = AbortOnDrop(watch);
    let mut shutdown = std::pin::pin!(shutdown);
    let api: Api<ConfigMap> = Api::namespaced(client, &reference.namespace);
    let params = PatchParams::apply(FIELD_MANAGER_VC_MANAGER).force();
    let mut written: Option<BTreeMap<String, String>> = None;
    let mut refused_before: Vec<(String, String)> = Vec::new();
    let mut rewrite = tokio::time::interval(REWRITE_INTERVAL);
    tokio::select! {
        () = &mut shutdown => return,
        ready = store.wait_until_ready() => if ready.is_err() { return },
    }
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = changed.notified() => {
                // A burst of Secret events (a new tenant, a rotation) makes one write.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ = rewrite.tick() => written = None,
        }
        let (entries, refused) = entries(store.state().iter().map(AsRef::as_ref));
        for (secret, reason) in refused.iter().filter(|r| !refused_before.contains(r)) {
            tracing::warn!(%secret, %reason, "kubelet-client Secret left out of the CA bundle");
        }
        refused_before = refused;
        if !leader.is_leader() || written.as_ref() == Some(&entries) {
            continue;
        }
        let desired = bundle(&reference, entries.clone());
        match api.patch(&reference.name, &params, &Patch::Apply(&desired)).await {
            Ok(_) => {
                tracing::info!(bundle = %reference, tenants = entries.len(), "kubelet-client CA bundle written");
                written = Some(entries);
            }
            Err(error) => {
                tracing::warn!(bundle = %reference, %error, "writing the kubelet-client CA bundle; retrying");
                written = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
                changed.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_reference_is_namespace_and_name() {
        let reference: BundleRef = "platform/kubelet-client-cas".parse().expect("reference");
        assert_eq!(reference.to_string(), "platform/kubelet-client-cas");
        assert!("kubelet-client-cas".parse::<BundleRef>().is_err());
        assert!("/x".parse::<BundleRef>().is_err());
    }

    #[test]
    fn only_the_ca_of_a_secret_reaches_the_bundle() {
        let key = crds::naming::cluster_key("team-a", "uid-a", "dev");
        let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let mut secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubelet-client", "namespace": key, "annotations": {
                "tenancy.x-k8s.io/cluster": key, "tenancy.x-k8s.io/vcnamespace": "team-a",
                "tenancy.x-k8s.io/vcname": "dev", "tenancy.x-k8s.io/vcuid": "uid-a"}},
            "stringData": {"tls.key": "private"}
        }))
        .expect("secret");
        secret.data = Some(
            [
                ("ca.crt", pem),
                ("tls.crt", "certificate"),
                ("tls.key", "private"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
            .collect(),
        );
        keep_only_the_ca(&mut secret);
        let mut stray = secret.clone();
        stray.metadata.namespace = Some("kube-system".into());
        let (entries, refused) = entries([&secret, &stray]);
        assert_eq!(entries, BTreeMap::from([(key, pem.to_owned())]));
        assert_eq!(refused.len(), 1, "{refused:?}");
        let json = serde_json::to_string(&bundle(&"p/b".parse().expect("ref"), entries)).expect("json");
        assert!(
            !json.contains("private") && !json.contains("certificate\""),
            "{json}"
        );
    }
}
