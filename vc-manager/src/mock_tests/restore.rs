//! A VirtualCluster being restored from a snapshot: vc-manager makes only its root namespace until the
//! snapshot's authorities are in, then etcd alone until the snapshot's keys are in.

use std::sync::Arc;

use crds::wellknown::{
    ANNOTATION_RESTORE, CONDITION_APISERVER_READY, CONDITION_READY, RESTORE_STAGE_ETCD, RESTORE_STAGE_PKI,
};
use serde_json::{Value, json};

use super::*;
use crate::{restore::REASON_RESTORING, virtual_cluster::reconcile};
use tenant_pki::secrets::Scope;

fn restoring(stage: &str) -> VirtualCluster {
    let mut vc = native_vc();
    vc.metadata.annotations = Some([(ANNOTATION_RESTORE.to_owned(), stage.to_owned())].into());
    vc
}

fn root_namespace() -> Value {
    let identity = TenantIdentity::of(&native_vc()).expect("identity");
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": root(),
            "uid": "ns-uid",
            "labels": crate::identity::managed_labels(),
            "annotations": identity.root_namespace_annotations(),
        }
    })
}

#[tokio::test]
async fn before_the_snapshots_authorities_are_in_only_the_root_namespace_is_made() {
    let (ctx, _caches, mut api) = context(no_probe());
    let result = run(
        async move {
            api.expect("GET", &format!("/api/v1/namespaces/{}", root()))
                .await
                .ok(root_namespace());
            // No ClusterVersion read, no Services, no Secrets: the status says why.
            let status: Value = api.vc_status().await;
            assert_eq!(status["phase"], "Pending", "{status}");
            assert_eq!(status["reason"], REASON_RESTORING);
            assert!(
                status["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("certificate authorities") && m.contains(&root())),
                "{status}"
            );
            assert_eq!(condition(&status, CONDITION_READY)["status"], "False");
        },
        reconcile(Arc::new(restoring(RESTORE_STAGE_PKI)), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn while_the_snapshots_keys_go_in_etcd_runs_alone() {
    let (ctx, _caches, mut api) = context(no_probe());
    let secrets = stored_secrets(&Scope::Native(Box::new(network())));
    let result = run(
        async move {
            super::pause::everything_but_the_statefulsets(&mut api, &secrets).await;
            let call = api
                .expect(
                    "PATCH",
                    &format!("/apis/apps/v1/namespaces/{}/statefulsets/etcd{APPLY}", root()),
                )
                .await;
            let body = with_status(call.body.clone(), 1, 1);
            call.ok(body);
            assert!(
                api.event("EtcdCreated")
                    .await
                    .contains("created the etcd StatefulSet")
            );
            // etcd is ready, yet neither the apiserver nor the controller-manager is applied.
            let status: Value = api.vc_status().await;
            assert_eq!(status["phase"], "Pending", "{status}");
            assert_eq!(status["reason"], REASON_RESTORING);
            assert_eq!(condition(&status, CONDITION_APISERVER_READY)["status"], "False");
        },
        reconcile(Arc::new(restoring(RESTORE_STAGE_ETCD)), ctx),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
}
