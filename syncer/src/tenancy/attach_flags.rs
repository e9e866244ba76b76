//! Flags of attaching tenants: how their apiservers are reached and checked, and how much of each is held.
//! A file of its own beside `attach` (which needs the `Context`), so that the flags sit below it.

use std::time::Duration;

use vc_runtime::limits::ResponseLimits;

use crate::engine::{budget::CacheLimits, config::values};

/// The floor of both response limits: a smaller one would cut ordinary list pages.
const MIN_RESPONSE_BYTES: u64 = 64 * 1024;

/// Flags of attaching and watching tenants.
#[derive(Clone, Debug, clap::Args)]
pub struct AttachFlags {
    /// Seconds between checks that an attached tenant's apiserver still answers.
    #[arg(long = "tenant-health-period-seconds", default_value = "30", value_parser = values::period)]
    pub tenant_health_period: Duration,
    /// Reach tenant apiservers over HTTP/2 when they offer it (every kube-apiserver does): a tenant's
    /// watches and requests then share one TLS connection. `false`: HTTP/1.1, one connection per watch.
    #[arg(long, env = "TENANT_HTTP2", default_value_t = true, action = clap::ArgAction::Set)]
    pub tenant_http2: bool,
    /// What the syncer caches of one tenant at most.
    #[command(flatten)]
    pub tenant_cache_limits: CacheLimits,
    /// Most bytes all of one tenant apiserver's responses may hold at once (list pages, answers, the line a
    /// watch is reading); past it the response is cut and the tenant detached with
    /// `TenantResponseTooLarge`, backing off, so an apiserver sending endless bodies cannot fill the
    /// syncer's memory.
    #[arg(long, env = "TENANT_RESPONSE_MAX_BYTES", default_value_t = ResponseLimits::default().max_bytes, value_parser = response_bytes)]
    pub tenant_response_max_bytes: u64,
    /// Most bytes of one watch event line from a tenant apiserver; a longer one is cut like a response
    /// past `--tenant-response-max-bytes`.
    #[arg(long, env = "TENANT_WATCH_LINE_MAX_BYTES", default_value_t = ResponseLimits::default().max_line_bytes, value_parser = response_bytes)]
    pub tenant_watch_line_max_bytes: u64,
}

impl AttachFlags {
    /// What a tenant apiserver's responses may hold at once.
    pub fn tenant_response_limits(&self) -> ResponseLimits {
        ResponseLimits {
            max_bytes: self.tenant_response_max_bytes,
            max_line_bytes: self.tenant_watch_line_max_bytes,
        }
    }
}

/// Bytes, raised to [`MIN_RESPONSE_BYTES`].
fn response_bytes(value: &str) -> Result<u64, String> {
    values::at_least_one(value).map(|bytes| bytes.max(MIN_RESPONSE_BYTES))
}
