//! Writing a tenant's context into a kubeconfig file the way kubectl does: every other cluster, user,
//! context and field is kept as it was, the file is replaced atomically (a temporary file in the same
//! folder, synced, renamed) with mode 0600 while kubectl's lock file `<file>.lock` is held, and an entry of
//! the same name that was written for something else is replaced only when asked.
//!
//! Each entry written carries an extension naming the VirtualCluster it is for (namespace, name, uid), so a
//! later `connect` to the same VirtualCluster updates its own entries (new port, renewed certificate)
//! without `--overwrite`, and a VirtualCluster recreated under the same name does not.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{Error, Result};

/// Name of the extension that marks the entries `kubectl vc connect` wrote.
pub const EXTENSION: &str = "tenancy.x-k8s.io/virtualcluster";

/// The VirtualCluster an entry was written for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid (another VirtualCluster of the same name has another).
    pub uid: String,
}

/// The three kinds of entry, in the order the file lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// `clusters[]`, with a `cluster`.
    Cluster,
    /// `users[]`, with a `user`.
    User,
    /// `contexts[]`, with a `context`.
    Context,
}

impl EntryKind {
    /// The list's key.
    pub fn list(self) -> &'static str {
        match self {
            Self::Cluster => "clusters",
            Self::User => "users",
            Self::Context => "contexts",
        }
    }

    /// The key of the entry's body.
    pub fn body(self) -> &'static str {
        match self {
            Self::Cluster => "cluster",
            Self::User => "user",
            Self::Context => "context",
        }
    }
}

/// An entry to write: its kind, name and body (`cluster`, `user` or `context` object).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Kind.
    pub kind: EntryKind,
    /// Name.
    pub name: String,
    /// Body, without the owner extension (added when written).
    pub body: Value,
}

/// What happened to one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// It was not there.
    Added,
    /// It was there (for this VirtualCluster, or replaced with `--overwrite`) and differed.
    Updated,
    /// It was there exactly as it would be written.
    Unchanged,
}

/// The merged document and what changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    /// The whole kubeconfig.
    pub document: Value,
    /// Per entry written: kind, name, change.
    pub changes: Vec<(EntryKind, String, Change)>,
    /// Whether `current-context` was changed.
    pub switched: bool,
}

/// `body` with the owner extension (replacing any earlier one of that name, keeping others).
fn with_owner(body: &Value, owner: &Owner) -> Value {
    let mut body = body.clone();
    let Some(map) = body.as_object_mut() else {
        return body;
    };
    let mut extensions: Vec<Value> = map
        .get("extensions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    extensions.retain(|e| e.get("name").and_then(Value::as_str) != Some(EXTENSION));
    extensions.push(json!({"name": EXTENSION, "extension": owner}));
    map.insert("extensions".into(), Value::Array(extensions));
    body
}

/// The owner an entry body names, if `kubectl vc connect` wrote it.
pub fn owner_of(body: &Value) -> Option<Owner> {
    body.get("extensions")?
        .as_array()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(EXTENSION))
        .and_then(|e| serde_json::from_value(e.get("extension")?.clone()).ok())
}

/// The body of entry `name` of `kind` in a kubeconfig document, if there is one.
pub fn find<'a>(document: &'a Value, kind: EntryKind, name: &str) -> Option<&'a Value> {
    document
        .get(kind.list())?
        .as_array()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|e| e.get(kind.body()))
}

/// Merges `entries` for `owner` into `existing` (`None`: no file yet). An entry of the same name is
/// replaced when it is identical, written for the same owner, or `overwrite`; otherwise nothing is changed
/// and the error names every conflicting entry. `switch` sets `current-context` to the context written.
/// `path` names the file in errors.
pub fn merge(
    path: &Path,
    existing: Option<Value>,
    entries: &[Entry],
    owner: &Owner,
    overwrite: bool,
    switch: bool,
) -> Result<Merged> {
    let invalid = |problem: String| Error::KubeconfigFile {
        path: path.to_owned(),
        problem,
    };
    let mut document = match existing {
        None | Some(Value::Null) => json!({"apiVersion": "v1", "kind": "Config", "preferences": {}}),
        Some(Value::Object(map)) => Value::Object(map),
        Some(_) => return Err(invalid("not a kubeconfig: the document is not a mapping".into())),
    };
    let map = document
        .as_object_mut()
        .ok_or_else(|| invalid("not a mapping".into()))?;
    let mut changes = Vec::new();
    let mut conflicts = Vec::new();
    for entry in entries {
        let list = match map.get(entry.kind.list()) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return Err(invalid(format!("{} is not a list", entry.kind.list()))),
        };
        let body = with_owner(&entry.body, owner);
        let position = list
            .iter()
            .position(|e| e.get("name").and_then(Value::as_str) == Some(entry.name.as_str()));
        let mut list = list;
        let change = match position {
            None => {
                list.push(json!({"name": entry.name, entry.kind.body(): body}));
                Change::Added
            }
            Some(index) => {
                let current = list[index].get(entry.kind.body()).cloned().unwrap_or(Value::Null);
                if current == body {
                    Change::Unchanged
                } else if overwrite || owner_of(&current).as_ref() == Some(owner) {
                    list[index] = json!({"name": entry.name, entry.kind.body(): body});
                    Change::Updated
                } else {
                    let whose = match owner_of(&current) {
                        Some(other) => format!(
                            " (written for VirtualCluster {}/{} uid {})",
                            other.namespace, other.name, other.uid
                        ),
                        None => String::new(),
                    };
                    conflicts.push(format!("{} {:?}{whose}", entry.kind.body(), entry.name));
                    Change::Unchanged
                }
            }
        };
        map.insert(entry.kind.list().into(), Value::Array(list));
        changes.push((entry.kind, entry.name.clone(), change));
    }
    if !conflicts.is_empty() {
        return Err(Error::KubeconfigConflict {
            path: path.to_owned(),
            entries: conflicts.join(", "),
        });
    }
    let context = entries.iter().find(|e| e.kind == EntryKind::Context);
    let mut switched = false;
    if let (true, Some(context)) = (switch, context) {
        switched = map.get("current-context").and_then(Value::as_str) != Some(context.name.as_str());
        map.insert("current-context".into(), Value::String(context.name.clone()));
    }
    for (key, value) in [("apiVersion", "v1"), ("kind", "Config")] {
        map.entry(key).or_insert_with(|| Value::String(value.into()));
    }
    Ok(Merged {
        document,
        changes,
        switched,
    })
}

/// The file `connect` writes to: `explicit`, else the super cluster's `--kubeconfig`, else the first file of
/// `$KUBECONFIG` (`kubeconfig_env`), else `~/.kube/config` under `home`.
pub fn target(
    explicit: Option<&Path>,
    super_kubeconfig: Option<&Path>,
    kubeconfig_env: Option<&std::ffi::OsStr>,
    home: Option<&Path>,
) -> Result<PathBuf> {
    if let Some(path) = explicit.or(super_kubeconfig) {
        return Ok(path.to_owned());
    }
    if let Some(first) = kubeconfig_env
        .into_iter()
        .flat_map(std::env::split_paths)
        .find(|p| !p.as_os_str().is_empty())
    {
        return Ok(first);
    }
    home.map(|home| home.join(".kube").join("config"))
        .ok_or_else(|| Error::InvalidArgument {
            flag: "--write-kubeconfig",
            problem: "neither $KUBECONFIG nor $HOME is set; name the file to write".into(),
        })
}

/// Reads a kubeconfig file as a document (`None` when it does not exist or is empty).
pub fn read(path: &Path) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(Error::KubeconfigFile {
                path: path.to_owned(),
                problem: format!("reading it: {error}"),
            });
        }
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_saphyr::from_str(&text)
        .map(Some)
        .map_err(|e| Error::KubeconfigFile {
            path: path.to_owned(),
            problem: format!("not YAML: {e}"),
        })
}

/// kubectl's lock on a kubeconfig file (`<file>.lock`, created exclusively, removed when dropped).
pub struct Lock {
    path: PathBuf,
}

impl Lock {
    /// Takes the lock of `file`; fails when another writer holds it.
    pub fn take(file: &Path) -> Result<Self> {
        let mut name = file.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::KubeconfigFile {
                path: file.to_owned(),
                problem: format!("creating its folder: {e}"),
            })?;
        }
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(_) => Ok(Self { path }),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::KubeconfigFile {
                path: file.to_owned(),
                problem: format!(
                    "{} exists: kubectl or another kubectl vc is writing it (remove the lock file if none is running)",
                    path.display()
                ),
            }),
            Err(error) => Err(Error::KubeconfigFile {
                path: file.to_owned(),
                problem: format!("creating the lock file {}: {error}", path.display()),
            }),
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Best effort: a lock file left behind is reported by the next writer.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Replaces `path` with `text` atomically, mode 0600: a temporary file beside it is written, synced and
/// renamed over it. A symbolic link is followed (its target is replaced). Nothing is changed on failure.
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let failed = |problem: String| Error::KubeconfigFile {
        path: path.to_owned(),
        problem,
    };
    let path = match std::fs::canonicalize(path) {
        Ok(real) => real,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => path.to_owned(),
        Err(error) => return Err(failed(format!("resolving it: {error}"))),
    };
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(folder).map_err(|e| failed(format!("creating its folder: {e}")))?;
    let file_name = path
        .file_name()
        .ok_or_else(|| failed("it names no file".into()))?
        .to_string_lossy();
    let temporary = folder.join(format!(".{file_name}.kubectl-vc-{}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temporary)?;
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(failed(format!("writing it: {error}")));
    }
    Ok(())
}

/// Merges `entries` into the kubeconfig file at `path` under its lock and writes it back (only when
/// something changed); returns what changed.
pub fn update(
    path: &Path,
    entries: &[Entry],
    owner: &Owner,
    overwrite: bool,
    switch: bool,
) -> Result<Merged> {
    let _lock = Lock::take(path)?;
    let existing = read(path)?;
    let merged = merge(path, existing, entries, owner, overwrite, switch)?;
    let changed = merged.switched || merged.changes.iter().any(|(_, _, c)| *c != Change::Unchanged);
    if changed {
        let text = serde_saphyr::to_string(&merged.document).map_err(|e| Error::Serialize {
            what: format!("kubeconfig {}", path.display()),
            message: e.to_string(),
        })?;
        write_atomically(path, &text)?;
    }
    Ok(merged)
}

/// A kubeconfig document's entry list as name → body (for tests and summaries).
pub fn entries_of(document: &Value, kind: EntryKind) -> Map<String, Value> {
    document
        .get(kind.list())
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e.get("name")?.as_str()?.to_owned(),
                e.get(kind.body()).cloned().unwrap_or(Value::Null),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OTHERS: &str = "apiVersion: v1
kind: Config
preferences: {colors: true}
clusters:
- name: prod
  cluster: {server: 'https://prod.example.com:6443', certificate-authority-data: UFJPRA==}
- name: team-vc-1
  cluster: {server: 'https://someone-else:6443'}
users:
- name: prod-admin
  user: {token: secret-prod}
contexts:
- name: prod
  context: {cluster: prod, user: prod-admin, namespace: apps}
current-context: prod
";

    fn owner(uid: &str) -> Owner {
        Owner {
            namespace: "team".into(),
            name: "vc-1".into(),
            uid: uid.into(),
        }
    }

    fn entries(server: &str) -> Vec<Entry> {
        vec![
            Entry {
                kind: EntryKind::Cluster,
                name: "team-vc-1".into(),
                body: json!({"server": server, "certificate-authority-data": "Q0E=", "tls-server-name": "apiserver-svc.root.svc"}),
            },
            Entry {
                kind: EntryKind::User,
                name: "team-vc-1-admin".into(),
                body: json!({"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"}),
            },
            Entry {
                kind: EntryKind::Context,
                name: "team-vc-1".into(),
                body: json!({"cluster": "team-vc-1", "user": "team-vc-1-admin"}),
            },
        ]
    }

    fn others() -> Value {
        serde_saphyr::from_str(OTHERS).expect("yaml")
    }

    fn without(mut document: Value, names: &[&str]) -> Value {
        for kind in [EntryKind::Cluster, EntryKind::User, EntryKind::Context] {
            if let Some(list) = document.get_mut(kind.list()).and_then(Value::as_array_mut) {
                list.retain(|e| !names.contains(&e["name"].as_str().unwrap_or_default()));
            }
        }
        document
    }

    #[test]
    fn other_entries_and_fields_are_kept_and_a_foreign_entry_of_the_same_name_is_refused() {
        let path = Path::new("/k/config");
        let error = merge(
            path,
            Some(others()),
            &entries("https://127.0.0.1:4443"),
            &owner("u1"),
            false,
            false,
        )
        .expect_err("cluster team-vc-1 is someone else's");
        assert!(
            matches!(&error, Error::KubeconfigConflict { entries, .. } if entries == "cluster \"team-vc-1\""),
            "{error}"
        );
        assert!(error.to_string().contains("--overwrite"), "{error}");

        let merged = merge(
            path,
            Some(others()),
            &entries("https://127.0.0.1:4443"),
            &owner("u1"),
            true,
            false,
        )
        .expect("--overwrite");
        assert_eq!(
            merged.changes.iter().map(|(_, _, c)| *c).collect::<Vec<_>>(),
            [Change::Updated, Change::Added, Change::Added]
        );
        assert!(!merged.switched);
        // Everything that was not written is exactly as it was.
        let document = &merged.document;
        assert_eq!(
            without(document.clone(), &["team-vc-1", "team-vc-1-admin"]),
            without(others(), &["team-vc-1"])
        );
        assert_eq!(document["current-context"], "prod");
        assert_eq!(document["preferences"]["colors"], true);
        let cluster = find(document, EntryKind::Cluster, "team-vc-1").expect("written");
        assert_eq!(cluster["server"], "https://127.0.0.1:4443");
        assert_eq!(owner_of(cluster), Some(owner("u1")));
        assert_eq!(
            owner_of(find(document, EntryKind::Context, "team-vc-1").expect("context")),
            Some(owner("u1"))
        );
    }

    #[test]
    fn the_same_virtual_cluster_updates_its_entries_and_another_uid_is_refused() {
        let path = Path::new("/k/config");
        let first = merge(
            path,
            None,
            &entries("https://127.0.0.1:4443"),
            &owner("u1"),
            false,
            true,
        )
        .expect("new file");
        assert!(first.switched);
        assert_eq!(first.document["current-context"], "team-vc-1");
        assert_eq!(first.document["kind"], "Config");
        let again = merge(
            path,
            Some(first.document.clone()),
            &entries("https://127.0.0.1:4443"),
            &owner("u1"),
            false,
            true,
        )
        .expect("same");
        assert!(again.changes.iter().all(|(_, _, c)| *c == Change::Unchanged));
        assert!(!again.switched);
        let moved = merge(
            path,
            Some(first.document.clone()),
            &entries("https://127.0.0.1:5555"),
            &owner("u1"),
            false,
            false,
        )
        .expect("own entries");
        assert_eq!(moved.changes[0].2, Change::Updated);
        assert_eq!(moved.changes[1].2, Change::Unchanged);
        // A VirtualCluster recreated under the same name is another tenant.
        let error = merge(
            path,
            Some(first.document),
            &entries("https://127.0.0.1:5555"),
            &owner("u2"),
            false,
            false,
        )
        .expect_err("another uid");
        let message = error.to_string();
        assert!(
            message.contains("cluster \"team-vc-1\" (written for VirtualCluster team/vc-1 uid u1)"),
            "{message}"
        );
        assert!(message.contains("user \"team-vc-1-admin\""), "{message}");
        assert!(message.contains("context \"team-vc-1\""), "{message}");
    }

    #[test]
    fn documents_that_are_not_kubeconfigs_are_refused() {
        let path = Path::new("/k/config");
        for bad in [json!(["a"]), json!({"clusters": {"a": 1}})] {
            let error = merge(
                path,
                Some(bad),
                &entries("https://x:1"),
                &owner("u"),
                false,
                false,
            )
            .expect_err("bad");
            assert!(
                error.to_string().starts_with("kubeconfig file /k/config: "),
                "{error}"
            );
        }
    }

    #[test]
    fn the_target_is_the_flag_then_the_super_kubeconfig_then_kubeconfig_then_home() {
        let explicit = Path::new("/out");
        let super_ = Path::new("/super");
        assert_eq!(
            target(Some(explicit), Some(super_), None, None).expect("flag"),
            explicit
        );
        assert_eq!(target(None, Some(super_), None, None).expect("super"), super_);
        let env = std::ffi::OsString::from("/a/config:/b/config");
        assert_eq!(
            target(None, None, Some(&env), Some(Path::new("/home/u"))).expect("env"),
            Path::new("/a/config")
        );
        assert_eq!(
            target(
                None,
                None,
                Some(std::ffi::OsStr::new("")),
                Some(Path::new("/home/u"))
            )
            .expect("home"),
            Path::new("/home/u/.kube/config")
        );
        assert!(target(None, None, None, None).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn files_are_written_whole_with_mode_0600_through_links_and_under_the_lock() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let real = dir.path().join("real-config");
        std::fs::write(&real, OTHERS).expect("write");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let link = dir.path().join("config");
        std::os::unix::fs::symlink(&real, &link).expect("link");

        let merged = update(
            &link,
            &entries("https://127.0.0.1:4443"),
            &owner("u1"),
            true,
            true,
        )
        .expect("update");
        assert!(merged.switched);
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("link")
                .file_type()
                .is_symlink(),
            "the link stays"
        );
        let mode = std::fs::metadata(&real).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let written = read(&real).expect("read").expect("document");
        assert_eq!(written, merged.document);
        assert!(!dir.path().join("config.lock").exists(), "lock released");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // kubectl reads what was written.
        let parsed = kube::config::Kubeconfig::read_from(&link).expect("kube reads it");
        assert_eq!(parsed.current_context.as_deref(), Some("team-vc-1"));
        assert_eq!(parsed.contexts.len(), 2);

        // Held lock: refused, nothing changed.
        let before = std::fs::read(&real).expect("bytes");
        std::fs::write(dir.path().join("config.lock"), "").expect("lock");
        let error =
            update(&link, &entries("https://127.0.0.1:9"), &owner("u1"), false, false).expect_err("locked");
        assert!(error.to_string().contains("config.lock exists"), "{error}");
        assert_eq!(std::fs::read(&real).expect("bytes"), before);
        std::fs::remove_file(dir.path().join("config.lock")).expect("unlock");

        // Not YAML: refused, nothing changed.
        let broken = dir.path().join("broken");
        std::fs::write(&broken, "clusters: [unclosed").expect("write");
        let error = update(&broken, &entries("https://x:1"), &owner("u1"), false, false).expect_err("broken");
        assert!(error.to_string().contains("not YAML"), "{error}");
        assert_eq!(
            std::fs::read_to_string(&broken).expect("text"),
            "clusters: [unclosed"
        );

        // A new file in a new folder.
        let fresh = dir.path().join("new").join("config");
        update(&fresh, &entries("https://x:1"), &owner("u1"), false, false).expect("new");
        assert_eq!(
            std::fs::metadata(&fresh).expect("meta").permissions().mode() & 0o777,
            0o600
        );
    }
}
