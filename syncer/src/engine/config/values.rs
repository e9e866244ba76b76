//! Value parsers the flag groups share: clap runs them on each value, so that a bad value fails at parse
//! time with clap's error naming the flag. Plain functions of one value; they need nothing of the syncer.

use std::time::Duration;

use ipnet::IpNet;

/// Whole seconds.
pub fn seconds(value: &str) -> Result<Duration, String> {
    whole(value).map(Duration::from_secs)
}

/// Whole seconds, `0` taken as `1` (a period of nothing would spin).
pub fn period(value: &str) -> Result<Duration, String> {
    whole(value).map(|secs| Duration::from_secs(secs.max(1)))
}

/// A count or size, `0` taken as `1` (none of it would stop the work outright).
pub fn at_least_one(value: &str) -> Result<u64, String> {
    whole(value).map(|n| n.max(1))
}

/// A count of tasks, `0` taken as `1`.
pub fn tasks(value: &str) -> Result<usize, String> {
    value
        .trim()
        .parse::<usize>()
        .map(|n| n.max(1))
        .map_err(|e| format!("{value:?} is not a whole number ({e})"))
}

fn whole(value: &str) -> Result<u64, String> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("{value:?} is not a whole number ({e})"))
}

/// A namespace (or other name) that must not be empty.
pub fn namespace(value: &str) -> Result<String, String> {
    match value.trim() {
        "" => Err("must not be empty".into()),
        namespace => Ok(namespace.to_owned()),
    }
}

/// `namespace/name`; empty is `None`.
pub fn namespaced_name(value: &str) -> Result<Blank<crds::NamespacedName>, String> {
    match value.trim() {
        "" => Ok(Blank(None)),
        reference => reference
            .parse::<crds::NamespacedName>()
            .map(|name| Blank(Some(name)))
            .map_err(|_| format!("must be namespace/name, got {reference:?}")),
    }
}

/// A CIDR, host bits cleared (so that a policy names the network); empty is `None`.
pub fn cidr(value: &str) -> Result<Option<IpNet>, String> {
    match value.trim() {
        "" => Ok(None),
        cidr => cidr
            .parse::<IpNet>()
            .map(|net| Some(net.trunc()))
            .map_err(|e| format!("{cidr:?} is not a CIDR ({e})")),
    }
}

/// A `key=value` label (the key not empty); empty is `None`.
pub fn label(value: &str) -> Result<Option<(String, String)>, String> {
    if value.is_empty() {
        return Ok(None);
    }
    match value.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok(Some((key.to_owned(), value.to_owned()))),
        _ => Err(format!("{value:?} is not a key=value label")),
    }
}

/// An entry of a list, trimmed; an empty one is dropped by [`listed`].
pub fn trimmed(value: &str) -> Result<String, String> {
    Ok(value.trim().to_owned())
}

/// The entries of a list flag that are not empty (`--flag=` gives one empty entry: an empty list).
pub fn listed(values: Vec<String>) -> Vec<String> {
    values.into_iter().filter(|v| !v.is_empty()).collect()
}

/// A flag value that may be given empty, meaning none: a type of its own, because clap takes a field of type
/// `Option` as "the flag may be left out".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blank<T>(pub Option<T>);

impl<T> Blank<T> {
    /// The value of a flag that may also be left out.
    pub fn of(flag: Option<Self>) -> Option<T> {
        flag.and_then(|blank| blank.0)
    }
}

/// A flag group from these flags alone, the environment unread (so that a test's result does not hang on
/// the variables of the shell it runs in).
pub fn parse_without_env<T: clap::Args + clap::FromArgMatches>(flags: &[&str]) -> Result<T, String> {
    let command = T::augment_args(clap::Command::new("syncer")).mut_args(|arg| arg.env(None::<&str>));
    let matches = command
        .try_get_matches_from(std::iter::once("syncer").chain(flags.iter().copied()))
        .map_err(|e| e.to_string())?;
    T::from_arg_matches(&matches).map_err(|e| e.to_string())
}

/// A flag group's defaults: what an empty command line gives, so that they are written once, in the flags.
///
/// # Panics
///
/// When the defaults do not parse, a fault of the flags' definitions that every test using them shows.
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    match parse_without_env(&[]) {
        Ok(defaults) => defaults,
        Err(error) => panic!("the flags' defaults do not parse: {error}"),
    }
}
