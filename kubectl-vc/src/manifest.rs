//! `kubectl vc create -f FILE`: the file's VirtualClusters and ClusterVersions, checked before anything is
//! sent, then server-side applied under the field manager `kubectl-vc` (ClusterVersions first, so a
//! VirtualCluster never waits for the version it names), and with `--wait` followed until Running.

use std::{path::Path, time::Duration};

use crds::{ClusterVersion, VirtualCluster};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::Value;

use crate::{Error, Result, Streams, args::CreateArgs, output, progress};

/// The field manager of `kubectl vc create`.
pub use crds::wellknown::FIELD_MANAGER_KUBECTL_VC as FIELD_MANAGER;

/// `apiVersion` of the kinds `create` applies.
pub const API_VERSION: &str = "tenancy.x-k8s.io/v1alpha1";

/// A kind `create` applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A namespaced VirtualCluster.
    VirtualCluster,
    /// A cluster-scoped ClusterVersion.
    ClusterVersion,
}

impl Kind {
    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::VirtualCluster => "VirtualCluster",
            Self::ClusterVersion => "ClusterVersion",
        }
    }

    /// `virtualcluster.tenancy.x-k8s.io` (as kubectl names resources in its output).
    pub fn resource(self) -> &'static str {
        match self {
            Self::VirtualCluster => "virtualcluster.tenancy.x-k8s.io",
            Self::ClusterVersion => "clusterversion.tenancy.x-k8s.io",
        }
    }
}

/// One object of the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// 1-based position in the file (counting empty documents).
    pub index: usize,
    /// Its kind.
    pub kind: Kind,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, if the file sets one (VirtualClusters only).
    pub namespace: Option<String>,
    /// The object exactly as written (what is applied, so that only the fields in the file are owned).
    pub object: Value,
}

/// Splits a YAML stream at its `---` document markers.
fn split_documents(text: &str) -> Vec<String> {
    let mut documents = vec![String::new()];
    for line in text.lines() {
        let marker = line.trim_end();
        if marker == "---" || marker.starts_with("--- ") || marker.starts_with("---#") {
            documents.push(String::new());
            continue;
        }
        if marker == "..." {
            continue;
        }
        let current = documents.last_mut().expect("never empty");
        current.push_str(line);
        current.push('\n');
    }
    documents
}

/// Parses the documents of a manifest file (`path` names it in errors). Empty documents are skipped; any
/// kind but VirtualCluster and ClusterVersion of `tenancy.x-k8s.io/v1alpha1` is refused, and so is an
/// object that does not read as its kind.
pub fn parse(path: &str, text: &str) -> Result<Vec<Document>> {
    let mut documents = Vec::new();
    for (position, chunk) in split_documents(text).iter().enumerate() {
        let index = position + 1;
        let invalid = |message: String| Error::InvalidDocument {
            path: path.to_owned(),
            document: index,
            message,
        };
        let value: Value = if chunk
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            Value::Null
        } else {
            serde_saphyr::from_str(chunk).map_err(|e| invalid(format!("not YAML: {e}")))?
        };
        if value.is_null() {
            continue;
        }
        let Some(map) = value.as_object() else {
            return Err(invalid(
                "not an object (a mapping with apiVersion, kind, metadata)".into(),
            ));
        };
        let text_of = |key: &str| {
            map.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (api_version, kind_name) = (text_of("apiVersion"), text_of("kind"));
        let kind = match (api_version.as_str(), kind_name.as_str()) {
            (API_VERSION, "VirtualCluster") => Kind::VirtualCluster,
            (API_VERSION, "ClusterVersion") => Kind::ClusterVersion,
            _ => {
                return Err(Error::UnsupportedKind {
                    path: path.to_owned(),
                    document: index,
                    api_version: if api_version.is_empty() {
                        "no apiVersion".into()
                    } else {
                        api_version
                    },
                    kind: if kind_name.is_empty() {
                        "document without kind".into()
                    } else {
                        kind_name
                    },
                });
            }
        };
        let checked = match kind {
            Kind::VirtualCluster => serde_json::from_value::<VirtualCluster>(value.clone()).map(|_| ()),
            Kind::ClusterVersion => serde_json::from_value::<ClusterVersion>(value.clone()).map(|_| ()),
        };
        checked.map_err(|e| invalid(format!("not a valid {}: {e}", kind.name())))?;
        let meta = map.get("metadata");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| invalid(format!("the {} has no metadata.name", kind.name())))?
            .to_owned();
        let namespace = match kind {
            Kind::VirtualCluster => meta
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
            Kind::ClusterVersion => None,
        };
        let mut object = value.clone();
        if kind == Kind::ClusterVersion
            && let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut)
        {
            // Cluster-scoped: a namespace in the file means nothing.
            meta.remove("namespace");
        }
        documents.push(Document {
            index,
            kind,
            name,
            namespace,
            object,
        });
    }
    if documents.is_empty() {
        return Err(Error::EmptyFile {
            path: path.to_owned(),
        });
    }
    Ok(documents)
}

/// Reads the file (`-`: stdin).
pub fn read(path: &Path) -> Result<(String, String)> {
    let shown = path.display().to_string();
    let text = if shown == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|error| Error::ReadFile {
        path: shown.clone(),
        error,
    })?;
    Ok((shown, text))
}

/// The namespace each VirtualCluster goes to: its own, else `namespace`; refused when it differs from an
/// explicit `--namespace`.
pub fn resolve_namespaces(
    path: &str,
    documents: &mut [Document],
    namespace: &str,
    explicit: bool,
) -> Result<()> {
    for document in documents.iter_mut().filter(|d| d.kind == Kind::VirtualCluster) {
        match &document.namespace {
            Some(own) if explicit && own != namespace => {
                return Err(Error::NamespaceMismatch {
                    path: path.to_owned(),
                    kind: document.kind.name(),
                    name: document.name.clone(),
                    object_namespace: own.clone(),
                    namespace: namespace.to_owned(),
                });
            }
            Some(_) => {}
            None => {
                document.namespace = Some(namespace.to_owned());
                if let Some(meta) = document.object.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("namespace".into(), Value::String(namespace.to_owned()));
                }
            }
        }
    }
    Ok(())
}

/// What an apply returned.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The document.
    pub document: Document,
    /// `metadata.generation` after the apply.
    pub generation: Option<i64>,
    /// The object the apply returned (without managed fields).
    pub object: Value,
}

/// Server-side applies the documents, ClusterVersions first; with `report`, prints kubectl's line for each.
pub async fn apply(
    client: &Client,
    documents: &[Document],
    io: &mut Streams<'_>,
    report: bool,
) -> Result<Vec<Applied>> {
    let params = PatchParams::apply(FIELD_MANAGER).validation_strict();
    let mut ordered: Vec<&Document> = documents.iter().collect();
    ordered.sort_by_key(|d| (d.kind != Kind::ClusterVersion, d.index));
    let mut applied = Vec::new();
    for document in ordered {
        let action = |ns: Option<&str>| match ns {
            Some(ns) => format!("applying {} {ns}/{}", document.kind.name(), document.name),
            None => format!("applying {} {}", document.kind.name(), document.name),
        };
        let (generation, object) = match document.kind {
            Kind::ClusterVersion => {
                let api: Api<ClusterVersion> = Api::all(client.clone());
                let cv = api
                    .patch(&document.name, &params, &Patch::Apply(&document.object))
                    .await
                    .map_err(|e| Error::api(action(None), e))?;
                (cv.metadata.generation, output::without_managed_fields(&cv)?)
            }
            Kind::VirtualCluster => {
                let namespace = document.namespace.as_deref().unwrap_or("default");
                let api: Api<VirtualCluster> = Api::namespaced(client.clone(), namespace);
                let vc = api
                    .patch(&document.name, &params, &Patch::Apply(&document.object))
                    .await
                    .map_err(|e| Error::api(action(Some(namespace)), e))?;
                (vc.metadata.generation, output::without_managed_fields(&vc)?)
            }
        };
        if report {
            io.result(&format!(
                "{}/{} serverside-applied",
                document.kind.resource(),
                document.name
            ))?;
        }
        applied.push(Applied {
            document: document.clone(),
            generation,
            object,
        });
    }
    Ok(applied)
}

/// `kubectl vc create`.
pub async fn command(
    client: &Client,
    namespace: &str,
    explicit_namespace: bool,
    args: &CreateArgs,
    io: &mut Streams<'_>,
) -> Result<()> {
    let (path, text) = read(&args.file)?;
    let mut documents = parse(&path, &text)?;
    resolve_namespaces(&path, &mut documents, namespace, explicit_namespace)?;
    let report = args.output.output.is_none();
    let mut applied = apply(client, &documents, io, report).await?;
    if args.wait {
        wait(client, args, &mut applied, io, report).await?;
    }
    if let Some(format) = args.output.output {
        // kubectl's convention: one object as itself, several as a List.
        let objects: Vec<&Value> = applied.iter().map(|a| &a.object).collect();
        let text = match objects.as_slice() {
            [one] => output::serialize(one, format, "the applied object")?,
            several => output::serialize(&output::list(several)?, format, "the applied objects")?,
        };
        io.out.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// `--wait`: follows every applied VirtualCluster until it is Running, one after the other, within one
/// `--timeout`; each one's object becomes the one last seen.
async fn wait(
    client: &Client,
    args: &CreateArgs,
    applied: &mut [Applied],
    io: &mut Streams<'_>,
    report: bool,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + args.timeout;
    for applied in applied
        .iter_mut()
        .filter(|a| a.document.kind == Kind::VirtualCluster)
    {
        let document = &applied.document;
        let api: Api<VirtualCluster> =
            Api::namespaced(client.clone(), document.namespace.as_deref().unwrap_or("default"));
        let remaining = deadline
            .checked_duration_since(tokio::time::Instant::now())
            .unwrap_or(Duration::ZERO);
        let running = progress::wait_running(
            &api,
            &document.name,
            applied.generation,
            remaining,
            args.timeout,
            io,
            report,
        )
        .await?;
        applied.object = output::without_managed_fields(&running)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples(name: &str) -> String {
        std::fs::read_to_string(format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR")))
            .expect("example")
    }

    #[test]
    fn the_examples_parse() {
        let text = format!(
            "{}\n---\n# a comment only\n---\n{}",
            examples("clusterversion-nodeport.yaml"),
            examples("virtualcluster-native.yaml")
        );
        let documents = parse("both.yaml", &text).expect("parses");
        let kinds: Vec<(Kind, &str, Option<&str>)> = documents
            .iter()
            .map(|d| (d.kind, d.name.as_str(), d.namespace.as_deref()))
            .collect();
        assert_eq!(
            kinds,
            [
                (Kind::ClusterVersion, "cv-v1-33-nodeport", None),
                (Kind::VirtualCluster, "team-a", Some("default")),
            ]
        );
        assert_eq!(documents[1].index, 3);
        // Applied as written: no defaults filled in.
        assert!(documents[1].object["spec"].get("opaqueMetaPrefixes").is_none());
        let adopt = parse("a.yaml", &examples("virtualcluster-adopt.yaml")).expect("adopt parses");
        assert!(adopt.iter().all(|d| d.kind == Kind::VirtualCluster));
    }

    #[test]
    fn other_kinds_are_refused_by_position() {
        let text = "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata: {name: vc}\nspec: {clusterVersionName: cv}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\n";
        let error = parse("f.yaml", text).expect_err("a Pod");
        assert!(matches!(&error, Error::UnsupportedKind { document: 2, kind, .. } if kind == "Pod"));
        assert_eq!(
            error.to_string(),
            "f.yaml: document 2 is a Pod (v1); kubectl vc create applies only VirtualCluster and ClusterVersion (tenancy.x-k8s.io/v1alpha1) — use kubectl apply for other objects"
        );
        let other_version =
            "apiVersion: tenancy.x-k8s.io/v1beta1\nkind: VirtualCluster\nmetadata: {name: x}\n";
        assert!(matches!(
            parse("f.yaml", other_version),
            Err(Error::UnsupportedKind { .. })
        ));
        assert!(matches!(
            parse("f.yaml", "just text"),
            Err(Error::InvalidDocument { document: 1, .. })
        ));
        assert!(matches!(
            parse("f.yaml", "# nothing\n---\n"),
            Err(Error::EmptyFile { .. })
        ));
        let bad_field = "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata: {name: x}\nspec: {weight: heavy}\n";
        let error = parse("f.yaml", bad_field).expect_err("bad weight");
        assert!(
            error
                .to_string()
                .starts_with("f.yaml: document 1: not a valid VirtualCluster"),
            "{error}"
        );
        let no_name = "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata: {namespace: x}\nspec: {}\n";
        assert!(
            parse("f.yaml", no_name)
                .expect_err("no name")
                .to_string()
                .contains("no metadata.name")
        );
    }

    #[test]
    fn namespaces_come_from_the_file_or_the_flag() {
        let text = "apiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata: {name: a}\nspec: {clusterVersionName: cv}\n---\napiVersion: tenancy.x-k8s.io/v1alpha1\nkind: VirtualCluster\nmetadata: {name: b, namespace: team}\nspec: {clusterVersionName: cv}\n";
        let mut documents = parse("f.yaml", text).expect("parses");
        resolve_namespaces("f.yaml", &mut documents, "team", true).expect("agrees");
        assert_eq!(documents[0].namespace.as_deref(), Some("team"));
        assert_eq!(documents[0].object["metadata"]["namespace"], "team");
        let mut documents = parse("f.yaml", text).expect("parses");
        let error = resolve_namespaces("f.yaml", &mut documents, "other", true).expect_err("disagrees");
        assert!(
            error
                .to_string()
                .contains("is in namespace \"team\", but --namespace is \"other\""),
            "{error}"
        );
        // The context's namespace is only a default.
        let mut documents = parse("f.yaml", text).expect("parses");
        resolve_namespaces("f.yaml", &mut documents, "other", false).expect("default only");
        assert_eq!(documents[1].namespace.as_deref(), Some("team"));
        assert_eq!(documents[0].namespace.as_deref(), Some("other"));
    }
}
