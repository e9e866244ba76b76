//! Which kubelet endpoint a request is for: the paths of the kubelet API that tenant apiservers (and
//! metrics-server) call, with every name checked before it is used to build another request.

use http::Method;

/// A per-pod kubelet action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `GET /containerLogs/{namespace}/{pod}/{container}`.
    ContainerLogs,
    /// `/exec/{namespace}/{pod}[/{uid}]/{container}` (an upgrade).
    Exec,
    /// `/attach/{namespace}/{pod}[/{uid}]/{container}` (an upgrade).
    Attach,
    /// `/portForward/{namespace}/{pod}[/{uid}]` (an upgrade).
    PortForward,
    /// `POST /run/{namespace}/{pod}[/{uid}]/{container}`.
    Run,
}

impl Action {
    /// The kubelet path segment, also the `verb` label of the request metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ContainerLogs => "containerLogs",
            Self::Exec => "exec",
            Self::Attach => "attach",
            Self::PortForward => "portForward",
            Self::Run => "run",
        }
    }

    /// Whether the action is a streaming upgrade (SPDY or WebSocket).
    pub fn is_streaming(self) -> bool {
        matches!(self, Self::Exec | Self::Attach | Self::PortForward)
    }
}

/// A pod as the caller names it: namespace, name and optionally uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTarget {
    /// The caller's namespace.
    pub namespace: String,
    /// The pod name (the same on both sides).
    pub name: String,
    /// The caller's pod uid, when the path carries one.
    pub uid: Option<String>,
}

/// A recognised kubelet request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletRequest {
    /// A per-pod action.
    Pod {
        /// What to do.
        action: Action,
        /// Which pod.
        pod: PodTarget,
        /// Which container (`None` only for port-forward).
        container: Option<String>,
    },
    /// `GET /pods`.
    Pods,
    /// `GET /stats/summary`.
    StatsSummary,
    /// `GET /metrics/resource`.
    MetricsResource,
}

impl KubeletRequest {
    /// The `verb` label of the request metrics.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Pod { action, .. } => action.as_str(),
            Self::Pods => "pods",
            Self::StatsSummary => "statsSummary",
            Self::MetricsResource => "metricsResource",
        }
    }
}

/// Why a path is not served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Not a kubelet endpoint vn-agent serves.
    #[error("no such endpoint")]
    NotFound,
    /// The endpoint exists but not with this method.
    #[error("method {0} not allowed here")]
    MethodNotAllowed(Method),
    /// A path segment is not a valid Kubernetes name.
    #[error("invalid {what} {value:?} in the path")]
    InvalidSegment {
        /// Which segment.
        what: &'static str,
        /// Its value (truncated).
        value: String,
    },
}

/// The `verb` label for a request that did not parse.
pub const UNKNOWN_VERB: &str = "unknown";

/// Parses a request's method and path.
pub fn parse(method: &Method, path: &str) -> Result<KubeletRequest, RouteError> {
    let trimmed = path.strip_prefix('/').ok_or(RouteError::NotFound)?;
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    let segments: Vec<&str> = trimmed.split('/').collect();
    let (first, rest) = segments.split_first().ok_or(RouteError::NotFound)?;

    let get_only = |request: KubeletRequest| match *method == Method::GET {
        true => Ok(request),
        false => Err(RouteError::MethodNotAllowed(method.clone())),
    };
    match (*first, rest) {
        ("pods", []) => return get_only(KubeletRequest::Pods),
        ("stats", ["summary"]) => return get_only(KubeletRequest::StatsSummary),
        ("metrics", ["resource"]) => return get_only(KubeletRequest::MetricsResource),
        _ => {}
    }

    let action = match *first {
        "containerLogs" => Action::ContainerLogs,
        "exec" => Action::Exec,
        "attach" => Action::Attach,
        "portForward" => Action::PortForward,
        "run" => Action::Run,
        _ => return Err(RouteError::NotFound),
    };
    // The kubelet's own routes: logs have no uid form; port-forward has no container.
    let (namespace, name, uid, container) = match (action, rest) {
        (Action::ContainerLogs, [ns, pod, container]) => (ns, pod, None, Some(container)),
        (Action::PortForward, [ns, pod]) => (ns, pod, None, None),
        (Action::PortForward, [ns, pod, uid]) => (ns, pod, Some(uid), None),
        (Action::Exec | Action::Attach | Action::Run, [ns, pod, container]) => {
            (ns, pod, None, Some(container))
        }
        (Action::Exec | Action::Attach | Action::Run, [ns, pod, uid, container]) => {
            (ns, pod, Some(uid), Some(container))
        }
        _ => return Err(RouteError::NotFound),
    };
    let allowed = match action {
        Action::ContainerLogs => *method == Method::GET,
        Action::Run => *method == Method::POST,
        // SPDY clients POST, WebSocket clients GET.
        Action::Exec | Action::Attach | Action::PortForward => {
            *method == Method::GET || *method == Method::POST
        }
    };
    if !allowed {
        return Err(RouteError::MethodNotAllowed(method.clone()));
    }
    Ok(KubeletRequest::Pod {
        action,
        pod: PodTarget {
            namespace: checked("namespace", namespace, is_dns_name)?,
            name: checked("pod name", name, is_dns_name)?,
            uid: uid.map(|uid| checked("pod uid", uid, is_uid)).transpose()?,
        },
        container: container
            .map(|c| checked("container name", c, is_dns_name))
            .transpose()?,
    })
}

fn checked(what: &'static str, value: &str, valid: fn(&str) -> bool) -> Result<String, RouteError> {
    match valid(value) {
        true => Ok(value.to_owned()),
        false => Err(RouteError::InvalidSegment {
            what,
            value: value.chars().take(80).collect(),
        }),
    }
}

/// Lower-case DNS labels and subdomains (namespaces, pod and container names). Nothing that could change
/// the meaning of a path we build from it: no `%`, no `/`, no `.`-only segments.
fn is_dns_name(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 253
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && value.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn is_uid(value: &str) -> bool {
    !value.is_empty() && value.len() <= 64 && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        action: Action,
        ns: &str,
        name: &str,
        uid: Option<&str>,
        container: Option<&str>,
    ) -> KubeletRequest {
        KubeletRequest::Pod {
            action,
            pod: PodTarget {
                namespace: ns.into(),
                name: name.into(),
                uid: uid.map(Into::into),
            },
            container: container.map(Into::into),
        }
    }

    #[test]
    fn kubelet_paths_parse() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(
            parse(&get, "/containerLogs/default/web-0/nginx"),
            Ok(pod(
                Action::ContainerLogs,
                "default",
                "web-0",
                None,
                Some("nginx")
            ))
        );
        assert_eq!(
            parse(&post, "/exec/team/api-7d9f/app"),
            Ok(pod(Action::Exec, "team", "api-7d9f", None, Some("app")))
        );
        assert_eq!(
            parse(&get, "/exec/team/api/0b6c5c3e-1f7a-4b8e-9c1d-2e3f4a5b6c7d/app"),
            Ok(pod(
                Action::Exec,
                "team",
                "api",
                Some("0b6c5c3e-1f7a-4b8e-9c1d-2e3f4a5b6c7d"),
                Some("app")
            ))
        );
        assert_eq!(
            parse(&post, "/attach/team/api/app"),
            Ok(pod(Action::Attach, "team", "api", None, Some("app")))
        );
        assert_eq!(
            parse(&post, "/portForward/team/api"),
            Ok(pod(Action::PortForward, "team", "api", None, None))
        );
        assert_eq!(
            parse(&get, "/portForward/team/api/uid-1"),
            Ok(pod(Action::PortForward, "team", "api", Some("uid-1"), None))
        );
        assert_eq!(
            parse(&post, "/run/team/api/uid-1/app"),
            Ok(pod(Action::Run, "team", "api", Some("uid-1"), Some("app")))
        );
        assert_eq!(parse(&get, "/pods"), Ok(KubeletRequest::Pods));
        assert_eq!(parse(&get, "/pods/"), Ok(KubeletRequest::Pods));
        assert_eq!(parse(&get, "/stats/summary"), Ok(KubeletRequest::StatsSummary));
        assert_eq!(
            parse(&get, "/metrics/resource"),
            Ok(KubeletRequest::MetricsResource)
        );
    }

    #[test]
    fn verbs_label_the_metrics() {
        assert_eq!(parse(&Method::GET, "/pods").map(|r| r.verb()), Ok("pods"));
        assert_eq!(
            parse(&Method::POST, "/portForward/a/b").map(|r| r.verb()),
            Ok("portForward")
        );
        assert!(Action::Exec.is_streaming() && !Action::ContainerLogs.is_streaming());
    }

    #[test]
    fn other_paths_are_not_served() {
        for path in [
            "/",
            "/healthz",
            "/spec",
            "/stats",
            "/stats/summary/extra",
            "/metrics",
            "/metrics/cadvisor",
            "/configz",
            "/debug/pprof/",
            "/logs/",
            "/containerLogs/ns/pod",
            "/containerLogs/ns/pod/uid/container",
            "/exec/ns/pod",
            "/portForward/ns",
            "/exec/ns/pod/uid/container/more",
            "containerLogs/ns/pod/c",
        ] {
            assert_eq!(parse(&Method::GET, path), Err(RouteError::NotFound), "{path}");
        }
    }

    #[test]
    fn methods_are_checked() {
        assert_eq!(
            parse(&Method::POST, "/containerLogs/ns/pod/c"),
            Err(RouteError::MethodNotAllowed(Method::POST))
        );
        assert_eq!(
            parse(&Method::GET, "/run/ns/pod/c"),
            Err(RouteError::MethodNotAllowed(Method::GET))
        );
        assert_eq!(
            parse(&Method::DELETE, "/pods"),
            Err(RouteError::MethodNotAllowed(Method::DELETE))
        );
        assert_eq!(
            parse(&Method::PUT, "/exec/ns/pod/c"),
            Err(RouteError::MethodNotAllowed(Method::PUT))
        );
    }

    #[test]
    fn names_that_could_escape_the_path_are_refused() {
        for path in [
            "/containerLogs/../pod/c",
            "/containerLogs/ns/../c",
            "/containerLogs/ns/pod/..",
            "/containerLogs/ns/%2e%2e/c",
            "/containerLogs/NS/pod/c",
            "/containerLogs/ns/pod%2Fother/c",
            "/exec/ns/pod/u%2F1/c",
            "/exec/ns//c",
            "/containerLogs/-ns/pod/c",
        ] {
            assert!(
                matches!(
                    parse(&Method::GET, path),
                    Err(RouteError::InvalidSegment { .. }) | Err(RouteError::NotFound)
                ),
                "{path} was accepted"
            );
        }
        assert!(matches!(
            parse(&Method::GET, "/containerLogs/ns/pod%2Fx/c"),
            Err(RouteError::InvalidSegment { what: "pod name", .. })
        ));
    }
}
