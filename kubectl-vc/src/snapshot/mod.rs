//! `kubectl vc snapshot`: snapshots of native VirtualClusters in a folder, and VirtualClusters restored
//! from them.
//!
//! - [`format`]: the snapshot folder, its manifest and checksums, and the checks a restore makes.
//! - [`etcd`]: the tenant's etcd through its JSON gateway and a port-forward.
//! - [`create`], [`restore`], and `list` here.
//!
//! A snapshot is logical: every key of etcd read at one revision (one consistent state, whatever the
//! apiserver writes meanwhile), restored by writing the keys into the new tenant's etcd before its
//! apiserver first starts. It works the same on etcd 3.4 and 3.5 and needs nothing in the etcd image.

pub mod create;
pub mod etcd;
pub mod format;
pub mod restore;

use std::path::{Path, PathBuf};

use crds::wellknown::{SECRET_ADMIN_KUBECONFIG, SECRET_KUBELET_CLIENT};
use serde::Serialize;
use vc_manager::secret_names::{
    SECRET_APISERVER, SECRET_CONTROLLER_MANAGER_KUBECONFIG, SECRET_ETCD_CA, SECRET_ETCD_CLIENT,
    SECRET_ETCD_SERVER, SECRET_FRONT_PROXY_CA, SECRET_FRONT_PROXY_CLIENT, SECRET_KUBELET_CLIENT_CA,
    SECRET_ROOT_CA, SECRET_SERVICE_ACCOUNT,
};

use crate::{
    Result, Streams,
    args::{SnapshotCommand, SnapshotListArgs},
    output, table,
};

/// The PKI Secrets of a native tenant's root namespace, all of which a snapshot keeps.
pub const PKI_SECRET_NAMES: [&str; 12] = [
    SECRET_ROOT_CA,
    SECRET_APISERVER,
    SECRET_ETCD_CA,
    SECRET_ETCD_SERVER,
    SECRET_ETCD_CLIENT,
    SECRET_FRONT_PROXY_CA,
    SECRET_FRONT_PROXY_CLIENT,
    SECRET_SERVICE_ACCOUNT,
    SECRET_KUBELET_CLIENT_CA,
    SECRET_KUBELET_CLIENT,
    SECRET_ADMIN_KUBECONFIG,
    SECRET_CONTROLLER_MANAGER_KUBECONFIG,
];

/// A snapshot as `create` and `list` report it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotReport {
    /// The folder.
    pub path: PathBuf,
    /// `sha256:` of the manifest.
    pub checksum: String,
    /// The manifest.
    pub manifest: format::Manifest,
}

/// `kubectl vc snapshot ...`.
pub async fn command(
    client: &kube::Client,
    namespace: &str,
    command: &SnapshotCommand,
    io: &mut Streams<'_>,
) -> Result<()> {
    match command {
        SnapshotCommand::Create(args) => create::command(client, namespace, args, io).await,
        SnapshotCommand::Restore(args) => restore::command(client, namespace, args, io).await,
        SnapshotCommand::List(args) => list(args, io),
    }
}

/// The snapshots directly under `dir`, by folder name, read from their manifests (not verified: that is
/// the restore's job); folders without a readable manifest are reported as warnings.
pub fn scan(dir: &Path) -> Result<(Vec<SnapshotReport>, Vec<String>)> {
    let entries = std::fs::read_dir(dir).map_err(|e| crate::Error::Snapshot {
        path: dir.to_owned(),
        problem: e.to_string(),
    })?;
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect();
    paths.sort();
    for path in paths {
        let read = format::read_small(&path, format::MANIFEST).and_then(|bytes| {
            let manifest: format::Manifest =
                serde_json::from_slice(&bytes).map_err(|e| crate::Error::Snapshot {
                    path: path.clone(),
                    problem: format!("{}: {e}", format::MANIFEST),
                })?;
            Ok((manifest, format::sha256_hex(&bytes)))
        });
        match read {
            Ok((manifest, checksum)) => found.push(SnapshotReport {
                path,
                checksum: format::display_checksum(&checksum),
                manifest,
            }),
            Err(error) => skipped.push(error.one_line()),
        }
    }
    Ok((found, skipped))
}

fn list(args: &SnapshotListArgs, io: &mut Streams<'_>) -> Result<()> {
    let (found, skipped) = scan(&args.dir)?;
    for problem in &skipped {
        io.warn(&format!("skipped {problem}"))?;
    }
    if let Some(format) = args.output.output {
        io.out
            .write_all(output::serialize(&found, format, "the snapshots")?.as_bytes())?;
        return Ok(());
    }
    if found.is_empty() {
        writeln!(io.err, "no snapshots in {}", args.dir.display())?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|s| {
            let m = &s.manifest;
            vec![
                s.path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                format!("{}/{}", m.virtual_cluster.namespace, m.virtual_cluster.name),
                m.created_at.clone(),
                m.etcd.keys.to_string(),
                m.total_size().to_string(),
                s.checksum.clone(),
            ]
        })
        .collect();
    io.out.write_all(
        table::render(
            &["NAME", "VIRTUALCLUSTER", "CREATED", "KEYS", "BYTES", "CHECKSUM"],
            &rows,
            0,
        )
        .as_bytes(),
    )?;
    Ok(())
}
