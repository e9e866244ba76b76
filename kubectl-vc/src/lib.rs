//! `kubectl vc`, the kubectl plugin for VirtualClusters (binary `kubectl-vc`). It reads and writes the
//! super cluster's VirtualClusters, ClusterVersions and tenant Secrets; certificates and kubeconfigs go
//! through the PKI vc-manager uses too ([`tenant_pki::pki`], [`tenant_pki::kubeconfig`]).
//!
//! The binary parses [`Args`], connects with [`client`] and calls [`run`]; tests call the same two with a
//! client of their own and buffers for stdout and stderr.
//!
//! - [`args`]: the command line; [`duration`]: `90m`, `7d` and ages; [`error`]: one-line failures.
//! - [`manifest`]: `create -f` (parse, check kinds, server-side apply); [`progress`]: `--wait` on a watch.
//! - [`kubeconfig`]: tenant kubeconfigs with a reachable server; [`certs`]: per-user certificates.
//! - [`list`], [`describe`] ([`usage`] against quota), [`top`] (what tenants consume), [`delete`],
//!   [`pause`] (and resume); [`table`] and [`output`] format them.
//! - [`connect`]: a tenant context merged into a kubeconfig file ([`kubeconfig_file`]), through a
//!   port-forward ([`forward`]) when the tenant apiserver does not answer from here.
//! - [`snapshot`]: `snapshot create`, `restore` and `list` (etcd keys at one revision, PKI, checksums).
//! - [`completion`]: shell completion scripts and kubectl's plugin completion (`__complete`).
//! - [`uninstall`]: `uninstall prepare` and `release`, the chart's `helm uninstall` hooks.
//! - [`streams`]: results on stdout, warnings and progress on stderr.

pub mod args;
pub mod certs;
pub mod completion;
pub mod connect;
pub mod delete;
pub mod describe;
pub mod duration;
pub mod error;
pub mod forward;
pub mod kubeconfig;
pub mod kubeconfig_file;
pub mod list;
pub mod manifest;
pub mod output;
pub mod pause;
pub mod progress;
pub mod snapshot;
pub mod streams;
pub mod table;
pub mod top;
pub mod uninstall;
pub mod usage;

#[cfg(test)]
mod mock_tests;

use std::{future::Future, io::Write};

pub use args::{Args, Command, Global};
pub use error::{Error, Result};
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
pub use streams::Streams;

/// Connects to the super cluster as kubectl would: `--kubeconfig`, else `$KUBECONFIG`/`~/.kube/config`,
/// else the in-cluster service account; `--context` picks the context. The client's default namespace is
/// the context's namespace, else `default`.
pub async fn client(global: &Global) -> Result<Client> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..Default::default()
    };
    let failed = |message: String| Error::Config {
        path: global.kubeconfig.clone(),
        message,
    };
    let mut config = match &global.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| failed(e.to_string()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| failed(e.to_string()))?
        }
        None => match Kubeconfig::read() {
            Ok(kubeconfig) => Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| failed(e.to_string()))?,
            Err(read_error) if global.context.is_none() => Config::incluster().map_err(|in_cluster| {
                failed(format!(
                    "no kubeconfig ({read_error}) and not in a cluster ({in_cluster}); pass --kubeconfig"
                ))
            })?,
            Err(read_error) => return Err(failed(read_error.to_string())),
        },
    };
    vc_runtime::clients::with_user_agent(&mut config);
    Client::try_from(config).map_err(|e| failed(e.to_string()))
}

/// Runs a command against the super cluster behind `client`: results on `out`, warnings (and "nothing
/// found") on `err`, no progress lines; Ctrl-C ends `connect`'s port-forward. Every failure is an
/// [`Error`] whose message fits one line.
pub async fn run(
    args: &Args,
    client: Client,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<()> {
    run_with(args, client, Streams::new(out, err, false), interrupted()).await
}

/// Resolves at Ctrl-C or SIGTERM (a pod being stopped; never for a signal that cannot be listened for).
pub async fn interrupted() {
    let terminated = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let interrupted = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = terminated => {}
        () = interrupted => {}
    }
}

/// [`run`] with `streams` (progress on a terminal) and `interrupt`, which ends a foreground port-forward.
pub async fn run_with(
    args: &Args,
    client: Client,
    streams: Streams<'_>,
    interrupt: impl Future<Output = ()> + Send,
) -> Result<()> {
    let mut streams = if args.command.output().is_some() {
        streams.without_progress()
    } else {
        streams
    };
    let explicit = args.global.namespace.is_some();
    let namespace = args
        .global
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let io = &mut streams;
    // Each command's future is boxed: inlined, the largest of them made this one big enough to overflow
    // the stack of a test thread that runs commands in process (debug builds keep every arm's state).
    let result = match &args.command {
        Command::Create(create) => {
            Box::pin(manifest::command(&client, &namespace, explicit, create, io)).await
        }
        Command::Kubeconfig(kubeconfig) => {
            Box::pin(kubeconfig::command(&client, &namespace, kubeconfig, io)).await
        }
        Command::List(list) => {
            let scope = if list.all_namespaces {
                list::Scope::All
            } else {
                list::Scope::Namespace(namespace)
            };
            Box::pin(list::command(&client, scope, list, io)).await
        }
        Command::Describe(describe) => Box::pin(describe::command(&client, &namespace, describe, io)).await,
        Command::Top(top) => Box::pin(top::command(&client, &namespace, top, io)).await,
        Command::Delete(delete) => Box::pin(delete::command(&client, &namespace, delete, io)).await,
        Command::Pause(pause) => Box::pin(pause::command(&client, &namespace, pause, true, io)).await,
        Command::Resume(resume) => Box::pin(pause::command(&client, &namespace, resume, false, io)).await,
        Command::Connect(connect) => {
            Box::pin(connect::command(
                &client,
                &namespace,
                &args.global,
                connect,
                io,
                interrupt,
            ))
            .await
        }
        Command::Snapshot(snapshot) => {
            Box::pin(snapshot::command(
                &client,
                &namespace,
                &snapshot.command,
                io,
                interrupt,
            ))
            .await
        }
        Command::Completion(completion) => completion::script(completion.shell, io.out),
        Command::Uninstall(uninstall) => match &uninstall.command {
            args::UninstallCommand::Prepare(prepare) => {
                Box::pin(uninstall::prepare(&client, prepare, io)).await
            }
            args::UninstallCommand::Release(release) => {
                Box::pin(uninstall::release(&client, release, io)).await
            }
        },
    };
    streams.out.flush()?;
    result
}
