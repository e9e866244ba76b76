//! Custom resources synced by the platform's choice (`--custom-resources`, issue 16), against a real super
//! cluster and two real tenant apiservers with the syncer in process (simulated nodes; nothing runs).
//!
//! - `listed_custom_resources_are_published_synced_and_reported`: the platform's `widgets.example.com`
//!   (status subresource, a field naming a Secret, one naming a ConfigMap with its namespace) is listed
//!   for VirtualClusters labelled `widgets=yes`: its CRD appears in the labelled tenant and not in the
//!   other; a tenant Widget appears in the super namespace with its ConfigMap reference mapped there and
//!   its Secret synced beside it; status the "operator" writes in the super cluster reaches the tenant; a
//!   copy deleted in the super cluster comes back; a tenant deletion removes the copy; a Widget whose name
//!   a foreign super object holds gets `CustomResourceConflict` and the foreign object stays as it was; one
//!   the super cluster's admission refuses (a ValidatingAdmissionPolicy, from Kubernetes 1.30) gets
//!   `CustomResourceInvalid` and stays in the tenant; a tenant edit of the published CRD is put back with
//!   `CustomResourceDefinitionRestored`; `gadgets.example.com`, listed for nobody but labelled
//!   `tenancy.x-k8s.io/super.public=true`, appears in both tenants; taking the label off removes it; the
//!   other tenant's VirtualCluster, labelled later, gets widgets too.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use crds::{VirtualCluster, wellknown};
use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, Namespace, Secret},
        events::v1::Event,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions, TenantMaster, VC_NAMESPACE},
    wait,
};
use serde_json::{Value, json};
use syncer::{Metrics, Syncer, SyncerConfig, engine::config::custom_kinds};
use vc_runtime::admin::Health;

use crate::object_support::create;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver];
const PATIENCE: Duration = Duration::from_secs(60);

fn crd(plural: &str, kind: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.example.com"), "labels": labels},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "integer"},
                        "credentials": {"type": "string"},
                        "config": {"type": "object", "properties": {
                            "name": {"type": "string"}, "namespace": {"type": "string"}
                        }}
                    }},
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
                }}}
            }]
        }
    })
}

fn widgets() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets")
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("widget")
}

async fn apply_json(client: &Client, resource: &ApiResource, object: Value) -> anyhow::Result<()> {
    let object: DynamicObject = serde_json::from_value(object)?;
    let api: Api<DynamicObject> = match object.metadata.namespace.as_deref() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    };
    api.patch(
        &object.name_any(),
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&object),
    )
    .await
    .with_context(|| format!("applying {} {}", resource.kind, object.name_any()))?;
    Ok(())
}

fn crd_resource() -> ApiResource {
    ApiResource::erase::<CustomResourceDefinition>(&())
}

/// Waits until the tenant has (`true`) or lacks the CRD.
async fn definition(tenant: &TenantMaster, name: &str, present: bool) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(tenant.client());
    wait::until_true(
        PATIENCE,
        &format!(
            "{}: CRD {name} {}",
            tenant.name,
            if present { "published" } else { "absent" }
        ),
        || {
            let api = api.clone();
            async move { api.get_opt(name).await.ok().map(|c| c.is_some()) == Some(present) }
        },
    )
    .await?;
    Ok(())
}

/// Waits for a Warning event of this reason about the named object, in any namespace of the tenant, and
/// returns its note.
async fn event(tenant: &TenantMaster, name: &str, reason: &str) -> anyhow::Result<String> {
    let api: Api<Event> = Api::all(tenant.client());
    Ok(wait::until(
        PATIENCE,
        &format!("{}: {reason} event about {name}", tenant.name),
        || {
            let api = api.clone();
            async move {
                api.list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.type_.as_deref() == Some("Warning")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    })
                    .map(|e| e.note.unwrap_or_default())
            }
        },
    )
    .await?)
}

/// Waits until the object (`None`: its absence) matches.
async fn object_until(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&DynamicObject>) -> bool,
) -> anyhow::Result<Option<DynamicObject>> {
    Ok(wait::until(PATIENCE, what, || {
        let (api, name, check) = (api.clone(), name.to_owned(), &check);
        async move {
            let object = api.get_opt(&name).await.ok()?;
            check(object.as_ref()).then_some(object)
        }
    })
    .await?)
}

/// Whether the super cluster serves ValidatingAdmissionPolicies (GA in Kubernetes 1.30).
async fn refuses_big_widgets(super_client: &Client) -> anyhow::Result<bool> {
    let policy = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy"),
        "validatingadmissionpolicies",
    );
    let binding = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
        ),
        "validatingadmissionpolicybindings",
    );
    let applied = apply_json(super_client, &policy, json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "small-widgets"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["example.com"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["widgets"]}]},
            "validations": [{"expression": "!has(object.spec.size) || object.spec.size <= 10", "message": "the platform allows widgets of size 10 at most"}]
        }
    }))
    .await;
    if let Err(error) = applied {
        println!(
            "the super cluster serves no ValidatingAdmissionPolicy (before Kubernetes 1.30): the refused-copy part is not run ({error:#})"
        );
        return Ok(false);
    }
    apply_json(
        super_client,
        &binding,
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "small-widgets"},
            "spec": {"policyName": "small-widgets", "validationActions": ["Deny"]}
        }),
    )
    .await?;
    Ok(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listed_custom_resources_are_published_synced_and_reported() -> anyhow::Result<()> {
    if !local_cluster::require("listed_custom_resources_are_published_synced_and_reported", NEEDS) {
        return Ok(());
    }
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 2,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let super_client = tenancy.super_client();
    let (allowed, other) = (tenancy.tenant("tenant-0"), tenancy.tenant("tenant-1"));

    // The platform's CRDs, and the VirtualCluster label that grants widgets.
    apply_json(
        &super_client,
        &crd_resource(),
        crd("widgets", "Widget", json!({})),
    )
    .await?;
    apply_json(
        &super_client,
        &crd_resource(),
        crd(
            "gadgets",
            "Gadget",
            json!({(wellknown::LABEL_SUPER_PUBLIC): "true"}),
        ),
    )
    .await?;
    let vcs: Api<VirtualCluster> = Api::namespaced(super_client.clone(), VC_NAMESPACE);
    vcs.patch(
        "tenant-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"widgets": "yes"}}})),
    )
    .await?;
    let small_widgets = refuses_big_widgets(&super_client).await?;

    let config = SyncerConfig {
        patrol_interval: Duration::from_secs(3),
        downward_workers: 4,
        upward_workers: 4,
        custom_resources: custom_kinds::parse_all(&[
            "widgets.example.com;tenants=widgets=yes;secrets=spec.credentials;configmaps=spec.config".into(),
            "gadgets.example.com;tenants=nobody=ever".into(),
        ])
        .map_err(anyhow::Error::msg)?,
        ..SyncerConfig::for_tests()
    };
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let _syncer = Syncer::start(
        super_client.clone(),
        config,
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;

    // Published where allowed: widgets in the labelled tenant only, the public gadgets in both.
    definition(allowed, "widgets.example.com", true).await?;
    definition(allowed, "gadgets.example.com", true).await?;
    definition(other, "gadgets.example.com", true).await?;
    let published: CustomResourceDefinition = Api::all(allowed.client()).get("widgets.example.com").await?;
    assert!(
        published
            .spec
            .conversion
            .as_ref()
            .is_none_or(|c| c.webhook.is_none())
    );
    // Several patrols later the other tenant still has no widgets.
    tokio::time::sleep(Duration::from_secs(7)).await;
    definition(other, "widgets.example.com", false).await?;

    // A Widget naming a Secret and a ConfigMap reaches the super namespace, references valid there.
    let client = allowed.client();
    create::<Namespace>(&client, None, json!({"metadata": {"name": "shop"}})).await?;
    create::<Secret>(
        &client,
        Some("shop"),
        json!({"metadata": {"name": "db-creds"}, "stringData": {"password": "s3cret"}}),
    )
    .await?;
    create::<ConfigMap>(
        &client,
        Some("shop"),
        json!({"metadata": {"name": "settings"}, "data": {"mode": "fast"}}),
    )
    .await?;
    let tenant_widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "shop", &widgets());
    let mut w1 = widget(
        "w1",
        json!({"size": 3, "credentials": "db-creds", "config": {"name": "settings", "namespace": "shop"}}),
    );
    // The tenant's own labels go down; one claiming another VirtualCluster does not.
    w1.metadata.labels = Some(
        [
            ("app".to_owned(), "db".to_owned()),
            (wellknown::LABEL_VC_NAME.to_owned(), "someone-else".to_owned()),
        ]
        .into(),
    );
    w1.metadata.finalizers = Some(vec!["example.com/tenant-finalizer".into()]);
    let w1 = tenant_widgets.create(&PostParams::default(), &w1).await?;
    let super_namespace = allowed.super_namespace("shop");
    let super_widgets: Api<DynamicObject> =
        Api::namespaced_with(super_client.clone(), &super_namespace, &widgets());
    let copy = object_until(&super_widgets, "w1", "w1 copied down", |o| o.is_some())
        .await?
        .context("w1 copy")?;
    assert_eq!(copy.data["spec"]["size"], 3);
    assert_eq!(copy.data["spec"]["credentials"], "db-creds");
    assert_eq!(
        copy.data["spec"]["config"],
        json!({"name": "settings", "namespace": super_namespace})
    );
    let annotations = copy.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(wellknown::ANNOTATION_CLUSTER),
        Some(&allowed.cluster_key)
    );
    assert_eq!(
        annotations.get(wellknown::ANNOTATION_UID),
        w1.metadata.uid.as_ref()
    );
    assert_eq!(copy.labels().get("app").map(String::as_str), Some("db"));
    assert_eq!(
        copy.labels().get(wellknown::LABEL_VC_NAME).map(String::as_str),
        Some("tenant-0")
    );
    assert!(
        copy.metadata.finalizers.is_none(),
        "a tenant's finalizers stay in the tenant"
    );
    let secrets: Api<Secret> = Api::namespaced(super_client.clone(), &super_namespace);
    wait::until_true(PATIENCE, "the referenced Secret beside the copy", || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("db-creds").await.ok().flatten().is_some() }
    })
    .await?;

    // The operator's status reaches the tenant.
    super_widgets
        .patch_status(
            "w1",
            &PatchParams::apply("widget-operator").force(),
            &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "status": {"phase": "Ready"}})),
        )
        .await?;
    object_until(&tenant_widgets, "w1", "w1 status copied up", |o| {
        o.is_some_and(|o| o.data["status"]["phase"] == "Ready")
    })
    .await?;

    // A copy deleted in the super cluster comes back from the tenant.
    let old_uid = copy.uid();
    super_widgets.delete("w1", &DeleteParams::default()).await?;
    object_until(&super_widgets, "w1", "w1 copy recreated", |o| {
        o.is_some_and(|o| o.uid() != old_uid)
    })
    .await?;

    // A super object of that name that is not the tenant's: an event, and nothing changes on either side.
    super_widgets
        .create(&PostParams::default(), &widget("taken", json!({"size": 1})))
        .await?;
    tenant_widgets
        .create(&PostParams::default(), &widget("taken", json!({"size": 2})))
        .await?;
    let note = event(allowed, "taken", "CustomResourceConflict").await?;
    assert!(note.contains("not this object's copy"), "{note}");
    let foreign = super_widgets.get("taken").await?;
    assert_eq!(foreign.data["spec"]["size"], 1);
    assert!(foreign.annotations().get(wellknown::ANNOTATION_CLUSTER).is_none());
    assert!(tenant_widgets.get_opt("taken").await?.is_some());

    // A copy the super cluster's admission refuses: an event naming the reason, the tenant object stays.
    if small_widgets {
        let refused = wait::until(PATIENCE, "the admission policy in force", || {
            let api = super_widgets.clone();
            async move {
                let probe = widget("probe", json!({"size": 50}));
                match api
                    .create(
                        &PostParams {
                            dry_run: true,
                            ..Default::default()
                        },
                        &probe,
                    )
                    .await
                {
                    Err(kube::Error::Api(s)) if s.code == 422 => Some(true),
                    _ => None,
                }
            }
        })
        .await?;
        assert!(refused);
        tenant_widgets
            .create(&PostParams::default(), &widget("huge", json!({"size": 50})))
            .await?;
        let note = event(allowed, "huge", "CustomResourceInvalid").await?;
        assert!(note.contains("size 10 at most"), "{note}");
        assert!(tenant_widgets.get_opt("huge").await?.is_some());
        assert!(super_widgets.get_opt("huge").await?.is_none());
    }

    // A tenant edit of the published CRD is put back, with an event.
    let tenant_crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    tenant_crds
        .patch(
            "widgets.example.com",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"names": {"shortNames": ["wd"]}}})),
        )
        .await?;
    event(allowed, "widgets.example.com", "CustomResourceDefinitionRestored").await?;
    wait::until_true(PATIENCE, "the published CRD put back", || {
        let api = tenant_crds.clone();
        async move {
            api.get_opt("widgets.example.com")
                .await
                .ok()
                .flatten()
                .is_some_and(|c| c.spec.names.short_names.unwrap_or_default().is_empty())
        }
    })
    .await?;

    // A tenant deletion removes the copy (the tenant's finalizer is the tenant's: the copy goes at once).
    tenant_widgets.delete("w1", &DeleteParams::default()).await?;
    object_until(&super_widgets, "w1", "w1 copy deleted", |o| o.is_none()).await?;

    // The public label taken off the gadgets CRD: it leaves both tenants.
    let super_crds: Api<CustomResourceDefinition> = Api::all(super_client.clone());
    super_crds
        .patch(
            "gadgets.example.com",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {(wellknown::LABEL_SUPER_PUBLIC): null}}})),
        )
        .await?;
    definition(allowed, "gadgets.example.com", false).await?;
    definition(other, "gadgets.example.com", false).await?;

    // A VirtualCluster labelled later gets the kind.
    vcs.patch(
        "tenant-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"widgets": "yes"}}})),
    )
    .await?;
    definition(other, "widgets.example.com", true).await?;
    Ok(())
}
