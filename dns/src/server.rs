//! Answering one query: who asks (the source address's pod), whether its tenant may ask now, what the
//! index says, and the upstream resolvers for names outside the cluster.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Instant,
};

use hickory_proto::{
    op::{Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode},
    rr::{DNSClass, Name, Record},
};
use hickory_server::{
    net::runtime::Time,
    server::{Request, RequestHandler, ResponseHandler, ResponseInfo},
    zone_handler::MessageResponseBuilder,
};

use crate::{
    index::{self, Key, Resolution},
    limits::{Limits, UpstreamSlot},
    metrics::{LatencyLabels, Metrics, QueryLabels, TenantLabels, UNKNOWN_TENANT},
    upstream::Forwarder,
    watch::SharedIndex,
};

/// Everything a query is answered with.
pub struct Shared {
    /// The index.
    pub index: SharedIndex,
    /// Per-tenant limits.
    pub limits: Limits,
    /// The upstream resolvers.
    pub forwarder: Forwarder,
    /// Metrics.
    pub metrics: Metrics,
    /// Zones never forwarded.
    pub never_forward: Vec<Name>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// The request handler of the hickory server.
#[derive(Clone, Debug)]
pub struct Handler {
    shared: Arc<Shared>,
}

impl Handler {
    /// A handler over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

/// The source of a query as an address the pod index knows (IPv4-mapped IPv6 as IPv4).
pub fn source_address(source: SocketAddr) -> IpAddr {
    match source.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The answer to one query, before encoding.
struct Answer {
    code: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
    authorities: Vec<Record>,
    additionals: Vec<Record>,
    upstream: bool,
}

impl Answer {
    fn code(code: ResponseCode) -> Self {
        Self {
            code,
            authoritative: false,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
            upstream: false,
        }
    }
}

/// The response code's mnemonic (RFC 1035, 2136), as dig prints it.
fn rcode_label(code: ResponseCode) -> String {
    match code {
        ResponseCode::NoError => "NOERROR".to_owned(),
        ResponseCode::FormErr => "FORMERR".to_owned(),
        ResponseCode::ServFail => "SERVFAIL".to_owned(),
        ResponseCode::NXDomain => "NXDOMAIN".to_owned(),
        ResponseCode::NotImp => "NOTIMP".to_owned(),
        ResponseCode::Refused => "REFUSED".to_owned(),
        other => u16::from(other).to_string(),
    }
}

impl Handler {
    async fn forward(
        &self,
        tenant: &Key,
        name: &Name,
        qtype: hickory_proto::rr::RecordType,
        mut answer: Answer,
    ) -> Answer {
        let _slot = match self.shared.limits.upstream(tenant) {
            UpstreamSlot::Granted(own, all) => (own, all),
            UpstreamSlot::TenantBusy | UpstreamSlot::AllBusy => {
                self.shared
                    .metrics
                    .upstream_busy
                    .get_or_create(&TenantLabels {
                        tenant: tenant.to_string(),
                    })
                    .inc();
                answer.code = ResponseCode::ServFail;
                return answer;
            }
        };
        let upstream = self.shared.forwarder.lookup(name, qtype).await;
        answer.code = upstream.code;
        answer.answers.extend(upstream.answers);
        answer.upstream = true;
        answer
    }

    async fn answer(&self, request: &Request, tenant: Option<&Key>) -> Answer {
        if request.metadata.message_type != MessageType::Query {
            return Answer::code(ResponseCode::FormErr);
        }
        if request.metadata.op_code != OpCode::Query {
            return Answer::code(ResponseCode::NotImp);
        }
        let [query] = request.queries.queries() else {
            return Answer::code(ResponseCode::FormErr);
        };
        // An address no live tenant pod has: never an answer, so the super cluster's names (and which
        // tenants exist) stay unknown to it.
        let Some(tenant) = tenant else {
            return Answer::code(ResponseCode::Refused);
        };
        if !self.shared.limits.admit(tenant, Instant::now()) {
            self.shared
                .metrics
                .rate_limited
                .get_or_create(&TenantLabels {
                    tenant: tenant.to_string(),
                })
                .inc();
            return Answer::code(ResponseCode::Refused);
        }
        if query.query_class() != DNSClass::IN {
            return Answer::code(ResponseCode::NotImp);
        }
        let name: Name = query.name().clone().into();
        let qtype = query.query_type();
        let resolution = {
            let index = self.shared.index.read().unwrap_or_else(|e| e.into_inner());
            index.resolve(tenant, &name, qtype, &self.shared.never_forward)
        };
        match resolution {
            Resolution::Found {
                answers,
                additionals,
                zone,
            } => {
                let authorities = match answers.is_empty() {
                    true => vec![index::soa(&zone)],
                    false => Vec::new(),
                };
                Answer {
                    code: ResponseCode::NoError,
                    authoritative: true,
                    answers,
                    authorities,
                    additionals,
                    upstream: false,
                }
            }
            Resolution::NxDomain { zone } => Answer {
                code: ResponseCode::NXDomain,
                authoritative: true,
                answers: Vec::new(),
                authorities: match zone.is_root() {
                    true => Vec::new(),
                    false => vec![index::soa(&zone)],
                },
                additionals: Vec::new(),
                upstream: false,
            },
            Resolution::Cname { answers, target } => {
                let answer = Answer {
                    code: ResponseCode::NoError,
                    authoritative: true,
                    answers,
                    authorities: Vec::new(),
                    additionals: Vec::new(),
                    upstream: false,
                };
                // The target is another name: never one the tenant could not ask for itself.
                let blocked = self.shared.never_forward.iter().any(|b| b.zone_of(&target));
                if blocked {
                    return answer;
                }
                let mut answer = self.forward(tenant, &target, qtype, answer).await;
                if answer.code == ResponseCode::ServFail && answer.answers.len() == 1 {
                    // The CNAME alone still tells the client where to look.
                    answer.code = ResponseCode::NoError;
                }
                answer
            }
            Resolution::Forward => {
                self.forward(tenant, &name, qtype, Answer::code(ResponseCode::NoError))
                    .await
            }
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let started = Instant::now();
        let tenant = {
            let index = self.shared.index.read().unwrap_or_else(|e| e.into_inner());
            index.tenant_of(source_address(request.src()))
        };
        let answer = self.answer(request, tenant.as_ref()).await;

        let response_edns = request.edns.as_ref().map(|edns| {
            let mut response = Edns::new();
            // At most 1232 bytes over UDP (the DNS flag day's size: no IP fragmentation, and no large
            // answers to a forged source); larger answers are truncated and asked again over TCP.
            response.set_max_payload(edns.max_payload().clamp(512, 1232));
            response.set_version(0);
            response
        });
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = answer.code;
        metadata.authoritative = answer.authoritative;
        metadata.recursion_available = answer.code != ResponseCode::Refused;
        let mut builder = MessageResponseBuilder::new(&request.queries, None);
        if let Some(edns) = &response_edns {
            builder.edns(edns);
        }
        let response = builder.build(
            metadata,
            answer.answers.iter(),
            answer.authorities.iter(),
            std::iter::empty(),
            answer.additionals.iter(),
        );
        let info = match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(error) => {
                tracing::debug!(%error, "sending a response");
                let mut metadata = Metadata::response_from_request(&request.metadata);
                metadata.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata,
                    counts: HeaderCounts::default(),
                })
            }
        };
        let metrics = &self.shared.metrics;
        metrics
            .queries
            .get_or_create(&QueryLabels {
                tenant: tenant.as_deref().unwrap_or(UNKNOWN_TENANT).to_owned(),
                rcode: rcode_label(answer.code),
            })
            .inc();
        metrics
            .latency
            .get_or_create(&LatencyLabels {
                source: if answer.upstream { "upstream" } else { "local" },
            })
            .observe(started.elapsed().as_secs_f64());
        info
    }
}
