//! Reading and setting `--flag=value` in a container's command line, for rendering (etcd's cluster, the
//! service range) and for adapting legacy templates alike.

use k8s_openapi::api::core::v1::Container;

/// Value of a `--flag=value` in the container's command or arguments.
pub(crate) fn flag_value(container: &Container, flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .flat_map(|a| a.split_whitespace())
        .find_map(|word| word.strip_prefix(&prefix).map(str::to_owned))
}

/// Sets `--flag=value` wherever the flag appears in the command or arguments (also inside a shell
/// command line); appends it to the arguments when it appears nowhere.
pub(crate) fn set_flag(container: &mut Container, flag: &str, value: &str) {
    let prefix = format!("{flag}=");
    let mut found = false;
    let replace = |arg: &mut String, found: &mut bool| {
        if !arg.contains(&prefix) {
            return;
        }
        let words: Vec<String> = arg
            .split(' ')
            .map(|word| match word.strip_prefix(&prefix) {
                Some(_) => {
                    *found = true;
                    format!("{prefix}{value}")
                }
                None => word.to_owned(),
            })
            .collect();
        *arg = words.join(" ");
    };
    for arg in container.command.iter_mut().flatten() {
        replace(arg, &mut found);
    }
    for arg in container.args.iter_mut().flatten() {
        replace(arg, &mut found);
    }
    if !found {
        container
            .args
            .get_or_insert_with(Default::default)
            .push(format!("{prefix}{value}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_cidr_is_added_when_the_template_has_none_and_replaced_inside_shell_commands() {
        let mut container = Container {
            name: "apiserver".into(),
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                "kube-apiserver --service-cluster-ip-range=1.0.0.0/8 --v=2".into(),
            ]),
            ..Default::default()
        };
        set_flag(&mut container, "--service-cluster-ip-range", "10.0.0.0/24");
        assert_eq!(
            container.command.as_ref().map(|c| c[2].as_str()),
            Some("kube-apiserver --service-cluster-ip-range=10.0.0.0/24 --v=2")
        );
        assert!(container.args.is_none());
        let mut bare = Container::default();
        set_flag(&mut bare, "--service-cluster-ip-range", "10.0.0.0/24");
        assert_eq!(
            bare.args,
            Some(vec!["--service-cluster-ip-range=10.0.0.0/24".to_owned()])
        );
    }
}
