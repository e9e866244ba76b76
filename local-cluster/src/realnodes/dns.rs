//! Cluster DNS of the super cluster on real nodes, as CoreDNS would serve it on a real cluster: Debian's
//! dnsmasq answers on the host's address towards the nodes, from a hosts file the harness rewrites whenever
//! a Service or its Endpoints change, behind Service `kube-system/kube-dns` (the cluster IP kubelets give
//! pods as their nameserver, `.10` of the service range, as kubeadm makes it), whose Endpoints lead to that
//! address.
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
/// Namespace and name of the super cluster's DNS Service.
pub const DNS_SERVICE: (&str, &str) = ("kube-system", "kube-dns");

/// The cluster IP of the DNS Service in `service_cidr`: its tenth address, as kubeadm chooses.
pub fn dns_cluster_ip(service_cidr: &str) -> Option<String> {
    let (base, _) = service_cidr.split(',').next()?.split_once('/')?;
    let ip: std::net::Ipv4Addr = base.parse().ok()?;
    Some(std::net::Ipv4Addr::from(u32::from(ip) + 10).to_string())
}

/// Applies Service `kube-system/kube-dns` at `cluster_ip` with Endpoints leading to `address`:53.
pub async fn apply_dns_service(client: &Client, cluster_ip: &str, address: &str) -> Result<()> {
    let (namespace, name) = DNS_SERVICE;
    let objects = serde_json::json!([
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "namespace": namespace, "labels": {"k8s-app": "kube-dns"}},
         "spec": {"clusterIP": cluster_ip, "ports": [
             {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}},
        {"apiVersion": "v1", "kind": "Endpoints",
         "metadata": {"name": name, "namespace": namespace, "labels": {"k8s-app": "kube-dns"}},
         "subsets": [{"addresses": [{"ip": address}], "ports": [
             {"name": "dns", "port": 53, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}]},
    ]);
    for object in objects.as_array().into_iter().flatten() {
        let object: kube::api::DynamicObject =
            serde_json::from_value(object.clone()).map_err(|e| Error::Io {
                context: "the super cluster's DNS Service".into(),
                source: std::io::Error::other(e),
            })?;
        crate::apply::apply_object(client, object, namespace).await?;
    }
    Ok(())
}

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

    #[test]
    fn the_dns_service_takes_the_tenth_address() {
        assert_eq!(dns_cluster_ip("10.0.0.0/16").as_deref(), Some("10.0.0.10"));
        assert_eq!(
            dns_cluster_ip("10.96.0.0/12,fd00::/108").as_deref(),
            Some("10.96.0.10")
        );
        assert_eq!(dns_cluster_ip("not a range"), None);
    }

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
