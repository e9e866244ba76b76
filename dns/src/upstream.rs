//! The platform's upstream resolvers, for every name outside the cluster domain.

use std::{net::SocketAddr, time::Duration};

use hickory_proto::{
    op::ResponseCode,
    rr::{Name, Record, RecordType},
};
use hickory_resolver::{
    TokioResolver,
    config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts},
    net::{DnsError, NetError, runtime::TokioRuntimeProvider},
};

use crate::{Error, Result};

/// What an upstream said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    /// Its response code.
    pub code: ResponseCode,
    /// Its answers.
    pub answers: Vec<Record>,
}

/// A resolver that asks the upstream servers, with a small shared cache of their answers (public names
/// only: nothing of the cluster is ever asked upstream).
#[derive(Clone)]
pub struct Forwarder {
    resolver: TokioResolver,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").finish_non_exhaustive()
    }
}

/// The nameservers of a resolv.conf text (port 53).
pub fn nameservers_of_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
        })
        .filter_map(|address| {
            // Scoped IPv6 addresses (fe80::1%eth0) cannot be used from a pod; skip them.
            address.parse().ok().map(|ip| SocketAddr::new(ip, 53))
        })
        .collect()
}

/// `ip` or `ip:port` or `[ipv6]:port`.
pub fn parse_server(value: &str) -> Option<SocketAddr> {
    let value = value.trim();
    value
        .parse::<SocketAddr>()
        .ok()
        .or_else(|| value.parse().ok().map(|ip| SocketAddr::new(ip, 53)))
}

impl Forwarder {
    /// A forwarder to `servers` (tried in order of their answers' speed), each query given `timeout` per
    /// attempt and two attempts.
    pub fn new(servers: &[SocketAddr], timeout: Duration) -> Result<Self> {
        if servers.is_empty() {
            return Err(Error::Settings("no upstream resolvers: set --upstream".into()));
        }
        let name_servers = servers
            .iter()
            .map(|server| {
                let connection = |mut config: ConnectionConfig| {
                    config.port = server.port();
                    config
                };
                NameServerConfig::new(
                    server.ip(),
                    true,
                    vec![
                        connection(ConnectionConfig::udp()),
                        connection(ConnectionConfig::tcp()),
                    ],
                )
            })
            .collect();
        let mut options = ResolverOpts::default();
        options.timeout = timeout;
        options.attempts = 2;
        options.ndots = 0;
        options.cache_size = 4096;
        options.edns0 = true;
        options.preserve_intermediates = true;
        options.recursion_desired = true;
        let resolver = TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(name_servers),
            TokioRuntimeProvider::default(),
        )
        .with_options(options)
        .build()
        .map_err(|source| Error::Upstream(source.to_string()))?;
        Ok(Self { resolver })
    }

    /// Asks for `name` (absolute) of `qtype`.
    pub async fn lookup(&self, name: &Name, qtype: RecordType) -> Upstream {
        let mut name = name.clone();
        name.set_fqdn(true);
        match self.resolver.lookup(name.clone(), qtype).await {
            Ok(lookup) => Upstream {
                code: ResponseCode::NoError,
                answers: lookup.answers().to_vec(),
            },
            Err(NetError::Dns(DnsError::NoRecordsFound(none))) => Upstream {
                code: none.response_code,
                answers: Vec::new(),
            },
            Err(NetError::Dns(DnsError::ResponseCode(code))) => Upstream {
                code,
                answers: Vec::new(),
            },
            Err(error) => {
                tracing::debug!(%error, %name, "upstream lookup failed");
                Upstream {
                    code: ResponseCode::ServFail,
                    answers: Vec::new(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers_and_server_flags_are_read() {
        let text = "# generated\nsearch example.com\nnameserver 10.0.0.2\nnameserver fd00::53\nnameserver fe80::1%eth0\noptions ndots:2\n";
        assert_eq!(
            nameservers_of_resolv_conf(text),
            vec![
                "10.0.0.2:53".parse().expect("addr"),
                "[fd00::53]:53".parse().expect("addr")
            ]
        );
        assert_eq!(parse_server("1.1.1.1"), Some("1.1.1.1:53".parse().expect("addr")));
        assert_eq!(
            parse_server("127.0.0.1:5353"),
            Some("127.0.0.1:5353".parse().expect("addr"))
        );
        assert_eq!(
            parse_server("[::1]:5353"),
            Some("[::1]:5353".parse().expect("addr"))
        );
        assert_eq!(parse_server("resolver.example"), None);
    }
}
