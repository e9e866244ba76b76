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
    if shell == clap_complete::Shell::Bash {
        // clap_complete's bash script turns the `-` of a binary name into `__` in some function names and
        // into `__subcmd__` in others, so no subcommand's flags would complete for `kubectl-vc`: generate it
        // for `kubectl_vc` (the functions dispatch on the word typed) and register it for `kubectl-vc`.
        clap_complete::generate(shell, &mut command, "kubectl_vc", &mut buffer);
        let text = String::from_utf8_lossy(&buffer)
            .lines()
            .map(|line| match line.strip_suffix(" kubectl_vc") {
                Some(start) if line.trim_start().starts_with("complete ") => format!("{start} kubectl-vc"),
                _ => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        out.write_all(text.as_bytes())?;
        out.write_all(b"\n")?;
    } else {
        clap_complete::generate(shell, &mut command, "kubectl-vc", &mut buffer);
        out.write_all(&buffer)?;
    }
    Ok(())
}

/// The words to complete when the process was started for completion: as `kubectl_complete-vc <words>`
/// or `kubectl-vc __complete <words>`.
pub fn request(argv: &[OsString]) -> Option<Vec<String>> {
    let program = argv
        .first()
        .map(Path::new)?
        .file_stem()?
        .to_string_lossy()
        .into_owned();
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
        // Commands nest (`snapshot create`): a word names a subcommand until one without subcommands.
        if command.has_subcommands() {
            if let Some(sub) = command.find_subcommand(word) {
                command = sub;
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
    } else if command.has_subcommands() {
        Wanted::Fixed(
            command
                .get_subcommands()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        // A trailing space means a new, empty word.
        let mut words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if line.is_empty() || line.ends_with(' ') {
            words.push(String::new());
        }
        words
    }

    fn values(wanted: &Wanted) -> Vec<&str> {
        match wanted {
            Wanted::Fixed(candidates) => candidates.iter().map(|(v, _)| v.as_str()).collect(),
            other => panic!("not fixed: {other:?}"),
        }
    }

    #[test]
    fn commands_flags_and_values_are_planned_from_the_clap_definitions() {
        let commands = plan(&words(""));
        assert_eq!(
            values(&commands.wanted),
            [
                "create",
                "kubeconfig",
                "list",
                "describe",
                "top",
                "delete",
                "pause",
                "resume",
                "connect",
                "snapshot",
                "completion",
                "uninstall"
            ]
        );
        assert_eq!(
            values(&plan(&words("snapshot ")).wanted),
            ["create", "restore", "list", "prune", "schedule"]
        );
        assert_eq!(plan(&words("snapshot create vc-1 --to ")).wanted, Wanted::File);
        assert_eq!(plan(&words("con")).prefix, "con");
        assert_eq!(plan(&words("top ")).wanted, Wanted::VirtualCluster);
        let flags = plan(&words("connect vc-1 --"));
        let flags = values(&flags.wanted);
        for flag in [
            "--port-forward",
            "--local-port",
            "--switch",
            "--context-name",
            "--output",
            "--namespace",
        ] {
            assert!(flags.contains(&flag), "{flag} in {flags:?}");
        }
        assert_eq!(
            values(&plan(&words("connect vc-1 --port-forward ")).wanted),
            ["auto", "always", "never"]
        );
        assert_eq!(values(&plan(&words("list -o ")).wanted), ["yaml", "json"]);
        assert_eq!(
            values(&plan(&words("completion ")).wanted),
            ["bash", "elvish", "fish", "powershell", "zsh"]
        );
        assert_eq!(plan(&words("create -f ")).wanted, Wanted::File);
        assert_eq!(plan(&words("delete vc-1 --timeout ")).wanted, Wanted::Nothing);
        assert_eq!(plan(&words("describe vc-1 ")).wanted, Wanted::Nothing);
    }

    #[test]
    fn names_are_planned_with_the_connection_flags_typed() {
        let planned = plan(&words("-n team --kubeconfig=/k connect t"));
        assert_eq!(planned.wanted, Wanted::VirtualCluster);
        assert_eq!(planned.prefix, "t");
        assert_eq!(planned.global.namespace.as_deref(), Some("team"));
        assert_eq!(planned.global.kubeconfig.as_deref(), Some(Path::new("/k")));
        // The alias `get` is `list`; flags after the command count too.
        assert_eq!(plan(&words("get -A --context ")).wanted, Wanted::Context);
        let planned = plan(&words("describe --context prod -nteam "));
        assert_eq!(planned.wanted, Wanted::VirtualCluster);
        assert_eq!(planned.global.context.as_deref(), Some("prod"));
        assert_eq!(planned.global.namespace.as_deref(), Some("team"));
        assert_eq!(plan(&words("delete vc-1 -n ")).wanted, Wanted::Namespace);
    }

    #[test]
    fn answers_follow_cobras_protocol() {
        let candidates = vec![
            ("vc-1".to_owned(), "Running".to_owned()),
            ("vc-2".to_owned(), String::new()),
            ("other".to_owned(), String::new()),
        ];
        assert_eq!(
            format(&candidates, "vc", NO_FILE_COMPLETION),
            "vc-1\tRunning\nvc-2\n:4\n"
        );
        assert_eq!(format(&[], "", DEFAULT), ":0\n");
    }

    #[test]
    fn completion_requests_are_recognized_by_name_or_command() {
        let argv = |items: &[&str]| items.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            request(&argv(&["/usr/local/bin/kubectl_complete-vc", "connect", ""])),
            Some(vec!["connect".to_owned(), String::new()])
        );
        assert_eq!(
            request(&argv(&["kubectl-vc", "__complete", "li"])),
            Some(vec!["li".to_owned()])
        );
        assert_eq!(request(&argv(&["kubectl-vc", "list"])), None);
    }

    #[tokio::test]
    async fn the_binary_answers_kubectl_without_a_cluster_for_fixed_words() {
        assert_eq!(
            answer(&words("connect vc-1 --port-forward a")).await,
            "auto\tOnly when the apiserver's address does not answer from here\nalways\tAlways (staying in the foreground until Ctrl-C)\n:4\n"
        );
    }

    #[test]
    fn scripts_are_generated_for_every_shell() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
            clap_complete::Shell::PowerShell,
            clap_complete::Shell::Elvish,
        ] {
            let mut out = Vec::new();
            script(shell, &mut out).expect("script");
            let text = String::from_utf8(out).expect("utf-8");
            for word in ["kubectl-vc", "connect", "port-forward", "completion"] {
                assert!(text.contains(word), "{shell}: {word} missing");
            }
        }
    }

    #[test]
    fn the_bash_script_completes_flag_values_of_subcommands() {
        let mut out = Vec::new();
        script(clap_complete::Shell::Bash, &mut out).expect("script");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("kubectl-vc.bash");
        std::fs::write(&path, out).expect("write");
        let complete = |words: &str| {
            let program = format!(
                r#"source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _kubectl_vc kubectl-vc "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"; echo "${{COMPREPLY[@]}}""#,
                path.display()
            );
            let output = std::process::Command::new("bash")
                .args(["-c", &program])
                .output()
                .expect("bash runs");
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).expect("utf-8").trim().to_owned()
        };
        assert_eq!(complete(r#"kubectl-vc con"#), "connect");
        assert_eq!(
            complete(r#"kubectl-vc connect vc-1 --port-forward """#),
            "auto always never"
        );
        assert_eq!(complete(r#"kubectl-vc list -o j"#), "json");
    }
}
