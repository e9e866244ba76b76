//! `kubectl vc delete`: deletes a VirtualCluster and, with `--wait`, follows it until vc-manager's finalizer
//! has removed its root and tenant namespaces and the object is gone.

use std::io::Write;

use crds::VirtualCluster;
use kube::{Api, Client, ResourceExt, api::DeleteParams};

use crate::{Error, Result, args::DeleteArgs, manifest::Kind, progress};

/// `kubectl vc delete`.
pub async fn command(
    client: &Client,
    namespace: &str,
    args: &DeleteArgs,
    out: &mut (dyn Write + Send),
) -> Result<()> {
    let api: Api<VirtualCluster> = Api::namespaced(client.clone(), namespace);
    let name = args.name.as_str();
    let uid = match api.delete(name, &DeleteParams::default()).await {
        // Still there: finalizers run first.
        Ok(either) => either.left().and_then(|vc| vc.uid()),
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
    writeln!(out, "{} {name:?} deleted", Kind::VirtualCluster.resource())?;
    if !args.wait {
        return Ok(());
    }
    progress::wait_deleted(&api, name, uid, args.timeout, out).await
}
