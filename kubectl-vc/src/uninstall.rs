//! `kubectl vc uninstall prepare|release`: removing the platform without leaving VirtualClusters or
//! ClusterVersions stuck on finalizers nobody removes. The chart runs both as hooks of `helm uninstall`
//! (`prepare` before anything is deleted, `release` after); without the hooks a platform team runs them by
//! hand, in that order around `helm uninstall --no-hooks`.
//!
//! - `prepare --virtual-clusters refuse` fails while any VirtualCluster exists, naming them: nothing is
//!   removed (the default).
//! - `prepare --virtual-clusters delete` deletes every VirtualCluster and waits until vc-manager and the
//!   syncer (still running) have removed its control plane, namespaces and pods.
//! - `prepare --virtual-clusters orphan` leaves them: their control planes and pods keep running,
//!   unmanaged.
//! - `release` waits until vc-manager's pods are gone (`--controllers-selector`), then removes vc-manager's
//!   finalizers from every VirtualCluster and ClusterVersion that still holds one, so that deleting them
//!   later (or deleting their CRDs) never hangs. A later install re-adds them.

use std::time::Duration;

use crds::{
    ClusterVersion, VirtualCluster,
    wellknown::{FINALIZER_CLUSTER_VERSION, FINALIZER_VIRTUAL_CLUSTER},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{
    Error, Result, Streams,
    args::{UninstallPrepareArgs, UninstallReleaseArgs, VirtualClustersOnUninstall},
};

/// How often the waits look again.
const POLL: Duration = Duration::from_secs(2);

/// `namespace/name (phase)` of each VirtualCluster, sorted.
pub fn describe(vcs: &[VirtualCluster]) -> Vec<String> {
    let mut named: Vec<String> = vcs
        .iter()
        .map(|vc| {
            let phase = vc
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map_or_else(|| "no phase".to_owned(), |p| format!("{p:?}"));
            let deleting = if vc.meta().deletion_timestamp.is_some() {
                ", being deleted"
            } else {
                ""
            };
            format!(
                "{}/{} ({phase}{deleting})",
                vc.namespace().unwrap_or_default(),
                vc.name_any()
            )
        })
        .collect();
    named.sort();
    named
}

/// The finalizers an object keeps once `ours` is removed; `None` when it does not hold `ours`.
pub fn without(finalizers: &[String], ours: &str) -> Option<Vec<String>> {
    finalizers
        .iter()
        .any(|f| f == ours)
        .then(|| finalizers.iter().filter(|f| *f != ours).cloned().collect())
}

/// Every object of a kind, or none when the kind is not served (its CRD is gone or was never installed).
async fn list_all<K>(api: &Api<K>, what: &str) -> Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(error) => Err(Error::api(format!("listing {what}"), error)),
    }
}

/// `kubectl vc uninstall prepare`.
pub async fn prepare(client: &Client, args: &UninstallPrepareArgs, io: &mut Streams<'_>) -> Result<()> {
    let all: Api<VirtualCluster> = Api::all(client.clone());
    let vcs = list_all(&all, "VirtualClusters").await?;
    if vcs.is_empty() {
        io.result("no VirtualClusters: nothing runs that the uninstall would strand")?;
        return Ok(());
    }
    let named = describe(&vcs);
    match args.virtual_clusters {
        VirtualClustersOnUninstall::Refuse => Err(Error::UninstallRefused {
            count: named.len(),
            listing: named.join(", "),
        }),
        VirtualClustersOnUninstall::Orphan => {
            io.result(&format!(
                "{} VirtualCluster(s) stay, unmanaged: their control planes and pods keep running, but nothing syncs them (new pods never start, status stops) until the platform is installed again: {}",
                named.len(),
                named.join(", ")
            ))?;
            Ok(())
        }
        VirtualClustersOnUninstall::Delete => delete_all(&all, vcs, args.timeout, io).await,
    }
}

/// Deletes every VirtualCluster (pinned to its uid) and waits until all are gone.
async fn delete_all(
    all: &Api<VirtualCluster>,
    vcs: Vec<VirtualCluster>,
    timeout: Duration,
    io: &mut Streams<'_>,
) -> Result<()> {
    for vc in &vcs {
        let (namespace, name) = (vc.namespace().unwrap_or_default(), vc.name_any());
        let api: Api<VirtualCluster> = Api::namespaced(all.clone().into_client(), &namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: vc.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => io.result(&format!("deleting VirtualCluster {namespace}/{name}"))?,
            // Gone, or replaced by another object of the name (which the wait below then shows).
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(error) => {
                return Err(Error::api(
                    format!("deleting VirtualCluster {namespace}/{name}"),
                    error,
                ));
            }
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = list_all(all, "VirtualClusters").await?;
        if left.is_empty() {
            io.result("every VirtualCluster is deleted, with its control plane, namespaces and pods")?;
            return Ok(());
        }
        let named = describe(&left);
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: "vc-manager to remove every VirtualCluster (their deletion goes on; run the uninstall again once `kubectl get virtualclusters -A` is empty, or with a longer uninstall.timeout and helm --timeout)".into(),
                after: timeout,
                last: format!("{} left: {}", named.len(), named.join(", ")),
            });
        }
        io.progress(&format!(
            "waiting for {} VirtualCluster(s): {}",
            named.len(),
            named.join(", ")
        ))?;
        tokio::time::sleep(POLL).await;
    }
}

/// `kubectl vc uninstall release`.
pub async fn release(client: &Client, args: &UninstallReleaseArgs, io: &mut Streams<'_>) -> Result<()> {
    if let (Some(namespace), Some(selector)) = (&args.controllers_namespace, &args.controllers_selector) {
        wait_for_no_pods(client, namespace, selector, args.timeout, io).await?;
        // What the controllers made there at run time, which Helm does not know of: vc-manager's kubelet
        // client CA bundle and the syncer's attach journals.
        remove_runtime_config_maps(client, namespace, io).await?;
    }
    let vcs: Api<VirtualCluster> = Api::all(client.clone());
    let mut released = 0;
    for vc in list_all(&vcs, "VirtualClusters").await? {
        let api: Api<VirtualCluster> = Api::namespaced(client.clone(), &vc.namespace().unwrap_or_default());
        let what = format!(
            "VirtualCluster {}/{}",
            vc.namespace().unwrap_or_default(),
            vc.name_any()
        );
        released += usize::from(remove_finalizer(&api, &vc, FINALIZER_VIRTUAL_CLUSTER, &what, io).await?);
    }
    let cvs: Api<ClusterVersion> = Api::all(client.clone());
    for cv in list_all(&cvs, "ClusterVersions").await? {
        let what = format!("ClusterVersion {}", cv.name_any());
        released += usize::from(remove_finalizer(&cvs, &cv, FINALIZER_CLUSTER_VERSION, &what, io).await?);
    }
    io.result(&format!(
        "released {released} finalizer(s): VirtualClusters and ClusterVersions can be deleted without vc-manager (a VirtualCluster deleted now leaves its namespaces and pods behind)"
    ))?;
    Ok(())
}

/// Deletes the ConfigMaps the controllers created in `namespace` while they ran (by their labels).
async fn remove_runtime_config_maps(client: &Client, namespace: &str, io: &mut Streams<'_>) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), namespace);
    for selector in [
        crds::wellknown::LABEL_SYNCER_JOURNAL.to_owned(),
        format!(
            "app.kubernetes.io/managed-by={}",
            crds::wellknown::FIELD_MANAGER_VC_MANAGER
        ),
    ] {
        let found = api
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::api(format!("listing ConfigMaps {selector} in {namespace}"), e))?;
        for map in found.items {
            let name = map.name_any();
            let params = kube::api::DeleteParams {
                preconditions: map.metadata.uid.clone().map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    ..Default::default()
                }),
                ..Default::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => io.result(&format!("deleted ConfigMap {namespace}/{name}"))?,
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(Error::api(format!("deleting ConfigMap {namespace}/{name}"), e)),
            }
        }
    }
    Ok(())
}

/// Waits until no pod matches `selector` in `namespace` (the controllers have stopped, so none adds a
/// finalizer back).
async fn wait_for_no_pods(
    client: &Client,
    namespace: &str,
    selector: &str,
    timeout: Duration,
    io: &mut Streams<'_>,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = pods
            .list_metadata(&ListParams::default().labels(selector))
            .await
            .map_err(|e| Error::api(format!("listing pods {selector} in {namespace}"), e))?;
        if left.items.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = left.items.iter().map(ResourceExt::name_any).collect();
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("the pods {selector} in {namespace} to stop"),
                after: timeout,
                last: names.join(", "),
            });
        }
        io.progress(&format!("waiting for {} to stop", names.join(", ")))?;
        tokio::time::sleep(POLL).await;
    }
}

/// Removes `ours` from the object's finalizers (a merge patch pinned to the resourceVersion read, retried
/// on a conflict); whether it held it.
async fn remove_finalizer<K>(
    api: &Api<K>,
    object: &K,
    ours: &str,
    what: &str,
    io: &mut Streams<'_>,
) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let name = object.name_any();
    let mut current = object.clone();
    let mut attempts = 0;
    loop {
        let Some(kept) = without(current.finalizers(), ours) else {
            return Ok(false);
        };
        let patch = json!({
            "metadata": {"finalizers": kept, "resourceVersion": current.resource_version()},
        });
        attempts += 1;
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                io.result(&format!("removed finalizer {ours} from {what}"))?;
                return Ok(true);
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
            // Changed since it was read: read it again, a few times.
            Err(kube::Error::Api(status)) if status.code == 409 && attempts < 5 => {
                current = match api.get_opt(&name).await {
                    Ok(Some(object)) => object,
                    Ok(None) => return Ok(false),
                    Err(error) => return Err(Error::api(format!("reading {what}"), error)),
                };
            }
            Err(error) => {
                return Err(Error::api(
                    format!("removing finalizer {ours} from {what}"),
                    error,
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_finalizer_goes() {
        let finalizers = vec![
            "example.com/backup".to_owned(),
            FINALIZER_VIRTUAL_CLUSTER.to_owned(),
        ];
        assert_eq!(
            without(&finalizers, FINALIZER_VIRTUAL_CLUSTER),
            Some(vec!["example.com/backup".to_owned()])
        );
        assert_eq!(without(&finalizers, FINALIZER_CLUSTER_VERSION), None);
        assert_eq!(without(&[], FINALIZER_VIRTUAL_CLUSTER), None);
    }

    #[test]
    fn virtual_clusters_are_named_with_their_phase_in_order() {
        let mut b = VirtualCluster::new("b", Default::default());
        b.metadata.namespace = Some("team".into());
        b.status = Some(crds::VirtualClusterStatus {
            phase: Some(crds::ClusterPhase::Running),
            ..Default::default()
        });
        let mut a = VirtualCluster::new("a", Default::default());
        a.metadata.namespace = Some("team".into());
        a.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(
            describe(&[b, a]),
            ["team/a (no phase, being deleted)", "team/b (Running)"]
        );
    }
}
