//! Flags of vNodes: which super nodes tenants see, how long, and where their kubelet is said to be.

use std::time::Duration;

use crate::engine::config::values::{self, Blank};

/// Flags of vNodes.
#[derive(Clone, Debug, clap::Args)]
pub struct VNodeFlags {
    /// Port vNodes advertise as their kubelet port: vn-agent's port.
    #[arg(long, env = "VN_AGENT_PORT", default_value_t = crds::wellknown::DEFAULT_VN_AGENT_PORT)]
    pub vn_agent_port: u16,
    /// Advertise this vn-agent Service's ClusterIP (`namespace/name`) as every vNode's address instead of
    /// the super node's addresses.
    #[arg(long, value_parser = values::namespaced_name)]
    pub vn_agent_service: Option<Blank<crds::NamespacedName>>,
    /// Seconds a vNode stays after its tenant's last pod left the node.
    #[arg(long = "vnode-grace-seconds", default_value = "120", value_parser = values::seconds)]
    pub vnode_grace: Duration,
    /// Which super nodes tenants see: `pods` (those their pods run on, unschedulable), `usable` (every
    /// node their pods may use, from the start, schedulable) or `selected:key=value[,...]` (the usable
    /// nodes with those labels).
    #[arg(long, env = "VNODE_MODE", default_value_t = VNodeMode::default(), value_parser = vnode_mode)]
    pub vnode_mode: VNodeMode,
}

impl VNodeFlags {
    /// Where vNodes say their kubelet is.
    pub fn addresses(&self) -> VNodeAddresses {
        match Blank::of(self.vn_agent_service.clone()) {
            None => VNodeAddresses::Node,
            Some(service) => VNodeAddresses::Service {
                namespace: service.namespace,
                name: service.name,
            },
        }
    }
}

/// Where vNodes say their kubelet (vn-agent) is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VNodeAddresses {
    /// The super node's own addresses (vn-agent runs with hostNetwork).
    Node,
    /// The ClusterIP of this vn-agent Service (`namespace/name`), for every vNode.
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
    },
}

/// Which super nodes a tenant sees as vNodes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum VNodeMode {
    /// Only those its pods run on, unschedulable, removed a grace period after its last pod left (the
    /// original project's behaviour: fewest objects).
    #[default]
    Pods,
    /// Every super node its pods may use (each NoSchedule/NoExecute taint one the tenant may tolerate),
    /// from attach on, schedulable: a tenant sees ready nodes before it runs anything, and DaemonSets get
    /// one pod per node.
    Usable,
    /// The usable super nodes that carry these labels (`key=value`, all of them).
    Selected(Vec<(String, String)>),
}

impl std::str::FromStr for VNodeMode {
    type Err = String;

    /// `pods`, `usable`, or `selected:key=value[,key=value...]`.
    fn from_str(value: &str) -> Result<Self, String> {
        vnode_mode(value)
    }
}

impl std::fmt::Display for VNodeMode {
    /// As the flag takes it, so that it round-trips through [`std::str::FromStr`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pods => f.write_str("pods"),
            Self::Usable => f.write_str("usable"),
            Self::Selected(labels) => {
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "selected:{}", labels.join(","))
            }
        }
    }
}

fn vnode_mode(value: &str) -> Result<VNodeMode, String> {
    match value.trim() {
        "pods" => Ok(VNodeMode::Pods),
        "usable" => Ok(VNodeMode::Usable),
        other => {
            let Some(labels) = other.strip_prefix("selected:") else {
                return Err(format!(
                    "--vnode-mode must be pods, usable or selected:key=value[,key=value], got {other:?}"
                ));
            };
            let labels = labels
                .split(',')
                .map(|pair| match pair.split_once('=') {
                    Some((key, value)) if !key.trim().is_empty() => {
                        Ok((key.trim().to_owned(), value.trim().to_owned()))
                    }
                    _ => Err(format!(
                        "--vnode-mode selected: {pair:?} is not a key=value label"
                    )),
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(VNodeMode::Selected(labels))
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<VNodeMode, String> {
        values::parse_without_env::<VNodeFlags>(flags).map(|flags| flags.vnode_mode)
    }

    #[test]
    fn vnode_modes_parse() {
        assert_eq!(parse(&[]).expect("default"), VNodeMode::Pods);
        assert_eq!(
            parse(&["--vnode-mode=usable"]).expect("usable"),
            VNodeMode::Usable
        );
        assert_eq!(
            parse(&["--vnode-mode=selected:pool=tenants,zone=a"]).expect("selected"),
            VNodeMode::Selected(vec![
                ("pool".into(), "tenants".into()),
                ("zone".into(), "a".into())
            ])
        );
        for bad in [
            "--vnode-mode=all",
            "--vnode-mode=selected:",
            "--vnode-mode=selected:=x",
        ] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn vnode_modes_round_trip_through_their_text() {
        for text in ["pods", "usable", "selected:zone=a,tier=gold"] {
            let mode: VNodeMode = text.parse().expect("parses");
            assert_eq!(mode.to_string(), text);
        }
    }
}
