//! `kubectl vc snapshot create NAME --to DIR`: every key of the tenant's etcd at one revision, its PKI
//! Secrets, its VirtualCluster and ClusterVersion, and a manifest of sizes and checksums, written into a
//! new folder `DIR/<name>-<UTC time>`. The folder appears only once complete: it is written under a hidden
//! name and renamed at the end, so a failed snapshot leaves no half snapshot behind.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use base64::Engine as _;
use crds::{ClusterVersion, ControlPlaneMode, TenantIdentity, VirtualCluster};
use k8s_openapi::{
    api::core::v1::{Secret, Service},
    jiff::Timestamp,
};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::json;

use super::{
    PKI_SECRET_NAMES, SnapshotReport,
    etcd::{EtcdClient, next_key},
    format::{
        self, CLUSTER_VERSION, ETCD_KEYS, EtcdSummary, FileEntry, HashingWriter, KeyLine, MANIFEST, Manifest,
        PKI_SECRETS, SourceTenant, VIRTUAL_CLUSTER,
    },
};
use crate::{
    Error, Result, Streams,
    args::SnapshotCreateArgs,
    forward::{self, Forward},
    kubeconfig::InClusterEndpoint,
    output,
};

/// The etcd client port when the ClusterVersion's Service names none.
const ETCD_CLIENT_PORT: i32 = 2379;

/// One PKI Secret as a snapshot keeps it: name, type and data (base64), nothing of its metadata.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct StoredSecret {
    /// The Secret's name in the root namespace.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Its data, base64 as in the API.
    pub data: BTreeMap<String, String>,
}

impl StoredSecret {
    pub(crate) fn of(secret: &Secret) -> Self {
        let b64 = base64::engine::general_purpose::STANDARD;
        Self {
            name: secret.name_any(),
            type_: secret.type_.clone().unwrap_or_else(|| "Opaque".into()),
            data: secret
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), b64.encode(&v.0)))
                .collect(),
        }
    }

    /// The value of `key`, decoded, as text.
    pub fn text(&self, key: &str) -> Option<String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.data.get(key)?)
            .ok()?;
        String::from_utf8(bytes).ok()
    }
}

/// The name of a snapshot folder: the VirtualCluster's name and the UTC time, e.g.
/// `team-a-20261125T013000Z`.
pub fn folder_name(vc_name: &str, at: Timestamp) -> String {
    format!("{vc_name}-{}", at.strftime("%Y%m%dT%H%M%SZ"))
}

fn text_of(secret: &Secret, key: &str, namespace: &str) -> Result<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or_else(|| Error::BadSecret {
            namespace: namespace.to_owned(),
            name: secret.name_any(),
            problem: format!("no {key}"),
        })
}

/// A port-forward to a ready etcd member of the tenant and a client of it through the forward, with the
/// tenant's `etcd-client` certificate.
pub async fn connect_etcd(
    client: &Client,
    root: &str,
    cv: &ClusterVersion,
    etcd_client: &Secret,
) -> Result<(Forward, EtcdClient)> {
    let (service_name, _) = cv.spec.etcd_service_names();
    let port = Api::<Service>::namespaced(client.clone(), root)
        .get_opt(&service_name)
        .await
        .map_err(|e| Error::reading("Service", root, &service_name, e))?
        .and_then(|s| s.spec?.ports)
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some("client"))
                .or_else(|| ports.first())
                .map(|p| p.port)
        })
        .unwrap_or(ETCD_CLIENT_PORT);
    let endpoint = InClusterEndpoint {
        url: format!("https://{service_name}.{root}.svc:{port}"),
        service: service_name,
        namespace: root.to_owned(),
        port,
    };
    let target = forward::find_target(client, &endpoint).await?;
    let listener = forward::bind(None, None).await?;
    let forward = forward::start(client.clone(), endpoint, target, listener)?;
    let certified = tenant_pki::pki::CertifiedKey {
        cert_pem: text_of(etcd_client, "tls.crt", root)?,
        key_pem: text_of(etcd_client, "tls.key", root)?,
    };
    let ca = text_of(etcd_client, "ca.crt", root)?;
    let etcd = EtcdClient::connect(forward.local, &ca, &certified).await?;
    Ok((forward, etcd))
}

fn io_error(path: &Path, action: &str, error: std::io::Error) -> Error {
    Error::Snapshot {
        path: path.to_owned(),
        problem: format!("{action}: {error}"),
    }
}

/// Writes `value` as pretty JSON into `dir/name`; returns its entry.
fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> Result<FileEntry> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| Error::Serialize {
        what: name.to_owned(),
        message: e.to_string(),
    })?;
    std::fs::write(dir.join(name), &bytes).map_err(|e| io_error(dir, &format!("writing {name}"), e))?;
    Ok(FileEntry {
        name: name.to_owned(),
        size: bytes.len() as u64,
        sha256: format::sha256_hex(&bytes),
    })
}

/// Reads every key of `etcd` at one revision into `dir/ETCD_KEYS`, showing progress; returns the file's
/// entry and what was read.
async fn dump_keys(etcd: &EtcdClient, dir: &Path, io: &mut Streams<'_>) -> Result<(FileEntry, EtcdSummary)> {
    let path = dir.join(ETCD_KEYS);
    let file = File::create(&path).map_err(|e| io_error(dir, "creating the key file", e))?;
    let mut writer = HashingWriter::new(BufWriter::new(file));
    let (mut from, mut revision) = (vec![0u8], 0);
    let (mut keys, mut skipped) = (0u64, 0u64);
    loop {
        let page = etcd.range_page(&from, revision).await?;
        // The first page fixes the revision; every later page reads at it.
        if revision == 0 {
            revision = page.revision;
        }
        for kv in &page.kvs {
            if kv.lease != 0 {
                skipped += 1;
                continue;
            }
            let line =
                serde_json::to_string(&KeyLine::new(&kv.key, &kv.value)).map_err(|e| Error::Serialize {
                    what: "an etcd key".into(),
                    message: e.to_string(),
                })?;
            writer
                .write_all(line.as_bytes())
                .and_then(|()| writer.write_all(b"\n"))
                .map_err(|e| io_error(dir, "writing the key file", e))?;
            keys += 1;
        }
        io.progress(&format!(
            "etcd revision {revision}: {keys} keys, {} bytes written",
            writer.written()
        ))?;
        match (page.more, page.kvs.last()) {
            (true, Some(last)) => from = next_key(&last.key),
            _ => break,
        }
    }
    let (_, size, sha256) = writer
        .finish()
        .map_err(|e| io_error(dir, "writing the key file", e))?;
    Ok((
        FileEntry {
            name: ETCD_KEYS.to_owned(),
            size,
            sha256,
        },
        EtcdSummary {
            revision,
            keys,
            skipped_leased_keys: skipped,
        },
    ))
}

/// The end of the hidden name a snapshot folder has while it is written.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// Removes a partly written snapshot folder when dropped, unless kept.
struct Staging {
    path: PathBuf,
    keep: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Creates `path`, readable by its owner only (it holds private keys).
fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

/// `kubectl vc snapshot create` into a folder here (`--to pvc/<claim>` is [`super::schedule::request`]'s,
/// chosen by [`super::command`]).
pub async fn command(
    client: &Client,
    namespace: &str,
    args: &SnapshotCreateArgs,
    io: &mut Streams<'_>,
) -> Result<()> {
    let vc_ref = format!("{namespace}/{}", args.name);
    let report = take(client, namespace, &args.name, &args.to, io).await?;
    match args.output.output {
        Some(format) => io
            .out
            .write_all(output::serialize(&report, format, "the snapshot")?.as_bytes())?,
        None => io.result(&format!(
            "snapshot {} of VirtualCluster {vc_ref}: {}\nchecksum {}",
            report.path.display(),
            report.summary(),
            report.checksum
        ))?,
    }
    Ok(())
}

/// Takes a snapshot of the native VirtualCluster `namespace/name` into a new folder under `dir`, showing
/// progress on `io`.
pub async fn take(
    client: &Client,
    namespace: &str,
    name: &str,
    dir: &Path,
    io: &mut Streams<'_>,
) -> Result<SnapshotReport> {
    let vc_ref = format!("{namespace}/{name}");
    let vc = Api::<VirtualCluster>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| Error::reading("VirtualCluster", namespace, name, e))?;
    let cv_name = native_cluster_version(&vc, &vc_ref)?;
    let identity = TenantIdentity::of(&vc).map_err(|e| Error::InvalidArgument {
        flag: "NAME",
        problem: e.to_string(),
    })?;
    let root = identity.root_namespace().to_owned();
    let cv = Api::<ClusterVersion>::all(client.clone())
        .get(&cv_name)
        .await
        .map_err(|e| Error::reading("ClusterVersion", "", &cv_name, e))?;
    let secrets_api: Api<Secret> = Api::namespaced(client.clone(), &root);
    let mut secrets = Vec::new();
    for secret_name in PKI_SECRET_NAMES {
        let secret = secrets_api
            .get(secret_name)
            .await
            .map_err(|e| Error::reading("Secret", &root, secret_name, e))?;
        secrets.push(secret);
    }
    let etcd_client = secrets
        .iter()
        .find(|s| s.name_any() == tenant_pki::names::SECRET_ETCD_CLIENT)
        .ok_or_else(|| Error::NotFound {
            kind: "Secret",
            namespace: root.clone(),
            name: tenant_pki::names::SECRET_ETCD_CLIENT.into(),
        })?;

    let created = Timestamp::now();
    let folder = folder_name(name, created);
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, "creating the folder", e))?;
    let final_path = dir.join(&folder);
    if final_path.exists() {
        return Err(Error::Snapshot {
            path: final_path,
            problem: "already exists; nothing was written".into(),
        });
    }
    let staging = Staging {
        path: dir.join(format!(".{folder}{PARTIAL_SUFFIX}")),
        keep: false,
    };
    create_private_dir(&staging.path).map_err(|e| io_error(&staging.path, "creating the folder", e))?;
    io.progress(&format!(
        "{vc_ref}: reading etcd in {root} through a port-forward"
    ))?;

    let (forward, etcd) = connect_etcd(client, &root, &cv, etcd_client).await?;
    let dumped = dump_keys(&etcd, &staging.path, io).await;
    forward.stop().await;
    let (keys_entry, summary) = dumped?;

    let stored: Vec<StoredSecret> = secrets.iter().map(StoredSecret::of).collect();
    let pki_entry = write_json(&staging.path, PKI_SECRETS, &stored)?;
    let vc_entry = write_json(
        &staging.path,
        VIRTUAL_CLUSTER,
        &json!({
            "apiVersion": crate::manifest::API_VERSION,
            "kind": "VirtualCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": vc.spec,
        }),
    )?;
    let cv_entry = write_json(
        &staging.path,
        CLUSTER_VERSION,
        &json!({
            "apiVersion": crate::manifest::API_VERSION,
            "kind": "ClusterVersion",
            "metadata": {"name": cv_name},
            "spec": cv.spec,
        }),
    )?;
    let manifest = Manifest {
        format: format::FORMAT.to_owned(),
        virtual_cluster: SourceTenant {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: identity.vc_uid.clone(),
            cluster_key: identity.cluster_key.clone(),
        },
        cluster_version_name: cv_name,
        created_at: created.to_string(),
        etcd: summary,
        files: vec![keys_entry, pki_entry, vc_entry, cv_entry],
    };
    let manifest_entry = write_json(&staging.path, MANIFEST, &manifest)?;
    std::fs::rename(&staging.path, &final_path)
        .map_err(|e| io_error(&final_path, "moving the finished snapshot in place", e))?;
    let mut staging = staging;
    staging.keep = true;

    Ok(SnapshotReport {
        path: final_path,
        checksum: format::display_checksum(&manifest_entry.sha256),
        manifest,
    })
}

/// The ClusterVersion of a VirtualCluster whose etcd vc-manager runs; [`Error::NotNative`] otherwise.
pub fn native_cluster_version(vc: &VirtualCluster, vc_ref: &str) -> Result<String> {
    match (&vc.spec.cluster_version_name, vc.mode()) {
        (Some(cv), ControlPlaneMode::Provisioned) => Ok(cv.clone()),
        _ => Err(Error::NotNative {
            vc: vc_ref.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn folders_are_named_by_tenant_and_utc_time() {
        let at: Timestamp = "2026-11-25T01:30:05Z".parse().expect("time");
        assert_eq!(folder_name("team-a", at), "team-a-20261125T013005Z");
    }

    #[test]
    fn secrets_keep_name_type_and_data_only() {
        let mut secret = Secret::default();
        secret.metadata.name = Some("root-ca".into());
        secret.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        secret.type_ = Some("kubernetes.io/tls".into());
        secret.data = Some([("tls.crt".to_owned(), ByteString(b"PEM".to_vec()))].into());
        let stored = StoredSecret::of(&secret);
        assert_eq!(
            serde_json::to_value(&stored).expect("json"),
            json!({"name": "root-ca", "type": "kubernetes.io/tls", "data": {"tls.crt": "UEVN"}})
        );
        assert_eq!(stored.text("tls.crt").as_deref(), Some("PEM"));
        assert_eq!(stored.text("tls.key"), None);
    }
}
