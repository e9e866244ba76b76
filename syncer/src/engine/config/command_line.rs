//! The syncer's command line as the platform sees it, pinned: every flag's name, environment variable,
//! default, delimiter and accepted values, compared with `command_line.txt` (captured before the flags
//! moved beside their subsystems). A flag renamed, dropped or given another default fails here.

use clap::CommandFactory;

use crate::engine::config::Args;

/// One line per flag, sorted by name.
fn command_line() -> String {
    let command = Args::command();
    let mut lines: Vec<String> = command
        .get_arguments()
        .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
        .map(|arg| {
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .map(|v| v.get_name().to_owned())
                .collect();
            format!(
                "--{} env={} default={:?} delimiter={:?} takes_value={} possible={:?}",
                arg.get_long().unwrap_or_default(),
                arg.get_env()
                    .map(|e| e.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                defaults,
                arg.get_value_delimiter(),
                arg.get_action().takes_values(),
                possible,
            )
        })
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

#[test]
fn the_command_line_is_unchanged() {
    let now = command_line();
    let pinned = include_str!("command_line.txt");
    if now != pinned {
        let (now, pinned): (Vec<&str>, Vec<&str>) = (now.lines().collect(), pinned.lines().collect());
        let gone: Vec<&&str> = pinned.iter().filter(|l| !now.contains(l)).collect();
        let new: Vec<&&str> = now.iter().filter(|l| !pinned.contains(l)).collect();
        panic!("the command line changed:\n  was: {gone:#?}\n  now: {new:#?}");
    }
}
