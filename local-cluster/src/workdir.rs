use std::{
    path::{Path, PathBuf},
    sync::Once,
};

use crate::{Error, Result};

const PREFIX: &str = "vc-e2e-";

/// A temporary folder for one harness object, removed when dropped.
///
/// Folders are named `vc-e2e-<pid>-...`; the first harness object of a process removes folders whose process
/// is gone, so a test run killed by a signal leaves nothing behind past the next run.
#[derive(Debug)]
pub struct WorkDir {
    dir: tempfile::TempDir,
}

impl WorkDir {
    /// Creates a folder whose name includes `purpose`.
    pub fn new(purpose: &str) -> Result<Self> {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(sweep_stale);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-{purpose}-", std::process::id()))
            .tempdir()
            .map_err(Error::io(format!("creating a temporary folder for {purpose}")))?;
        Ok(Self { dir })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the folder.
    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a file inside the folder and returns its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> Result<PathBuf> {
        let path = self.join(name);
        std::fs::write(&path, contents).map_err(Error::io(format!("writing {}", path.display())))?;
        Ok(path)
    }
}

/// Removes every folder of this process, for a process that exits without dropping its harness objects
/// (a benchmark that must not wait for its children to be reaped). Best effort: a folder a still-running
/// child writes into may stay, and the next run's sweep removes it.
pub fn remove_own_folders() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let own = format!("{PREFIX}{}-", std::process::id());
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.starts_with(&own)) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes folders of earlier test processes that no longer run.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        // Real nodes' folders hold container state and mounts: their own sweep cleans them first.
        if rest.contains(crate::realnodes::host::FOLDER_MARK) {
            continue;
        }
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
