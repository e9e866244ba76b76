//! The platform as it ships, run the way a platform team runs it: the component images built from the
//! workspace ([`images`]), the chart installed with `helm install --wait` onto a super cluster of real
//! nodes ([`helm`]), every component a pod, and tenants created from VirtualCluster YAML.
//!
//! [`Platform`] is `vc-sandbox`'s main path on real nodes and the setting of the e2e tests of the shipped
//! platform; the in-process components of [`crate::sandbox`] stay for simulated nodes and benchmarks.
//!
//! What the harness adds to a platform team's install, each as a platform team would do it:
//! - the images' registry and tag (`image.registry`, `image.tag`): the harness's registry, which every
//!   node mirrors;
//! - vn-agent's serving certificate (`vnAgent.tls.secretName`), from a CA of the harness that every
//!   adopted tenant's apiserver verifies vn-agent against (`--kubelet-certificate-authority`);
//! - the release namespace's Pod Security label `privileged` (vn-agent runs on the host network).

pub mod helm;
pub mod images;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use crds::VirtualCluster;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams},
};

pub use helm::{Release, ReleaseOptions};
pub use images::{ComponentImages, IMAGE_REGISTRY, TAG};

use crate::{
    Error, Result,
    apply::apply_yaml,
    client_from_kubeconfig_file,
    pki::{CertificateAuthority, Usage},
    sandbox::{
        CLUSTER_VERSION, Files, NATIVE_PATIENCE, TENANT_PATIENCE, cluster_version_yaml,
        hand_over_kubelet_client, native_kubeconfig, wait_tenant_ready,
    },
    tenancy::{Tenancy, TenancyOptions, VC_NAMESPACE},
    wait,
};

/// The Secret holding vn-agent's serving certificate, in the release's namespace.
pub const VN_AGENT_TLS_SECRET: &str = "vn-agent-serving";

/// Field manager of what the harness writes around the release.
const FIELD_MANAGER: &str = "vc-e2e-platform";

/// How to start a [`Platform`].
#[derive(Clone, Debug)]
pub struct PlatformOptions {
    /// Real super nodes.
    pub nodes: usize,
    /// The release: its name, namespace, values and tag.
    pub release: ReleaseOptions,
    /// Where the kubeconfigs go (kept); default a temporary folder.
    pub dir: Option<PathBuf>,
    /// Keep the super apiserver's audit log of writes ([`crate::ApiServer::audit_events`]).
    pub audit: bool,
}

impl Default for PlatformOptions {
    fn default() -> Self {
        Self {
            nodes: 2,
            release: ReleaseOptions::default(),
            dir: None,
            audit: false,
        }
    }
}

/// A super cluster of real nodes with the chart installed, and its tenants. Fields drop in order: the
/// tenants' and super cluster's processes go with [`Tenancy`], then the files.
pub struct Platform {
    release: Release,
    tenancy: Tenancy,
    vn_agent_ca: CertificateAuthority,
    images: &'static ComponentImages,
    install_time: Duration,
    files: Files,
    super_kubeconfig: PathBuf,
    tenant_kubeconfigs: BTreeMap<String, PathBuf>,
    cluster_version_applied: bool,
}

impl std::fmt::Debug for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Platform")
            .field("release", &self.release)
            .field("tenants", &self.tenant_kubeconfigs)
            .finish_non_exhaustive()
    }
}

impl Platform {
    /// Starts a super cluster with `options.nodes` real nodes, builds and serves the component images,
    /// and installs the chart with `helm install --wait`; returns once every component is Ready.
    pub async fn start(options: PlatformOptions) -> Result<Self> {
        let files = Files::new(options.dir.as_deref())?;
        // Before the nodes start: the first build compiles the release binaries.
        let images = tokio::task::spawn_blocking(images::ensure)
            .await
            .map_err(|e| Error::Io {
                context: "building the component images".into(),
                source: std::io::Error::other(e),
            })??;
        let vn_agent_ca = CertificateAuthority::new("vn-agent serving CA")?;
        let tenancy = Tenancy::start(TenancyOptions {
            tenants: 0,
            nodes: options.nodes,
            real_nodes: true,
            network_policies: true,
            install_crds: false,
            super_audit: options.audit,
            tenant_kubelet_ca: Some(vn_agent_ca.cert_pem().to_owned()),
            ..TenancyOptions::default()
        })
        .await?;
        let super_client = tenancy.super_client();
        tenancy.nodes.wait_ready(&super_client).await?;
        let super_kubeconfig = files.write(
            "super.kubeconfig",
            &tenancy.super_cluster.apiserver().admin_kubeconfig(),
        )?;
        ensure_namespace(&super_client, &options.release.namespace).await?;
        let nodes: Vec<(String, String)> = tenancy
            .nodes
            .real()
            .map(|real| {
                real.nodes()
                    .iter()
                    .map(|n| (n.name().to_owned(), n.ip()))
                    .collect()
            })
            .unwrap_or_default();
        write_vn_agent_certificate(&super_client, &vn_agent_ca, &options.release.namespace, &nodes).await?;
        let (release, install_time) =
            Release::install(super_client, &super_kubeconfig, base_values(), &options.release).await?;
        Ok(Self {
            release,
            tenancy,
            vn_agent_ca,
            images,
            install_time,
            files,
            super_kubeconfig,
            tenant_kubeconfigs: BTreeMap::new(),
            cluster_version_applied: false,
        })
    }

    /// Starts a tenant master (apiserver and controller-manager processes on this machine, reachable from
    /// the nodes) and adopts it from YAML: a Secret with its kubeconfig and a VirtualCluster naming it.
    /// Hands it vc-manager's kubelet-client certificate and its client CA to `kubectl vc`, as the platform
    /// guide tells an operator to, and waits until it is Running and synced. Returns the path of its admin
    /// kubeconfig.
    pub async fn add_adopted_tenant(&mut self, name: &str) -> Result<PathBuf> {
        let client = self.super_client();
        let control_plane = self.tenancy.start_master(name).await?;
        let yaml = adopted_tenant_yaml(name, &control_plane.apiserver().node_admin_kubeconfig());
        apply_yaml(&client, &yaml, VC_NAMESPACE).await?;
        let virtual_cluster = Api::<VirtualCluster>::namespaced(client.clone(), VC_NAMESPACE)
            .get(name)
            .await
            .map_err(Error::kube(format!("reading VirtualCluster {name}")))?;
        self.tenancy.push_tenant(name, control_plane, virtual_cluster)?;
        hand_over_kubelet_client(&client, self.tenancy.tenant_mut(name)).await?;
        if let Err(error) = wait_tenant_ready(&client, name, TENANT_PATIENCE).await {
            return Err(self.explain(name, error).await);
        }
        let kubeconfig = self
            .tenancy
            .tenant(name)
            .control_plane
            .apiserver()
            .admin_kubeconfig();
        let path = self.files.write(&format!("{name}.kubeconfig"), &kubeconfig)?;
        self.tenant_kubeconfigs.insert(name.to_owned(), path.clone());
        Ok(path)
    }

    /// Creates a native tenant from YAML (the `examples/` ClusterVersion with the images built here, once,
    /// and a VirtualCluster naming it), waits until vc-manager reports it Running and the syncer synced it,
    /// and writes its admin kubeconfig pointed at its apiserver Service's cluster IP. Returns its path.
    pub async fn add_native_tenant(&mut self, name: &str) -> Result<PathBuf> {
        let client = self.super_client();
        if !self.cluster_version_applied {
            apply_yaml(&client, &cluster_version_yaml()?, VC_NAMESPACE).await?;
            self.cluster_version_applied = true;
        }
        apply_yaml(&client, &native_tenant_yaml(name, CLUSTER_VERSION), VC_NAMESPACE).await?;
        if let Err(error) = wait_tenant_ready(&client, name, NATIVE_PATIENCE).await {
            return Err(self.explain(name, error).await);
        }
        let vc = Api::<VirtualCluster>::namespaced(client.clone(), VC_NAMESPACE)
            .get(name)
            .await
            .map_err(Error::kube(format!("reading VirtualCluster {name}")))?;
        let key = crds::naming::cluster_key_of(&vc).ok_or_else(|| Error::Kubeconfig {
            context: format!("VirtualCluster {name} has no uid"),
            source: "created without uid".into(),
        })?;
        let kubeconfig = native_kubeconfig(&client, &key).await?;
        let path = self.files.write(&format!("{name}.kubeconfig"), &kubeconfig)?;
        let tenant = client_from_kubeconfig_file(&path).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(tenant, "default");
        wait::until_true(
            TENANT_PATIENCE,
            &format!("the default service account of native tenant {name}"),
            || {
                let accounts = accounts.clone();
                async move { matches!(accounts.get_opt("default").await, Ok(Some(_))) }
            },
        )
        .await?;
        self.tenant_kubeconfigs.insert(name.to_owned(), path.clone());
        Ok(path)
    }

    /// `error` with what VirtualCluster `name`'s status, its control plane's pods (native tenants) and the
    /// release's pods (with their last log lines) say.
    async fn explain(&self, name: &str, error: Error) -> Error {
        let Error::Timeout { what, seconds } = error else {
            return error;
        };
        let client = self.super_client();
        let vc = Api::<VirtualCluster>::namespaced(client.clone(), VC_NAMESPACE)
            .get_opt(name)
            .await
            .ok()
            .flatten();
        let status = vc.as_ref().and_then(|vc| vc.status.as_ref());
        let mut what = format!(
            "{what}; its status: {}",
            status
                .and_then(|s| serde_json::to_string(s).ok())
                .unwrap_or_else(|| "none".into())
        );
        if let Some(root) = status.and_then(|s| s.cluster_namespace.clone()) {
            what += &format!(
                "; in {root}: {}",
                helm::diagnose_namespace(&client, &root, Some(10)).await
            );
        }
        what += &format!(
            "; in {}: {}",
            self.release.namespace(),
            helm::diagnose_namespace(&client, self.release.namespace(), Some(20)).await
        );
        Error::Timeout { what, seconds }
    }

    /// Deletes VirtualCluster `name`, waits until vc-manager and the syncer have let it go, and stops its
    /// tenant master when the harness started one.
    pub async fn remove_tenant(&mut self, name: &str) -> Result<()> {
        let api: Api<VirtualCluster> = Api::namespaced(self.super_client(), VC_NAMESPACE);
        api.delete(name, &DeleteParams::default())
            .await
            .map_err(Error::kube(format!("deleting VirtualCluster {name}")))?;
        wait::until_true(NATIVE_PATIENCE, &format!("VirtualCluster {name} gone"), || {
            let api = api.clone();
            async move { matches!(api.get_opt(name).await, Ok(None)) }
        })
        .await?;
        self.tenancy.tenants.retain(|t| t.name != name);
        self.tenant_kubeconfigs.remove(name);
        Ok(())
    }

    /// `helm uninstall` of the release (which must have no tenants left), then `helm install --wait` with
    /// `options`; how long the install took.
    pub async fn reinstall(&mut self, options: &ReleaseOptions) -> Result<Duration> {
        if self.release.is_installed() {
            self.release.uninstall(Duration::from_secs(300)).await?;
        }
        let client = self.super_client();
        ensure_namespace(&client, &options.namespace).await?;
        let nodes = self.node_names_and_addresses();
        write_vn_agent_certificate(&client, &self.vn_agent_ca, &options.namespace, &nodes).await?;
        let (release, took) =
            Release::install(client, &self.super_kubeconfig, base_values(), options).await?;
        self.release = release;
        self.install_time = took;
        Ok(took)
    }

    fn node_names_and_addresses(&self) -> Vec<(String, String)> {
        self.tenancy
            .nodes
            .real()
            .map(|real| {
                real.nodes()
                    .iter()
                    .map(|n| (n.name().to_owned(), n.ip()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The documented uninstall: deletes every VirtualCluster (vc-manager removes their control planes and
    /// the syncer their super namespaces) and waits until they are gone, then `helm uninstall --wait`.
    pub async fn uninstall(&mut self) -> Result<String> {
        let client = self.super_client();
        let api: Api<VirtualCluster> = Api::all(client.clone());
        let listed = api
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("listing VirtualClusters"))?;
        for vc in &listed.items {
            let namespaced: Api<VirtualCluster> =
                Api::namespaced(client.clone(), &vc.namespace().unwrap_or_default());
            namespaced
                .delete(&vc.name_any(), &DeleteParams::default())
                .await
                .map_err(Error::kube(format!("deleting VirtualCluster {}", vc.name_any())))?;
        }
        wait::until_true(NATIVE_PATIENCE, "every VirtualCluster gone", || {
            let api = api.clone();
            async move {
                api.list(&ListParams::default())
                    .await
                    .is_ok_and(|l| l.items.is_empty())
            }
        })
        .await?;
        self.release.uninstall(Duration::from_secs(300)).await
    }

    /// The release.
    pub fn release(&self) -> &Release {
        &self.release
    }

    /// The release, to uninstall it.
    pub fn release_mut(&mut self) -> &mut Release {
        &mut self.release
    }

    /// How long `helm install --wait` took, until every component was Ready.
    pub fn install_time(&self) -> Duration {
        self.install_time
    }

    /// The component images and their sizes.
    pub fn images(&self) -> &'static ComponentImages {
        self.images
    }

    /// The super cluster, its nodes and the adopted tenants' masters.
    pub fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    /// The same, to stop or restart processes.
    pub fn tenancy_mut(&mut self) -> &mut Tenancy {
        &mut self.tenancy
    }

    /// A cluster-admin client of the super cluster.
    pub fn super_client(&self) -> Client {
        self.tenancy.super_client()
    }

    /// The super cluster's admin kubeconfig file.
    pub fn super_kubeconfig(&self) -> &Path {
        &self.super_kubeconfig
    }

    /// Admin kubeconfig files of the tenants, by name.
    pub fn tenant_kubeconfigs(&self) -> &BTreeMap<String, PathBuf> {
        &self.tenant_kubeconfigs
    }

    /// The folder holding the kubeconfigs.
    pub fn dir(&self) -> &Path {
        self.files.path()
    }
}

/// The harness's own values, given before any other: vn-agent's serving certificate.
fn base_values() -> serde_json::Value {
    serde_json::json!({"vnAgent": {"tls": {"secretName": VN_AGENT_TLS_SECRET}}})
}

/// Creates `namespace` with the Pod Security label vn-agent's host network needs, or labels it.
pub async fn ensure_namespace(client: &Client, namespace: &str) -> Result<()> {
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            labels: Some(
                [(
                    "pod-security.kubernetes.io/enforce".to_owned(),
                    "privileged".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .patch(
            namespace,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(Error::kube(format!("creating namespace {namespace}")))?;
    Ok(())
}

/// vn-agent's serving certificate for every node (its name and address), signed by `ca`, as the
/// `kubernetes.io/tls` Secret the chart's `vnAgent.tls.secretName` names.
async fn write_vn_agent_certificate(
    client: &Client,
    ca: &CertificateAuthority,
    namespace: &str,
    nodes: &[(String, String)],
) -> Result<()> {
    let mut names: Vec<&str> = vec!["localhost", "127.0.0.1"];
    for (name, address) in nodes {
        names.push(name);
        names.push(address);
    }
    let serving = ca.issue("vn-agent", &[], &names, Usage::Server)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(VN_AGENT_TLS_SECRET.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        string_data: Some(
            [
                ("tls.crt".to_owned(), serving.cert_pem.clone()),
                ("tls.key".to_owned(), serving.key_pem.clone()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(
            VN_AGENT_TLS_SECRET,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(Error::kube("writing vn-agent's serving certificate"))?;
    Ok(())
}

/// An adopted tenant as a platform team writes it: the Secret holding the tenant's admin kubeconfig,
/// labelled as meant for it, and the VirtualCluster naming it (`examples/virtualcluster-adopt.yaml`).
pub fn adopted_tenant_yaml(name: &str, kubeconfig: &str) -> String {
    let indented: String = kubeconfig.lines().map(|line| format!("    {line}\n")).collect();
    let label = crds::wellknown::LABEL_KUBECONFIG_FOR;
    format!(
        "apiVersion: v1
kind: Secret
metadata:
  name: {name}-kubeconfig
  namespace: {VC_NAMESPACE}
  labels:
    {label}: {name}
stringData:
  value: |
{indented}---
apiVersion: tenancy.x-k8s.io/v1alpha1
kind: VirtualCluster
metadata:
  name: {name}
  namespace: {VC_NAMESPACE}
spec:
  kubeconfigSecretRef:
    name: {name}-kubeconfig
    key: value
"
    )
}

/// A native tenant as a platform team writes it (`examples/virtualcluster-native.yaml`, trimmed).
pub fn native_tenant_yaml(name: &str, cluster_version: &str) -> String {
    format!(
        "apiVersion: tenancy.x-k8s.io/v1alpha1
kind: VirtualCluster
metadata:
  name: {name}
  namespace: {VC_NAMESPACE}
spec:
  clusterVersionName: {cluster_version}
  clusterDomain: cluster.local
  serviceCidr: 10.32.0.0/16
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_yaml_parses_into_the_objects_a_platform_team_writes() {
        let kubeconfig = "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://10.243.0.1:6443\n";
        let objects =
            crate::apply::parse_documents(&adopted_tenant_yaml("team-b", kubeconfig)).expect("YAML");
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[0].data["stringData"]["value"], kubeconfig);
        assert_eq!(
            objects[1].data["spec"]["kubeconfigSecretRef"]["name"],
            "team-b-kubeconfig"
        );
        let native = crate::apply::parse_documents(&native_tenant_yaml("team-a", "cv")).expect("YAML");
        assert_eq!(native[0].data["spec"]["clusterVersionName"], "cv");
    }
}
