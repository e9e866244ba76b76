//! The real server on loopback with a filled index and a real DNS client (hickory-resolver) asking from
//! chosen loopback addresses, as tenant pods would from theirs: one tenant flooding the server is held to
//! its own rate and does not slow another tenant's answers; the metrics count queries by tenant and
//! response code.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use hickory_resolver::{
    TokioResolver,
    config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts},
    net::{DnsError, NetError, runtime::TokioRuntimeProvider},
    proto::{op::ResponseCode, rr::RecordType},
};
use prometheus_client::registry::Registry;
use vc_dns::{
    Dns, Metrics, Settings,
    index::{Index, NamespaceOwner, PodAddresses, ServiceKind, ServiceRecord},
};

const NOISY: &str = "default-aaaaaa-noisy";
const QUIET: &str = "default-bbbbbb-quiet";

fn source(tenant: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 61, 0, tenant))
}

fn index() -> Index {
    let mut index = Index::new();
    for (n, key) in [(1u8, NOISY), (2, QUIET)] {
        index.set_domain(key.into(), "cluster.local");
        let namespace = crds::naming::super_namespace(key, "app");
        let owner = NamespaceOwner {
            cluster: key.into(),
            tenant_namespace: "app".into(),
        };
        index.set_namespace(&namespace, Some(owner.clone()));
        index.set_service(
            &namespace,
            "web",
            Some(ServiceRecord {
                owner,
                kind: ServiceKind::ClusterIp(vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, n))]),
                ports: Vec::new(),
            }),
        );
        index.set_pod(
            &namespace,
            "client",
            Some(PodAddresses {
                cluster: key.into(),
                addresses: vec![source(n)],
            }),
        );
    }
    index
}

/// The response code and answers of one query from `from`.
async fn ask(server: SocketAddr, from: IpAddr, name: &str) -> (ResponseCode, Vec<String>) {
    let mut connection = ConnectionConfig::udp();
    connection.port = server.port();
    connection.bind_addr = Some(SocketAddr::new(from, 0));
    let mut options = ResolverOpts::default();
    options.cache_size = 0;
    options.attempts = 1;
    options.ndots = 0;
    options.timeout = Duration::from_secs(2);
    let resolver = TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![NameServerConfig::new(server.ip(), true, vec![connection])]),
        TokioRuntimeProvider::default(),
    )
    .with_options(options)
    .build()
    .expect("resolver");
    match resolver.lookup(name, RecordType::A).await {
        Ok(lookup) => (
            ResponseCode::NoError,
            lookup.answers().iter().map(|r| r.data.to_string()).collect(),
        ),
        Err(NetError::Dns(DnsError::NoRecordsFound(none))) => (none.response_code, Vec::new()),
        Err(NetError::Dns(DnsError::ResponseCode(code))) => (code, Vec::new()),
        Err(error) => panic!("{name} from {from}: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_is_held_to_its_rate_and_another_is_answered() {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let mut settings = Settings::local(vec![SocketAddr::from(([127, 0, 0, 1], 9))]);
    settings.tenant_qps = 20;
    settings.tenant_burst = 20;
    // An unknown address waits this long for the pod watch (there is none here) before it is refused.
    settings.unknown_source_wait = Duration::from_millis(300);
    let dns = Dns::serve_index(settings, Arc::new(RwLock::new(index())), metrics)
        .await
        .expect("server");
    let server = dns.local_addr();
    let name = "web.app.svc.cluster.local.";

    // The noisy tenant asks 200 times at once: its burst is answered, the rest refused.
    let flood: Vec<_> = (0..200)
        .map(|_| tokio::spawn(ask(server, source(1), name)))
        .collect();
    // Meanwhile the quiet tenant is answered, with its own address, promptly.
    let started = Instant::now();
    for _ in 0..5 {
        let (code, answers) = ask(server, source(2), name).await;
        assert_eq!(code, ResponseCode::NoError);
        assert_eq!(answers, ["10.96.0.2"]);
    }
    let quiet = started.elapsed();
    let mut answered = 0;
    let mut refused = 0;
    for query in flood {
        match query.await.expect("query") {
            (ResponseCode::NoError, answers) => {
                assert_eq!(answers, ["10.96.0.1"]);
                answered += 1;
            }
            (ResponseCode::Refused, _) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    eprintln!("noisy tenant: {answered} answered, {refused} refused; quiet tenant: 5 answers in {quiet:?}");
    assert!((20..=30).contains(&answered), "{answered} answered");
    assert!(refused >= 170, "{refused} refused");
    assert!(quiet < Duration::from_secs(1), "{quiet:?}");

    // An address no pod has: refused, counted as `unknown`.
    let (code, _) = ask(server, IpAddr::V4(Ipv4Addr::new(127, 61, 0, 99)), name).await;
    assert_eq!(code, ResponseCode::Refused);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("metrics");
    // (The client asks a server that refuses once more before it gives up: refusals count twice.)
    for line in [
        format!("vc_dns_queries_total{{tenant=\"{QUIET}\",rcode=\"NOERROR\"}} 5\n"),
        format!("vc_dns_queries_total{{tenant=\"{NOISY}\",rcode=\"NOERROR\"}} {answered}\n"),
        format!("vc_dns_queries_total{{tenant=\"{NOISY}\",rcode=\"REFUSED\"}} "),
        "vc_dns_queries_total{tenant=\"unknown\",rcode=\"REFUSED\"} ".to_owned(),
        "vc_dns_unknown_source_queries_total{outcome=\"unknown\"} ".to_owned(),
        format!("vc_dns_rate_limited_total{{tenant=\"{NOISY}\"}} "),
        "vc_dns_query_duration_seconds_count{source=\"local\"} ".to_owned(),
    ] {
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
    assert!(!text.contains(&format!("vc_dns_rate_limited_total{{tenant=\"{QUIET}\"}}")));
    dns.shutdown().await.expect("shutdown");
}
