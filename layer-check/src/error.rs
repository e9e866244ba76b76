//! The one error type of layer-check: what could not be read. Breaches of the rules are not errors but the
//! check's answer ([`crate::check::check`]).

use std::path::PathBuf;

/// Errors of layer-check.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder could not be read.
    #[error("reading {path}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A manifest lacks what the check needs.
    #[error("{path}: {problem}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is missing.
        problem: String,
    },
    /// The architecture document has no ```` ```layers ```` block.
    #[error("docs/architecture.md has no ```layers block")]
    NoRules,
    /// A line of the rules cannot be read.
    #[error("rule {line:?}: {problem}")]
    Rule {
        /// The line.
        line: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
