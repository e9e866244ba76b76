//! What a reconcile did, for the workers' metrics, retries and rate limits.

/// What a reconcile did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Created the super object (`writes` API writes in all).
    Created {
        /// Writes made.
        writes: u32,
    },
    /// Brought the super object in line.
    Updated {
        /// Writes made.
        writes: u32,
    },
    /// Deleted the super object.
    Deleted,
    /// Nothing to do.
    InSync,
    /// Held back; retried when something changes (or after the given delay).
    Waiting {
        /// Why, for logs.
        reason: String,
        /// Look again after this long, if nothing else queues the item first.
        retry_after: Option<std::time::Duration>,
    },
}

impl Outcome {
    /// API writes to the super cluster.
    pub fn writes(&self) -> u32 {
        match self {
            Outcome::Created { writes } | Outcome::Updated { writes } => *writes,
            Outcome::Deleted => 1,
            Outcome::InSync | Outcome::Waiting { .. } => 0,
        }
    }
}
