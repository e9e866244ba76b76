//! Answering one query: who asks (the source address's pod), whether its tenant may ask now, what the
//! index says, and the upstream resolvers for names outside the cluster.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
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
    metrics::{LatencyLabels, Metrics, QueryLabels, TenantLabels, UNKNOWN_TENANT, UnknownSourceLabels},
    upstream::Forwarder,
    watch::{IndexChanges, SharedIndex},
};
use tokio::sync::Semaphore;

/// How queries from addresses the index does not know are held: a new pod's first query can arrive before
/// the pod watch delivers the pod's address (the kubelet reports it after the containers started), and
/// REFUSED is an answer resolvers do not ask again. Such a query waits, briefly, for the index to learn the
/// address; a bounded number wait at once, so a flood of unknown sources costs a bounded number of tasks.
/// Each source range (a node's pod range, by default a /24 or a /64) holds at most a few of the waiting
/// slots: a flood from one range, which one tenant's pods can send, leaves the slots of the others free
/// for their new pods' first queries.
#[derive(Debug)]
pub struct UnknownSources {
    wait: Duration,
    slots: Semaphore,
    ranges: SourceRanges,
}

/// How many waiters each source range may hold, and how wide a range is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLimits {
    /// Waiters of one range at once.
    pub waiters: usize,
    /// Prefix length of an IPv4 range.
    pub v4_bits: u8,
    /// Prefix length of an IPv6 range.
    pub v6_bits: u8,
}

impl Default for RangeLimits {
    fn default() -> Self {
        Self {
            waiters: 16,
            v4_bits: 24,
            v6_bits: 64,
        }
    }
}

/// The range an address falls in: the address with every bit past the prefix cleared.
pub fn range_of(ip: IpAddr, limits: RangeLimits) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(limits.v4_bits.min(32));
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            IpAddr::from((u32::from(v4) & mask).to_be_bytes())
        }
        IpAddr::V6(v6) => {
            let bits = u32::from(limits.v6_bits.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            IpAddr::from((u128::from(v6) & mask).to_be_bytes())
        }
    }
}

/// Waiters per source range.
#[derive(Debug)]
struct SourceRanges {
    limits: RangeLimits,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One waiter's hold on its range, given back when dropped.
struct RangeHold<'a> {
    ranges: &'a SourceRanges,
    range: IpAddr,
}

impl SourceRanges {
    fn try_hold(&self, source: IpAddr) -> Option<RangeHold<'_>> {
        let range = range_of(source, self.limits);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(range).or_default();
        if *count >= self.limits.waiters {
            return None;
        }
        *count += 1;
        Some(RangeHold { ranges: self, range })
    }
}

impl Drop for RangeHold<'_> {
    fn drop(&mut self) {
        let mut held = self.ranges.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.range) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.range);
            }
        }
    }
}

impl UnknownSources {
    /// Queries wait up to `wait`, at most `waiters` at once, each source range as [`RangeLimits`] (the
    /// default's) allows.
    pub fn new(wait: Duration, waiters: usize) -> Self {
        Self::with_ranges(wait, waiters, RangeLimits::default())
    }

    /// Queries wait up to `wait`, at most `waiters` at once and `ranges.waiters` of one range.
    pub fn with_ranges(wait: Duration, waiters: usize, ranges: RangeLimits) -> Self {
        Self {
            wait,
            slots: Semaphore::new(waiters.min(Semaphore::MAX_PERMITS)),
            ranges: SourceRanges {
                limits: ranges,
                held: Mutex::default(),
            },
        }
    }
}

/// The tenant whose pod has address `source`. An address the index does not know is waited for (see
/// [`UnknownSources`]); unknown still, or with every waiting slot taken, it has none.
pub async fn tenant_of_source(
    index: &SharedIndex,
    changes: &IndexChanges,
    unknown: &UnknownSources,
    metrics: &Metrics,
    source: IpAddr,
) -> Option<Key> {
    let known = || index.read().unwrap_or_else(|e| e.into_inner()).tenant_of(source);
    if let Some(tenant) = known() {
        return Some(tenant);
    }
    if unknown.wait.is_zero() {
        return None;
    }
    let count = |outcome: &'static str| {
        metrics
            .unknown_sources
            .get_or_create(&UnknownSourceLabels { outcome })
            .inc();
    };
    let Some(_range) = unknown.ranges.try_hold(source) else {
        count("range_busy");
        return None;
    };
    let Ok(_slot) = unknown.slots.try_acquire() else {
        count("busy");
        return None;
    };
    // Subscribed before looking again, so that no change between the two is missed.
    let mut changed = changes.subscribe();
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + unknown.wait;
    loop {
        if let Some(tenant) = known() {
            count("learned");
            tracing::debug!(%source, tenant = %tenant, waited_ms = started.elapsed().as_millis() as u64, "source learned while its query waited");
            return Some(tenant);
        }
        match tokio::time::timeout_at(deadline, changed.changed()).await {
            Ok(Ok(())) => {}
            // The deadline, or the watches are gone: one last look.
            Ok(Err(_)) | Err(_) => {
                let tenant = known();
                count(if tenant.is_some() { "learned" } else { "unknown" });
                return tenant;
            }
        }
    }
}

/// Everything a query is answered with.
pub struct Shared {
    /// The index.
    pub index: SharedIndex,
    /// Told of every change of the index.
    pub changes: IndexChanges,
    /// How queries from unknown addresses wait.
    pub unknown_sources: UnknownSources,
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
        let tenant = tenant_of_source(
            &self.shared.index,
            &self.shared.changes,
            &self.shared.unknown_sources,
            &self.shared.metrics,
            source_address(request.src()),
        )
        .await;
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

#[cfg(test)]
mod tests {
    use std::sync::RwLock;

    use super::*;
    use crate::index::{Index, NamespaceOwner, PodAddresses};

    const KEY: &str = "default-aaaaaa-a";

    fn source() -> IpAddr {
        IpAddr::from([10, 244, 0, 5])
    }

    fn learn(index: &SharedIndex) {
        let mut index = index.write().expect("index");
        let namespace = crds::naming::super_namespace(KEY, "shop");
        index.set_namespace(
            &namespace,
            Some(NamespaceOwner {
                cluster: KEY.into(),
                tenant_namespace: "shop".into(),
            }),
        );
        index.set_pod(
            &namespace,
            "new",
            Some(PodAddresses {
                cluster: KEY.into(),
                addresses: vec![source()],
            }),
        );
    }

    fn counted(metrics: &Metrics, outcome: &'static str) -> u64 {
        metrics
            .unknown_sources
            .get_or_create(&UnknownSourceLabels { outcome })
            .get()
    }

    #[test]
    fn ranges_are_prefixes() {
        let limits = RangeLimits::default();
        let cases = [
            ("10.244.3.77", "10.244.3.0"),
            ("10.244.3.0", "10.244.3.0"),
            ("fd00:1:2:3:4:5:6:7", "fd00:1:2:3::"),
        ];
        for (ip, range) in cases {
            assert_eq!(
                range_of(ip.parse().expect("ip"), limits),
                range.parse::<IpAddr>().expect("range"),
                "{ip}"
            );
        }
        let all = RangeLimits {
            v4_bits: 0,
            v6_bits: 0,
            ..limits
        };
        assert_eq!(
            range_of(IpAddr::from([1, 2, 3, 4]), all),
            IpAddr::from([0, 0, 0, 0])
        );
        let exact = RangeLimits {
            v4_bits: 40,
            v6_bits: 200,
            ..limits
        };
        assert_eq!(
            range_of(IpAddr::from([1, 2, 3, 4]), exact),
            IpAddr::from([1, 2, 3, 4])
        );
    }

    /// A flood of unknown sources from one range takes that range's waiting slots only: a first query
    /// from another range still waits, and is answered once its pod is known.
    #[tokio::test]
    async fn a_flood_from_one_range_leaves_the_other_ranges_their_waits() {
        let index: SharedIndex = Arc::new(RwLock::new(Index::new()));
        let changes = crate::watch::index_changes();
        let unknown = UnknownSources::with_ranges(
            Duration::from_millis(800),
            256,
            RangeLimits {
                waiters: 4,
                ..RangeLimits::default()
            },
        );
        let metrics = Metrics::default();
        let flood =
            futures::future::join_all((1..=50u8).map(|n| {
                tenant_of_source(&index, &changes, &unknown, &metrics, IpAddr::from([10, 9, 9, n]))
            }));
        let newcomer = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let asked = tenant_of_source(&index, &changes, &unknown, &metrics, source());
            let learned = async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                learn(&index);
                changes.send_replace(());
            };
            tokio::join!(asked, learned).0
        };
        let (flooded, answered) = tokio::join!(flood, newcomer);
        assert!(flooded.iter().all(Option::is_none));
        assert_eq!(answered.as_deref(), Some(KEY));
        assert_eq!(counted(&metrics, "range_busy"), 46);
        assert_eq!(counted(&metrics, "unknown"), 4);
    }

    #[tokio::test]
    async fn an_unknown_source_waits_for_the_index_to_learn_it_and_no_longer() {
        let wait = Duration::from_millis(600);
        let index: SharedIndex = Arc::new(RwLock::new(Index::new()));
        let changes = crate::watch::index_changes();
        let unknown = UnknownSources::new(wait, 2);
        let metrics = Metrics::default();

        // Learned while waiting: answered as soon as the index says so, not at the end of the wait.
        let started = Instant::now();
        let (tenant, ()) = tokio::join!(
            tenant_of_source(&index, &changes, &unknown, &metrics, source()),
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                learn(&index);
                changes.send_replace(());
            }
        );
        let waited = started.elapsed();
        assert_eq!(tenant.as_deref(), Some(KEY));
        assert!(
            waited >= Duration::from_millis(100) && waited < wait,
            "{waited:?}"
        );
        assert_eq!(counted(&metrics, "learned"), 1);
        // Known: no wait, nothing counted.
        assert_eq!(
            tenant_of_source(&index, &changes, &unknown, &metrics, source())
                .await
                .as_deref(),
            Some(KEY)
        );
        assert_eq!(counted(&metrics, "learned"), 1);

        // Never learned (changes of other objects wake it, and it goes on waiting): none, after the wait.
        let stranger = IpAddr::from([10, 244, 9, 9]);
        let started = Instant::now();
        let (tenant, ()) = tokio::join!(
            tenant_of_source(&index, &changes, &unknown, &metrics, stranger),
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                changes.send_replace(());
            }
        );
        assert_eq!(tenant, None);
        assert!(started.elapsed() >= wait, "{:?}", started.elapsed());
        assert_eq!(counted(&metrics, "unknown"), 1);

        // Every slot taken: refused at once, while the others wait.
        let (first, second, third) = tokio::join!(
            tenant_of_source(
                &index,
                &changes,
                &unknown,
                &metrics,
                IpAddr::from([10, 244, 9, 1])
            ),
            tenant_of_source(
                &index,
                &changes,
                &unknown,
                &metrics,
                IpAddr::from([10, 244, 9, 2])
            ),
            async {
                tokio::task::yield_now().await;
                let started = Instant::now();
                let third = tenant_of_source(&index, &changes, &unknown, &metrics, stranger).await;
                (third, started.elapsed())
            }
        );
        assert_eq!((first, second), (None, None));
        assert_eq!(third.0, None);
        assert!(third.1 < wait / 2, "{:?}", third.1);
        assert_eq!(counted(&metrics, "busy"), 1);
        assert_eq!(counted(&metrics, "unknown"), 3);

        // No wait configured: refused at once, and not counted as waiting.
        let immediate = UnknownSources::new(Duration::ZERO, 2);
        let started = Instant::now();
        assert_eq!(
            tenant_of_source(&index, &changes, &immediate, &metrics, stranger).await,
            None
        );
        assert!(started.elapsed() < wait / 2);
        assert_eq!(counted(&metrics, "unknown"), 3);
    }
}
