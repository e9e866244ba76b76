//! Shell completion.
//!
//! - `kubectl vc completion bash|zsh|fish|powershell|elvish` prints a script (clap_complete) for the
//!   binary typed as `kubectl-vc`.
//! - `kubectl vc <TAB>` goes through kubectl (1.26 and later): it runs `kubectl_complete-vc` from `PATH`
//!   with the words after `vc` (the last one the word being completed, empty for a new word) and reads
//!   cobra's protocol: one candidate a line (`value<TAB>description`), then `:<directive>`. The
//!   `kubectl-vc` binary answers that itself when it is called as `kubectl_complete-vc` (a link to it) or
//!   as `kubectl-vc __complete <words...>`: commands, flags, flag values, and the names of VirtualClusters,
//!   namespaces and contexts, read from the super cluster with a short timeout.

use std::{ffi::OsString, io::Write, path::Path, time::Duration};

use clap::{Arg, CommandFactory, ValueHint};
use crds::VirtualCluster;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, ResourceExt, api::ListParams, config::Kubeconfig};

use crate::{Args, Global, Result};

/// The hidden command of cobra's completion protocol.
pub const COMPLETE: &str = "__complete";

/// The file name kubectl looks for on `PATH` to complete `kubectl vc`.
pub const PLUGIN_COMPLETER: &str = "kubectl_complete-vc";

/// cobra's directive: complete nothing else (no file names).
pub const NO_FILE_COMPLETION: u32 = 4;

/// cobra's directive: the shell's default completion (file names).
pub const DEFAULT: u32 = 0;

/// How long the super cluster may take to answer a completion.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Prints the completion script for `shell`.
pub fn script(shell: clap_complete::Shell, out: &mut (dyn Write + Send)) -> Result<()> {
    let mut command = Args::command();
    let mut buffer = Vec::new();
    clap_complete::generate(shell, &mut command, "kubectl-vc", &mut buffer);
    out.write_all(&buffer)?;
    Ok(())
}

/// The words to complete when the process was started for completion: as `kubectl_complete-vc <words>`
/// or `kubectl-vc __complete <words>`.
pub fn request(argv: &[OsString]) -> Option<Vec<String>> {
    let program = argv.first().map(Path::new)?.file_stem()?.to_string_lossy().into_owned();
    let words = if program == PLUGIN_COMPLETER {
        &argv[1..]
    } else if argv.get(1).is_some_and(|w| w == COMPLETE) {
        &argv[2..]
    } else {
        return None;
    };
    Some(words.iter().map(|w| w.to_string_lossy().into_owned()).collect())
}

/// A candidate: value and description.
pub type Candidate = (String, String);

/// What the word being completed should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// One of these.
    Fixed(Vec<Candidate>),
    /// A file name (the shell completes it).
    File,
    /// A VirtualCluster of the namespace.
    VirtualCluster,
    /// A namespace.
    Namespace,
    /// A context of the kubeconfig.
    Context,
    /// Anything (a duration, a URL...): nothing to offer.
    Nothing,
}

/// The plan for one completion: what is wanted, the prefix typed so far, and the connection flags typed
/// on the line (for the names read from the super cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// What the word should be.
    pub wanted: Wanted,
    /// What was typed of it.
    pub prefix: String,
    /// `--kubeconfig`, `--context`, `-n` as typed.
    pub global: Global,
}

fn takes_value(arg: &Arg) -> bool {
    arg.get_action().takes_values()
}

/// What a value of `arg` should be.
fn value_of(arg: &Arg) -> Wanted {
    let values: Vec<Candidate> = arg
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| {
            (
                v.get_name().to_owned(),
                v.get_help().map(ToString::to_string).unwrap_or_default(),
            )
        })
        .collect();
    if !values.is_empty() {
        return Wanted::Fixed(values);
    }
    match arg.get_id().as_str() {
        "namespace" => Wanted::Namespace,
        "context" => Wanted::Context,
        "name" => Wanted::VirtualCluster,
        _ if matches!(
            arg.get_value_hint(),
            ValueHint::FilePath | ValueHint::AnyPath | ValueHint::DirPath
        ) =>
        {
            Wanted::File
        }
        _ => Wanted::Nothing,
    }
}

fn first_line(text: Option<&clap::builder::StyledStr>) -> String {
    text.map(|t| t.to_string().lines().next().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// Plans the completion of the last of `words` (the words after `kubectl vc`).
pub fn plan(words: &[String]) -> Plan {
    let mut root = Args::command();
    root.build();
    let (prefix, typed) = match words.split_last() {
        Some((last, typed)) => (last.clone(), typed),
        None => (String::new(), &[][..]),
    };
    let mut global = Global::default();
    let mut command = &root;
    let mut in_subcommand = false;
    let mut pending: Option<&Arg> = None;
    let mut positionals = 0;
    let mut record = |arg: &Arg, value: &str| match arg.get_id().as_str() {
        "kubeconfig" => global.kubeconfig = Some(value.into()),
        "context" => global.context = Some(value.to_owned()),
        "namespace" => global.namespace = Some(value.to_owned()),
        _ => {}
    };
    let mut only_positionals = false;
    for word in typed {
        if let Some(arg) = pending.take() {
            record(arg, word);
            continue;
        }
        if !only_positionals && word == "--" {
            only_positionals = true;
            continue;
        }
        if !only_positionals && let Some(long) = word.strip_prefix("--") {
            let (name, value) = long.split_once('=').map_or((long, None), |(n, v)| (n, Some(v)));
            if let Some(arg) = command.get_arguments().find(|a| a.get_long() == Some(name)) {
                match value {
                    Some(value) => record(arg, value),
                    None if takes_value(arg) => pending = Some(arg),
                    None => {}
                }
            }
            continue;
        }
        if !only_positionals && word.len() > 1 && word.starts_with('-') {
            let mut chars = word[1..].chars();
            let short = chars.next();
            let rest = chars.as_str();
            if let Some(arg) = command.get_arguments().find(|a| a.get_short() == short) {
                match (takes_value(arg), rest.is_empty()) {
                    (true, true) => pending = Some(arg),
                    (true, false) => record(arg, rest.trim_start_matches('=')),
                    _ => {}
                }
            }
            continue;
        }
        if !in_subcommand {
            if let Some(sub) = root.find_subcommand(word) {
                command = sub;
                in_subcommand = true;
            }
            continue;
        }
        positionals += 1;
    }
    let wanted = if let Some(arg) = pending {
        value_of(arg)
    } else if prefix.starts_with('-') {
        let mut flags: Vec<Candidate> = command
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !a.is_positional())
            .filter_map(|a| Some((format!("--{}", a.get_long()?), first_line(a.get_help()))))
            .collect();
        flags.sort();
        Wanted::Fixed(flags)
    } else if !in_subcommand {
        Wanted::Fixed(
            root.get_subcommands()
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
                .map(|s| (s.get_name().to_owned(), first_line(s.get_about())))
                .collect(),
        )
    } else {
        match command.get_positionals().nth(positionals) {
            Some(arg) => value_of(arg),
            None => Wanted::Nothing,
        }
    };
    Plan {
        wanted,
        prefix,
        global,
    }
}

/// Reads the names `wanted` asks for from the super cluster behind `client` (VirtualClusters of
/// `namespace`, with their phase; namespaces). Failures give no names: a completion never prints errors.
pub async fn names(client: &Client, namespace: &str, wanted: &Wanted) -> Vec<Candidate> {
    let listed = async {
        match wanted {
            Wanted::VirtualCluster => Api::<VirtualCluster>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .map(|list| {
                    list.items
                        .iter()
                        .map(|vc| {
                            let phase = vc.phase().map(|p| p.to_string()).unwrap_or_default();
                            (vc.name_any(), phase)
                        })
                        .collect()
                })
                .unwrap_or_default(),
            Wanted::Namespace => Api::<Namespace>::all(client.clone())
                .list_metadata(&ListParams::default())
                .await
                .map(|list| list.items.iter().map(|n| (n.name_any(), String::new())).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    };
    tokio::time::timeout(TIMEOUT, listed).await.unwrap_or_default()
}

/// The context names of the kubeconfig `--kubeconfig` names (else `$KUBECONFIG`, else `~/.kube/config`).
pub fn contexts(global: &Global) -> Vec<Candidate> {
    let config = match &global.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    };
    config
        .map(|c| c.contexts.into_iter().map(|c| (c.name, String::new())).collect())
        .unwrap_or_default()
}

/// cobra's answer: the candidates starting with `prefix`, then the directive.
pub fn format(candidates: &[Candidate], prefix: &str, directive: u32) -> String {
    let mut text = String::new();
    for (value, description) in candidates.iter().filter(|(v, _)| v.starts_with(prefix)) {
        text.push_str(value);
        if !description.is_empty() {
            text.push('\t');
            text.push_str(description);
        }
        text.push('\n');
    }
    text.push_str(&format!(":{directive}\n"));
    text
}

/// Answers a completion request for `words`.
pub async fn answer(words: &[String]) -> String {
    let plan = plan(words);
    let candidates = match &plan.wanted {
        Wanted::File => return format(&[], "", DEFAULT),
        Wanted::Nothing => Vec::new(),
        Wanted::Fixed(candidates) => candidates.clone(),
        Wanted::Context => contexts(&plan.global),
        Wanted::VirtualCluster | Wanted::Namespace => {
            match tokio::time::timeout(TIMEOUT, crate::client(&plan.global)).await {
                Ok(Ok(client)) => {
                    let namespace = plan
                        .global
                        .namespace
                        .clone()
                        .unwrap_or_else(|| client.default_namespace().to_owned());
                    names(&client, &namespace, &plan.wanted).await
                }
                _ => Vec::new(),
            }
        }
    };
    format(&candidates, &plan.prefix, NO_FILE_COMPLETION)
}
