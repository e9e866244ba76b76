//! Tenant DNS (issue 12) against real etcd and kube-apiserver processes: two tenant masters, the syncer
//! and vc-dns in process, simulated nodes that give pods loopback addresses, and a real DNS client
//! (hickory-resolver) that asks from a tenant pod's address, the way the pod itself would. vc-dns knows who
//! asks only from that address and answers from the super cluster alone:
//!
//! - `each_tenant_resolves_its_own_services_and_nothing_else`: every record type (Service A, headless A,
//!   StatefulSet-style hostnames, SRV, ExternalName CNAME chased upstream under the syncer's default
//!   settings, whose super stub leads nowhere, pod A records, PTR, `kubernetes.default`, also through the
//!   search path as a pod's resolver asks it),
//!   the same Service name answered differently for two tenants, other tenants' and super-cluster names
//!   NXDOMAIN, an unknown source REFUSED, names outside the cluster forwarded to the upstream (which is
//!   never asked a cluster name), and the syncer pointing pods at vc-dns and keeping opted-out pods off the
//!   super cluster's DNS.
//! - `changes_show_within_a_second`: a Service created, an endpoint added, a Service deleted: each shows in
//!   the answers within a second of the super cluster holding the change.
//! - `tenant_pods_reach_their_own_services_by_name_on_real_nodes`: busybox pods of two tenants on real
//!   nodes fetch a page through a Service by its short name and through an ExternalName Service, and a
//!   pod whose first command looks up `web.default` (sent before vc-dns can have seen the pod's address)
//!   gets web's address through the search path.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Parser;
use hickory_proto::{op::ResponseCode, rr::RecordType};
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use local_cluster::{
    Binary,
    dns::{FakeUpstream, Reply, ask, ask_through_search},
    tenancy::{Tenancy, TenancyOptions, TenantMaster},
    wait,
};
use serde_json::json;
use syncer::{Args, Metrics, Syncer, SyncerConfig};
use vc_dns::{Dns, Settings};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "shop";
/// The public name the fake upstream knows.
const PUBLIC_NAME: &str = "public.example.";
const PUBLIC_ADDRESS: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
/// Pods with this label get a loopback address from the simulated node, which the test sends from.
const LOOPBACK_LABEL: &str = "e2e.test/loopback-address";

struct Setup {
    // Drop order: the components before the clusters.
    dns: Dns,
    _syncer: Syncer,
    tenancy: Tenancy,
    upstream: FakeUpstream,
    /// Cluster IP of the super cluster's `default/vc-dns` Service, which pods are pointed at.
    dns_service_ip: String,
}

impl Setup {
    fn server(&self) -> SocketAddr {
        self.dns.local_addr()
    }
}

async fn create<K>(client: &Client, namespace: &str, object: serde_json::Value) -> anyhow::Result<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object)?;
    Ok(Api::<K>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await?)
}

async fn start() -> anyhow::Result<Setup> {
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let upstream = FakeUpstream::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        &[(PUBLIC_NAME, PUBLIC_ADDRESS)],
    )
    .await?;
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 2,
        nodes: 1,
        loopback_ip_label: Some(LOOPBACK_LABEL.to_owned()),
        ..Default::default()
    })
    .await?;
    let super_client = tenancy.super_client();
    // The Service the platform runs vc-dns behind (the chart's); here only its cluster IP matters.
    let service: Service = create(
        &super_client,
        "default",
        json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "vc-dns"},
            "spec": {"ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"}
            ]}
        }),
    )
    .await?;
    let dns_service_ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("vc-dns Service cluster IP")?;
    let dns = Dns::start(
        Settings::local(vec![upstream.address()]),
        super_client.clone(),
        vc_dns::Metrics::default(),
    )
    .await?;
    tokio::time::timeout(PATIENCE, dns.wait_ready())
        .await
        .context("vc-dns watches listing")??;
    let args = Args::try_parse_from([
        "syncer",
        "--patrol-interval-seconds=5",
        "--tenant-health-period-seconds=2",
        "--downward-workers=4",
        "--upward-workers=4",
        "--tenant-dns-service=default/vc-dns",
        // The simulated nodes give pods with this label loopback addresses, which the test can send from;
        // the syncer copies only allowed label keys as they are.
        &format!("--copied-meta-keys={LOOPBACK_LABEL}"),
    ])?;
    let syncer = Syncer::start(
        super_client,
        SyncerConfig::try_from(args.syncer).map_err(anyhow::Error::msg)?,
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;
    Ok(Setup {
        dns,
        _syncer: syncer,
        tenancy,
        upstream,
        dns_service_ip,
    })
}

fn pod(name: &str, labels: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "main", "image": "busybox", "ports": [{"name": "http", "containerPort": 8080}]}]
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec})
}

/// The tenant objects both tenants have (`web`, a client pod), and for tenant 0 also a headless `db` with a
/// StatefulSet-style pod and an ExternalName Service.
async fn populate(tenant: &TenantMaster, with_extras: bool) -> anyhow::Result<()> {
    let client = tenant.client();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if namespaces.get_opt(NAMESPACE).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
            )
            .await?;
    }
    create::<Service>(
        &client,
        NAMESPACE,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )
    .await?;
    create::<Pod>(&client, NAMESPACE, pod("web-1", json!({"app": "web"}), json!({}))).await?;
    create::<Pod>(
        &client,
        NAMESPACE,
        pod(
            "client",
            json!({"app": "client", LOOPBACK_LABEL: "true"}),
            json!({}),
        ),
    )
    .await?;
    create::<Pod>(
        &client,
        NAMESPACE,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "opted-out", "annotations": {"tenancy.x-k8s.io/disable.dnsPolicyMutation": "true"}},
            "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main", "image": "busybox"}]}}),
    )
    .await?;
    if with_extras {
        create::<Service>(
            &client,
            NAMESPACE,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"},
                "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"name": "pg", "port": 5432}]}}),
        )
        .await?;
        create::<Pod>(
            &client,
            NAMESPACE,
            pod(
                "db-0",
                json!({"app": "db"}),
                json!({"hostname": "db-0", "subdomain": "db"}),
            ),
        )
        .await?;
        create::<Service>(
            &client,
            NAMESPACE,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext"},
                "spec": {"type": "ExternalName", "externalName": PUBLIC_NAME.trim_end_matches('.')}}),
        )
        .await?;
    }
    Ok(())
}

/// A super pod of `tenant` once it runs: its address.
async fn super_pod_ip(setup: &Setup, tenant: &TenantMaster, name: &str) -> anyhow::Result<IpAddr> {
    let api: Api<Pod> = Api::namespaced(setup.tenancy.super_client(), &tenant.super_namespace(NAMESPACE));
    let ip = wait::until(
        PATIENCE,
        &format!("super pod {name} of {} running", tenant.name),
        || {
            let api = api.clone();
            async move {
                let pod = api.get_opt(name).await.ok()??;
                pod.status?.pod_ip.filter(|ip| !ip.is_empty())
            }
        },
    )
    .await?;
    Ok(ip.parse()?)
}

/// A super Service's cluster IP.
async fn super_service_ip(setup: &Setup, namespace: &str, name: &str) -> anyhow::Result<String> {
    let api: Api<Service> = Api::namespaced(setup.tenancy.super_client(), namespace);
    Ok(
        wait::until(PATIENCE, &format!("super Service {namespace}/{name}"), || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok()??.spec?.cluster_ip }
        })
        .await?,
    )
}

/// Asks until the reply satisfies `check` (watches deliver changes a moment after the super cluster holds
/// them); returns the last reply.
async fn ask_until(
    setup: &Setup,
    source: IpAddr,
    name: &str,
    qtype: RecordType,
    check: impl Fn(&Reply) -> bool,
) -> anyhow::Result<Reply> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let reply = ask(setup.server(), source, name, qtype).await?;
        if check(&reply) {
            return Ok(reply);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name} {qtype} from {source}: still {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reverse(ip: &str) -> String {
    let octets: Vec<&str> = ip.split('.').rev().collect();
    format!("{}.in-addr.arpa.", octets.join("."))
}

#[tokio::test]
async fn each_tenant_resolves_its_own_services_and_nothing_else() -> anyhow::Result<()> {
    const TEST: &str = "each_tenant_resolves_its_own_services_and_nothing_else";
    if !local_cluster::require(TEST, NEEDS) {
        return Ok(());
    }
    let setup = start().await?;
    let (a, b) = (&setup.tenancy.tenants[0], &setup.tenancy.tenants[1]);
    populate(a, true).await?;
    populate(b, false).await?;
    let source_a = super_pod_ip(&setup, a, "client").await?;
    let source_b = super_pod_ip(&setup, b, "client").await?;
    let db_ip = super_pod_ip(&setup, a, "db-0").await?.to_string();
    let web_a = super_service_ip(&setup, &a.super_namespace(NAMESPACE), "web").await?;
    let web_b = super_service_ip(&setup, &b.super_namespace(NAMESPACE), "web").await?;
    assert_ne!(web_a, web_b);
    let web = "web.shop.svc.cluster.local.";

    // The same name, each tenant's own super cluster IP.
    ask_until(&setup, source_a, web, RecordType::A, |r| r.is(&[&web_a])).await?;
    ask_until(&setup, source_b, web, RecordType::A, |r| r.is(&[&web_b])).await?;

    // Headless: the ready endpoints' super pod addresses, and the pod's hostname under the Service.
    ask_until(
        &setup,
        source_a,
        "db.shop.svc.cluster.local.",
        RecordType::A,
        |r| r.is(&[&db_ip]),
    )
    .await?;
    let reply = ask(
        setup.server(),
        source_a,
        "db-0.db.shop.svc.cluster.local.",
        RecordType::A,
    )
    .await?;
    assert!(reply.is(&[&db_ip]), "{reply:?}");

    // SRV for named ports: the Service's port, and each endpoint of a headless Service.
    let reply = ask(
        setup.server(),
        source_a,
        "_http._tcp.web.shop.svc.cluster.local.",
        RecordType::SRV,
    )
    .await?;
    assert!(reply.is(&["0 100 80 web.shop.svc.cluster.local."]), "{reply:?}");
    let reply = ask(
        setup.server(),
        source_a,
        "_pg._tcp.db.shop.svc.cluster.local.",
        RecordType::SRV,
    )
    .await?;
    assert!(
        reply.is(&["0 100 5432 db-0.db.shop.svc.cluster.local."]),
        "{reply:?}"
    );

    // ExternalName, under the syncer's default settings: a CNAME, chased through the upstream. The super
    // cluster holds a stub that leads nowhere: headless, without selector, externalName or endpoints.
    let ext = "ext.shop.svc.cluster.local.";
    ask_until(&setup, source_a, ext, RecordType::CNAME, |r| r.is(&[PUBLIC_NAME])).await?;
    let reply = ask(setup.server(), source_a, ext, RecordType::A).await?;
    assert!(reply.is(&[&PUBLIC_ADDRESS.to_string(), PUBLIC_NAME]), "{reply:?}");
    let super_namespace = a.super_namespace(NAMESPACE);
    let stub = Api::<Service>::namespaced(setup.tenancy.super_client(), &super_namespace)
        .get("ext")
        .await?;
    let spec = stub.spec.context("stub spec")?;
    assert_eq!(
        (spec.type_.as_deref(), spec.cluster_ip.as_deref()),
        (Some("ClusterIP"), Some("None"))
    );
    assert_eq!(spec.external_name, None);
    assert!(spec.selector.is_none_or(|s| s.is_empty()));
    let slices = Api::<EndpointSlice>::namespaced(setup.tenancy.super_client(), &super_namespace)
        .list(&ListParams::default().labels("kubernetes.io/service-name=ext"))
        .await?;
    assert!(slices.items.is_empty(), "{:?}", slices.items);
    let endpoints = Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(
        setup.tenancy.super_client(),
        &super_namespace,
    )
    .get_opt("ext")
    .await?;
    assert!(
        endpoints.is_none_or(|e| e.subsets.unwrap_or_default().is_empty()),
        "the stub has endpoints"
    );

    // A pod by its dashed address: the tenant's own pods in that namespace only.
    let pod_name = |ip: &IpAddr| format!("{}.shop.pod.cluster.local.", ip.to_string().replace('.', "-"));
    let reply = ask(setup.server(), source_a, &pod_name(&source_a), RecordType::A).await?;
    assert!(reply.is(&[&source_a.to_string()]), "{reply:?}");
    let reply = ask(setup.server(), source_b, &pod_name(&source_a), RecordType::A).await?;
    assert_eq!(reply.code, ResponseCode::NXDomain, "{reply:?}");

    // PTR of the tenant's own addresses; another tenant's are not found.
    let reply = ask(setup.server(), source_a, &reverse(&web_a), RecordType::PTR).await?;
    assert!(reply.is(&[web]), "{reply:?}");
    let reply = ask(setup.server(), source_a, &reverse(&db_ip), RecordType::PTR).await?;
    assert!(reply.is(&["db-0.db.shop.svc.cluster.local."]), "{reply:?}");
    let reply = ask(setup.server(), source_a, &reverse(&web_b), RecordType::PTR).await?;
    assert_eq!(reply.code, ResponseCode::NXDomain, "{reply:?}");

    // `kubernetes.default`: the tenant's own apiserver, as pods reach it today.
    let kubernetes = "kubernetes.default.svc.cluster.local.";
    for (tenant, source) in [(a, source_a), (b, source_b)] {
        let ip = super_service_ip(&setup, &tenant.super_namespace("default"), "kubernetes").await?;
        ask_until(&setup, source, kubernetes, RecordType::A, |r| r.is(&[&ip])).await?;
    }
    // As a pod's resolver asks `kubernetes.default`: through the search path the syncer wrote (ndots 5),
    // `kubernetes.default.shop.svc.cluster.local` and `kubernetes.default.svc.svc.cluster.local` do not
    // exist and `kubernetes.default.svc.cluster.local` is the tenant's apiserver.
    let ip = super_service_ip(&setup, &a.super_namespace("default"), "kubernetes").await?;
    let reply = ask_through_search(
        setup.server(),
        source_a,
        "kubernetes.default",
        RecordType::A,
        &["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"],
        5,
    )
    .await?;
    assert!(reply.is(&[&ip]), "{reply:?}");
    let super_kubernetes = super_service_ip(&setup, "default", "kubernetes").await?;
    let reply = ask(setup.server(), source_a, kubernetes, RecordType::A).await?;
    assert!(
        !reply.answers.contains(&super_kubernetes),
        "never the super apiserver: {reply:?}"
    );

    // Another tenant's names and the super cluster's do not exist, however they are spelled.
    for name in [
        "db.shop.svc.cluster.local.".to_owned(),
        "ext.shop.svc.cluster.local.".to_owned(),
        format!("web.{}.svc.cluster.local.", a.super_namespace(NAMESPACE)),
        "vc-dns.default.svc.cluster.local.".to_owned(),
        "kube-dns.kube-system.svc.cluster.local.".to_owned(),
        "kubernetes.default.svc.cluster.local.shop.svc.cluster.local.".to_owned(),
    ] {
        let reply = ask(setup.server(), source_b, &name, RecordType::A).await?;
        assert_eq!(reply.code, ResponseCode::NXDomain, "{name}: {reply:?}");
    }

    // A source no tenant pod has: refused, whatever it asks.
    for name in [web, PUBLIC_NAME] {
        let reply = ask(
            setup.server(),
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
            name,
            RecordType::A,
        )
        .await?;
        assert_eq!(reply.code, ResponseCode::Refused, "{name}: {reply:?}");
    }

    // Outside the cluster domain: the upstream's answer. The upstream is never asked a cluster name.
    let reply = ask(setup.server(), source_b, PUBLIC_NAME, RecordType::A).await?;
    assert!(reply.is(&[&PUBLIC_ADDRESS.to_string()]), "{reply:?}");
    let reply = ask(setup.server(), source_b, "nowhere.example.", RecordType::A).await?;
    assert_eq!(reply.code, ResponseCode::NXDomain);
    let asked = setup.upstream.asked();
    assert!(asked.contains(&"nowhere.example.".to_owned()), "{asked:?}");
    assert!(
        asked
            .iter()
            .all(|n| !n.contains("cluster.local") && !n.contains("in-addr.arpa")),
        "{asked:?}"
    );

    // The syncer points tenant pods at vc-dns; an opted-out pod gets the node's resolver, never the
    // super cluster's DNS.
    let super_pods: Api<Pod> = Api::namespaced(setup.tenancy.super_client(), &a.super_namespace(NAMESPACE));
    let client_spec = super_pods.get("client").await?.spec.context("spec")?;
    assert_eq!(client_spec.dns_policy.as_deref(), Some("None"));
    let config = client_spec.dns_config.context("dns config")?;
    assert_eq!(config.nameservers, Some(vec![setup.dns_service_ip.clone()]));
    assert_eq!(
        config.searches.unwrap_or_default()[..3],
        ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    );
    let opted_out = wait::until(PATIENCE, "the opted-out super pod", || {
        let api = super_pods.clone();
        async move { api.get_opt("opted-out").await.ok()? }
    })
    .await?;
    assert_eq!(
        opted_out.spec.context("spec")?.dns_policy.as_deref(),
        Some("Default")
    );
    Ok(())
}

/// Polls the super cluster and vc-dns together until both show a change; returns how long vc-dns took
/// after the super cluster held it.
async fn lag(
    what: &str,
    super_holds: impl AsyncFn() -> bool,
    dns_shows: impl AsyncFn() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + PATIENCE;
    let mut held: Option<Instant> = None;
    loop {
        let now = Instant::now();
        anyhow::ensure!(now < deadline, "{what}: not within {PATIENCE:?}");
        if held.is_none() && super_holds().await {
            held = Some(now);
        }
        if dns_shows().await? {
            let lag = held.map_or(Duration::ZERO, |held| now.saturating_duration_since(held));
            eprintln!("{what}: vc-dns answered {lag:?} after the super cluster held the change");
            return Ok(lag);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn changes_show_within_a_second() -> anyhow::Result<()> {
    const TEST: &str = "changes_show_within_a_second";
    if !local_cluster::require(TEST, NEEDS) {
        return Ok(());
    }
    let setup = start().await?;
    let a = &setup.tenancy.tenants[0];
    populate(a, true).await?;
    let source = super_pod_ip(&setup, a, "client").await?;
    let client = a.client();
    let super_namespace = a.super_namespace(NAMESPACE);
    let super_services: Api<Service> = Api::namespaced(setup.tenancy.super_client(), &super_namespace);
    let super_slices: Api<EndpointSlice> = Api::namespaced(setup.tenancy.super_client(), &super_namespace);
    ask_until(&setup, source, "db.shop.svc.cluster.local.", RecordType::A, |r| {
        r.answers.len() == 1
    })
    .await?;
    let second = Duration::from_secs(1);

    // A Service created.
    let started = Instant::now();
    create::<Service>(
        &client,
        NAMESPACE,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "late"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}),
    )
    .await?;
    let created = lag(
        "Service created",
        async || {
            super_services
                .get_opt("late")
                .await
                .ok()
                .flatten()
                .and_then(|s| s.spec?.cluster_ip)
                .is_some()
        },
        async || {
            Ok(ask(
                setup.server(),
                source,
                "late.shop.svc.cluster.local.",
                RecordType::A,
            )
            .await?
            .code
                == ResponseCode::NoError)
        },
    )
    .await?;
    eprintln!(
        "Service created: answered {:?} after the tenant created it",
        started.elapsed()
    );
    assert!(created < second, "{created:?}");

    // An endpoint added: a second pod behind the headless Service.
    create::<Pod>(
        &client,
        NAMESPACE,
        pod(
            "db-1",
            json!({"app": "db"}),
            json!({"hostname": "db-1", "subdomain": "db"}),
        ),
    )
    .await?;
    let endpoint = lag(
        "endpoint added",
        async || {
            super_slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
                .await
                .map(|l| l.items.iter().map(|s| s.endpoints.len()).sum::<usize>() >= 2)
                .unwrap_or(false)
        },
        async || {
            Ok(ask(
                setup.server(),
                source,
                "db.shop.svc.cluster.local.",
                RecordType::A,
            )
            .await?
            .answers
            .len()
                == 2)
        },
    )
    .await?;
    assert!(endpoint < second, "{endpoint:?}");

    // A Service deleted.
    Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .delete("late", &DeleteParams::default())
        .await?;
    let deleted = lag(
        "Service deleted",
        async || super_services.get_opt("late").await.ok().flatten().is_none(),
        async || {
            Ok(ask(
                setup.server(),
                source,
                "late.shop.svc.cluster.local.",
                RecordType::A,
            )
            .await?
            .code
                == ResponseCode::NXDomain)
        },
    )
    .await?;
    assert!(deleted < second, "{deleted:?}");
    Ok(())
}

/// Runs `command` in a tenant pod (through the tenant apiserver and vn-agent to the real kubelet); its
/// standard output.
async fn exec(client: &Client, pod: &str, command: &[&str]) -> anyhow::Result<String> {
    use tokio::io::AsyncReadExt;
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut attached = api
        .exec(
            pod,
            command.to_vec(),
            &kube::api::AttachParams::default().stderr(false),
        )
        .await
        .with_context(|| format!("exec {command:?} in {pod}"))?;
    let mut output = String::new();
    if let Some(mut stdout) = attached.stdout() {
        stdout.read_to_string(&mut output).await?;
    }
    attached.join().await?;
    Ok(output)
}

/// On real nodes: a busybox pod of each of two tenants resolves Service `web` by its short name through
/// vc-dns and fetches a page from the pod behind it through kube-proxy; the same name leads each tenant to
/// its own pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_pods_reach_their_own_services_by_name_on_real_nodes() -> anyhow::Result<()> {
    const TEST: &str = "tenant_pods_reach_their_own_services_by_name_on_real_nodes";
    let needs = [
        Binary::Etcd,
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
    ];
    if !local_cluster::require(TEST, &needs) || !local_cluster::realnodes::require(TEST) {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let sandbox = local_cluster::sandbox::Sandbox::start(local_cluster::sandbox::SandboxOptions {
        tenants: vec!["dns-a".to_owned(), "dns-b".to_owned()],
        node_kind: local_cluster::sandbox::NodeKind::Real,
        ..Default::default()
    })
    .await?;
    let mut clients = Vec::new();
    for (tenant, kubeconfig) in sandbox.tenant_kubeconfigs() {
        let client = local_cluster::client_from_kubeconfig_file(kubeconfig).await?;
        wait::until_true(PATIENCE, &format!("{tenant}'s default service account"), || {
            let client = client.clone();
            async move {
                Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client, "default")
                    .get_opt("default")
                    .await
                    .is_ok_and(|a| a.is_some())
            }
        })
        .await?;
        let server = format!(
            "mkdir -p /www && echo hello-from-{tenant} > /www/index.html && exec httpd -f -p 8080 -h /www"
        );
        create::<Service>(
            &client,
            "default",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
        )
        .await?;
        // Under the syncer's default settings: a CNAME only vc-dns serves, chased in the tenant's zone.
        create::<Service>(
            &client,
            "default",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "alias"},
                "spec": {"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}}),
        )
        .await?;
        // `first` resolves before anything else it does, racing vc-dns's watch of its own address (the
        // Services come first, so that its answer exists).
        for (name, labels, script) in [
            ("first", json!({"app": "first"}), FIRST_LOOKUP),
            ("web-1", json!({"app": "web"}), server.as_str()),
            ("client", json!({"app": "client"}), "exec sleep 3600"),
        ] {
            create::<Pod>(
                &client,
                "default",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                    "spec": {"terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}}),
            )
            .await?;
        }
        clients.push((tenant.clone(), client));
    }
    for (tenant, client) in &clients {
        let api: Api<Pod> = Api::namespaced(client.clone(), "default");
        for name in ["first", "web-1", "client"] {
            wait::until_true(
                Duration::from_secs(180),
                &format!("{tenant}'s pod {name} Running"),
                || {
                    let api = api.clone();
                    async move {
                        api.get(name)
                            .await
                            .ok()
                            .and_then(|p| p.status?.phase)
                            .is_some_and(|phase| phase == "Running")
                    }
                },
            )
            .await?;
        }
        let resolv = exec(client, "client", &["cat", "/etc/resolv.conf"]).await?;
        eprintln!("{tenant}'s client pod resolv.conf:\n{resolv}");
        // By short name, through the search path the syncer wrote, to vc-dns, then through kube-proxy.
        let page = wait::until(
            Duration::from_secs(60),
            &format!("http://web/ from {tenant}'s client"),
            || {
                let client = client.clone();
                async move {
                    // (busybox's wget crashes on -T: the time limit comes from `timeout`.)
                    exec(
                        &client,
                        "client",
                        &["timeout", "5", "wget", "-qO-", "http://web/"],
                    )
                    .await
                    .ok()
                    .filter(|p| p.contains("hello"))
                }
            },
        )
        .await?;
        assert_eq!(
            page.trim(),
            format!("hello-from-{tenant}"),
            "{tenant} reaches its own web"
        );
        let lookup = exec(client, "client", &["nslookup", "web.default.svc.cluster.local"]).await?;
        eprintln!("{tenant}: nslookup web.default.svc.cluster.local:\n{lookup}");

        // The pod's very first lookup: `web.default` through the search path (a miss first), answered with
        // web's super cluster IP.
        let super_namespace = sandbox.tenancy().tenant(tenant).super_namespace("default");
        let web = Api::<Service>::namespaced(sandbox.super_client(), &super_namespace)
            .get("web")
            .await?
            .spec
            .and_then(|s| s.cluster_ip)
            .context("the super cluster IP of the tenant's web Service")?;
        let first = wait::until(
            Duration::from_secs(30),
            &format!("{tenant}'s first lookup"),
            || {
                let api = api.clone();
                async move {
                    let log = api.logs("first", &Default::default()).await.ok()?;
                    log.contains(FIRST_LOOKUP_DONE).then_some(log)
                }
            },
        )
        .await?;
        eprintln!("{tenant}'s first lookup:\n{first}");
        assert!(
            first.contains(&format!("Connecting to web.default ({web}:80)")),
            "{tenant}'s first lookup of web.default did not answer {web}:\n{first}"
        );

        // The ExternalName Service's CNAME, followed to web by the pod's own resolver. Retried like the
        // fetch of web above: one lost UDP answer costs the resolver its whole 5 s timeout on a loaded
        // machine; every failed try is printed, so an answer that never works shows as such.
        let page = wait::until(
            Duration::from_secs(60),
            &format!("http://alias/ from {tenant}'s client"),
            || {
                let client = client.clone();
                async move {
                    let output = exec(
                        &client,
                        "client",
                        &["sh", "-c", "timeout 5 wget -qO- http://alias/ 2>&1"],
                    )
                    .await
                    .ok()?;
                    if output.contains("hello") {
                        Some(output)
                    } else {
                        eprintln!("{tenant}: http://alias/ not yet: {output:?}");
                        None
                    }
                }
            },
        )
        .await?;
        assert_eq!(page.trim(), format!("hello-from-{tenant}"), "http://alias/");
        let lookup = exec(client, "client", &["nslookup", "alias"]).await?;
        eprintln!("{tenant}: nslookup alias:\n{lookup}");
        assert!(lookup.contains("web.default.svc.cluster.local"), "{lookup}");
    }
    Ok(())
}

/// What pod `first` runs: a lookup before anything else, then a marker that it is done. The lookup is
/// wget's, through the C library's resolver, which tries the search path first for a name with fewer dots
/// than `ndots` (busybox's own nslookup tries it only for names without a dot), and prints the address it
/// connects to. (Not `kubernetes.default`: the pod's hosts file has it, so no DNS query would be sent.)
const FIRST_LOOKUP: &str =
    "timeout 5 wget -O /dev/null http://web.default/ 2>&1; echo first-lookup-done; exec sleep 3600";
/// See [`FIRST_LOOKUP`].
const FIRST_LOOKUP_DONE: &str = "first-lookup-done";

/// The super objects the syncer would make for one tenant namespace: the namespace, annotated with its
/// tenant, and a Service; returns the Service's cluster IP.
async fn tenant_namespace_in_super(client: &Client, key: &str) -> anyhow::Result<(String, String)> {
    use crds::wellknown::{ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE};
    let namespace = crds::naming::super_namespace(key, NAMESPACE);
    let annotations = json!({ANNOTATION_CLUSTER: key, ANNOTATION_NAMESPACE: NAMESPACE});
    let labels = tenant_labels(key);
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": namespace, "labels": labels, "annotations": annotations}}),
            )?,
        )
        .await?;
    // No controller-manager here: the pod's ServiceAccount, which admission looks up.
    create::<k8s_openapi::api::core::v1::ServiceAccount>(
        client,
        &namespace,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
    )
    .await?;
    let service: Service = create(
        client,
        &namespace,
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "labels": labels, "annotations": annotations},
            "spec": {"ports": [{"name": "http", "port": 80}]}}),
    )
    .await?;
    let ip = service.spec.and_then(|s| s.cluster_ip).context("cluster IP")?;
    Ok((namespace, ip))
}

/// The labels the syncer gives a tenant's super objects (vc-dns watches only objects with them): the
/// VirtualCluster `default/tenant` with cluster key `key`.
fn tenant_labels(key: &str) -> serde_json::Value {
    use crds::wellknown::{LABEL_CLUSTER, LABEL_VC_NAME, LABEL_VC_NAMESPACE};
    json!({LABEL_CLUSTER: key, LABEL_VC_NAME: "tenant", LABEL_VC_NAMESPACE: "default"})
}

/// A super pod of tenant `key` with address `ip`, as the syncer's copy looks once its kubelet reported it.
async fn super_pod_at(
    client: &Client,
    key: &str,
    namespace: &str,
    name: &str,
    ip: IpAddr,
) -> anyhow::Result<()> {
    use crds::wellknown::{ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": name, "labels": tenant_labels(key),
                "annotations": {ANNOTATION_CLUSTER: key, ANNOTATION_NAMESPACE: NAMESPACE}},
            "spec": {"nodeName": "nowhere", "containers": [{"name": "main", "image": "busybox"}]}
        }))?,
    )
    .await?;
    pods.patch_status(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip.to_string(),
            "podIPs": [{"ip": ip.to_string()}]}})),
    )
    .await?;
    Ok(())
}

/// One A query over UDP from `source`, sent once: a pod's resolver asks once and waits its timeout before
/// asking again (hickory's resolver, behind [`ask`], may send a query more than once, and each copy would
/// take a waiting slot). The reply's code and addresses.
async fn ask_once(
    server: SocketAddr,
    source: IpAddr,
    name: &str,
) -> anyhow::Result<(ResponseCode, Vec<String>)> {
    use hickory_proto::{
        op::{Message, Query},
        rr::Name,
    };
    let socket = tokio::net::UdpSocket::bind(SocketAddr::new(source, 0)).await?;
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(Name::from_ascii(name)?, RecordType::A));
    socket.send_to(&query.to_vec()?, server).await?;
    let mut buffer = vec![0u8; 4096];
    let (len, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buffer))
        .await
        .with_context(|| format!("no reply to {source}"))??;
    let reply = Message::from_vec(&buffer[..len])?;
    Ok((
        reply.metadata.response_code,
        reply.answers.iter().map(|r| r.data.to_string()).collect(),
    ))
}

/// What one flood did: the new pod's reply and how long it took, and how many of the flood's queries
/// waited (refused after the wait) or were refused at once.
struct FloodRound {
    newcomer: (ResponseCode, Vec<String>),
    took: Duration,
    waited: usize,
    refused_at_once: usize,
}

const FLOOD: u8 = 40;
const WAITERS: usize = 8;

/// vc-dns with `per_range` waiters per source range (and [`WAITERS`] in all) takes a flood of [`FLOOD`]
/// queries from range `127.0.<flood_range>.0/24`, addresses no pod has; a moment later a new pod of the
/// tenant at `newcomer` asks its first query, before vc-dns can have seen its address, and its copy's
/// address reaches the super cluster a moment after that.
async fn flood_round(
    client: &Client,
    key: &str,
    namespace: &str,
    per_range: usize,
    flood_range: u8,
    newcomer: IpAddr,
) -> anyhow::Result<FloodRound> {
    // An upstream is required; cluster.local is never forwarded, so nothing is ever sent to it.
    let mut settings = Settings::local(vec![SocketAddr::from(([127, 0, 0, 1], 9))]);
    settings.unknown_source_wait = Duration::from_millis(2000);
    settings.unknown_source_waiters = WAITERS;
    settings.unknown_source_ranges = vc_dns::server::RangeLimits {
        waiters: per_range,
        ..Default::default()
    };
    let dns = Dns::start(settings, client.clone(), vc_dns::Metrics::default()).await?;
    tokio::time::timeout(PATIENCE, dns.wait_ready())
        .await
        .context("vc-dns watches listing")??;
    let server = dns.local_addr();
    let web = "web.shop.svc.cluster.local.";
    let flood: Vec<_> = (1..=FLOOD)
        .map(|host| {
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = ask_once(server, IpAddr::from([127, 0, flood_range, host]), web).await;
                (reply, started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first_query = tokio::spawn(async move {
        let started = Instant::now();
        let reply = ask_once(server, newcomer, web).await;
        (reply, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    super_pod_at(
        client,
        key,
        namespace,
        &format!("newcomer-{flood_range}"),
        newcomer,
    )
    .await?;
    let (reply, took) = first_query.await?;
    let mut refused_at_once = 0;
    let mut waited = 0;
    for task in flood {
        let (reply, elapsed) = task.await?;
        let (code, _) = reply?;
        anyhow::ensure!(code == ResponseCode::Refused, "a flood query got {code}");
        if elapsed < Duration::from_millis(1000) {
            refused_at_once += 1;
        } else {
            waited += 1;
        }
    }
    Ok(FloodRound {
        newcomer: reply?,
        took,
        waited,
        refused_at_once,
    })
}

/// A new pod's first query is sent before vc-dns can know its address (issue 32, item 11): it waits for
/// the pod watch, in one of a bounded number of waiting slots. Pods of one tenant on one node (one source
/// range) flood vc-dns with queries from addresses it does not know, to hold every slot. With the per-range
/// cap off (as large as all the slots, as before item 11) the flood holds every slot and the new pod on
/// another node is REFUSED; with it, its range holds at most `--unknown-source-waiters-per-range`, the
/// rest of the flood is refused at once, and the new pod is answered.
#[tokio::test]
async fn a_flood_from_one_range_leaves_another_ranges_first_query_answered() -> anyhow::Result<()> {
    const TEST: &str = "a_flood_from_one_range_leaves_another_ranges_first_query_answered";
    if !local_cluster::require(TEST, &[Binary::Etcd, Binary::KubeApiserver]) {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let etcd = Arc::new(local_cluster::Etcd::start().await?);
    let super_cluster =
        local_cluster::ControlPlane::start_on(etcd, local_cluster::ControlPlaneOptions::bare("super"))
            .await?;
    let client = super_cluster.client();
    local_cluster::install_crds(&client).await?;
    let vc: crds::VirtualCluster = Api::<crds::VirtualCluster>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
                "metadata": {"name": "tenant"}, "spec": {"clusterVersionName": "cv"}}),
            )?,
        )
        .await?;
    let key = crds::naming::cluster_key_of(&vc).context("cluster key")?;
    let (namespace, web_ip) = tenant_namespace_in_super(&client, &key).await?;

    // The cap off: the flood takes every slot.
    let uncapped = flood_round(
        &client,
        &key,
        &namespace,
        WAITERS,
        1,
        IpAddr::from([127, 0, 2, 5]),
    )
    .await?;
    assert_eq!(
        uncapped.newcomer.0,
        ResponseCode::Refused,
        "without the per-range cap the flood holds every slot: {:?}",
        uncapped.newcomer
    );
    assert_eq!(uncapped.waited, WAITERS);

    const PER_RANGE: usize = 2;
    let capped = flood_round(
        &client,
        &key,
        &namespace,
        PER_RANGE,
        3,
        IpAddr::from([127, 0, 4, 5]),
    )
    .await?;
    assert_eq!(
        (capped.newcomer.0, capped.newcomer.1.clone()),
        (ResponseCode::NoError, vec![web_ip.clone()]),
        "the new pod's first query, sent while the flood held what it could (after {:.2} s; the flood: {} waited, {} refused at once)",
        capped.took.as_secs_f64(),
        capped.waited,
        capped.refused_at_once
    );
    assert_eq!(
        capped.waited, PER_RANGE,
        "the flood's range held its share of the waiting slots"
    );
    assert_eq!(capped.refused_at_once, usize::from(FLOOD) - PER_RANGE);
    println!(
        "a flood of {FLOOD} queries from one /24 ({WAITERS} waiting slots): without a per-range cap {} waited, {} were refused at once and the other range's new pod was refused after {:.2} s; with {PER_RANGE} per range {} waited, {} were refused at once and the new pod got its answer after {:.2} s",
        uncapped.waited,
        uncapped.refused_at_once,
        uncapped.took.as_secs_f64(),
        capped.waited,
        capped.refused_at_once,
        capped.took.as_secs_f64()
    );
    Ok(())
}
