//! `kubectl vc list`: VirtualClusters with phase, version, age, and how many super namespaces and pods each
//! has. A super namespace belongs to a VirtualCluster when the syncer's labels name it
//! (`tenancy.x-k8s.io/vcname`, `tenancy.x-k8s.io/vcnamespace`) and its `tenancy.x-k8s.io/cluster`
//! annotation is the VirtualCluster's cluster key (a recreated VirtualCluster of the same name has another).

use std::collections::{BTreeMap, BTreeSet};

use crds::{
    VirtualCluster,
    naming::cluster_key_of,
    wellknown::{LABEL_VC_NAME, LABEL_VC_NAMESPACE},
};
use k8s_openapi::{
    api::core::v1::{Namespace, Pod},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{Api, Client, ResourceExt, api::ListParams};

use crate::{
    Error, Result, Streams,
    args::{Format, ListArgs},
    duration, output, table,
};

/// Which VirtualClusters to list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Those of one namespace.
    Namespace(String),
    /// Those of every namespace.
    All,
}

/// Whether namespace metadata `meta` is a super namespace of `vc`: labelled for it, and the tenant's by the
/// ownership rule ([`crds::Owner`]).
pub fn is_super_namespace_of(meta: &ObjectMeta, vc: &VirtualCluster, cluster_key: &str) -> bool {
    let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str);
    label(LABEL_VC_NAME) == vc.metadata.name.as_deref()
        && label(LABEL_VC_NAMESPACE) == vc.metadata.namespace.as_deref()
        && crds::Owner::of(meta).is_some_and(|owner| owner.is(cluster_key))
}

/// The names of `vc`'s super namespaces among `namespaces`, sorted.
pub fn super_namespaces(vc: &VirtualCluster, namespaces: &[ObjectMeta]) -> BTreeSet<String> {
    let Some(key) = cluster_key_of(vc) else {
        return BTreeSet::new();
    };
    namespaces
        .iter()
        .filter(|meta| is_super_namespace_of(meta, vc, &key))
        .filter_map(|meta| meta.name.clone())
        .collect()
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Phase, or empty.
    pub phase: String,
    /// `spec.clusterVersionName`, or `adopted`.
    pub version: String,
    /// Age, kubectl style.
    pub age: String,
    /// Super namespaces.
    pub tenant_namespaces: usize,
    /// Pods in them.
    pub pods: usize,
}

/// `spec.clusterVersionName`, or `adopted`.
pub fn version(vc: &VirtualCluster) -> String {
    match (&vc.spec.cluster_version_name, vc.adoption()) {
        (_, Some(_)) => "adopted".into(),
        (Some(name), None) => name.clone(),
        (None, None) => "<none>".into(),
    }
}

/// Age of an object at `now`, or empty without a creation time.
pub fn age(meta: &ObjectMeta, now: Timestamp) -> String {
    meta.creation_timestamp
        .as_ref()
        .map(|t| duration::age(now.as_second() - t.0.as_second()))
        .unwrap_or_default()
}

/// Rows from the VirtualClusters, namespaces (metadata) and pods (metadata), sorted by namespace and name.
pub fn rows(
    vcs: &[VirtualCluster],
    namespaces: &[ObjectMeta],
    pods: &[ObjectMeta],
    now: Timestamp,
) -> Vec<Row> {
    let mut pods_by_namespace: BTreeMap<&str, usize> = BTreeMap::new();
    for pod in pods {
        if let Some(ns) = pod.namespace.as_deref() {
            *pods_by_namespace.entry(ns).or_default() += 1;
        }
    }
    let mut rows: Vec<Row> = vcs
        .iter()
        .map(|vc| {
            let owned = super_namespaces(vc, namespaces);
            Row {
                name: vc.name_any(),
                namespace: vc.namespace().unwrap_or_default(),
                phase: vc.phase().map(|p| p.to_string()).unwrap_or_default(),
                version: version(vc),
                age: age(&vc.metadata, now),
                tenant_namespaces: owned.len(),
                pods: owned
                    .iter()
                    .map(|ns| pods_by_namespace.get(ns.as_str()).copied().unwrap_or(0))
                    .sum(),
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// The table; with the NAMESPACE column for `-A`.
pub fn render(rows: &[Row], all_namespaces: bool) -> String {
    let rows = rows
        .iter()
        .map(|row| {
            let cells = vec![
                row.phase.clone(),
                row.version.clone(),
                row.age.clone(),
                row.tenant_namespaces.to_string(),
                row.pods.to_string(),
            ];
            (row.name.clone(), row.namespace.clone(), cells)
        })
        .collect();
    table::render_named(
        &["PHASE", "VERSION", "AGE", "TENANT NAMESPACES", "PODS"],
        rows,
        all_namespaces,
    )
}

/// The label selector of the super namespaces and pods of the VirtualClusters in `scope`.
pub fn selector(scope: &Scope) -> String {
    match scope {
        Scope::Namespace(ns) => format!("{LABEL_VC_NAMESPACE}={ns}"),
        Scope::All => LABEL_VC_NAME.to_owned(),
    }
}

/// `kubectl vc list`.
pub async fn command(client: &Client, scope: Scope, args: &ListArgs, io: &mut Streams<'_>) -> Result<()> {
    let (api, where_): (Api<VirtualCluster>, String) = match &scope {
        Scope::Namespace(ns) => (Api::namespaced(client.clone(), ns), format!("namespace {ns}")),
        Scope::All => (Api::all(client.clone()), "every namespace".into()),
    };
    let vcs = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::api(format!("listing VirtualClusters in {where_}"), e))?
        .items;
    if let Some(format) = args.output.output {
        return print_objects(&vcs, format, io);
    }
    if vcs.is_empty() {
        match &scope {
            Scope::Namespace(ns) => writeln!(io.err, "No VirtualClusters found in namespace {ns}.")?,
            Scope::All => writeln!(io.err, "No VirtualClusters found.")?,
        }
        return Ok(());
    }
    let params = ListParams::default().labels(&selector(&scope));
    let namespaces: Vec<ObjectMeta> = Api::<Namespace>::all(client.clone())
        .list_metadata(&params)
        .await
        .map_err(|e| Error::api("listing the syncer's tenant namespaces", e))?
        .items
        .into_iter()
        .map(|n| n.metadata)
        .collect();
    let pods: Vec<ObjectMeta> = Api::<Pod>::all(client.clone())
        .list_metadata(&params)
        .await
        .map_err(|e| Error::api("listing tenant pods", e))?
        .items
        .into_iter()
        .map(|p| p.metadata)
        .collect();
    let rows = rows(&vcs, &namespaces, &pods, Timestamp::now());
    io.out.write_all(render(&rows, scope == Scope::All).as_bytes())?;
    Ok(())
}

fn print_objects(vcs: &[VirtualCluster], format: Format, io: &mut Streams<'_>) -> Result<()> {
    let list = output::list(vcs)?;
    io.out
        .write_all(output::serialize(&list, format, "the VirtualClusters")?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn vc(namespace: &str, name: &str, uid: &str, version: Option<&str>) -> VirtualCluster {
        let mut vc = VirtualCluster::new(
            name,
            crds::VirtualClusterSpec {
                cluster_version_name: version.map(str::to_owned),
                kubeconfig_secret_ref: version.is_none().then(|| crds::KubeconfigSecretRef {
                    name: "kc".into(),
                    key: "value".into(),
                }),
                ..Default::default()
            },
        );
        vc.metadata.namespace = Some(namespace.into());
        vc.metadata.uid = Some(uid.into());
        vc.metadata.creation_timestamp = Some(Time(Timestamp::from_second(NOW - 3 * 86_400).expect("time")));
        vc.status = Some(crds::VirtualClusterStatus {
            phase: Some(crds::ClusterPhase::Running),
            ..Default::default()
        });
        vc
    }

    fn super_ns(vc: &VirtualCluster, tenant_ns: &str) -> ObjectMeta {
        let key = cluster_key_of(vc).expect("key");
        ObjectMeta {
            name: Some(crds::naming::super_namespace(&key, tenant_ns)),
            labels: Some(
                [
                    (LABEL_VC_NAME.to_owned(), vc.name_any()),
                    (LABEL_VC_NAMESPACE.to_owned(), vc.namespace().unwrap_or_default()),
                ]
                .into(),
            ),
            annotations: Some(
                [
                    (crds::wellknown::ANNOTATION_CLUSTER.to_owned(), key),
                    (
                        crds::wellknown::ANNOTATION_NAMESPACE.to_owned(),
                        tenant_ns.to_owned(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    fn pod_in(namespace: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some("p".into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        }
    }

    #[test]
    fn namespaces_and_pods_are_counted_per_virtual_cluster() {
        let a = vc("team", "a", "uid-a", Some("cv-1"));
        let b = vc("other", "b", "uid-b", None);
        // A namespace left from an earlier "a" (another uid) does not count.
        let old_a = vc("team", "a", "uid-old", Some("cv-1"));
        let namespaces = vec![
            super_ns(&a, "default"),
            super_ns(&a, "kube-system"),
            super_ns(&b, "default"),
            super_ns(&old_a, "default"),
        ];
        let pods = vec![
            pod_in(namespaces[0].name.as_deref().expect("name")),
            pod_in(namespaces[0].name.as_deref().expect("name")),
            pod_in(namespaces[1].name.as_deref().expect("name")),
            pod_in(namespaces[3].name.as_deref().expect("name")),
            pod_in("unrelated"),
        ];
        let now = Timestamp::from_second(NOW).expect("now");
        let rows = rows(&[b.clone(), a.clone()], &namespaces, &pods, now);
        assert_eq!(
            rows,
            [
                Row {
                    name: "b".into(),
                    namespace: "other".into(),
                    phase: "Running".into(),
                    version: "adopted".into(),
                    age: "3d".into(),
                    tenant_namespaces: 1,
                    pods: 0,
                },
                Row {
                    name: "a".into(),
                    namespace: "team".into(),
                    phase: "Running".into(),
                    version: "cv-1".into(),
                    age: "3d".into(),
                    tenant_namespaces: 2,
                    pods: 3,
                },
            ]
        );
        assert_eq!(
            render(&rows, true),
            "NAME   NAMESPACE   PHASE     VERSION   AGE   TENANT NAMESPACES   PODS\n\
             b      other       Running   adopted   3d    1                   0\n\
             a      team        Running   cv-1      3d    2                   3\n"
        );
        assert_eq!(
            render(&rows[1..], false),
            "NAME   PHASE     VERSION   AGE   TENANT NAMESPACES   PODS\n\
             a      Running   cv-1      3d    2                   3\n"
        );
    }

    #[test]
    fn selectors_follow_the_scope() {
        assert_eq!(
            selector(&Scope::Namespace("team".into())),
            "tenancy.x-k8s.io/vcnamespace=team"
        );
        assert_eq!(selector(&Scope::All), "tenancy.x-k8s.io/vcname");
    }
}
