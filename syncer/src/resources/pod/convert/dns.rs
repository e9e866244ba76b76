//! A super pod's DNS and its way to the tenant's apiserver: the tenant's DNS (never the super cluster's), the
//! `kubernetes` Service's variables, and downward-API values that differ in the super cluster as literals.

use k8s_openapi::api::core::v1::{EnvVar, PodDNSConfig, PodDNSConfigOption, PodSpec};

use super::PodConversion;

/// Whether the kubelet would give a pod the cluster's DNS: `ClusterFirstWithHostNet` always,
/// `ClusterFirst` (the default) unless the pod uses the host network, where it means the node's resolver.
pub(super) fn wants_cluster_dns(spec: &PodSpec) -> bool {
    match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => spec.host_network != Some(true),
        _ => false,
    }
}

/// A pod that opted out of the rewrite keeps its DNS settings, except that cluster DNS can never mean the
/// super cluster's (which would answer with other tenants' and the platform's Services): it gets the
/// platform's upstream nameservers with its own `dnsConfig`, or the node's resolver.
pub(super) fn keep_off_super_dns(spec: &mut PodSpec, upstream: &[String]) {
    if !wants_cluster_dns(spec) {
        return;
    }
    if upstream.is_empty() {
        // `Default` merges the pod's dnsConfig with the node's resolv.conf, as ClusterFirst would have.
        spec.dns_policy = Some("Default".to_owned());
        return;
    }
    let mut config = spec.dns_config.take().unwrap_or_default();
    let mut nameservers = upstream.to_vec();
    for own in config.nameservers.take().unwrap_or_default() {
        if nameservers.len() < 3 && !nameservers.contains(&own) {
            nameservers.push(own);
        }
    }
    config.nameservers = Some(nameservers);
    spec.dns_policy = Some("None".to_owned());
    spec.dns_config = Some(config);
}

/// ClusterFirst DNS becomes the tenant's own DNS; without a tenant DNS the node's resolver is used, never
/// the super cluster's, which would answer with super-cluster services.
pub(super) fn rewrite_dns(spec: &mut PodSpec, tenant_namespace: &str, cx: &PodConversion<'_>) {
    if !wants_cluster_dns(spec) {
        return;
    }
    let Some(dns_ip) = &cx.endpoints.dns_ip else {
        spec.dns_policy = Some("Default".to_owned());
        return;
    };
    let domain = cx.cluster_domain;
    let existing = spec.dns_config.take().unwrap_or_default();
    let mut nameservers = vec![dns_ip.clone()];
    nameservers.extend(existing.nameservers.unwrap_or_default());
    let mut searches = vec![
        format!("{tenant_namespace}.svc.{domain}"),
        format!("svc.{domain}"),
        domain.to_owned(),
    ];
    searches.extend(existing.searches.unwrap_or_default());
    let mut options = existing.options.unwrap_or_default();
    if !options.iter().any(|o| o.name.as_deref() == Some("ndots")) {
        options.insert(
            0,
            PodDNSConfigOption {
                name: Some("ndots".into()),
                value: Some(cx.ndots.to_string()),
            },
        );
    }
    spec.dns_policy = Some("None".to_owned());
    spec.dns_config = Some(PodDNSConfig {
        nameservers: Some(nameservers),
        searches: Some(searches),
        options: Some(options),
    });
}

/// The host in-cluster clients connect to: a name in every tenant apiserver's certificate, which the pod's
/// host alias maps to the super cluster IP of the tenant's `kubernetes` Service. That IP is in no tenant
/// apiserver's certificate, so a client that connected to it by address would fail TLS verification.
const APISERVER_HOST: &str = "kubernetes.default.svc";

/// The variables a kubelet sets for the `kubernetes` Service, pointing at the tenant's apiserver. Explicit
/// container variables win over the kubelet's, so these replace the super cluster's.
pub(super) fn set_apiserver_env(env: &mut Option<Vec<EnvVar>>, ip: &str, port: i32) {
    let url = format!("tcp://{ip}:{port}");
    let values = [
        ("KUBERNETES_SERVICE_HOST".to_owned(), APISERVER_HOST.to_owned()),
        ("KUBERNETES_SERVICE_PORT".to_owned(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), port.to_string()),
        ("KUBERNETES_PORT".to_owned(), url.clone()),
        (format!("KUBERNETES_PORT_{port}_TCP"), url),
        (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".to_owned()),
        (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
        (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), ip.to_owned()),
    ];
    let env = env.get_or_insert_with(Vec::new);
    for (name, value) in values {
        if !env.iter().any(|e| e.name == name) {
            env.push(EnvVar {
                name,
                value: Some(value),
                value_from: None,
            });
        }
    }
}

/// Downward-API variables whose value differs in the super cluster become literals.
pub(super) fn literal_downward_env(env: &mut Option<Vec<EnvVar>>, tenant_namespace: &str, tenant_uid: &str) {
    for var in env.iter_mut().flatten() {
        let field = var
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        let literal = match field {
            Some("metadata.namespace") => tenant_namespace,
            Some("metadata.uid") => tenant_uid,
            _ => continue,
        };
        var.value = Some(literal.to_owned());
        var.value_from = None;
    }
}
