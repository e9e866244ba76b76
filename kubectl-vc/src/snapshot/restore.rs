//! `kubectl vc snapshot restore NAME --from DIR`: a new VirtualCluster from a snapshot, with the
//! snapshot's objects, certificate authorities and service-account key.
//!
//! 1. The snapshot is verified (every size and checksum) and its VirtualCluster, certificate authorities
//!    and service-account key are read and checked, before anything in the cluster changes.
//! 2. The VirtualCluster is created with annotation `tenancy.x-k8s.io/restore-from-snapshot: pki`:
//!    vc-manager makes its root namespace and nothing else.
//! 3. The snapshot's authorities and key go into the root namespace; the annotation moves to `etcd`:
//!    vc-manager keeps them (it keeps valid authorities), issues the leaf certificates for the new
//!    tenant's names from them, and starts etcd alone.
//! 4. Once etcd is ready and empty, the snapshot's keys are written into it through a port-forward; the
//!    number of keys is checked; the annotation is removed and vc-manager starts the apiserver on them.

use std::time::Duration;

use crds::{
    ClusterVersion, TenantIdentity, VirtualCluster,
    wellknown::{ANNOTATION_RESTORE, RESTORE_STAGE_ETCD, RESTORE_STAGE_PKI},
};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
};
use serde::Serialize;
use tenant_pki::names::{
    SECRET_ETCD_CA, SECRET_ETCD_CLIENT, SECRET_FRONT_PROXY_CA, SECRET_KUBELET_CLIENT_CA, SECRET_ROOT_CA,
    SECRET_SERVICE_ACCOUNT,
};

use super::{
    create::{StoredSecret, connect_etcd},
    etcd::batches,
    format::{self, KeyLines, PKI_SECRETS, VIRTUAL_CLUSTER, Verified},
};
use crate::{Error, Result, Streams, args::SnapshotRestoreArgs, manifest::FIELD_MANAGER, output, progress};

/// The Secrets a restore brings back: the certificate authorities and the service-account key. Every
/// other PKI Secret is derived from them and names the tenant's root namespace and Services, so vc-manager
/// issues it anew for the restored tenant, signed by the restored authorities.
pub const RESTORED_SECRETS: [&str; 5] = [
    SECRET_ROOT_CA,
    SECRET_ETCD_CA,
    SECRET_FRONT_PROXY_CA,
    SECRET_KUBELET_CLIENT_CA,
    SECRET_SERVICE_ACCOUNT,
];

/// How often the restore looks again while it waits for vc-manager.
const POLL: Duration = Duration::from_millis(500);

/// What a snapshot restores, read and checked from its files.
#[derive(Clone, Debug)]
pub struct RestorePlan {
    /// The VirtualCluster's spec.
    pub spec: crds::VirtualClusterSpec,
    /// The Secrets of [`RESTORED_SECRETS`], checked.
    pub secrets: Vec<RestoredSecret>,
}

/// A Secret a restore writes.
#[derive(Clone, Debug)]
pub struct RestoredSecret {
    /// Its name in the root namespace.
    pub name: &'static str,
    /// Its type (from what vc-manager writes, never from the snapshot).
    pub type_: &'static str,
    /// Its keys and values.
    pub data: Vec<(&'static str, String)>,
}

fn bad(snapshot: &Verified, text: impl Into<String>) -> Error {
    Error::Snapshot {
        path: snapshot.dir.clone(),
        problem: text.into(),
    }
}

/// Reads the VirtualCluster spec and the authorities of a verified snapshot and checks them: a native
/// VirtualCluster; each authority a certificate authority with its key; the service-account key a key.
pub fn plan(snapshot: &Verified, now: i64) -> Result<RestorePlan> {
    let vc_bytes = format::read_small(&snapshot.dir, VIRTUAL_CLUSTER)?;
    let vc: VirtualCluster = serde_json::from_slice(&vc_bytes).map_err(|e| {
        bad(
            snapshot,
            format!("{VIRTUAL_CLUSTER} is not a VirtualCluster: {e}"),
        )
    })?;
    if vc.spec.cluster_version_name.is_none() || vc.spec.kubeconfig_secret_ref.is_some() {
        return Err(bad(
            snapshot,
            format!("{VIRTUAL_CLUSTER} is not a provisioned VirtualCluster (no clusterVersionName)"),
        ));
    }
    let secrets_bytes = format::read_small(&snapshot.dir, PKI_SECRETS)?;
    let stored: Vec<StoredSecret> = serde_json::from_slice(&secrets_bytes)
        .map_err(|e| bad(snapshot, format!("{PKI_SECRETS} is not a list of Secrets: {e}")))?;
    let mut secrets = Vec::new();
    for name in RESTORED_SECRETS {
        let mut found = stored.iter().filter(|s| s.name == name);
        let (Some(secret), None) = (found.next(), found.next()) else {
            return Err(bad(
                snapshot,
                format!("{PKI_SECRETS} must hold Secret {name} exactly once"),
            ));
        };
        let key = secret
            .text("tls.key")
            .ok_or_else(|| bad(snapshot, format!("Secret {name} in {PKI_SECRETS} has no tls.key")))?;
        let (type_, data) = if name == SECRET_SERVICE_ACCOUNT {
            let loaded = tenant_pki::pki::ServiceAccountKey::load(&key)
                .map_err(|e| bad(snapshot, format!("Secret {name} in {PKI_SECRETS}: {e}")))?;
            // The public half is derived from the private key, as vc-manager does.
            ("Opaque", vec![("tls.crt", loaded.public_pem), ("tls.key", key)])
        } else {
            let cert = secret
                .text("tls.crt")
                .ok_or_else(|| bad(snapshot, format!("Secret {name} in {PKI_SECRETS} has no tls.crt")))?;
            tenant_pki::pki::CertificateAuthority::load(&cert, &key, now)
                .map_err(|e| bad(snapshot, format!("Secret {name} in {PKI_SECRETS}: {e}")))?;
            ("kubernetes.io/tls", vec![("tls.crt", cert), ("tls.key", key)])
        };
        secrets.push(RestoredSecret { name, type_, data });
    }
    Ok(RestorePlan {
        spec: vc.spec,
        secrets,
    })
}

/// The VirtualCluster a restore applies: `name` in `namespace` with the snapshot's spec and, while the
/// restore runs, the stage annotation.
pub fn virtual_cluster(
    name: &str,
    namespace: &str,
    plan: &RestorePlan,
    stage: Option<&str>,
) -> VirtualCluster {
    let mut vc = VirtualCluster::new(name, plan.spec.clone());
    vc.metadata.namespace = Some(namespace.to_owned());
    vc.metadata.annotations = stage.map(|s| {
        [(ANNOTATION_RESTORE.to_owned(), s.to_owned())]
            .into_iter()
            .collect()
    });
    vc
}

/// What `restore` reports.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    /// `namespace/name` of the new VirtualCluster.
    pub virtual_cluster: String,
    /// Its root namespace.
    pub cluster_namespace: String,
    /// The snapshot folder.
    pub snapshot: std::path::PathBuf,
    /// Its checksum.
    pub checksum: String,
    /// Keys written into etcd.
    pub keys: u64,
    /// The Secrets restored.
    pub secrets: Vec<String>,
}

/// Polls `look` until it gives something or `deadline` passes (then fails saying `what`).
async fn poll<T, F, Fut>(
    deadline: tokio::time::Instant,
    timeout: Duration,
    what: &str,
    mut look: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let mut last = "nothing yet".to_owned();
    loop {
        match look().await {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(error) => last = error.one_line(),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                after: timeout,
                last,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `kubectl vc snapshot restore`.
pub async fn command(
    client: &Client,
    namespace: &str,
    args: &SnapshotRestoreArgs,
    io: &mut Streams<'_>,
) -> Result<()> {
    let name = args.name.as_str();
    let vc_ref = format!("{namespace}/{name}");
    let expected = args
        .checksum
        .as_deref()
        .map(format::parse_checksum)
        .transpose()
        .map_err(|problem| Error::InvalidArgument {
            flag: "--checksum",
            problem,
        })?;
    io.progress(&format!("verifying snapshot {}", args.from.display()))?;
    let snapshot = format::verify(&args.from, expected.as_deref())?;
    let plan = plan(&snapshot, vc_runtime::clock::now())?;
    let cv_name = plan.spec.cluster_version_name.clone().unwrap_or_default();
    Api::<ClusterVersion>::all(client.clone())
        .get_opt(&cv_name)
        .await
        .map_err(|e| Error::reading("ClusterVersion", "", &cv_name, e))?
        .ok_or_else(|| Error::Snapshot {
            path: snapshot.dir.clone(),
            problem: format!(
                "its ClusterVersion {cv_name} does not exist here; apply {} from the snapshot (or another ClusterVersion of that name) first",
                format::CLUSTER_VERSION
            ),
        })?;
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), namespace);
    if vcs
        .get_opt(name)
        .await
        .map_err(|e| Error::reading("VirtualCluster", namespace, name, e))?
        .is_some()
    {
        return Err(Error::InvalidArgument {
            flag: "NAME",
            problem: format!(
                "VirtualCluster {vc_ref} exists; a snapshot is restored into a new VirtualCluster (delete it first, or pick another name)"
            ),
        });
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let apply = |stage: Option<&'static str>| {
        let (vcs, vc) = (vcs.clone(), virtual_cluster(name, namespace, &plan, stage));
        let action = format!("applying VirtualCluster {vc_ref}");
        let params = params.clone();
        async move {
            vcs.patch(name, &params, &Patch::Apply(&vc))
                .await
                .map_err(|e| Error::api(action, e))
        }
    };
    let created = apply(Some(RESTORE_STAGE_PKI)).await?;
    let identity = TenantIdentity::of(&created).map_err(|e| Error::InvalidArgument {
        flag: "NAME",
        problem: e.to_string(),
    })?;
    let root = identity.root_namespace().to_owned();
    io.progress(&format!(
        "{vc_ref}: created; waiting for its root namespace {root}"
    ))?;
    let deadline = tokio::time::Instant::now() + args.timeout;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    poll(deadline, args.timeout, &format!("root namespace {root}"), || {
        let namespaces = namespaces.clone();
        let root = root.clone();
        async move {
            let found = namespaces
                .get_opt(&root)
                .await
                .map_err(|e| Error::reading("Namespace", "", &root, e))?;
            Ok(found.filter(|n| n.metadata.deletion_timestamp.is_none()))
        }
    })
    .await?;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &root);
    for restored in &plan.secrets {
        let secret_name = restored.name;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.to_owned()),
                namespace: Some(root.clone()),
                labels: Some(crds::tenant::managed_labels()),
                annotations: Some(identity.annotations()),
                ..Default::default()
            },
            type_: Some(restored.type_.to_owned()),
            data: Some(
                restored
                    .data
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.clone().into_bytes())))
                    .collect(),
            ),
            ..Default::default()
        };
        secrets
            .patch(secret_name, &params, &Patch::Apply(&secret))
            .await
            .map_err(|e| Error::api(format!("writing Secret {root}/{secret_name}"), e))?;
    }
    io.progress(&format!(
        "{vc_ref}: certificate authorities and service-account key written; waiting for etcd"
    ))?;
    apply(Some(RESTORE_STAGE_ETCD)).await?;

    // The etcd client certificate vc-manager issues from the restored etcd CA.
    let etcd_ca = plan
        .secrets
        .iter()
        .find(|s| s.name == SECRET_ETCD_CA)
        .and_then(|s| s.data.iter().find(|(k, _)| *k == "tls.crt"))
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let etcd_client = poll(
        deadline,
        args.timeout,
        &format!("Secret {root}/{SECRET_ETCD_CLIENT} issued by the restored etcd CA"),
        || {
            let (secrets, etcd_ca) = (secrets.clone(), etcd_ca.clone());
            async move {
                let found = secrets
                    .get_opt(SECRET_ETCD_CLIENT)
                    .await
                    .map_err(|e| Error::reading("Secret", "", SECRET_ETCD_CLIENT, e))?;
                Ok(found.filter(|s| {
                    s.data
                        .as_ref()
                        .and_then(|d| d.get("ca.crt"))
                        .map(|v| v.0.as_slice())
                        == Some(etcd_ca.as_bytes())
                }))
            }
        },
    )
    .await?;
    let cv = Api::<ClusterVersion>::all(client.clone())
        .get(&cv_name)
        .await
        .map_err(|e| Error::reading("ClusterVersion", "", &cv_name, e))?;
    let (forward, etcd) = poll(
        deadline,
        args.timeout,
        &format!("a ready etcd member in {root}"),
        || {
            let (cv, etcd_client) = (cv.clone(), etcd_client.clone());
            let root = root.clone();
            async move {
                let (forward, etcd) = connect_etcd(client, &root, &cv, &etcd_client).await?;
                match etcd.count().await {
                    Ok(_) => Ok(Some((forward, etcd))),
                    Err(error) => {
                        forward.stop().await;
                        Err(error)
                    }
                }
            }
        },
    )
    .await?;
    let written = write_keys(&snapshot, &etcd, io).await;
    forward.stop().await;
    let keys = written?;
    io.progress(&format!("{vc_ref}: {keys} keys in etcd; starting the apiserver"))?;
    let restored = apply(None).await?;

    let report = RestoreReport {
        virtual_cluster: vc_ref.clone(),
        cluster_namespace: root,
        snapshot: snapshot.dir.clone(),
        checksum: format::display_checksum(&snapshot.checksum),
        keys,
        secrets: plan.secrets.iter().map(|s| s.name.to_owned()).collect(),
    };
    let text = args.output.output.is_none();
    if text {
        io.result(&format!(
            "VirtualCluster {vc_ref} restored from {} ({}): {keys} etcd keys of {}/{} at revision {}; certificate authorities and service-account key {}",
            report.snapshot.display(),
            report.checksum,
            snapshot.manifest.virtual_cluster.namespace,
            snapshot.manifest.virtual_cluster.name,
            snapshot.manifest.etcd.revision,
            report.secrets.join(", ")
        ))?;
    }
    if args.wait {
        progress::wait_running(
            &vcs,
            name,
            restored.meta().generation,
            args.timeout,
            args.timeout,
            io,
            text,
        )
        .await?;
    }
    if let Some(format) = args.output.output {
        io.out
            .write_all(output::serialize(&report, format, "the restore")?.as_bytes())?;
    }
    Ok(())
}

/// Writes the snapshot's keys into `etcd`, which must hold none; checks the count afterwards.
async fn write_keys(
    snapshot: &Verified,
    etcd: &super::etcd::EtcdClient,
    io: &mut Streams<'_>,
) -> Result<u64> {
    let before = etcd.count().await?;
    if before != 0 {
        return Err(Error::Snapshot {
            path: snapshot.dir.clone(),
            problem: format!(
                "the new tenant's etcd already holds {before} keys; a snapshot is restored only into an empty etcd, nothing was written"
            ),
        });
    }
    let mut lines = KeyLines::open(snapshot)?;
    let (mut written, mut bytes) = (0u64, 0u64);
    let mut chunk = Vec::new();
    loop {
        let next = lines.next_pair()?;
        let done = next.is_none();
        if let Some(pair) = next {
            bytes += (pair.0.len() + pair.1.len()) as u64;
            chunk.push(pair);
        }
        // Batches are cut from a bounded chunk so that a large snapshot is never held in memory at once.
        if chunk.len() >= 1000 || (done && !chunk.is_empty()) {
            for batch in batches(&chunk) {
                etcd.put_batch(batch).await?;
                written += batch.len() as u64;
            }
            chunk.clear();
            io.progress(&format!(
                "etcd: {written} of {} keys, {bytes} bytes written",
                snapshot.manifest.etcd.keys
            ))?;
        }
        if done {
            break;
        }
    }
    let after = u64::try_from(etcd.count().await?).unwrap_or(0);
    if written != snapshot.manifest.etcd.keys || after != written {
        return Err(Error::Snapshot {
            path: snapshot.dir.clone(),
            problem: format!(
                "the manifest lists {} keys, {written} were read and etcd now holds {after}; the VirtualCluster keeps annotation {ANNOTATION_RESTORE} (delete it and restore again)",
                snapshot.manifest.etcd.keys
            ),
        });
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restored_virtual_cluster_carries_the_stage_only_while_restoring() {
        let plan = RestorePlan {
            spec: crds::VirtualClusterSpec {
                cluster_version_name: Some("cv".into()),
                ..Default::default()
            },
            secrets: Vec::new(),
        };
        let held = virtual_cluster("vc-2", "team", &plan, Some(RESTORE_STAGE_PKI));
        assert_eq!(
            held.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_RESTORE))
                .map(String::as_str),
            Some("pki")
        );
        assert_eq!(held.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(
            virtual_cluster("vc-2", "team", &plan, None).metadata.annotations,
            None
        );
    }
}
