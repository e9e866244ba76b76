//! The snapshot folder: its files, the manifest that lists them with sizes and SHA-256 checksums, and the
//! check a restore makes before it touches a cluster. A snapshot folder is untrusted input: the manifest
//! may name only the files of the format (no paths), every file must be a regular file (no symlinks) no
//! larger than its limit and exactly as large and as hashed as the manifest says.

use std::{
    collections::BTreeSet,
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The format this version writes and reads.
pub const FORMAT: &str = "virtualcluster-rs.snapshot/v1";
/// The manifest, whose SHA-256 is the snapshot's checksum.
pub const MANIFEST: &str = "manifest.json";
/// etcd's keys and values at one revision, one JSON object a line.
pub const ETCD_KEYS: &str = "etcd-keys.jsonl";
/// The PKI Secrets of the tenant's root namespace (name, type, data).
pub const PKI_SECRETS: &str = "pki-secrets.json";
/// The VirtualCluster (name, namespace, spec).
pub const VIRTUAL_CLUSTER: &str = "virtualcluster.json";
/// The ClusterVersion it used (spec), for the platform team to re-apply where it is missing.
pub const CLUSTER_VERSION: &str = "clusterversion.json";

/// The files a snapshot has besides the manifest, each exactly once.
pub const FILES: [&str; 4] = [ETCD_KEYS, PKI_SECRETS, VIRTUAL_CLUSTER, CLUSTER_VERSION];

/// The largest manifest read.
pub const MANIFEST_LIMIT: u64 = 64 * 1024;
/// The largest line of [`ETCD_KEYS`]: a base64 key and value of etcd's largest request (1.5 MiB by
/// default), with room.
pub const LINE_LIMIT: u64 = 4 * 1024 * 1024;

/// The largest size accepted for a file of the format: etcd's largest backend quota (8 GiB) for the keys,
/// a mebibyte for the rest.
pub fn size_limit(name: &str) -> u64 {
    match name {
        ETCD_KEYS => 8 << 30,
        MANIFEST => MANIFEST_LIMIT,
        _ => 1 << 20,
    }
}

/// One file of the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileEntry {
    /// Its name in the snapshot folder (one of [`FILES`]).
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256, lowercase hex.
    pub sha256: String,
}

/// The tenant a snapshot was taken of.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceTenant {
    /// The VirtualCluster's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// Its cluster key (root namespace).
    pub cluster_key: String,
}

/// What was read from etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSummary {
    /// The revision every key was read at.
    pub revision: i64,
    /// Keys in [`ETCD_KEYS`].
    pub keys: u64,
    /// Keys attached to an etcd lease (events, apiserver master leases), left out: they expire anyway,
    /// and a restore cannot recreate the lease.
    pub skipped_leased_keys: u64,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// The tenant.
    pub virtual_cluster: SourceTenant,
    /// The ClusterVersion it used.
    pub cluster_version_name: String,
    /// When the snapshot was taken (RFC 3339).
    pub created_at: String,
    /// etcd.
    pub etcd: EtcdSummary,
    /// The files, in [`FILES`] order.
    pub files: Vec<FileEntry>,
}

impl Manifest {
    /// Bytes of all files.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// `sha256:<hex>`, how checksums are shown and accepted.
pub fn display_checksum(hex: &str) -> String {
    format!("sha256:{hex}")
}

/// The SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A writer that counts and hashes what goes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flushes and returns the inner writer, the size and the SHA-256 (hex).
    pub fn finish(mut self) -> std::io::Result<(W, u64, String)> {
        self.inner.flush()?;
        Ok((self.inner, self.written, hex::encode(self.hasher.finalize())))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// One line of [`ETCD_KEYS`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyLine {
    /// The key, base64.
    pub key: String,
    /// The value, base64.
    pub value: String,
}

impl KeyLine {
    /// The line of `key` and `value`.
    pub fn new(key: &[u8], value: &[u8]) -> Self {
        let b64 = base64::engine::general_purpose::STANDARD;
        Self {
            key: b64.encode(key),
            value: b64.encode(value),
        }
    }

    /// The key and value, decoded.
    pub fn decode(&self) -> std::result::Result<(Vec<u8>, Vec<u8>), String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = b64
            .decode(&self.key)
            .map_err(|e| format!("key is not base64: {e}"))?;
        let value = b64
            .decode(&self.value)
            .map_err(|e| format!("value is not base64: {e}"))?;
        if key.is_empty() {
            return Err("empty key".into());
        }
        Ok((key, value))
    }
}

/// A snapshot whose manifest and files were checked.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The folder.
    pub dir: PathBuf,
    /// The manifest.
    pub manifest: Manifest,
    /// SHA-256 of the manifest (hex): the snapshot's checksum.
    pub checksum: String,
}

impl Verified {
    /// The path of one of its files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn problem(dir: &Path, text: impl Into<String>) -> Error {
    Error::Snapshot {
        path: dir.to_owned(),
        problem: text.into(),
    }
}

/// Opens `dir/name` for reading if it is a regular file (not a symlink) of at most `limit` bytes; returns
/// it and its size.
pub fn open_regular(dir: &Path, name: &str, limit: u64) -> Result<(File, u64)> {
    let path = dir.join(name);
    let meta = std::fs::symlink_metadata(&path).map_err(|e| problem(dir, format!("{name}: {e}")))?;
    if !meta.file_type().is_file() {
        return Err(problem(dir, format!("{name} is not a regular file")));
    }
    if meta.len() > limit {
        return Err(problem(
            dir,
            format!(
                "{name} has {} bytes, more than the {limit} a snapshot may have",
                meta.len()
            ),
        ));
    }
    let file = File::open(&path).map_err(|e| problem(dir, format!("{name}: {e}")))?;
    Ok((file, meta.len()))
}

/// Reads a whole file of the snapshot (see [`open_regular`]).
pub fn read_small(dir: &Path, name: &str) -> Result<Vec<u8>> {
    let limit = size_limit(name);
    let (file, _) = open_regular(dir, name, limit)?;
    let mut bytes = Vec::new();
    // `take` as well: the file may grow between the check and the read.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| problem(dir, format!("{name}: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(problem(
            dir,
            format!("{name} grew beyond {limit} bytes while read"),
        ));
    }
    Ok(bytes)
}

/// Normalises a checksum given on the command line (`sha256:<hex>` or `<hex>`).
pub fn parse_checksum(text: &str) -> std::result::Result<String, String> {
    let hex = text.strip_prefix("sha256:").unwrap_or(text).to_ascii_lowercase();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex)
    } else {
        Err(format!(
            "{text:?} is not a SHA-256 checksum (sha256:<64 hex digits>)"
        ))
    }
}

/// Checks the manifest's list of files: exactly the files of the format, each once, none larger than its
/// limit, checksums well formed.
pub fn check_listing(manifest: &Manifest) -> std::result::Result<(), String> {
    if manifest.format != FORMAT {
        return Err(format!(
            "format {:?} is not {FORMAT:?}, the one this kubectl vc reads",
            manifest.format
        ));
    }
    let mut seen = BTreeSet::new();
    for entry in &manifest.files {
        if !FILES.contains(&entry.name.as_str()) {
            return Err(format!(
                "the manifest lists {:?}, which is not a file of the format ({})",
                entry.name,
                FILES.join(", ")
            ));
        }
        if !seen.insert(entry.name.as_str()) {
            return Err(format!("the manifest lists {} twice", entry.name));
        }
        if entry.size > size_limit(&entry.name) {
            return Err(format!(
                "the manifest gives {} {} bytes, more than the {} allowed",
                entry.name,
                entry.size,
                size_limit(&entry.name)
            ));
        }
        if parse_checksum(&entry.sha256).ok().as_deref() != Some(entry.sha256.as_str()) {
            return Err(format!(
                "the checksum of {} is not lowercase SHA-256 hex",
                entry.name
            ));
        }
    }
    if let Some(missing) = FILES.iter().find(|f| !seen.contains(**f)) {
        return Err(format!("the manifest does not list {missing}"));
    }
    Ok(())
}

/// Hashes `reader` to its end, at most `limit` bytes; returns the size and SHA-256 (hex).
pub fn hash_reader(mut reader: impl Read, limit: u64) -> std::io::Result<(u64, String)> {
    let mut hasher = HashingWriter::new(std::io::sink());
    std::io::copy(&mut (&mut reader).take(limit + 1), &mut hasher)?;
    let (_, size, hex) = hasher.finish()?;
    Ok((size, hex))
}

/// Reads and checks the snapshot in `dir`: the manifest (against `expected`, the checksum the user
/// pinned, if any), the list of files, and each file's size and SHA-256.
pub fn verify(dir: &Path, expected: Option<&str>) -> Result<Verified> {
    let meta = std::fs::metadata(dir).map_err(|e| problem(dir, e.to_string()))?;
    if !meta.is_dir() {
        return Err(problem(dir, "not a folder"));
    }
    let bytes = read_small(dir, MANIFEST)?;
    let checksum = sha256_hex(&bytes);
    if let Some(expected) = expected
        && expected != checksum
    {
        return Err(problem(
            dir,
            format!(
                "checksum mismatch: the manifest hashes to {}, not the {} given; nothing was restored",
                display_checksum(&checksum),
                display_checksum(expected)
            ),
        ));
    }
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| problem(dir, format!("{MANIFEST} is not a snapshot manifest: {e}")))?;
    check_listing(&manifest).map_err(|text| problem(dir, text))?;
    for entry in &manifest.files {
        let (file, size) = open_regular(dir, &entry.name, size_limit(&entry.name))?;
        if size != entry.size {
            return Err(problem(
                dir,
                format!(
                    "{} has {size} bytes, the manifest says {}: the snapshot is incomplete or was changed; nothing was restored",
                    entry.name, entry.size
                ),
            ));
        }
        let (read, hex) =
            hash_reader(file, entry.size).map_err(|e| problem(dir, format!("{}: {e}", entry.name)))?;
        if read != entry.size || hex != entry.sha256 {
            return Err(problem(
                dir,
                format!(
                    "checksum mismatch: {} hashes to {}, the manifest says {}; nothing was restored",
                    entry.name,
                    display_checksum(&hex),
                    display_checksum(&entry.sha256)
                ),
            ));
        }
    }
    Ok(Verified {
        dir: dir.to_owned(),
        manifest,
        checksum,
    })
}

/// Reads [`ETCD_KEYS`] line by line, each line at most [`LINE_LIMIT`] bytes.
pub struct KeyLines {
    reader: BufReader<File>,
    dir: PathBuf,
    line: u64,
}

impl KeyLines {
    /// Opens the keys of a verified snapshot.
    pub fn open(snapshot: &Verified) -> Result<Self> {
        let (file, _) = open_regular(&snapshot.dir, ETCD_KEYS, size_limit(ETCD_KEYS))?;
        Ok(Self {
            reader: BufReader::new(file),
            dir: snapshot.dir.clone(),
            line: 0,
        })
    }

    /// The next key and value, `None` at the end.
    pub fn next_pair(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut bytes = Vec::new();
        let read = (&mut self.reader)
            .take(LINE_LIMIT + 1)
            .read_until(b'\n', &mut bytes)
            .map_err(|e| problem(&self.dir, format!("{ETCD_KEYS}: {e}")))?;
        if read == 0 {
            return Ok(None);
        }
        self.line += 1;
        let at = |text: String| problem(&self.dir, format!("{ETCD_KEYS} line {}: {text}", self.line));
        if bytes.last() != Some(&b'\n') {
            return Err(at(format!(
                "longer than {LINE_LIMIT} bytes or not ended by a newline"
            )));
        }
        let line: KeyLine = serde_json::from_slice(&bytes).map_err(|e| at(e.to_string()))?;
        line.decode().map(Some).map_err(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a snapshot of the given file contents into `dir` and returns its checksum.
    fn write_snapshot(dir: &Path, contents: &[(&str, &[u8])]) -> String {
        let files = contents
            .iter()
            .map(|(name, bytes)| {
                std::fs::write(dir.join(name), bytes).expect("write");
                FileEntry {
                    name: (*name).to_owned(),
                    size: bytes.len() as u64,
                    sha256: sha256_hex(bytes),
                }
            })
            .collect();
        let manifest = manifest(files);
        let bytes = serde_json::to_vec_pretty(&manifest).expect("json");
        std::fs::write(dir.join(MANIFEST), &bytes).expect("write");
        sha256_hex(&bytes)
    }

    fn manifest(files: Vec<FileEntry>) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            virtual_cluster: SourceTenant {
                namespace: "team".into(),
                name: "vc-1".into(),
                uid: "u".into(),
                cluster_key: "team-abcdef-vc-1".into(),
            },
            cluster_version_name: "cv".into(),
            created_at: "2026-11-25T01:00:00Z".into(),
            etcd: EtcdSummary {
                revision: 7,
                keys: 1,
                skipped_leased_keys: 0,
            },
            files,
        }
    }

    fn good_files() -> Vec<(&'static str, Vec<u8>)> {
        let key_line = serde_json::to_string(&KeyLine::new(b"/registry/a", b"x")).expect("json") + "\n";
        vec![
            (ETCD_KEYS, key_line.into_bytes()),
            (PKI_SECRETS, b"[]".to_vec()),
            (VIRTUAL_CLUSTER, b"{}".to_vec()),
            (CLUSTER_VERSION, b"{}".to_vec()),
        ]
    }

    fn snapshot_dir() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = good_files();
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        let checksum = write_snapshot(dir.path(), &refs);
        (dir, checksum)
    }

    #[test]
    fn a_written_snapshot_verifies_and_its_keys_read_back() {
        let (dir, checksum) = snapshot_dir();
        let verified = verify(dir.path(), Some(&checksum)).expect("verifies");
        assert_eq!(verified.checksum, checksum);
        assert_eq!(verified.manifest.files.len(), 4);
        let mut lines = KeyLines::open(&verified).expect("open");
        assert_eq!(
            lines.next_pair().expect("line"),
            Some((b"/registry/a".to_vec(), b"x".to_vec()))
        );
        assert_eq!(lines.next_pair().expect("end"), None);
    }

    #[test]
    fn a_changed_file_or_pinned_checksum_is_refused_naming_it() {
        let (dir, checksum) = snapshot_dir();
        // Same size, other bytes.
        std::fs::write(dir.path().join(VIRTUAL_CLUSTER), b"[]").expect("write");
        let error = verify(dir.path(), None).expect_err("changed").to_string();
        assert!(
            error.contains("checksum mismatch: virtualcluster.json hashes to sha256:"),
            "{error}"
        );
        assert!(error.contains("nothing was restored"), "{error}");
        let (dir, _) = snapshot_dir();
        let other = "0".repeat(64);
        let error = verify(dir.path(), Some(&other)).expect_err("pinned").to_string();
        assert!(
            error.contains("checksum mismatch: the manifest hashes to"),
            "{error}"
        );
        std::fs::write(dir.path().join(ETCD_KEYS), b"short").expect("write");
        let error = verify(dir.path(), Some(&checksum))
            .expect_err("truncated")
            .to_string();
        assert!(
            error.contains("etcd-keys.jsonl has 5 bytes, the manifest says"),
            "{error}"
        );
    }

    #[test]
    fn manifests_may_name_only_the_formats_files() {
        let entry = |name: &str| FileEntry {
            name: name.into(),
            size: 1,
            sha256: "a".repeat(64),
        };
        let all = || FILES.iter().map(|f| entry(f)).collect::<Vec<_>>();
        assert_eq!(check_listing(&manifest(all())), Ok(()));
        let mut traversal = all();
        traversal[1].name = "../../etc/passwd".into();
        assert!(
            check_listing(&manifest(traversal))
                .expect_err("traversal")
                .contains("\"../../etc/passwd\", which is not a file of the format")
        );
        let mut twice = all();
        twice.push(entry(ETCD_KEYS));
        assert!(
            check_listing(&manifest(twice))
                .expect_err("twice")
                .contains("twice")
        );
        let mut missing = all();
        missing.pop();
        assert!(
            check_listing(&manifest(missing))
                .expect_err("missing")
                .contains("does not list clusterversion.json")
        );
        let mut huge = all();
        huge[2].size = 2 << 20;
        assert!(
            check_listing(&manifest(huge))
                .expect_err("huge")
                .contains("more than")
        );
        let mut bad_hash = all();
        bad_hash[0].sha256 = "../x".into();
        assert!(check_listing(&manifest(bad_hash)).is_err());
        let mut other_format = manifest(all());
        other_format.format = "something/v9".into();
        assert!(
            check_listing(&other_format)
                .expect_err("format")
                .contains("something/v9")
        );
    }

    #[test]
    fn symlinks_and_oversized_files_are_refused() {
        let (dir, _) = snapshot_dir();
        let outside = tempfile::NamedTempFile::new().expect("file");
        std::fs::remove_file(dir.path().join(PKI_SECRETS)).expect("rm");
        std::os::unix::fs::symlink(outside.path(), dir.path().join(PKI_SECRETS)).expect("symlink");
        let error = verify(dir.path(), None).expect_err("symlink").to_string();
        assert!(
            error.contains("pki-secrets.json is not a regular file"),
            "{error}"
        );

        let (dir, _) = snapshot_dir();
        std::fs::write(dir.path().join(MANIFEST), vec![b' '; MANIFEST_LIMIT as usize + 1]).expect("write");
        let error = verify(dir.path(), None).expect_err("oversized").to_string();
        assert!(
            error.contains("more than the 65536 a snapshot may have"),
            "{error}"
        );
    }

    #[test]
    fn bad_key_lines_are_refused_with_their_line_number() {
        let (dir, _) = snapshot_dir();
        let lines = format!(
            "{}\n{{\"key\":\"!!\",\"value\":\"\"}}\n",
            serde_json::to_string(&KeyLine::new(b"k", b"v")).expect("json")
        );
        let contents = [
            (ETCD_KEYS, lines.as_bytes()),
            (PKI_SECRETS, b"[]".as_slice()),
            (VIRTUAL_CLUSTER, b"{}".as_slice()),
            (CLUSTER_VERSION, b"{}".as_slice()),
        ];
        write_snapshot(dir.path(), &contents);
        let verified = verify(dir.path(), None).expect("verifies");
        let mut reader = KeyLines::open(&verified).expect("open");
        assert!(reader.next_pair().expect("first").is_some());
        let error = reader.next_pair().expect_err("second").to_string();
        assert!(
            error.contains("etcd-keys.jsonl line 2: key is not base64"),
            "{error}"
        );
        assert_eq!(
            KeyLine {
                key: String::new(),
                value: String::new()
            }
            .decode(),
            Err("empty key".into())
        );
    }

    #[test]
    fn checksums_are_accepted_with_or_without_prefix() {
        let hex = "AB".repeat(32);
        assert_eq!(parse_checksum(&format!("sha256:{hex}")), Ok("ab".repeat(32)));
        assert_eq!(parse_checksum(&hex), Ok("ab".repeat(32)));
        assert!(parse_checksum("md5:abc").is_err());
    }
}
