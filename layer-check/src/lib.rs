//! The check that keeps the workspace's structure as docs/architecture.md describes it: no import circle
//! between modules (but the known ones the document lists, which may only shrink), no module importing a
//! higher layer of its crate, and no crate depending on a crate that is not below it. Its integration test
//! (`tests/workspace.rs`) runs it on this workspace, so `cargo test` fails when the code and the document
//! part.
//!
//! It reads code as text: [`lex`] leaves out comments, literals and inline test modules, [`imports`] finds
//! the paths named (`use` trees and inline `crate::`/`super::`/`self::` paths), [`workspace`] maps them to
//! modules (following re-exports), [`rules`] reads the document's rules and [`check`] holds one against the
//! other.

pub mod check;
pub mod imports;
pub mod lex;
pub mod rules;
pub mod workspace;

mod error;

pub use error::{Error, Result};

use std::path::Path;

/// Every breach of docs/architecture.md's rules by the workspace at `root`.
pub fn breaches(root: &Path) -> Result<Vec<String>> {
    let path = root.join("docs/architecture.md");
    let document = std::fs::read_to_string(&path).map_err(|source| Error::Read { path, source })?;
    let rules = rules::parse(&document)?;
    let crates = workspace::read(root)?;
    Ok(check::check(&crates, &rules))
}
