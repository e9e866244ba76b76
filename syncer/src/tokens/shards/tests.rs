//! The shared token Secrets on scripted apiservers: what creating pods and renewing their tokens cost the
//! super cluster.

use crds::wellknown::LABEL_POD_TOKEN;
use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Secret},
    jiff::{self, Timestamp},
};
use kube::core::PartialObjectMeta;
use serde_json::{Value, json};

use super::*;
use crate::{
    engine::{
        context::testing::{self, from_json, put as cache},
        items::{Item, Kind},
    },
    resources::Outcome,
    tenancy::settings::TenantSettings,
    tokens::records::{ANNOTATION_TOKEN_MEMBERS, Members},
};

const SUPER_NS: &str = "team-abc123-vc-ns";

fn tenant_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "7"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": [{"name": "kube-api-access-x",
            "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]},
        "status": {"phase": "Pending"}
    })
}

/// A TokenRequest's answer, bound to the pod the request names.
fn issued(request: &Value, expires: &str) -> Value {
    let pod = request["spec"]["boundObjectRef"]["name"]
        .as_str()
        .unwrap_or_default();
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": request["spec"],
        "status": {"token": format!("jwt-{pod}"), "expirationTimestamp": expires}})
}

fn decoded(value: &Value) -> String {
    let bytes: ByteString = serde_json::from_value(value.clone()).expect("base64");
    String::from_utf8(bytes.0).expect("utf-8")
}

/// Pods are created naming their shard's keys; their tokens are minted once each tenant pod is bound
/// (so the tenant apiserver names the node in them), and a burst of bindings shares the writes.
#[tokio::test]
async fn tokens_are_minted_after_the_binding_and_a_burst_shares_token_secret_writes() {
    let (super_client, mut supers) = testing::mock();
    let (tenant_client, mut tenants) = testing::mock();
    let (ctx, mut super_caches) = testing::context(super_client);
    let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
    for name in ["p1", "p2", "p3"] {
        cache(&mut caches.pods, from_json(tenant_pod(name)));
    }
    cache(
        &mut caches.vnodes,
        from_json(json!({"metadata": {"name": "node-1"}})),
    );
    cache(
        &mut super_caches.namespaces,
        from_json::<Namespace>(json!({"metadata": {"name": SUPER_NS, "annotations": {
            "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns"}}})),
    );
    let items: Vec<Item> = ["p1", "p2", "p3"]
        .into_iter()
        .map(|name| Item::new(Kind::Pod, "ns", name))
        .collect();

    // Down: the copies are created at once, naming keys of shard-0 not written yet; the tenant is not
    // asked for anything (unbound pods are copied from the cache's whole spec).
    let super_script = async {
        let mut created = Vec::new();
        for _ in 0..3 {
            let call = supers.next().await;
            assert_eq!(call.method, "POST", "{}", call.uri);
            assert!(
                call.uri
                    .starts_with(&format!("/api/v1/namespaces/{SUPER_NS}/pods?")),
                "{}",
                call.uri
            );
            let pod = call.body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let volume = &call.body["spec"]["volumes"][0]["projected"]["sources"];
            assert_eq!(volume[0]["secret"]["name"], "shard-0.vc-tokens");
            let key = volume[0]["secret"]["items"][0]["key"]
                .as_str()
                .unwrap_or_default();
            assert!(key.starts_with(&format!("{pod}.token-")), "{key}");
            assert_eq!(
                call.body["metadata"]["annotations"][crate::tokens::mounts::ANNOTATION_TOKEN_SECRET],
                "shard-0.vc-tokens"
            );
            created.push(call.echo());
        }
        created
    };
    let (o1, o2, o3, mut created) = tokio::join!(
        crate::resources::pod::down::sync(&ctx, &tenant, &items[0]),
        crate::resources::pod::down::sync(&ctx, &tenant, &items[1]),
        crate::resources::pod::down::sync(&ctx, &tenant, &items[2]),
        super_script,
    );
    for outcome in [o1, o2, o3] {
        assert_eq!(outcome.expect("synced"), Outcome::Created { writes: 1 });
    }
    assert_eq!(
        ctx.metrics
            .resources
            .super_write_counts()
            .iter()
            .filter(|(r, _, _)| *r == "secret")
            .count(),
        0
    );

    // The super scheduler places them; up: each tenant pod is bound, then its tokens are minted.
    for copy in &mut created {
        copy["spec"]["nodeName"] = json!("node-1");
        copy["status"] =
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]});
        cache(&mut super_caches.pods, from_json(copy.clone()));
    }
    let (minted_tx, mut minted_rx) = tokio::sync::watch::channel(0);
    let tenant_script = async {
        let mut bound = Vec::new();
        for _ in 0..6 {
            let call = tenants.next().await;
            let path = call.uri.trim_end_matches('?').to_owned();
            match (call.method.as_str(), path.as_str()) {
                ("POST", "/api/v1/namespaces/ns/serviceaccounts/default/token") => {
                    let pod = call.body["spec"]["boundObjectRef"]["name"]
                        .as_str()
                        .unwrap_or_default();
                    assert!(
                        bound.iter().any(|b| b == pod),
                        "{pod}'s token was asked for before its binding"
                    );
                    let answer = issued(&call.body, "2030-01-01T00:00:00Z");
                    call.ok(answer);
                    minted_tx.send_modify(|n| *n += 1);
                }
                ("POST", binding) if binding.ends_with("/binding") => {
                    assert_eq!(call.body["target"]["name"], "node-1");
                    bound.push(
                        call.body["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    );
                    call.respond(
                        201,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
                    );
                }
                (method, uri) => panic!("unexpected tenant request {method} {uri}"),
            }
        }
    };
    let super_script = async {
        let mut secret_writes = Vec::new();
        for _ in 0..2 {
            let call = supers.next().await;
            let secrets = format!("/api/v1/namespaces/{SUPER_NS}/secrets");
            match call.method.as_str() {
                "POST" if call.uri.starts_with(&secrets) => {
                    // The first pod's keys are written at once; the others' tokens arrive meanwhile.
                    let _ = minted_rx.wait_for(|n| *n == 3).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    assert_eq!(call.body["metadata"]["name"], "shard-0.vc-tokens");
                    assert_eq!(call.body["metadata"]["labels"][LABEL_POD_TOKEN], "true");
                    secret_writes.push(call.body.clone());
                    call.echo();
                }
                "PATCH" if call.uri.starts_with(&format!("{secrets}/shard-0.vc-tokens?")) => {
                    assert_eq!(call.content_type, "application/merge-patch+json");
                    assert_eq!(call.body["metadata"]["resourceVersion"], "200");
                    secret_writes.push(call.body.clone());
                    let mut answer = call.body.clone();
                    answer["metadata"]["resourceVersion"] = json!("201");
                    call.ok(answer);
                }
                _ => panic!("unexpected super request {} {}", call.method, call.uri),
            }
        }
        secret_writes
    };
    let (o1, o2, o3, (), writes) = tokio::join!(
        crate::resources::pod::up::pod(&ctx, &tenant, "ns", "p1"),
        crate::resources::pod::up::pod(&ctx, &tenant, "ns", "p2"),
        crate::resources::pod::up::pod(&ctx, &tenant, "ns", "p3"),
        tenant_script,
        super_script,
    );
    for outcome in [o1, o2, o3] {
        // The binding and the pod's share of a token Secret write.
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 2 });
    }
    // Three pods, two token Secret writes: the first alone, the two that waited together.
    assert_eq!(writes.len(), 2);
    assert_eq!(
        writes[0]["data"].as_object().map(|d| d.len()),
        Some(4),
        "{}",
        writes[0]
    );
    assert_eq!(
        writes[1]["data"].as_object().map(|d| d.len()),
        Some(6),
        "{}",
        writes[1]
    );
    let first = writes[0]["data"]
        .as_object()
        .and_then(|d| d.keys().find(|k| k.contains(".token-")).cloned())
        .expect("a token");
    let pod = first.split(".token-").next().unwrap_or_default();
    assert_eq!(decoded(&writes[0]["data"][&first]), format!("jwt-{pod}"));
    assert_eq!(
        decoded(&writes[0]["data"][&format!("{pod}.uid")]),
        format!("uid-{pod}")
    );
    assert_eq!(decoded(&writes[0]["data"]["namespace"]), "ns");
    let members: Members = serde_json::from_str(
        writes[1]["metadata"]["annotations"][ANNOTATION_TOKEN_MEMBERS]
            .as_str()
            .expect("members"),
    )
    .expect("members json");
    assert_eq!(members.keys().collect::<Vec<_>>(), ["p1", "p2", "p3"]);
    let counts = ctx.metrics.resources.super_write_counts();
    let count = |resource, verb| {
        counts
            .iter()
            .find(|(r, v, _)| *r == resource && *v == verb)
            .map_or(0, |(_, _, n)| *n)
    };
    assert_eq!(count("pod", "create"), 3);
    assert_eq!(count("secret", "create") + count("secret", "patch"), 2);

    // Once the binding shows, the next pass finds the tokens written: nothing is minted twice.
    for name in ["p1", "p2", "p3"] {
        let mut pod = tenant_pod(name);
        pod["spec"]["nodeName"] = json!("node-1");
        pod["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True"}]);
        cache(&mut caches.pods, from_json(pod));
        let again = tokio::time::timeout(
            Duration::from_secs(5),
            crate::resources::pod::up::pod(&ctx, &tenant, "ns", name),
        )
        .await
        .expect("no request");
        assert_eq!(again.expect("synced"), Outcome::InSync);
    }
    supers.idle().await;
    tenants.idle().await;
}

fn super_pod(name: &str) -> SuperPod {
    from_json(json!({
        "metadata": {"name": name, "namespace": SUPER_NS, "uid": format!("super-{name}"), "annotations": {
            "tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns",
            "tenancy.x-k8s.io/uid": format!("uid-{name}"),
            (crate::tokens::mounts::ANNOTATION_POD_TOKENS): crate::tokens::mounts::needs_annotation(&[need()]),
            (crate::tokens::mounts::ANNOTATION_TOKEN_SECRET): "shard-0.vc-tokens"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
}

fn need() -> TokenNeed {
    TokenNeed {
        key: "token".into(),
        audience: None,
        expiration_seconds: None,
    }
}

fn shard_meta(members: &Members) -> PartialObjectMeta<Secret> {
    from_json(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "shard-0.vc-tokens", "namespace": SUPER_NS, "resourceVersion": "300",
        "labels": {(LABEL_POD_TOKEN): "true"},
        "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "ns",
            (ANNOTATION_TOKEN_MEMBERS): serde_json::to_string(members).expect("json")}}}))
}

fn recorded(pod: &str, issued: i64, expires: i64) -> Member {
    Member {
        uid: format!("uid-{pod}").into(),
        keys: [format!("{pod}.token"), format!("{pod}.uid")]
            .into_iter()
            .collect(),
        issued,
        expires,
    }
}

#[tokio::test]
async fn a_due_shard_is_renewed_in_one_write_that_also_drops_gone_pods() {
    let (super_client, mut supers) = testing::mock();
    let (tenant_client, mut tenants) = testing::mock();
    let (ctx, mut super_caches) = testing::context(super_client);
    let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
    let now = now();
    // p1 is due, p2 past half its life, p3's pod is gone, p4 fresh.
    let members: Members = [
        ("p1".to_owned(), recorded("p1", now - 3000, now + 500)),
        ("p2".to_owned(), recorded("p2", now - 2000, now + 1600)),
        ("p3".to_owned(), recorded("p3", now - 3000, now + 500)),
        ("p4".to_owned(), recorded("p4", now - 10, now + 3590)),
    ]
    .into();
    cache(&mut super_caches.tokens, shard_meta(&members));
    for name in ["p1", "p2", "p4"] {
        cache(&mut super_caches.pods, super_pod(name));
        cache(&mut caches.pods, from_json(tenant_pod(name)));
    }
    let tenant_pod_of = |name: &str| {
        tenant
            .stores
            .pods
            .get(&ObjectRef::new(name).within("ns"))
            .expect("pod")
    };
    let super_pod_of = |name: &str| {
        ctx.supers
            .pods
            .copies
            .get(&ObjectRef::new(name).within(SUPER_NS))
            .expect("pod")
    };
    let needs = [need()];
    let (tenant_pods, super_pods): (Vec<_>, Vec<_>) = ["p1", "p2", "p4"]
        .into_iter()
        .map(|name| (tenant_pod_of(name), super_pod_of(name)))
        .unzip();
    let shard = "shard-0.vc-tokens";

    // A fresh member is in sync: nothing is asked or written (also right after a restart).
    let fresh = keep(&ctx, &tenant, &tenant_pods[2], &super_pods[2], shard, &needs);
    assert_eq!(fresh.await.expect("kept"), 0);
    supers.idle().await;
    tenants.idle().await;

    let expires = (Timestamp::now() + jiff::SignedDuration::from_secs(3600)).to_string();
    let (renewed, ()) = tokio::join!(
        keep(&ctx, &tenant, &tenant_pods[0], &super_pods[0], shard, &needs),
        async {
            for _ in 0..2 {
                let call = tenants
                    .expect("POST", "/api/v1/namespaces/ns/serviceaccounts/default/token?")
                    .await;
                let answer = issued(&call.body, &expires);
                call.ok(answer);
            }
            let call = supers
                .expect(
                    "PATCH",
                    &format!("/api/v1/namespaces/{SUPER_NS}/secrets/shard-0.vc-tokens?"),
                )
                .await;
            let data = call.body["data"].as_object().cloned().unwrap_or_default();
            assert_eq!(decoded(&data["p1.token"]), "jwt-p1");
            assert_eq!(decoded(&data["p2.token"]), "jwt-p2");
            assert!(!data.contains_key("p4.token"), "{}", call.body);
            assert_eq!(data["p3.token"], Value::Null);
            assert_eq!(data["p3.uid"], Value::Null);
            assert_eq!(call.body["metadata"]["resourceVersion"], "300");
            let mut answer = call.body.clone();
            answer["metadata"]["resourceVersion"] = json!("301");
            call.ok(answer);
        }
    );
    assert_eq!(renewed.expect("renewed"), 1);
    // p2 was renewed with p1: its own wake-up finds nothing to do.
    let along = keep(&ctx, &tenant, &tenant_pods[1], &super_pods[1], shard, &needs);
    assert_eq!(along.await.expect("kept"), 0);
    assert_eq!(ctx.metrics.resources.super_writes_total(), 1);
    supers.idle().await;
    tenants.idle().await;

    // The shard's one timer fires at its earliest member's renewal (p4's, at now + 2870), queues
    // the members then due, and is set again for the renewed ones (at about now + 2880).
    let shards = &ctx.tokens;
    let due_at = |at: i64| -> Vec<String> {
        let (due, _) = shards.fire_renewals(at);
        due.into_iter()
            .inspect(|(tenant_id, _)| assert_eq!(*tenant_id, tenant.id))
            .map(|(_, item)| format!("{}/{}", item.namespace, item.name))
            .collect()
    };
    assert_eq!(due_at(now + 2860), Vec::<String>::new());
    assert_eq!(due_at(now + 2875), ["ns/p4"]);
    // p4 again with them: nothing renewed it meanwhile.
    assert_eq!(due_at(now + 2890), ["ns/p1", "ns/p2", "ns/p4"]);
}
