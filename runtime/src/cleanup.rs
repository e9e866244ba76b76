//! Deleting what a tenant left in the super cluster: one object at a time, each pinned to the uid it was
//! read with, so that an object recreated under the same name since (another tenant's, or the platform's)
//! is never deleted in its place. vc-manager deletes a deleted tenant's namespaces this way, the syncer every
//! super object it removes, tenant namespaces included.

use std::fmt::Debug;

use kube::{
    Api, Resource,
    api::{DeleteParams, Preconditions},
};
use serde::de::DeserializeOwned;

/// What became of an object asked to go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// The apiserver accepted the deletion; the object may linger while finalizers run.
    Started,
    /// It was gone already, or has been replaced by another object of that name, which stays.
    Gone,
}

/// Deletes object `name` only while it is the one with `uid` (any object of that name when `None`), with
/// an optional grace period. Another object under the name, or none, is [`Deletion::Gone`], not a failure.
pub async fn delete_pinned<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
    grace_period_seconds: Option<u32>,
) -> Result<Deletion, kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        grace_period_seconds,
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(Deletion::Started),
        // 409: the uid precondition failed, so the name now belongs to another object. Codes, not reasons:
        // some answers (aggregated apiservers, proxies) carry no reason.
        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => Ok(Deletion::Gone),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Namespace;
    use mock_apiserver::{ApiServer, run};
    use serde_json::json;

    use super::*;

    async fn expect_delete(api: &mut ApiServer, name: &str, uid: &str) -> mock_apiserver::Call {
        let call = api.expect("DELETE", &format!("/api/v1/namespaces/{name}?")).await;
        assert_eq!(call.body["preconditions"]["uid"], uid, "{}", call.body);
        call
    }

    #[tokio::test]
    async fn a_deletion_is_pinned_to_the_uid_and_a_vanished_or_replaced_object_is_gone() {
        let (client, mut api) = mock_apiserver::pair();
        let namespaces: Api<Namespace> = Api::all(client);
        let results = run(
            async move {
                expect_delete(&mut api, "a", "uid-a")
                    .await
                    .ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
                expect_delete(&mut api, "b", "uid-b")
                    .await
                    .not_found("namespaces", "b");
                expect_delete(&mut api, "c", "uid-c").await.fail(
                    409,
                    "Conflict",
                    "Precondition failed: UID in precondition: uid-c, UID in object meta: uid-c2",
                );
                expect_delete(&mut api, "d", "uid-d").await.fail(
                    403,
                    "Forbidden",
                    "namespaces \"d\" is forbidden",
                );
            },
            async {
                let mut results = Vec::new();
                for name in ["a", "b", "c", "d"] {
                    results.push(delete_pinned(&namespaces, name, Some(format!("uid-{name}")), None).await);
                }
                results
            },
        )
        .await;
        assert_eq!(results[0].as_ref().ok(), Some(&Deletion::Started));
        assert_eq!(results[1].as_ref().ok(), Some(&Deletion::Gone));
        assert_eq!(results[2].as_ref().ok(), Some(&Deletion::Gone));
        match &results[3] {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
            other => panic!("a refusal is an error: {other:?}"),
        }
    }

    #[tokio::test]
    async fn without_a_uid_any_object_of_the_name_goes_and_a_grace_period_is_passed_on() {
        let (client, mut api) = mock_apiserver::pair();
        let namespaces: Api<Namespace> = Api::all(client);
        let result = run(
            async move {
                let call = api.expect("DELETE", "/api/v1/namespaces/a?").await;
                assert!(call.body.get("preconditions").is_none(), "{}", call.body);
                assert_eq!(call.body["gracePeriodSeconds"], 0, "{}", call.body);
                call.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
            },
            delete_pinned(&namespaces, "a", None, Some(0)),
        )
        .await;
        assert_eq!(result.expect("deleted"), Deletion::Started);
    }
}
