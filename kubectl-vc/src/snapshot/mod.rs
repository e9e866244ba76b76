//! `kubectl vc snapshot`: snapshots of native VirtualClusters in a folder, and VirtualClusters restored
//! from them.
//!
//! - [`format`]: the snapshot folder, its manifest and checksums, and the checks a restore makes.
//! - [`etcd`]: the tenant's etcd through its JSON gateway and a port-forward.
//! - [`create`], [`restore`], and `list` and `prune` (retention: [`to_remove`]) here.
//!
//! A snapshot is logical: every key of etcd read at one revision (one consistent state, whatever the
//! apiserver writes meanwhile), restored by writing the keys into the new tenant's etcd before its
//! apiserver first starts. It works the same on etcd 3.4 and 3.5 and needs nothing in the etcd image.

pub mod create;
pub mod etcd;
pub mod format;
pub mod metrics;
pub mod restore;
pub mod schedule;

use std::path::{Path, PathBuf};

use crds::wellknown::{SECRET_ADMIN_KUBECONFIG, SECRET_KUBELET_CLIENT};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use tenant_pki::names::{
    SECRET_APISERVER, SECRET_CONTROLLER_MANAGER_KUBECONFIG, SECRET_ETCD_CA, SECRET_ETCD_CLIENT,
    SECRET_ETCD_SERVER, SECRET_FRONT_PROXY_CA, SECRET_FRONT_PROXY_CLIENT, SECRET_KUBELET_CLIENT_CA,
    SECRET_ROOT_CA, SECRET_SERVICE_ACCOUNT,
};

use crate::{
    Result, Streams,
    args::{SnapshotCommand, SnapshotListArgs, SnapshotPruneArgs},
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

impl SnapshotReport {
    /// What the snapshot holds, in a line: keys, revision, leased keys left out, PKI Secrets, bytes.
    pub fn summary(&self) -> String {
        let m = &self.manifest;
        format!(
            "{} keys at etcd revision {} ({} leased keys left out), {} PKI Secrets, {} bytes",
            m.etcd.keys,
            m.etcd.revision,
            m.etcd.skipped_leased_keys,
            PKI_SECRET_NAMES.len(),
            m.total_size()
        )
    }
}

/// `kubectl vc snapshot ...`.
pub async fn command(
    client: &kube::Client,
    namespace: &str,
    command: &SnapshotCommand,
    io: &mut Streams<'_>,
    interrupt: impl Future<Output = ()> + Send,
) -> Result<()> {
    match command {
        // `--to pvc/<claim>` asks the platform's snapshot scheduler serving that store.
        SnapshotCommand::Create(args) => match schedule::store_of(&args.to) {
            Some(store) => schedule::request(client, namespace, args, &store, io).await,
            None => create::command(client, namespace, args, io).await,
        },
        SnapshotCommand::Restore(args) => restore::command(client, namespace, args, io).await,
        SnapshotCommand::List(args) => list(args, io),
        SnapshotCommand::Prune(args) => prune(args, io),
        SnapshotCommand::Schedule(args) => schedule::command(client, args, io, interrupt).await,
    }
}

/// The snapshots retention removes: of each source VirtualCluster (namespace, name, uid), all but the
/// `keep` newest by creation time. A snapshot whose creation time does not parse is never chosen.
pub fn to_remove(snapshots: &[SnapshotReport], keep: usize) -> Vec<&SnapshotReport> {
    use std::collections::BTreeMap;
    /// Dated snapshots of one source VirtualCluster.
    type Dated<'a> = Vec<(Timestamp, &'a SnapshotReport)>;
    let mut by_tenant: BTreeMap<&format::SourceTenant, Dated<'_>> = BTreeMap::new();
    for snapshot in snapshots {
        if let Ok(created) = snapshot.manifest.created_at.parse::<Timestamp>() {
            by_tenant
                .entry(&snapshot.manifest.virtual_cluster)
                .or_default()
                .push((created, snapshot));
        }
    }
    let mut removed = Vec::new();
    for mut dated in by_tenant.into_values() {
        dated.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.path.cmp(&a.1.path)));
        removed.extend(dated.into_iter().skip(keep).map(|(_, s)| s));
    }
    removed.sort_by(|a, b| a.path.cmp(&b.path));
    removed
}

fn prune(args: &SnapshotPruneArgs, io: &mut Streams<'_>) -> Result<()> {
    let (found, skipped) = scan(&args.dir)?;
    for problem in &skipped {
        io.warn(&format!("left alone: {problem}"))?;
    }
    let keep = usize::try_from(args.keep).unwrap_or(usize::MAX);
    let removed = to_remove(&found, keep);
    for snapshot in &removed {
        std::fs::remove_dir_all(&snapshot.path).map_err(|e| crate::Error::Snapshot {
            path: snapshot.path.clone(),
            problem: format!("removing it: {e}"),
        })?;
        if args.output.output.is_none() {
            io.result(&format!("removed {}", snapshot.path.display()))?;
        }
    }
    match args.output.output {
        Some(format) => io
            .out
            .write_all(output::serialize(&removed, format, "the removed snapshots")?.as_bytes())?,
        None if removed.is_empty() => writeln!(
            io.err,
            "nothing to remove in {}: no VirtualCluster has more than {} snapshots",
            args.dir.display(),
            args.keep
        )?,
        None => {}
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use format::{EtcdSummary, Manifest, SourceTenant};

    fn snapshot(vc: &str, uid: &str, created: &str) -> SnapshotReport {
        SnapshotReport {
            path: PathBuf::from(format!("/b/{vc}-{created}")),
            checksum: String::new(),
            manifest: Manifest {
                format: format::FORMAT.into(),
                virtual_cluster: SourceTenant {
                    namespace: "team".into(),
                    name: vc.into(),
                    uid: uid.into(),
                    cluster_key: String::new(),
                },
                cluster_version_name: "cv".into(),
                created_at: created.into(),
                etcd: EtcdSummary {
                    revision: 1,
                    keys: 0,
                    skipped_leased_keys: 0,
                },
                files: Vec::new(),
            },
        }
    }

    fn names(removed: &[&SnapshotReport]) -> Vec<String> {
        removed.iter().map(|s| s.path.display().to_string()).collect()
    }

    #[test]
    fn retention_keeps_the_newest_of_each_virtual_cluster() {
        let snapshots = [
            snapshot("a", "u1", "2026-11-25T01:00:00Z"),
            snapshot("a", "u1", "2026-11-25T03:00:00.5Z"),
            snapshot("a", "u1", "2026-11-25T02:00:00Z"),
            snapshot("b", "u2", "2026-11-20T00:00:00Z"),
            // Another VirtualCluster of the same name (recreated: another uid) counts on its own.
            snapshot("a", "u3", "2026-11-01T00:00:00Z"),
            // Undated: never removed.
            snapshot("a", "u1", "yesterday"),
        ];
        assert_eq!(names(&to_remove(&snapshots, 2)), ["/b/a-2026-11-25T01:00:00Z"]);
        assert_eq!(
            names(&to_remove(&snapshots, 1)),
            ["/b/a-2026-11-25T01:00:00Z", "/b/a-2026-11-25T02:00:00Z"]
        );
        assert!(to_remove(&snapshots, 3).is_empty());
    }
}
