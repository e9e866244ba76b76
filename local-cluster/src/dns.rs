//! DNS for tests of tenant DNS: a client that asks from a chosen source address (tenant DNS tells tenants
//! apart by their pods' addresses), and a stand-in for the platform's upstream resolvers on loopback that
//! answers a few public names and records every name it was asked.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use hickory_proto::{
    op::{Header, HeaderCounts, Metadata, ResponseCode},
    rr::{Name, RData, Record, RecordType, rdata::A},
};
use hickory_resolver::{
    TokioResolver,
    config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts},
    net::{DnsError, NetError, runtime::TokioRuntimeProvider},
};
use hickory_server::{
    Server,
    net::runtime::Time,
    server::{Request, RequestHandler, ResponseHandler, ResponseInfo},
    zone_handler::MessageResponseBuilder,
};

use crate::{Error, Result};

/// A reply: its response code and its answers' data, sorted (`10.0.0.1`, `0 100 80 web.ns.svc...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Response code.
    pub code: ResponseCode,
    /// The answers' data as text, sorted.
    pub answers: Vec<String>,
}

impl Reply {
    /// Whether the name exists with these answers.
    pub fn is(&self, answers: &[&str]) -> bool {
        self.code == ResponseCode::NoError && self.answers == answers
    }
}

/// Asks `server` for `name` of `qtype` over UDP from `source` (an address of this machine), without cache
/// or retries.
pub async fn ask(server: SocketAddr, source: IpAddr, name: &str, qtype: RecordType) -> Result<Reply> {
    let mut fqdn = dns_name(name)?;
    fqdn.set_fqdn(true);
    reply(server, source, fqdn, qtype, &[], 0).await
}

/// Asks as a pod's resolver does: `name` as written, through the `searches` first when it has fewer than
/// `ndots` dots (the syncer writes `<ns>.svc.<domain>`, `svc.<domain>`, `<domain>` and ndots 5).
pub async fn ask_through_search(
    server: SocketAddr,
    source: IpAddr,
    name: &str,
    qtype: RecordType,
    searches: &[&str],
    ndots: usize,
) -> Result<Reply> {
    let searches = searches.iter().map(|s| dns_name(s)).collect::<Result<Vec<_>>>()?;
    reply(server, source, dns_name(name)?, qtype, &searches, ndots).await
}

fn dns_name(name: &str) -> Result<Name> {
    Name::from_ascii(name).map_err(|e| Error::Io {
        context: format!("DNS name {name:?}"),
        source: std::io::Error::other(e.to_string()),
    })
}

async fn reply(
    server: SocketAddr,
    source: IpAddr,
    name: Name,
    qtype: RecordType,
    searches: &[Name],
    ndots: usize,
) -> Result<Reply> {
    let mut connection = ConnectionConfig::udp();
    connection.port = server.port();
    connection.bind_addr = Some(SocketAddr::new(source, 0));
    let mut options = ResolverOpts::default();
    options.cache_size = 0;
    options.attempts = 1;
    options.ndots = ndots;
    options.timeout = Duration::from_secs(3);
    options.preserve_intermediates = true;
    let mut config =
        ResolverConfig::from_name_servers(vec![NameServerConfig::new(server.ip(), true, vec![connection])]);
    for search in searches {
        config.add_search(search.clone());
    }
    let resolver = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
        .with_options(options)
        .build()
        .map_err(|e| Error::Io {
            context: "building a DNS client".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
    Ok(match resolver.lookup(name.clone(), qtype).await {
        Ok(lookup) => {
            let mut answers: Vec<String> = lookup.answers().iter().map(|r| r.data.to_string()).collect();
            answers.sort();
            Reply {
                code: ResponseCode::NoError,
                answers,
            }
        }
        Err(NetError::Dns(DnsError::NoRecordsFound(none))) => Reply {
            code: none.response_code,
            answers: Vec::new(),
        },
        Err(NetError::Dns(DnsError::ResponseCode(code))) => Reply {
            code,
            answers: Vec::new(),
        },
        Err(error) => {
            return Err(Error::Io {
                context: format!("asking {server} for {name} {qtype} from {source}"),
                source: std::io::Error::other(error.to_string()),
            });
        }
    })
}

/// The stand-in for upstream resolvers.
pub struct FakeUpstream {
    address: SocketAddr,
    asked: Arc<Mutex<Vec<String>>>,
    shutdown: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for FakeUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeUpstream")
            .field("address", &self.address)
            .finish()
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

struct Upstream {
    names: BTreeMap<String, Ipv4Addr>,
    asked: Arc<Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl RequestHandler for Upstream {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.recursion_available = true;
        let mut answers = Vec::new();
        if let [query] = request.queries.queries() {
            let name: Name = query.name().clone().into();
            let text = name.to_ascii().to_ascii_lowercase();
            self.asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(text.clone());
            match self.names.get(&text) {
                Some(ip) if query.query_type() == RecordType::A => {
                    answers.push(Record::from_rdata(name, 30, RData::A(A(*ip))));
                }
                Some(_) => {}
                None => metadata.response_code = ResponseCode::NXDomain,
            }
        }
        let builder = MessageResponseBuilder::new(&request.queries, None);
        let reply = builder.build(metadata, answers.iter(), [], [], []);
        response.send_response(reply).await.unwrap_or_else(|_| {
            ResponseInfo::from(Header {
                metadata,
                counts: HeaderCounts::default(),
            })
        })
    }
}

impl FakeUpstream {
    /// Answers `names` (`host.example.` → address) on `bind` (UDP and TCP), NXDOMAIN for any other.
    pub async fn start(bind: SocketAddr, names: &[(&str, Ipv4Addr)]) -> Result<Self> {
        let mut attempts = 0;
        let (udp, tcp, address) = loop {
            let udp = tokio::net::UdpSocket::bind(bind)
                .await
                .map_err(Error::io(format!("binding the fake upstream DNS on {bind}")))?;
            let address = udp.local_addr().map_err(Error::io("fake upstream address"))?;
            match tokio::net::TcpListener::bind(address).await {
                Ok(tcp) => break (udp, tcp, address),
                // With port 0, the UDP port may be taken for TCP: try another.
                Err(_) if bind.port() == 0 && attempts < 20 => attempts += 1,
                Err(error) => {
                    return Err(Error::io(format!(
                        "binding the fake upstream DNS on {address} (TCP)"
                    ))(error));
                }
            }
        };
        let asked = Arc::new(Mutex::new(Vec::new()));
        let handler = Upstream {
            names: names
                .iter()
                .map(|(n, ip)| (n.to_ascii_lowercase(), *ip))
                .collect(),
            asked: asked.clone(),
        };
        let mut server = Server::new(handler);
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(5), 65_535);
        let shutdown = server.shutdown_token().clone();
        tokio::spawn(async move {
            let _ = server.block_until_done().await;
        });
        Ok(Self {
            address,
            asked,
            shutdown,
        })
    }

    /// Its address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Every name it was asked (lower case, absolute), in order.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
