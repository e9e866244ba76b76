//! Hard multi-tenancy, round two (issue 32): attacks by a hostile tenant or VirtualCluster editor, each
//! written as the attacker would try it, against real etcd and kube-apiserver processes with vc-manager and
//! the syncer running in process:
//!
//! - `a_kubeconfig_secret_must_be_meant_for_its_virtual_cluster` (item 2): an editor points
//!   `kubeconfigSecretRef` at a Secret of the namespace that holds another cluster's credentials, or one
//!   meant for another VirtualCluster; vc-manager and the syncer refuse it (`KubeconfigSecretRefused`, naming
//!   the Secret and the label that would allow it), nothing is synced, `kubectl vc kubeconfig` prints
//!   nothing; once whoever owns the Secret labels it, the tenant is adopted.
//! - `no_component_echoes_the_bytes_of_a_kubeconfig_secret` (item 2): Secrets whose bytes break the
//!   kubeconfig parsers at a recognisable marker (YAML, context names, base64, PEM); no condition, event or
//!   `kubectl vc` error carries a byte of it.
//! - `endpoints_stop_leading_to_a_pod_that_ended` (item 3): a tenant's selector-less Endpoints lead to its
//!   pod; when that pod ends, the super copy stops leading to the address at once (the patrol is an hour
//!   away here), so the address cannot lead to whoever gets it next.
//! - `an_apiserver_that_never_stops_answering_is_cut_off` (item 5): adopted "apiservers" that answer a list
//!   with an endless body, or a watch with an endless line; the syncer cuts each at its limit, detaches the
//!   tenant with `TenantResponseTooLarge`, and another tenant syncs on in normal time.
//! - `a_tenant_that_never_becomes_ready_writes_nothing` (item 12): a native VirtualCluster whose apiserver
//!   never answers, and an adopted one whose apiserver is gone; vc-manager's and the syncer's writes to the
//!   super apiserver are counted over a minute of steady state (printed).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::vc_manager_support::{RunningManager, condition, fast_settings, init_logging, wait_vc};
use anyhow::Context as _;
use base64::{Engine, engine::general_purpose::STANDARD};
use clap::Parser;
use crds::{
    KubeconfigSecretRef, VirtualCluster, VirtualClusterSpec,
    wellknown::{CONDITION_APISERVER_READY, CONDITION_TENANT_SYNCED},
};
use futures::StreamExt;
use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{ConfigMap, Endpoints, Namespace, Pod, Secret, ServiceAccount},
        events::v1::Event,
    },
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, Etcd,
    tenancy::{Tenancy, TenancyOptions, TenantMaster, VC_NAMESPACE},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver];
const PATIENCE: Duration = Duration::from_secs(60);
/// What hostile Secrets carry where the parsers stumble.
const MARKER: &str = "SECRETMARKER7f3a";
// Spelled out rather than imported, so that this file also builds against the code before issue 32.
const LABEL_KUBECONFIG_FOR: &str = "tenancy.x-k8s.io/kubeconfig-for";
const REASON_REFUSED: &str = "KubeconfigSecretRefused";

fn syncer_config(flags: &[&str]) -> anyhow::Result<SyncerConfig> {
    let args = syncer::Args::try_parse_from(
        [
            "syncer",
            "--patrol-interval-seconds=3600",
            "--tenant-health-period-seconds=2",
            "--downward-workers=4",
            "--upward-workers=4",
            "--token-ttl-seconds=600",
        ]
        .iter()
        .chain(flags),
    )?;
    SyncerConfig::try_from(args.syncer).map_err(anyhow::Error::msg)
}

async fn start_syncer(client: Client, flags: &[&str]) -> anyhow::Result<Syncer> {
    Ok(Syncer::start(
        client,
        syncer_config(flags)?,
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?)
}

/// A super cluster (apiserver on its own etcd) with the CRDs installed.
async fn super_cluster() -> anyhow::Result<(Arc<Etcd>, ControlPlane)> {
    let etcd = Arc::new(Etcd::start().await?);
    let super_cluster = ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("super")).await?;
    local_cluster::install_crds(&super_cluster.client()).await?;
    Ok((etcd, super_cluster))
}

fn adopting(name: &str, secret: &str) -> VirtualCluster {
    VirtualCluster::new(
        name,
        VirtualClusterSpec {
            kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                name: secret.into(),
                key: "value".into(),
            }),
            ..Default::default()
        },
    )
}

/// A Secret with `value` under key `value`, labelled as meant for VirtualCluster `meant_for`.
fn kubeconfig_secret(name: &str, value: &[u8], meant_for: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: meant_for.map(|vc| [(LABEL_KUBECONFIG_FOR.to_owned(), vc.to_owned())].into()),
            ..Default::default()
        },
        data: Some([("value".to_owned(), ByteString(value.to_vec()))].into()),
        ..Default::default()
    }
}

async fn create<K>(api: &Api<K>, object: &K) -> anyhow::Result<K>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .with_context(|| format!("creating {}", object.meta().name.clone().unwrap_or_default()))
}

/// `kubectl vc <args>` in process: its output, or its error as one line.
async fn kubectl_vc(client: Client, args: &[&str]) -> anyhow::Result<Result<String, String>> {
    let args = kubectl_vc::Args::try_parse_from(["kubectl-vc", "-n", VC_NAMESPACE].iter().chain(args))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = kubectl_vc::run(&args, client, &mut out, &mut err).await;
    Ok(match result {
        Ok(()) => Ok(String::from_utf8(out)?),
        Err(error) => Err(error.one_line()),
    })
}

/// Waits until condition `type_` of VirtualCluster `name` has `reason`; returns its message.
async fn reason_of(
    vcs: &Api<VirtualCluster>,
    name: &str,
    type_: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let vc = wait_vc(vcs, name, PATIENCE, &format!("{type_} {reason}"), |vc| {
        condition(vc, type_).is_some_and(|c| c.reason == reason)
    })
    .await?;
    Ok(condition(&vc, type_).context("condition")?.message.clone())
}

/// Everything the components told about VirtualCluster `name`: its status and the notes of events about it.
async fn told_about(client: &Client, name: &str) -> anyhow::Result<String> {
    let vc = Api::<VirtualCluster>::namespaced(client.clone(), VC_NAMESPACE)
        .get(name)
        .await?;
    let mut told = serde_json::to_string(&vc.status)?;
    for event in Api::<Event>::namespaced(client.clone(), VC_NAMESPACE)
        .list(&Default::default())
        .await?
        .items
    {
        if event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) {
            told.push_str(&format!(
                " {} {}",
                event.reason.unwrap_or_default(),
                event.note.unwrap_or_default()
            ));
        }
    }
    Ok(told)
}

/// An editor of VirtualClusters in the platform's namespace, who may not read its Secrets, points two
/// VirtualClusters at Secrets there: the platform's own credentials for another cluster (unlabelled), and
/// the kubeconfig meant for another tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kubeconfig_secret_must_be_meant_for_its_virtual_cluster() -> anyhow::Result<()> {
    if !local_cluster::require("a_kubeconfig_secret_must_be_meant_for_its_virtual_cluster", NEEDS) {
        return Ok(());
    }
    init_logging();
    let (etcd, super_cluster) = super_cluster().await?;
    let victim = ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("victim")).await?;
    create(
        &Api::<Namespace>::all(victim.client()),
        &serde_json::from_value(json!({"metadata": {"name": "payroll"}}))?,
    )
    .await?;
    let client = super_cluster.client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let kubeconfig = victim.apiserver().admin_kubeconfig();
    create(
        &secrets,
        &kubeconfig_secret("ci-credentials", kubeconfig.as_bytes(), None),
    )
    .await?;
    create(
        &secrets,
        &kubeconfig_secret("team-a-kubeconfig", kubeconfig.as_bytes(), Some("team-a")),
    )
    .await?;
    let _manager = RunningManager::start(client.clone(), fast_settings(), None).await?;
    let _syncer = start_syncer(client.clone(), &[]).await?;

    // The attack.
    create(&vcs, &adopting("intruder", "ci-credentials")).await?;
    create(&vcs, &adopting("borrower", "team-a-kubeconfig")).await?;

    for (name, secret, says) in [
        (
            "intruder",
            "ci-credentials",
            format!("{LABEL_KUBECONFIG_FOR}=intruder"),
        ),
        ("borrower", "team-a-kubeconfig", "\"team-a\"".to_owned()),
    ] {
        let refused = reason_of(&vcs, name, CONDITION_APISERVER_READY, REASON_REFUSED).await?;
        assert!(refused.contains(&format!("{VC_NAMESPACE}/{secret}")), "{refused}");
        assert!(refused.contains(&says), "{refused}");
        let synced = reason_of(&vcs, name, CONDITION_TENANT_SYNCED, REASON_REFUSED).await?;
        assert!(synced.contains(&says), "{synced}");
        let vc = vcs.get(name).await?;
        let key = crds::naming::cluster_key_of(&vc).context("key")?;
        assert!(
            Api::<Namespace>::all(client.clone())
                .get_opt(&crds::naming::super_namespace(&key, "payroll"))
                .await?
                .is_none(),
            "the victim's namespace was synced as {name}'s"
        );
        let printed = kubectl_vc(client.clone(), &["kubeconfig", name]).await?;
        match printed {
            Ok(out) => anyhow::bail!("kubectl vc printed a kubeconfig for {name}:\n{out}"),
            Err(error) => {
                assert!(error.contains(&says), "{error}");
                assert!(!error.contains(victim.apiserver().url()), "{error}");
            }
        }
    }
    let told = told_about(&client, "intruder").await?;
    assert!(told.contains(REASON_REFUSED), "no event: {told}");

    // Whoever may write the Secret says it is meant for the intruder: now it is adopted (the migration
    // step for existing adopted tenants).
    secrets
        .patch(
            "ci-credentials",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL_KUBECONFIG_FOR: "intruder"}}})),
        )
        .await?;
    reason_of(&vcs, "intruder", CONDITION_TENANT_SYNCED, "TenantAttached").await?;
    Ok(())
}

/// Kubeconfig Secrets (each meant for its VirtualCluster) whose bytes break a parser at a marker.
fn echo_cases() -> Vec<(&'static str, String)> {
    let encoded = |text: &str| STANDARD.encode(text);
    let config = |cluster: &str, user: &str, context: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{{cluster}}}}}]\nusers: [{{name: u, user: {{{user}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: {context}\n"
        )
    };
    let server = "server: 'https://127.0.0.1:1'";
    let pem = |kind: &str| {
        encoded(&format!(
            "-----BEGIN {kind}-----\n{MARKER}\n-----END {kind}-----\n"
        ))
    };
    vec![
        ("scalar", MARKER.to_owned()),
        ("mapping", format!("{MARKER}: [unclosed")),
        ("context", config(server, "token: t", MARKER)),
        (
            "authority",
            config(
                &format!("{server}, certificate-authority-data: {}", pem("CERTIFICATE")),
                "token: t",
                "x",
            ),
        ),
        (
            "base64",
            config(
                &format!("{server}, certificate-authority-data: '{MARKER}!'"),
                "token: t",
                "x",
            ),
        ),
        (
            "key",
            config(
                server,
                &format!(
                    "client-certificate-data: {}, client-key-data: {}",
                    pem("CERTIFICATE"),
                    pem("PRIVATE KEY")
                ),
                "x",
            ),
        ),
    ]
}

/// An editor (with write access to the Secrets too, or a tenant whose kubeconfig Secret it can write)
/// makes the components read Secrets whose bytes break the kubeconfig parsers at a marker, to read the
/// Secrets back from whatever the components report (conditions, events, `kubectl vc` errors), which more
/// people can read than the Secrets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_component_echoes_the_bytes_of_a_kubeconfig_secret() -> anyhow::Result<()> {
    if !local_cluster::require("no_component_echoes_the_bytes_of_a_kubeconfig_secret", NEEDS) {
        return Ok(());
    }
    init_logging();
    let (_etcd, super_cluster) = super_cluster().await?;
    let client = super_cluster.client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let _manager = RunningManager::start(client.clone(), fast_settings(), None).await?;
    let _syncer = start_syncer(client.clone(), &[]).await?;
    let cases = echo_cases();
    for (name, value) in &cases {
        let secret = format!("{name}-kubeconfig");
        create(
            &secrets,
            &kubeconfig_secret(&secret, value.as_bytes(), Some(name)),
        )
        .await?;
        create(&vcs, &adopting(name, &secret)).await?;
    }
    let fragments = [MARKER, &MARKER[..7], &MARKER[7..]];
    for (name, _) in &cases {
        wait_vc(
            &vcs,
            name,
            PATIENCE,
            "refused by vc-manager and the syncer",
            |vc| {
                condition(vc, CONDITION_APISERVER_READY).is_some_and(|c| c.status == "False")
                    && condition(vc, CONDITION_TENANT_SYNCED).is_some_and(|c| c.status == "False")
            },
        )
        .await?;
        let mut told = told_about(&client, name).await?;
        if let Err(error) = kubectl_vc(client.clone(), &["kubeconfig", name]).await? {
            told.push_str(&error);
        }
        for fragment in fragments {
            assert!(
                !told.contains(fragment),
                "{name}: the Secret's bytes are echoed: {told}"
            );
        }
    }
    Ok(())
}

fn from_json<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> anyhow::Result<K> {
    Ok(serde_json::from_value(value)?)
}

async fn tenant_namespace(tenant: &TenantMaster, name: &str) -> anyhow::Result<()> {
    create(
        &Api::<Namespace>::all(tenant.client()),
        &from_json(json!({"metadata": {"name": name}}))?,
    )
    .await?;
    create(
        &Api::<ServiceAccount>::namespaced(tenant.client(), name),
        &from_json(json!({"metadata": {"name": "default"}}))?,
    )
    .await?;
    Ok(())
}

/// The addresses of a super Endpoints copy.
fn addresses(endpoints: &Endpoints) -> Vec<String> {
    endpoints
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .map(|a| a.ip.clone())
        .collect()
}

/// A tenant's selector-less Endpoints lead to its own pod; the pod ends (its address is free for the next
/// pod the node starts, any tenant's). The Endpoints must stop leading there now, not at the next patrol.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endpoints_stop_leading_to_a_pod_that_ended() -> anyhow::Result<()> {
    if !local_cluster::require("endpoints_stop_leading_to_a_pod_that_ended", NEEDS) {
        return Ok(());
    }
    init_logging();
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let tenant = tenancy.tenant("tenant-0");
    let _syncer = start_syncer(tenancy.super_client(), &[]).await?;
    tenant_namespace(tenant, "shop").await?;
    create(
        &Api::<Pod>::namespaced(tenant.client(), "shop"),
        &from_json(json!({"metadata": {"name": "job"},
            "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main", "image": "busybox"}]}}))?,
    )
    .await?;
    let super_pods: Api<Pod> = Api::namespaced(tenancy.super_client(), &tenant.super_namespace("shop"));
    let address = wait::until(PATIENCE, "the super pod's address", || {
        let pods = super_pods.clone();
        async move { pods.get_opt("job").await.ok().flatten()?.status?.pod_ip }
    })
    .await?;
    create(
        &Api::<k8s_openapi::api::core::v1::Service>::namespaced(tenant.client(), "shop"),
        &from_json(json!({"metadata": {"name": "relay"}, "spec": {"ports": [{"port": 80}]}}))?,
    )
    .await?;
    create(
        &Api::<Endpoints>::namespaced(tenant.client(), "shop"),
        &from_json(json!({"metadata": {"name": "relay"},
            "subsets": [{"addresses": [{"ip": address}], "ports": [{"port": 80}]}]}))?,
    )
    .await?;
    let super_endpoints: Api<Endpoints> =
        Api::namespaced(tenancy.super_client(), &tenant.super_namespace("shop"));
    wait::until(PATIENCE, "the super copy leads to the pod", || {
        let api = super_endpoints.clone();
        let address = address.clone();
        async move {
            let copy = api.get_opt("relay").await.ok().flatten()?;
            addresses(&copy).contains(&address).then_some(())
        }
    })
    .await?;

    // The pod ends, as its kubelet reports it.
    super_pods
        .patch_status(
            "job",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await?;
    let ended = Instant::now();
    wait::until(
        Duration::from_secs(15),
        "the super copy no longer leads to the ended pod",
        || {
            let api = super_endpoints.clone();
            let address = address.clone();
            async move {
                let copy = api.get_opt("relay").await.ok().flatten()?;
                (!addresses(&copy).contains(&address)).then_some(())
            }
        },
    )
    .await?;
    println!(
        "endpoints: the copy stopped leading to the ended pod {:.1} s after it ended",
        ended.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Bytes a fake apiserver sent on its endless responses, and the most one response sent.
#[derive(Default)]
pub(crate) struct Streamed {
    pub(crate) total: AtomicU64,
    pub(crate) most: AtomicU64,
}

/// What a fake tenant apiserver does with the syncer's requests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hostility {
    /// Lists of ConfigMaps never end.
    EndlessBody,
    /// A watch of ConfigMaps sends one line that never ends.
    EndlessLine,
    /// Lists of ConfigMaps are legal, and about this many bytes: 4 KiB ConfigMaps of names of their own.
    HugeList(u64),
}

/// A fake adopted apiserver over TLS: answers what attaching asks, lists everything as empty and holds
/// watches open, except for ConfigMaps, which it answers as `hostility` says, counting what it sent.
pub(crate) async fn hostile_apiserver(
    hostility: Hostility,
    streamed: Arc<Streamed>,
) -> anyhow::Result<(String, String)> {
    use axum::{Router, body::Body, extract::Request, response::Response};
    use hyper_util::{
        rt::{TokioExecutor, TokioIo},
        server::conn::auto,
        service::TowerToHyperService,
    };
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

    let ca = local_cluster::pki::CertificateAuthority::new("hostile")?;
    let serving = ca.issue("hostile", &[], &["127.0.0.1"], local_cluster::pki::Usage::Server)?;
    let certs = CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();

    let handler = move |request: Request| {
        let streamed = streamed.clone();
        async move {
            let path = request.uri().path().to_owned();
            let watch = request
                .uri()
                .query()
                .is_some_and(|q| q.contains("watch=true") || q.contains("watch=1"));
            let json = |value: serde_json::Value| {
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from(value.to_string()))
                    .expect("response")
            };
            if path == "/version" {
                return json(
                    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.3", "gitCommit": "x",
                    "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                    "compiler": "gc", "platform": "linux/amd64"}),
                );
            }
            if path == "/api/v1/namespaces/kube-system" {
                return json(json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "kube-system", "uid": "hostile-kube-system", "resourceVersion": "1"}}));
            }
            if let (Hostility::HugeList(bytes), true, false) =
                (hostility, path.ends_with("/configmaps"), watch)
            {
                return Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from_stream(huge_list(bytes, streamed.clone())))
                    .expect("response");
            }
            let endless = path.ends_with("/configmaps")
                && match hostility {
                    Hostility::EndlessBody => !watch,
                    Hostility::EndlessLine => watch,
                    Hostility::HugeList(_) => false,
                };
            if endless {
                let (head, unit): (String, String) = match hostility {
                    Hostility::HugeList(_) => unreachable!("answered above"),
                    Hostility::EndlessBody => (
                        r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"1"},"items":["#.into(),
                        format!(r#"{{"metadata":{{"name":"x","namespace":"default"}},"data":{{"k":"{}"}}}},"#, "v".repeat(4000)),
                    ),
                    Hostility::EndlessLine => (
                        r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default","resourceVersion":"2"},"data":{"k":""#.into(),
                        "v".repeat(4096),
                    ),
                };
                let chunk = bytes::Bytes::from(unit.repeat(16));
                let guard = Arc::new(AtomicU64::new(0));
                let stream =
                    futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(head)) })
                        .chain(futures::stream::repeat(chunk).map(move |chunk| {
                            let sent =
                                guard.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
                            streamed.total.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            streamed.most.fetch_max(sent, Ordering::Relaxed);
                            Ok(chunk)
                        }));
                return Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from_stream(stream))
                    .expect("response");
            }
            if watch {
                // Held open, silent.
                let stream = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
                return Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from_stream(stream))
                    .expect("response");
            }
            json(
                json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}),
            )
        }
    };
    let router = Router::new().fallback(handler);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                        .await;
                }
            });
        }
    });
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: h, cluster: {{server: 'https://127.0.0.1:{port}', certificate-authority-data: {}}}}}]\nusers: [{{name: h, user: {{token: t}}}}]\ncontexts: [{{name: h, context: {{cluster: h, user: h}}}}]\ncurrent-context: h\n",
        STANDARD.encode(ca.cert_pem())
    );
    Ok((kubeconfig, format!("https://127.0.0.1:{port}")))
}

/// A legal ConfigMap list of about `bytes`, in chunks of 16 ConfigMaps with names of their own.
fn huge_list(
    bytes: u64,
    streamed: Arc<Streamed>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send {
    let head = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"1"},"items":["#;
    let data = "v".repeat(4000);
    let per_chunk = 16u64;
    let chunk_bytes = per_chunk * (data.len() as u64 + 80);
    let chunks = bytes.div_ceil(chunk_bytes).max(1);
    let sent = Arc::new(AtomicU64::new(0));
    futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(head)) })
        .chain(futures::stream::iter(0..chunks).map(move |chunk| {
            let mut text = String::with_capacity(chunk_bytes as usize);
            for i in 0..per_chunk {
                let n = chunk * per_chunk + i;
                let last = chunk + 1 == chunks && i + 1 == per_chunk;
                text.push_str(&format!(
                    r#"{{"metadata":{{"name":"cm-{n}","namespace":"default","uid":"u-{n}","resourceVersion":"1"}},"data":{{"k":"{data}"}}}}{}"#,
                    if last { "]}" } else { "," }
                ));
            }
            let len = text.len() as u64;
            let total = sent.fetch_add(len, Ordering::Relaxed) + len;
            streamed.total.fetch_add(len, Ordering::Relaxed);
            streamed.most.fetch_max(total, Ordering::Relaxed);
            Ok(bytes::Bytes::from(text))
        }))
}

/// Peak resident memory of this process (VmHWM), in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A VirtualCluster editor adopts "apiservers" of its own making: one answers a list with a body that
/// never ends, the other a watch with a line that never ends, to grow the shared syncer's memory until it
/// is killed (and every replica after it). Another tenant works on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_apiserver_that_never_stops_answering_is_cut_off() -> anyhow::Result<()> {
    if !local_cluster::require("an_apiserver_that_never_stops_answering_is_cut_off", NEEDS) {
        return Ok(());
    }
    init_logging();
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let client = tenancy.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let limit: u64 = 8 * 1024 * 1024;
    let line: u64 = 1024 * 1024;
    let peak_before = peak_rss_mib();
    let _syncer = start_syncer(
        client.clone(),
        &[
            &format!("--tenant-response-max-bytes={limit}"),
            &format!("--tenant-watch-line-max-bytes={line}"),
        ],
    )
    .await?;
    let other = tenancy.tenant("tenant-0");
    tenant_namespace(other, "shop").await?;

    let mut streams = Vec::new();
    for (name, hostility) in [
        ("endless-body", Hostility::EndlessBody),
        ("endless-line", Hostility::EndlessLine),
    ] {
        let streamed = Arc::new(Streamed::default());
        let (kubeconfig, _) = hostile_apiserver(hostility, streamed.clone()).await?;
        tenancy
            .register(name, &kubeconfig, VirtualClusterSpec::default())
            .await?;
        streams.push((name, streamed));
    }
    for (name, streamed) in &streams {
        let message = match reason_of(&vcs, name, CONDITION_TENANT_SYNCED, "TenantResponseTooLarge").await {
            Ok(message) => message,
            Err(error) => anyhow::bail!(
                "{name}: not cut off ({error}); one response sent {:.0} MiB, {:.0} MiB in all; peak resident memory of the test process {:.0} MiB (before the syncer started: {peak_before:.0} MiB)",
                streamed.most.load(Ordering::Relaxed) as f64 / 1048576.0,
                streamed.total.load(Ordering::Relaxed) as f64 / 1048576.0,
                peak_rss_mib()
            ),
        };
        assert!(
            message.contains("--tenant-response-max-bytes"),
            "{name}: {message}"
        );
    }
    // The other tenant syncs in normal time while the attack goes on.
    let started = Instant::now();
    create(
        &Api::<ConfigMap>::namespaced(other.client(), "shop"),
        &from_json(json!({"metadata": {"name": "order"}, "data": {"k": "v"}}))?,
    )
    .await?;
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), &other.super_namespace("shop"));
    wait::until(
        Duration::from_secs(10),
        "the other tenant's ConfigMap synced",
        || {
            let copies = copies.clone();
            async move { copies.get_opt("order").await.ok().flatten() }
        },
    )
    .await?;
    let other_took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (name, streamed) in &streams {
        let most = streamed.most.load(Ordering::Relaxed);
        let total = streamed.total.load(Ordering::Relaxed);
        // What one response could push before it was cut: the limit, plus what the sockets, TLS and
        // HTTP/2 windows hold in flight.
        assert!(
            most < limit + 16 * 1024 * 1024,
            "{name}: one response sent {most} bytes"
        );
        println!(
            "{name}: one response cut after {:.1} MiB (limit {} MiB held at once, {} MiB per watch line); {:.1} MiB sent over every attempt",
            most as f64 / 1048576.0,
            limit / 1048576,
            line / 1048576,
            total as f64 / 1048576.0
        );
    }
    println!(
        "peak resident memory of the test process: {:.0} MiB before the syncer started, {:.0} MiB after the attack; the other tenant synced in {:.2} s",
        peak_before,
        peak_rss_mib(),
        other_took.as_secs_f64()
    );
    Ok(())
}

/// Counts the writes (every method but GET) a client sends, by `METHOD path`.
type WriteLog = Arc<Mutex<Vec<String>>>;

async fn counting_client(cluster: &ControlPlane) -> anyhow::Result<(Client, WriteLog)> {
    let kubeconfig = kube::config::Kubeconfig::read_from(cluster.apiserver().kubeconfig_path())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let log: WriteLog = Arc::default();
    let counted = log.clone();
    let layer = tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
        if request.method() != http::Method::GET {
            counted
                .lock()
                .expect("log")
                .push(format!("{} {}", request.method(), request.uri().path()));
        }
        request
    });
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build();
    Ok((client, log))
}

/// Writes logged since `from`, grouped by `METHOD path` (for the report).
fn grouped(log: &WriteLog, from: usize) -> (usize, Vec<(String, usize)>) {
    let writes = log.lock().expect("log")[from..].to_vec();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for write in &writes {
        *counts.entry(write.clone()).or_default() += 1;
    }
    (writes.len(), counts.into_iter().collect())
}

/// An editor makes VirtualClusters that never become ready, to keep the super apiserver busy for everyone:
/// a native one whose apiserver never answers (its pods run, nothing serves), and an adopted one whose
/// apiserver is gone. Over a minute of steady state vc-manager and the syncer write next to nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_that_never_becomes_ready_writes_nothing() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_tenant_that_never_becomes_ready_writes_nothing",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    init_logging();
    let cluster = ControlPlane::start(ControlPlaneOptions::super_cluster()).await?;
    let client = cluster.client();
    local_cluster::install_crds(&client).await?;
    let _nodes = local_cluster::NodeSimulator::start(
        &cluster,
        local_cluster::NodeSimulatorOptions {
            kubelet: false,
            ..Default::default()
        },
    )
    .await?;
    let examples = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    local_cluster::apply::apply_yaml(
        &client,
        &std::fs::read_to_string(examples.join("clusterversion-clusterip.yaml"))?,
        "default",
    )
    .await?;
    create(
        &Api::<Namespace>::all(client.clone()),
        &from_json(json!({"metadata": {"name": VC_NAMESPACE}}))?,
    )
    .await
    .ok();
    let (manager_client, manager_writes) = counting_client(&cluster).await?;
    let (syncer_client, syncer_writes) = counting_client(&cluster).await?;
    let mut settings = fast_settings();
    // As in production: Running only once the apiserver answers (here it never does: nothing serves), and
    // failed reconciles retried up to the default 300 s apart (the adopted tenant's, which fail each time).
    settings.native_readiness = vc_manager::NativeReadiness::ApiserverAnswers;
    settings.backoff_max = Duration::from_secs(300);
    let _manager = RunningManager::start(manager_client, settings, None).await?;
    let _syncer = start_syncer(syncer_client, &[]).await?;
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    create(
        &vcs,
        &from_json(json!({"apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": "silent"},
            "spec": {"clusterVersionName": "cv-v1-33-clusterip", "serviceCidr": "10.32.0.0/16", "pkiExpireDays": 90}}))?,
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let gone = "apiVersion: v1\nkind: Config\nclusters: [{name: g, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\nusers: [{name: g, user: {token: t}}]\ncontexts: [{name: g, context: {cluster: g, user: g}}]\ncurrent-context: g\n";
    create(
        &secrets,
        &kubeconfig_secret("gone-kubeconfig", gone.as_bytes(), Some("gone")),
    )
    .await?;
    create(&vcs, &adopting("gone", "gone-kubeconfig")).await?;

    // Steady state: the native tenant's StatefulSets run and its apiserver does not answer; the adopted
    // one is reported unreachable by the syncer.
    wait_vc(
        &vcs,
        "silent",
        Duration::from_secs(120),
        "control plane up, apiserver silent",
        |vc| {
            [
                crds::wellknown::CONDITION_ETCD_READY,
                crds::wellknown::CONDITION_APISERVER_READY,
                crds::wellknown::CONDITION_CONTROLLER_MANAGER_READY,
            ]
            .iter()
            .all(|type_| condition(vc, type_).is_some_and(|c| c.status == "True"))
                && condition(vc, crds::wellknown::CONDITION_READY).is_some_and(|c| c.status == "False")
        },
    )
    .await?;
    reason_of(&vcs, "gone", CONDITION_TENANT_SYNCED, "TenantUnreachable").await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (from_manager, from_syncer) = (
        manager_writes.lock().expect("log").len(),
        syncer_writes.lock().expect("log").len(),
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (manager, manager_by_path) = grouped(&manager_writes, from_manager);
    let (syncer, syncer_by_path) = grouped(&syncer_writes, from_syncer);
    println!(
        "writes per minute from a tenant that never becomes ready: vc-manager {manager} {manager_by_path:?}; syncer {syncer} {syncer_by_path:?}"
    );
    // Nothing is applied again; what is left are the event-series updates of the adopted tenant's failing
    // reconciles, whose retries back off to --backoff-max-seconds.
    assert!(
        manager_by_path
            .iter()
            .all(|(path, _)| path.contains("/events/") || path.ends_with("/status")),
        "vc-manager applied objects again: {manager_by_path:?}"
    );
    assert!(
        manager <= 5,
        "vc-manager wrote {manager} times in a minute: {manager_by_path:?}"
    );
    assert!(
        syncer <= 2,
        "the syncer wrote {syncer} times in a minute: {syncer_by_path:?}"
    );
    Ok(())
}
