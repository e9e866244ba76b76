//! `kubectl vc connect NAME`: writes (or merges) a context for the tenant's admin into a kubeconfig file,
//! as vcluster's users expect. The tenant's kubeconfig is the one `kubectl vc kubeconfig` prints; whether
//! its server answers from here is checked (TLS verified against the tenant CA, `GET /version`, a few
//! seconds). When it does not (or `--port-forward always`), a port-forward to the tenant apiserver pod is
//! started, the context points at `https://127.0.0.1:<port>` with `tls-server-name` set to the Service's
//! name (which every tenant apiserver certificate carries), and the command stays in the foreground until
//! interrupted. The kubeconfig file is written only once the tenant apiserver has answered through the
//! address written.

use std::{future::Future, path::Path, time::Duration};

use crds::VirtualCluster;
use kube::{
    Client, Config, ResourceExt,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

use crate::{
    Error, Result, Streams,
    args::{ConnectArgs, Global, KubeconfigArgs, OutputFlag, PortForward},
    forward,
    kubeconfig::{self, InClusterEndpoint, Names, get_virtual_cluster, split_url},
    kubeconfig_file::{self, Change, Entry, EntryKind, Owner},
    output,
};

/// How long the check of an address may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(8);

/// The names written for `args`: `--context-name X` gives context and cluster `X`, user `X-admin`;
/// by default those of `kubectl vc kubeconfig` (`<namespace>-<name>`, `<namespace>-<name>-admin`).
pub fn names(namespace: &str, args: &ConnectArgs) -> Names {
    match &args.context_name {
        Some(name) => Names {
            cluster: name.clone(),
            user: format!("{name}-admin"),
            context: name.clone(),
        },
        None => Names::admin(namespace, &args.name),
    }
}

/// Whether the server of a single-context kubeconfig answers from here: `Ok(version)` when it answered
/// over TLS verified as the kubeconfig says (an HTTP error answer counts: the server is there), `Err(why)`
/// otherwise.
pub async fn check(config: &Kubeconfig) -> Result<String, String> {
    let mut settings = Config::from_custom_kubeconfig(config.clone(), &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    settings.connect_timeout = Some(Duration::from_secs(3));
    settings.read_timeout = Some(Duration::from_secs(5));
    vc_runtime::clients::with_user_agent(&mut settings);
    let client = Client::try_from(settings).map_err(|e| crate::error::api_message(&e))?;
    match tokio::time::timeout(CHECK_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(info)) => Ok(info.git_version),
        Ok(Err(kube::Error::Api(status))) => Ok(format!("answered {} {}", status.code, status.reason)),
        Ok(Err(error)) => Err(crate::error::api_message(&error)),
        Err(_) => Err(format!("no answer within {}s", CHECK_TIMEOUT.as_secs())),
    }
}

/// The server URL and `tls-server-name` of a single-context kubeconfig.
fn server_of(config: &Kubeconfig) -> (String, Option<String>) {
    let cluster = config.clusters.first().and_then(|c| c.cluster.as_ref());
    (
        cluster.and_then(|c| c.server.clone()).unwrap_or_default(),
        cluster.and_then(|c| c.tls_server_name.clone()),
    )
}

/// Points a single-context kubeconfig at `url`, verified against `tls_server_name`.
fn point_at(config: &mut Kubeconfig, url: &str, tls_server_name: Option<String>) {
    if let Some(cluster) = config.clusters.first_mut().and_then(|c| c.cluster.as_mut()) {
        cluster.server = Some(url.to_owned());
        cluster.tls_server_name = tls_server_name;
    }
}

/// The cluster, user and context of a single-context kubeconfig as entries to write.
pub fn entries(config: &Kubeconfig) -> Result<Vec<Entry>> {
    let document = serde_json::to_value(config).map_err(|e| Error::Serialize {
        what: "the tenant kubeconfig".into(),
        message: e.to_string(),
    })?;
    [EntryKind::Cluster, EntryKind::User, EntryKind::Context]
        .into_iter()
        .map(|kind| {
            let first = document
                .get(kind.list())
                .and_then(Value::as_array)
                .and_then(|list| list.first())
                .ok_or_else(|| Error::Kubeconfig {
                    origin: "the tenant".into(),
                    problem: format!("it has no {}", kind.body()),
                })?;
            Ok(Entry {
                kind,
                name: first["name"].as_str().unwrap_or_default().to_owned(),
                body: without_nulls(first.get(kind.body()).cloned().unwrap_or(Value::Null)),
            })
        })
        .collect()
}

/// `value` without `null` fields (kube writes absent options as null; kubectl writes nothing).
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// The port of `https://127.0.0.1:<port>` in the context `name` of the file, when it was written for
/// `owner` (the port a previous port-forward used).
pub fn previous_port(document: Option<&Value>, cluster: &str, owner: &Owner) -> Option<u16> {
    let body = kubeconfig_file::find(document?, EntryKind::Cluster, cluster)?;
    if kubeconfig_file::owner_of(body).as_ref() != Some(owner) {
        return None;
    }
    match split_url(body.get("server")?.as_str()?)? {
        (_, "127.0.0.1", Some(port)) => Some(port),
        _ => None,
    }
}

/// `cluster "x" added, user "x-admin" unchanged, ...`.
pub fn describe_changes(changes: &[(EntryKind, String, Change)]) -> String {
    changes
        .iter()
        .map(|(kind, name, change)| {
            let change = match change {
                Change::Added => "added",
                Change::Updated => "updated",
                Change::Unchanged => "unchanged",
            };
            format!("{} {name:?} {change}", kind.body())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the context reaches the tenant apiserver.
enum Route {
    /// At the address of the tenant kubeconfig (which answered with this version, if it did).
    Direct(Option<String>),
    /// Through a port-forward, because `why`.
    Forward { why: String },
}

/// `kubectl vc connect`.
pub async fn command(
    client: &Client,
    namespace: &str,
    global: &Global,
    args: &ConnectArgs,
    io: &mut Streams<'_>,
    interrupt: impl Future<Output = ()> + Send,
) -> Result<()> {
    let path = kubeconfig_file::target(
        args.write_kubeconfig.as_deref(),
        global.kubeconfig.as_deref(),
        std::env::var_os("KUBECONFIG").as_deref(),
        std::env::var_os("HOME").as_deref().map(Path::new),
    )?;
    let vc = get_virtual_cluster(client, namespace, &args.name).await?;
    let owner = Owner {
        namespace: namespace.to_owned(),
        name: args.name.clone(),
        uid: vc.uid().unwrap_or_default(),
    };
    let names = names(namespace, args);
    let reporting = Reporting {
        args,
        owner: &owner,
        path: &path,
        names: &names,
        // kubectl reads the file by itself only when it is the default one.
        explicit_file: args.write_kubeconfig.is_some() || global.kubeconfig.is_some(),
    };
    let admin = kubeconfig::admin(client, &vc, &names, &admin_args(&args.name)).await?;
    let mut config = admin.config;
    let (url, _) = server_of(&config);

    let route = match args.port_forward {
        PortForward::Always => Route::Forward {
            why: "--port-forward always".into(),
        },
        PortForward::Auto | PortForward::Never => {
            io.progress(&format!(
                "Checking whether {url} answers from here (TLS verified against the tenant's CA)..."
            ))?;
            match check(&config).await {
                Ok(version) => {
                    io.progress(&format!("{url} answers ({version})."))?;
                    Route::Direct(Some(version))
                }
                Err(why) if args.port_forward == PortForward::Never => {
                    io.warn(&format!(
                        "{url} does not answer from here ({why}); the context is written anyway (--port-forward never)"
                    ))?;
                    Route::Direct(None)
                }
                Err(why) => Route::Forward {
                    why: format!("{url} does not answer from here: {why}"),
                },
            }
        }
    };

    match route {
        Route::Direct(version) => {
            for warning in &admin.warnings {
                io.warn(warning)?;
            }
            let merged = write(&path, &config, &owner, args)?;
            report(io, &reporting, &config, &merged, version, None)?;
            Ok(())
        }
        Route::Forward { why } => {
            let endpoint = admin.endpoint.ok_or_else(|| unreachable_error(&vc, &url, &why))?;
            forward_and_wait(client, io, &reporting, &mut config, endpoint, &why, interrupt).await
        }
    }
}

/// The `kubectl vc kubeconfig` arguments of the admin kubeconfig (address discovered, no user).
fn admin_args(name: &str) -> KubeconfigArgs {
    KubeconfigArgs {
        name: name.to_owned(),
        server: None,
        tls_server_name: None,
        user: None,
        groups: Vec::new(),
        ttl: None,
        output: OutputFlag::default(),
    }
}

/// Why an adopted tenant (or one whose stored server is not its Service) cannot be port-forwarded to.
fn unreachable_error(vc: &VirtualCluster, url: &str, why: &str) -> Error {
    let what = if vc.adoption().is_some() {
        "VirtualCluster {vc} is adopted: its apiserver does not run in the super cluster, so kubectl vc cannot port-forward to it"
    } else {
        "the stored kubeconfig of VirtualCluster {vc} does not name the apiserver Service, so kubectl vc cannot port-forward to it"
    };
    let vc_ref = format!("{}/{}", vc.namespace().unwrap_or_default(), vc.name_any());
    Error::Unreachable(format!(
        "{} ({why}); connect from where {url} answers, or pass --port-forward never to write the context anyway",
        what.replace("{vc}", &vc_ref)
    ))
}

/// Merges the context into `path`.
fn write(
    path: &Path,
    config: &Kubeconfig,
    owner: &Owner,
    args: &ConnectArgs,
) -> Result<kubeconfig_file::Merged> {
    kubeconfig_file::update(path, &entries(config)?, owner, args.overwrite, args.switch)
}

/// What the report of a connect names.
struct Reporting<'a> {
    args: &'a ConnectArgs,
    owner: &'a Owner,
    path: &'a Path,
    names: &'a Names,
    explicit_file: bool,
}

/// Starts the port-forward, checks the apiserver answers through it, writes the context, and forwards until
/// `interrupt`.
async fn forward_and_wait(
    client: &Client,
    io: &mut Streams<'_>,
    reporting: &Reporting<'_>,
    config: &mut Kubeconfig,
    endpoint: InClusterEndpoint,
    why: &str,
    interrupt: impl Future<Output = ()> + Send,
) -> Result<()> {
    let Reporting {
        args,
        owner,
        path,
        names,
        ..
    } = *reporting;
    let target = forward::find_target(client, &endpoint).await?;
    let existing = kubeconfig_file::read(path).ok().flatten();
    let listener = forward::bind(
        args.local_port,
        previous_port(existing.as_ref(), &names.cluster, owner),
    )
    .await?;
    let mut forward = forward::start(client.clone(), endpoint.clone(), target.clone(), listener)?;
    let local = format!("https://127.0.0.1:{}", forward.local.port());
    io.progress(&format!("{why}; forwarding {local} to {target}..."))?;
    point_at(config, &local, Some(endpoint.host()));
    let version = match check(config).await {
        Ok(version) => version,
        Err(problem) => {
            let mut detail = problem;
            while let Ok(more) = forward.problems.try_recv() {
                detail.push_str("; ");
                detail.push_str(&more);
            }
            forward.stop().await;
            return Err(Error::PortForward(format!(
                "the tenant apiserver did not answer through {target}: {detail}"
            )));
        }
    };
    let merged = match write(path, config, owner, args) {
        Ok(merged) => merged,
        Err(error) => {
            forward.stop().await;
            return Err(error);
        }
    };
    let forwarding = json!({
        "address": forward.local.to_string(),
        "pod": format!("{}/{}", target.namespace, target.pod),
        "port": target.port,
        "reason": why,
    });
    report(io, reporting, config, &merged, Some(version), Some(forwarding))?;
    if args.output.output.is_none() {
        io.result(&format!(
            "Forwarding {} to {target} ({why}). Press Ctrl-C to stop.",
            forward.local
        ))?;
    }
    tokio::pin!(interrupt);
    loop {
        tokio::select! {
            _ = &mut interrupt => break,
            problem = forward.problems.recv() => match problem {
                Some(problem) => io.warn(&format!("port-forward: {problem}"))?,
                None => break,
            },
        }
    }
    let last = forward.target().await;
    forward.stop().await;
    io.progress(&format!(
        "Stopped forwarding to {last}; context {:?} works again once `kubectl vc connect {}` forwards again.",
        names.context, args.name
    ))?;
    Ok(())
}

/// Prints what was written: lines, or with `-o` one document.
fn report(
    io: &mut Streams<'_>,
    reporting: &Reporting<'_>,
    config: &Kubeconfig,
    merged: &kubeconfig_file::Merged,
    version: Option<String>,
    forwarding: Option<Value>,
) -> Result<()> {
    let Reporting {
        args,
        path,
        names,
        explicit_file,
        ..
    } = *reporting;
    let (server, tls_server_name) = server_of(config);
    if let Some(format) = args.output.output {
        let find = |kind| kubeconfig_file::find(&merged.document, kind, &names.cluster).cloned();
        let document = json!({
            "kubeconfig": path.display().to_string(),
            "context": {"name": names.context, "context": kubeconfig_file::find(&merged.document, EntryKind::Context, &names.context)},
            "cluster": {"name": names.cluster, "cluster": find(EntryKind::Cluster)},
            "user": names.user,
            "changes": merged.changes.iter().map(|(kind, name, change)| json!({"kind": kind.body(), "name": name, "change": change})).collect::<Vec<_>>(),
            "currentContext": merged.document.get("current-context"),
            "server": server,
            "tlsServerName": tls_server_name,
            "serverVersion": version,
            "portForward": forwarding,
        });
        io.out
            .write_all(output::serialize(&document, format, "the connection")?.as_bytes())?;
        io.out.flush()?;
        return Ok(());
    }
    io.result(&format!(
        "Wrote context {:?} to {}: {}.",
        names.context,
        path.display(),
        describe_changes(&merged.changes)
    ))?;
    if merged.switched {
        io.result(&format!("Switched to context {:?}.", names.context))?;
    }
    let kubeconfig_flag = if explicit_file {
        format!(" --kubeconfig {}", path.display())
    } else {
        String::new()
    };
    let answered = version.map(|v| format!(" ({v})")).unwrap_or_default();
    io.result(&format!(
        "The tenant apiserver answers at {server}{answered}: kubectl{kubeconfig_flag} --context {} get namespaces",
        names.context
    ))?;
    Ok(())
}
