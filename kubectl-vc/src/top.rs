//! `kubectl vc top`: what tenants consume, as the syncer last measured it (`status.usage` of each
//! VirtualCluster): CPU and memory their pods use, pods, storage their claims request, load balancers,
//! node ports and their apiserver's requests per second. Nothing is scraped here.

use crds::{TenantUsage, VirtualCluster, quantity::parse_quantity};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, ResourceExt, api::ListParams};
use serde_json::{Value, json};

use crate::{
    Error, Result, Streams, args::TopArgs, duration, kubeconfig::get_virtual_cluster, list::Scope, output,
    table, usage::format_memory,
};

/// What the table shows for a figure the syncer did not measure.
pub const UNKNOWN: &str = "-";

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// CPU, e.g. `250m`.
    pub cpu: String,
    /// Memory, e.g. `64Mi`.
    pub memory: String,
    /// Pods.
    pub pods: String,
    /// Storage requested, e.g. `10Gi`.
    pub storage: String,
    /// LoadBalancer Services.
    pub load_balancers: String,
    /// Node ports.
    pub node_ports: String,
    /// Apiserver requests per second, e.g. `12.5`.
    pub requests: String,
    /// How long ago the syncer measured.
    pub measured: String,
}

fn amount(
    quantity: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    scale: f64,
) -> Option<i64> {
    quantity.and_then(|q| parse_quantity(&q.0, scale))
}

/// Thousandths of a quantity, exactly for the `<integer>m` form the syncer writes (the shared
/// `parse_quantity` goes through floating point and rounds up, so `175m` would read as 176).
pub fn thousandths(quantity: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<i64> {
    match quantity.0.strip_suffix('m').map(str::parse::<i64>) {
        Some(Ok(millis)) => Some(millis),
        _ => parse_quantity(&quantity.0, 1000.0),
    }
}

/// Millicores as `kubectl top` writes CPU: `250m`.
pub fn format_millicores(millis: i64) -> String {
    format!("{millis}m")
}

/// Bytes as `kubectl top` writes memory: whole MiB, `64Mi`.
pub fn format_mebibytes(bytes: i64) -> String {
    format!("{}Mi", bytes / (1 << 20))
}

/// Thousandths per second as a decimal: `12500` is `12.5`.
pub fn format_rate(thousandths: i64) -> String {
    let text = format!("{}.{:03}", thousandths / 1000, thousandths % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn or_unknown(value: Option<String>) -> String {
    value.unwrap_or_else(|| UNKNOWN.to_owned())
}

/// The row of one VirtualCluster at `now`.
pub fn row(vc: &VirtualCluster, now: Timestamp) -> Row {
    let usage = vc
        .status
        .as_ref()
        .and_then(|s| s.usage.clone())
        .unwrap_or_default();
    let count = |n: Option<i64>| or_unknown(n.map(|n| n.to_string()));
    Row {
        name: vc.name_any(),
        namespace: vc.namespace().unwrap_or_default(),
        cpu: or_unknown(usage.cpu.as_ref().and_then(thousandths).map(format_millicores)),
        memory: or_unknown(amount(usage.memory.as_ref(), 1.0).map(format_mebibytes)),
        pods: count(usage.pods),
        storage: or_unknown(amount(usage.storage.as_ref(), 1.0).map(format_memory)),
        load_balancers: count(usage.load_balancers),
        node_ports: count(usage.node_ports),
        requests: or_unknown(
            usage
                .apiserver_requests_per_second
                .as_ref()
                .and_then(thousandths)
                .map(format_rate),
        ),
        measured: or_unknown(
            usage
                .time
                .as_ref()
                .map(|t| duration::age(now.as_second() - t.0.as_second())),
        ),
    }
}

/// The table; with the NAMESPACE column for `-A`.
pub fn render(rows: &[Row], all_namespaces: bool) -> String {
    let rows = rows
        .iter()
        .map(|row| {
            let cells = vec![
                row.cpu.clone(),
                row.memory.clone(),
                row.pods.clone(),
                row.storage.clone(),
                row.load_balancers.clone(),
                row.node_ports.clone(),
                row.requests.clone(),
                row.measured.clone(),
            ];
            (row.name.clone(), row.namespace.clone(), cells)
        })
        .collect();
    table::render_named(
        &[
            "CPU",
            "MEMORY",
            "PODS",
            "STORAGE",
            "LOADBALANCERS",
            "NODEPORTS",
            "REQUESTS/S",
            "MEASURED",
        ],
        rows,
        all_namespaces,
    )
}

/// What `top -o json|yaml` prints: each VirtualCluster's namespace, name and `status.usage` (null when
/// the syncer has not measured it).
pub fn document(vcs: &[VirtualCluster]) -> Value {
    let items: Vec<Value> = vcs
        .iter()
        .map(|vc| {
            let usage: Option<&TenantUsage> = vc.status.as_ref().and_then(|s| s.usage.as_ref());
            json!({"namespace": vc.namespace(), "name": vc.name_any(), "usage": usage})
        })
        .collect();
    json!({ "virtualClusters": items })
}

/// `kubectl vc top [NAME]` (clap keeps a name and `-A` apart).
pub async fn command(client: &Client, namespace: &str, args: &TopArgs, io: &mut Streams<'_>) -> Result<()> {
    let scope = match args.all_namespaces {
        true => Scope::All,
        false => Scope::Namespace(namespace.to_owned()),
    };
    let mut vcs = match (&args.name, &scope) {
        (Some(name), _) => vec![get_virtual_cluster(client, namespace, name).await?],
        (None, Scope::Namespace(namespace)) => {
            Api::<VirtualCluster>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .map_err(|e| Error::api(format!("listing VirtualClusters in namespace {namespace}"), e))?
                .items
        }
        (None, Scope::All) => {
            Api::<VirtualCluster>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| Error::api("listing VirtualClusters in every namespace", e))?
                .items
        }
    };
    vcs.sort_by_key(|vc| (vc.namespace(), vc.name_any()));
    if let Some(format) = args.output.output {
        let text = output::serialize(&document(&vcs), format, "the usage")?;
        io.out.write_all(text.as_bytes())?;
        return Ok(());
    }
    if vcs.is_empty() {
        match &scope {
            Scope::Namespace(ns) => writeln!(io.err, "No VirtualClusters found in namespace {ns}.")?,
            Scope::All => writeln!(io.err, "No VirtualClusters found.")?,
        }
        return Ok(());
    }
    let now = Timestamp::now();
    let rows: Vec<Row> = vcs.iter().map(|vc| row(vc, now)).collect();
    io.out.write_all(render(&rows, scope == Scope::All).as_bytes())?;
    if rows.iter().any(|r| r.measured == UNKNOWN) {
        writeln!(
            io.err,
            "warning: {UNKNOWN} marks figures the syncer has not measured (tenant not attached, or usage measuring off)"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crds::VirtualClusterStatus;
    use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time};

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn vc(namespace: &str, name: &str, usage: Option<TenantUsage>) -> VirtualCluster {
        let mut vc = VirtualCluster::new(name, Default::default());
        vc.metadata.namespace = Some(namespace.into());
        vc.status = Some(VirtualClusterStatus {
            usage,
            ..Default::default()
        });
        vc
    }

    fn measured() -> TenantUsage {
        TenantUsage {
            time: Some(Time(Timestamp::from_second(NOW - 20).expect("time"))),
            cpu: Some(Quantity("1250m".into())),
            memory: Some(Quantity("201326592".into())),
            pods: Some(7),
            measured_pods: Some(6),
            persistent_volume_claims: Some(2),
            storage: Some(Quantity("11811160064".into())),
            load_balancers: Some(1),
            node_ports: Some(3),
            apiserver_requests_per_second: Some(Quantity("12500m".into())),
        }
    }

    #[test]
    fn rows_show_the_measured_figures_the_way_kubectl_top_writes_them() {
        let now = Timestamp::from_second(NOW).expect("now");
        let rows = vec![
            row(&vc("team", "a", Some(measured())), now),
            row(&vc("other", "b", None), now),
        ];
        assert_eq!(
            render(&rows, true),
            "NAME   NAMESPACE   CPU     MEMORY   PODS   STORAGE   LOADBALANCERS   NODEPORTS   REQUESTS/S   MEASURED\n\
             a      team        1250m   192Mi    7      11Gi      1               3           12.5         20s\n\
             b      other       -       -        -      -         -               -           -            -\n"
        );
        assert_eq!(
            render(&rows[..1], false),
            "NAME   CPU     MEMORY   PODS   STORAGE   LOADBALANCERS   NODEPORTS   REQUESTS/S   MEASURED\n\
             a      1250m   192Mi    7      11Gi      1               3           12.5         20s\n"
        );
    }

    #[test]
    fn millicores_read_exactly() {
        // Through floating point, 175m reads as 176.
        assert_eq!(thousandths(&Quantity("175m".into())), Some(175));
        assert_eq!(thousandths(&Quantity("2".into())), Some(2000));
    }

    #[test]
    fn rates_print_as_decimals() {
        assert_eq!(format_rate(12_500), "12.5");
        assert_eq!(format_rate(3_000), "3");
        assert_eq!(format_rate(7), "0.007");
        assert_eq!(format_rate(0), "0");
    }

    #[test]
    fn the_document_carries_each_status_usage_or_null() {
        let document = document(&[vc("team", "a", Some(measured())), vc("team", "b", None)]);
        assert_eq!(document["virtualClusters"][0]["usage"]["cpu"], "1250m");
        assert_eq!(
            document["virtualClusters"][0]["usage"]["apiserverRequestsPerSecond"],
            "12500m"
        );
        assert_eq!(document["virtualClusters"][1]["name"], "b");
        assert!(document["virtualClusters"][1]["usage"].is_null());
    }
}
