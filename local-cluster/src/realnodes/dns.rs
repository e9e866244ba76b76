//! Cluster DNS of the super cluster on real nodes, as CoreDNS would serve it on a real cluster: Debian's
//! dnsmasq answers on every node address, from a hosts file the harness rewrites whenever a Service or its
//! Endpoints change.
//!
//! A native tenant's control plane needs it: etcd advertises `etcd-0.etcd`, and the tenant apiserver finds
//! etcd at `etcd` and the controller-manager finds the apiserver at `apiserver-svc.<namespace>.svc`. Names:
//! `<svc>.<ns>.svc.<domain>` → the cluster IP, or the ready endpoint addresses of a headless Service, and
//! `<hostname>.<svc>.<ns>.svc.<domain>` → the address of an endpoint with a hostname (StatefulSet pods).
//! dnsmasq makes the PTR records; names under the cluster domain that are not listed do not exist.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio::task::JoinHandle;

use super::host::find_tool;
use crate::{Error, ManagedProcess, Result, WorkDir};

/// The super cluster's DNS domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// dnsmasq and the task that keeps its hosts file current.
pub struct ClusterDns {
    _process: ManagedProcess,
    writer: JoinHandle<()>,
    _dir: Arc<WorkDir>,
}

impl std::fmt::Debug for ClusterDns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterDns").finish_non_exhaustive()
    }
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

impl ClusterDns {
    /// Starts dnsmasq on port 53 of `addresses` (the node bridges' gateways, which must exist) and the hosts
    /// writer, and waits until the first hosts file is written.
    pub async fn start(client: Client, addresses: &[String]) -> Result<Self> {
        let dnsmasq = find_tool("dnsmasq").ok_or_else(|| Error::MissingPart {
            part: "dnsmasq (the super cluster's DNS)".into(),
            hint: "apt-get install dnsmasq-base".into(),
        })?;
        let dir = Arc::new(WorkDir::new("realnode-dns")?);
        let hosts_dir = dir.join("hosts");
        std::fs::create_dir_all(&hosts_dir).map_err(Error::io("creating the DNS hosts folder"))?;
        let (services, services_writer) = reflector::store::<Service>();
        let (endpoints, endpoints_writer) = reflector::store::<Endpoints>();
        let service_events = watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(services_writer)
            .touched_objects()
            .map(|_| ());
        let endpoint_events = watcher(Api::<Endpoints>::all(client), watcher::Config::default())
            .default_backoff()
            .reflect(endpoints_writer)
            .touched_objects()
            .map(|_| ());
        let target = hosts_dir.join("cluster");
        write_hosts(&target, "")?;

        let args = vec![
            "--keep-in-foreground".to_owned(),
            "--conf-file=/dev/null".to_owned(),
            "--user=root".to_owned(),
            "--pid-file=".to_owned(),
            "--no-resolv".to_owned(),
            "--no-hosts".to_owned(),
            "--bind-interfaces".to_owned(),
            format!("--listen-address={}", addresses.join(",")),
            "--except-interface=lo".to_owned(),
            format!("--hostsdir={}", hosts_dir.display()),
            // Names under the cluster domain are ours alone: no forwarding, NXDOMAIN when unknown.
            format!("--local=/{CLUSTER_DOMAIN}/"),
            "--domain-needed".to_owned(),
            "--local-ttl=1".to_owned(),
            "--log-facility=-".to_owned(),
        ];
        let mut process = ManagedProcess::start("dnsmasq", &dnsmasq, args, dir.join("dnsmasq.log"))?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        if !process.is_running() {
            return Err(process.not_ready("dnsmasq exited"));
        }

        let writer = tokio::spawn(async move {
            let mut events = futures::stream::select(service_events, endpoint_events).boxed();
            while events.next().await.is_some() {
                // Coalesce a burst of changes into one write.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while let Some(Some(_)) = futures::FutureExt::now_or_never(events.next()) {}
                let text = hosts_file(&services.state(), &endpoints.state());
                if let Err(error) = write_hosts(&target, &text) {
                    tracing::warn!(%error, "writing the super cluster's DNS hosts file");
                }
            }
        });
        Ok(Self {
            _process: process,
            writer,
            _dir: dir,
        })
    }
}

/// Replaces the file in one step, which dnsmasq's folder watch sees as a whole new file.
fn write_hosts(target: &std::path::Path, text: &str) -> Result<()> {
    let temporary: PathBuf = target.with_extension("new");
    std::fs::write(&temporary, text).map_err(Error::io("writing the DNS hosts file"))?;
    std::fs::rename(&temporary, target).map_err(Error::io("replacing the DNS hosts file"))
}

/// The hosts file for these Services and Endpoints.
fn hosts_file(services: &[Arc<Service>], endpoints: &[Arc<Endpoints>]) -> String {
    let endpoints: BTreeMap<(String, String), &Endpoints> = endpoints
        .iter()
        .map(|e| ((e.namespace().unwrap_or_default(), e.name_any()), e.as_ref()))
        .collect();
    let mut lines: Vec<String> = Vec::new();
    for service in services {
        let namespace = service.namespace().unwrap_or_default();
        let name = service.name_any();
        let fqdn = format!("{name}.{namespace}.svc.{CLUSTER_DOMAIN}");
        let spec = service.spec.clone().unwrap_or_default();
        let cluster_ip = spec.cluster_ip.unwrap_or_default();
        let headless = cluster_ip == "None";
        if !headless && !cluster_ip.is_empty() {
            lines.push(format!("{cluster_ip} {fqdn}"));
        }
        let Some(endpoints) = endpoints.get(&(namespace.clone(), name.clone())) else {
            continue;
        };
        for subset in endpoints.subsets.iter().flatten() {
            for address in subset.addresses.iter().flatten() {
                if headless {
                    lines.push(format!("{} {fqdn}", address.ip));
                }
                if let Some(hostname) = address.hostname.as_deref().filter(|h| !h.is_empty()) {
                    lines.push(format!("{} {hostname}.{fqdn}", address.ip));
                }
            }
        }
    }
    lines.sort();
    lines.dedup();
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, ServiceSpec};
    use kube::api::ObjectMeta;

    use super::*;

    fn service(name: &str, cluster_ip: &str) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(cluster_ip.into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn endpoints(name: &str, addresses: &[(&str, Option<&str>)]) -> Arc<Endpoints> {
        Arc::new(Endpoints {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            subsets: Some(vec![EndpointSubset {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(ip, hostname)| EndpointAddress {
                            ip: (*ip).into(),
                            hostname: hostname.map(Into::into),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }]),
        })
    }

    #[test]
    fn cluster_ips_headless_services_and_statefulset_pods() {
        let text = hosts_file(
            &[service("api", "10.0.0.20"), service("etcd", "None")],
            &[
                endpoints("api", &[("10.244.0.7", None)]),
                endpoints("etcd", &[("10.244.1.5", Some("etcd-0"))]),
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"10.0.0.20 api.ns.svc.cluster.local"));
        assert!(lines.contains(&"10.244.1.5 etcd.ns.svc.cluster.local"));
        assert!(lines.contains(&"10.244.1.5 etcd-0.etcd.ns.svc.cluster.local"));
        // A Service with a cluster IP is not answered with its endpoints.
        assert!(!lines.contains(&"10.244.0.7 api.ns.svc.cluster.local"));
    }
}
