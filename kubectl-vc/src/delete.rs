//! `kubectl vc delete`: deletes a VirtualCluster and, with `--wait`, follows it until vc-manager's finalizer
//! has removed its root and tenant namespaces and the object is gone.

use crds::VirtualCluster;
use kube::{Api, Client, ResourceExt, api::DeleteParams};
use serde_json::Value;

use crate::{Error, Result, Streams, args::DeleteArgs, manifest::Kind, output, progress};

/// `kubectl vc delete`.
pub async fn command(
    client: &Client,
    namespace: &str,
    args: &DeleteArgs,
    io: &mut Streams<'_>,
) -> Result<()> {
    let api: Api<VirtualCluster> = Api::namespaced(client.clone(), namespace);
    let name = args.name.as_str();
    let (uid, returned): (Option<String>, Value) = match api.delete(name, &DeleteParams::default()).await {
        // Still there (finalizers run first): the object; removed at once: the apiserver's Status.
        Ok(either) => either.either(
            |vc| Ok((vc.uid(), output::without_managed_fields(&vc)?)),
            |status| {
                serde_json::to_value(status)
                    .map(|value| (None, value))
                    .map_err(|e| Error::Serialize {
                        what: "the delete's status".into(),
                        message: e.to_string(),
                    })
            },
        )?,
        Err(kube::Error::Api(status)) if status.code == 404 && args.ignore_not_found => return Ok(()),
        Err(error) => {
            return Err(match &error {
                kube::Error::Api(status) if status.code == 404 => Error::NotFound {
                    kind: "VirtualCluster",
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                },
                _ => Error::api(format!("deleting VirtualCluster {namespace}/{name}"), error),
            });
        }
    };
    match args.output.output {
        Some(format) => io
            .out
            .write_all(output::serialize(&returned, format, "the VirtualCluster")?.as_bytes())?,
        None => io.result(&format!("{} {name:?} deleted", Kind::VirtualCluster.resource()))?,
    }
    if !args.wait {
        return Ok(());
    }
    progress::wait_deleted(&api, name, uid, args.timeout, io, args.output.output.is_none()).await
}
