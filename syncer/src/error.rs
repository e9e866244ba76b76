/// Errors of the syncer. Each variant says what was being done; [`Error::category`] gives a stable,
/// low-cardinality label for metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the super cluster failed.
    #[error("super cluster: {context}")]
    Super {
        /// What was being done.
        context: String,
        /// The kube error.
        #[source]
        source: kube::Error,
    },
    /// A call to a tenant apiserver failed.
    #[error("tenant {tenant}: {context}")]
    Tenant {
        /// The tenant's cluster key.
        tenant: String,
        /// What was being done.
        context: String,
        /// The kube error.
        #[source]
        source: kube::Error,
    },
    /// A tenant's kubeconfig could not be found or used.
    #[error("tenant {tenant}: {reason}")]
    Kubeconfig {
        /// The VirtualCluster (namespace/name).
        tenant: String,
        /// Why.
        reason: String,
    },
    /// A tenant object cannot be represented in the super cluster.
    #[error("{0}")]
    Conversion(String),
    /// Serializing an object failed.
    #[error("serializing {what}")]
    Serialize {
        /// What.
        what: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// Measuring a tenant's usage failed (an answer that could not be read).
    #[error("{what}: {reason}")]
    Measure {
        /// What was being read.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A sharded replica's membership Lease is held by another instance (an earlier process of the same
    /// replica) that has not expired yet.
    #[error(
        "membership Lease {name} is held by {holder} (an earlier process of this replica?); waiting for it to expire"
    )]
    LeaseHeld {
        /// The Lease.
        name: String,
        /// Its holder.
        holder: String,
    },
    /// A sharded replica's membership Lease was not renewed within the renew deadline.
    #[error("membership Lease {name}: no answer within the renew deadline")]
    LeaseTimeout {
        /// The Lease.
        name: String,
    },
    /// The shared runtime failed.
    #[error(transparent)]
    Runtime(#[from] vc_runtime::Error),
    /// A write made for several callers at once (a batched token Secret write) failed: each gets it.
    #[error("{0}")]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    /// A label for metrics: one of a fixed set of words.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Super { source, .. } | Self::Tenant { source, .. } => match source {
                kube::Error::Api(status) if status.code == 409 => "conflict",
                kube::Error::Api(status) if status.code == 404 => "not_found",
                kube::Error::Api(status) if status.code == 403 => "forbidden",
                kube::Error::Api(status) if status.code == 422 || status.code == 400 => "invalid",
                kube::Error::Api(_) => "api",
                _ => "transport",
            },
            Self::Kubeconfig { .. } => "kubeconfig",
            Self::Conversion(_) => "conversion",
            Self::Serialize { .. } => "serialize",
            Self::Measure { .. } => "measure",
            Self::LeaseHeld { .. } => "lease_held",
            Self::LeaseTimeout { .. } => "lease_timeout",
            Self::Runtime(_) => "runtime",
            Self::Shared(inner) => inner.category(),
        }
    }

    /// The message of the apiserver's answer, when it answered with an error status.
    pub fn status_message(&self) -> Option<&str> {
        match self {
            Self::Super {
                source: kube::Error::Api(s),
                ..
            }
            | Self::Tenant {
                source: kube::Error::Api(s),
                ..
            } => Some(s.message.as_str()),
            Self::Shared(inner) => inner.status_message(),
            _ => None,
        }
    }

    /// The fields of a server-side apply that other field managers own, when the super cluster refused
    /// the apply for them: `(field path, "conflict with \"manager\"")`.
    pub fn apply_conflicts(&self) -> Option<Vec<(String, String)>> {
        let Self::Super {
            source: kube::Error::Api(status),
            ..
        } = self
        else {
            return None;
        };
        if status.code != 409 {
            return None;
        }
        let causes: Vec<(String, String)> = status
            .details
            .as_ref()?
            .causes
            .iter()
            .filter(|c| c.reason == "FieldManagerConflict")
            .map(|c| (c.field.clone(), c.message.clone()))
            .collect();
        (!causes.is_empty()).then_some(causes)
    }

    /// Whether a tenant apiserver refused a request for what it asked (a missing service account, a
    /// forbidden or invalid request), as opposed to failing in a way worth retrying soon.
    pub fn is_tenant_refusal(&self) -> bool {
        matches!(self, Self::Tenant { source: kube::Error::Api(s), .. } if [400, 403, 404, 422].contains(&s.code))
    }

    /// Whether the apiserver answered with this HTTP status.
    pub fn is_status(&self, code: u16) -> bool {
        if let Self::Shared(inner) = self {
            return inner.is_status(code);
        }
        matches!(self, Self::Super { source: kube::Error::Api(s), .. } | Self::Tenant { source: kube::Error::Api(s), .. } if s.code == code)
    }
}

pub(crate) fn on_super(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let context = context.into();
    move |source| Error::Super { context, source }
}

pub(crate) fn on_tenant(tenant: &str, context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let tenant = tenant.to_owned();
    let context = context.into();
    move |source| Error::Tenant {
        tenant,
        context,
        source,
    }
}

/// Result of syncer operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
