//! Writes to the super cluster that every kind shares: server-side apply of built objects and of copies
//! (withholding what another manager owns), the objects the syncer alone keeps, deletes with uid
//! preconditions, and the metric label of a kind.

use std::fmt::Debug;

use k8s_openapi::{
    api::core::v1::ObjectReference,
    apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry},
};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    engine::{context::Context, events, items::Kind},
    error::{Error, Result, on_super},
    tenancy::{identity, tenant::Tenant},
};

/// Server-side applies `desired`; with `uid`, only onto the object with that uid.
/// Forced: for objects the syncer builds whole (pods, token Secrets, isolating NetworkPolicies); copies
/// of tenant objects go through [`apply_copy`], which never forces labels and annotations.
pub async fn apply<K>(ctx: &Context, api: &Api<K>, desired: K, uid: Option<String>) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    apply_with(ctx, api, desired, uid, true).await
}

/// Server-side apply under the syncer's field manager, without field validation. Every body the syncer
/// writes is serialized from typed objects, so the apiserver's strict second decoding of it (by default
/// `Warn`: a second YAML parse of every apply body, about 4% of the super apiserver's CPU in the synced
/// benchmark) could only find nothing; its warnings were never read.
pub fn apply_params() -> PatchParams {
    PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER).validation_ignore()
}

async fn apply_with<K>(
    ctx: &Context,
    api: &Api<K>,
    mut desired: K,
    uid: Option<String>,
    force: bool,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    desired.meta_mut().uid = uid;
    let name = desired.name_any();
    let resource = K::plural(&()).into_owned();
    let mut params = apply_params();
    params.force = force;
    let result = api
        .patch(&name, &params, &Patch::Apply(&desired))
        .await
        .map_err(on_super(format!(
            "applying {resource} {}/{name}",
            desired.namespace().unwrap_or_default()
        )));
    ctx.metrics.resources.super_write(kind_label::<K>(), "apply");
    result
}

/// Creates `desired` with a POST under the syncer's field manager: for the hot path where an apply costs
/// the apiserver more (it parses an apply body with its YAML parser and runs a structured merge of the whole
/// object; a POST of JSON is decoded once). The create leaves the syncer an `Update` entry in
/// `managedFields`; [`adopt_as_applied`] turns it into the syncer's `Apply` entry before the object's first
/// apply, so that later applies remove what they no longer set.
pub async fn create<K>(ctx: &Context, api: &Api<K>, desired: &K) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let params = PostParams {
        field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
        ..PostParams::default()
    };
    let result = api.create(&params, desired).await.map_err(on_super(format!(
        "creating {} {}/{}",
        K::plural(&()),
        desired.namespace().unwrap_or_default(),
        desired.name_any()
    )));
    ctx.metrics.resources.super_write(kind_label::<K>(), "create");
    result
}

/// Makes the fields the syncer set by [`create`] its applied ones: the syncer's `Update` entry of the object
/// itself (not of a subresource) is folded into its `Apply` entry, by a merge patch of `managedFields` alone
/// pinned to the object's resourceVersion (a patch that changes no field leaves the list as given, and the
/// patch's own empty `Update` entry is dropped). Without it, a field the syncer set at creation stays owned
/// by that entry, and an apply that no longer sets it (a label the tenant removed) would leave it. Returns
/// whether it wrote; an object with no such entry is left alone.
pub async fn adopt_as_applied<K>(ctx: &Context, api: &Api<K>, object: &K) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let manager = crds::wellknown::FIELD_MANAGER_SYNCER;
    let Some(entries) = applied_ownership(
        object.meta().managed_fields.as_deref().unwrap_or_default(),
        manager,
    ) else {
        return Ok(false);
    };
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": object.meta().resource_version,
        "managedFields": entries,
    }});
    let name = object.name_any();
    ctx.metrics.resources.super_write(kind_label::<K>(), "patch");
    api.patch(&name, &apply_params(), &Patch::Merge(&patch))
        .await
        .map_err(on_super(format!(
            "taking the fields of {} {}/{name} as applied",
            K::plural(&()),
            object.namespace().unwrap_or_default()
        )))?;
    Ok(true)
}

/// `entries` with `manager`'s `Update` entry of the object itself folded into its `Apply` entry (made from
/// it when there is none); `None` when there is no such `Update` entry.
fn applied_ownership(entries: &[ManagedFieldsEntry], manager: &str) -> Option<Vec<ManagedFieldsEntry>> {
    let ours = |e: &ManagedFieldsEntry, operation: &str| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(operation)
            && e.subresource.as_deref().unwrap_or_default().is_empty()
    };
    let updated = entries.iter().position(|e| ours(e, "Update"))?;
    let mut entries = entries.to_vec();
    let update = entries.remove(updated);
    match entries.iter_mut().find(|e| ours(e, "Apply")) {
        Some(applied) => {
            let mut fields = applied.fields_v1.take().map(|f| f.0).unwrap_or_default();
            union_fields(&mut fields, &update.fields_v1.map(|f| f.0).unwrap_or_default());
            applied.fields_v1 = Some(FieldsV1(fields));
        }
        None => entries.push(ManagedFieldsEntry {
            operation: Some("Apply".to_owned()),
            ..update
        }),
    }
    Some(entries)
}

/// Adds the field set `other` to `fields` (both in the `FieldsV1` form: nested objects keyed by `f:`, `k:`,
/// `v:` and `i:` path elements, `{}` for a leaf, `"."` for the field itself): their union.
fn union_fields(fields: &mut serde_json::Value, other: &serde_json::Value) {
    let serde_json::Value::Object(other) = other else {
        return;
    };
    if !fields.is_object() {
        *fields = serde_json::Value::Object(serde_json::Map::new());
    }
    if let serde_json::Value::Object(fields) = fields {
        for (key, value) in other {
            union_fields(
                fields
                    .entry(key.clone())
                    .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new())),
                value,
            );
        }
    }
}

/// Reason of the event on a tenant object some of whose labels or annotations another field manager of
/// the super cluster owns on its copy.
pub const REASON_METADATA_WITHHELD: &str = "MetadataWithheld";

/// Server-side applies the super copy of a tenant object without forcing first: labels and annotations
/// the tenant chose that another field manager of the super cluster owns stay that manager's. They are
/// withheld (left off, recorded in [`identity::ANNOTATION_WITHHELD`]) with a `MetadataWithheld` event on
/// the tenant object, and the rest is applied. Every other field of the copy is the tenant's desired
/// state, which the syncer repairs: a conflict there (someone edited the copy) is forced.
pub async fn apply_copy<K>(
    ctx: &Context,
    tenant: &Tenant,
    tenant_object: Option<&ObjectReference>,
    api: &Api<K>,
    desired: K,
    uid: Option<String>,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let error = match apply_with(ctx, api, desired.clone(), uid.clone(), false).await {
        Ok(applied) => return Ok(applied),
        Err(error) => error,
    };
    let Some(conflicts) = error.apply_conflicts() else {
        return Err(error);
    };
    let (withheld, repaired): (Vec<_>, Vec<_>) = conflicts
        .iter()
        .map(|(field, manager)| (identity::withholdable_key(field), field, manager))
        .partition(|(key, _, _)| key.is_some());
    let name = format!(
        "{}/{}",
        desired.namespace().unwrap_or_default(),
        desired.name_any()
    );
    let mut rest = desired;
    if !withheld.is_empty() {
        let keys: Vec<String> = withheld.iter().filter_map(|(key, _, _)| key.clone()).collect();
        let described: Vec<String> = withheld
            .iter()
            .map(|(_, field, manager)| format!("{field} ({manager})"))
            .collect();
        tracing::warn!(
            object = %name,
            withheld = %keys.join(","),
            conflicts = %described.join(", "),
            "MetadataWithheld: labels or annotations another field manager owns are left as they are"
        );
        if let Some(reference) = tenant_object {
            let message = format!(
                "not copied to the super cluster, where another manager owns them: {}",
                described.join(", ")
            );
            events::warn(tenant, reference, REASON_METADATA_WITHHELD, &message).await;
        }
        identity::withhold(rest.meta_mut(), &keys);
    }
    if !repaired.is_empty() {
        tracing::info!(
            object = %name,
            fields = %repaired.iter().map(|(_, f, m)| format!("{f} ({m})")).collect::<Vec<_>>().join(", "),
            "taking back fields of a super copy that someone else changed"
        );
    }
    apply_with(ctx, api, rest, uid, !repaired.is_empty()).await
}

/// An object the syncer alone keeps in a super namespace beside the copies (the isolating NetworkPolicy,
/// vn-agent's RoleBinding), by its cached state.
pub struct Kept<'a, K> {
    /// Its name.
    pub name: &'a str,
    /// As the cache shows it.
    pub existing: Option<std::sync::Arc<K>>,
    /// As it should be; `None` when the flags say there is none.
    pub desired: Option<K>,
    /// Whether a cached object is the syncer's (and may be deleted when none is desired).
    pub ours: fn(&K) -> bool,
    /// Whether the cached object is the desired one.
    pub in_sync: fn(&K, &K) -> bool,
    /// Whether the cached object cannot become the desired one in place (it is deleted first).
    pub replaced: fn(&K, &K) -> bool,
}

/// Brings a [`Kept`] object in line: applied with force when it differs (it is the syncer's alone, and
/// whoever changed it is overruled), the syncer's deleted when none is desired. Returns the writes made.
pub async fn keep<K>(ctx: &Context, api: &Api<K>, kept: Kept<'_, K>) -> Result<u32>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let Kept {
        name,
        existing,
        desired,
        ours,
        in_sync,
        replaced,
    } = kept;
    let Some(desired) = desired else {
        return match existing {
            Some(existing) if ours(&existing) => {
                delete(ctx, api, name, existing.uid(), None).await?;
                Ok(1)
            }
            _ => Ok(0),
        };
    };
    if let Some(existing) = &existing {
        if in_sync(&desired, existing) {
            return Ok(0);
        }
        if replaced(&desired, existing) {
            delete(ctx, api, name, existing.uid(), None).await?;
        }
    }
    apply(ctx, api, desired, None).await?;
    Ok(1)
}

/// Deletes a super object, only if it still has `uid`.
pub async fn delete<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
    grace: Option<u32>,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    ctx.metrics.resources.super_write(kind_label::<K>(), "delete");
    // Gone already, or replaced by another object (whose sync will follow): nothing to do.
    vc_runtime::cleanup::delete_pinned(api, name, uid, grace)
        .await
        .map(|_| ())
        .map_err(|source| Error::Super {
            context: format!("deleting {} {name}", K::plural(&())),
            source,
        })
}

/// The metric label of a kind.
pub fn kind_label<K: Resource<DynamicType = ()>>() -> &'static str {
    Kind::of_api_kind(&K::kind(&())).map_or("other", Kind::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(
        manager: &str,
        operation: &str,
        subresource: Option<&str>,
        fields: serde_json::Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.to_owned()),
            operation: Some(operation.to_owned()),
            subresource: subresource.map(str::to_owned),
            api_version: Some("v1".to_owned()),
            fields_type: Some("FieldsV1".to_owned()),
            fields_v1: Some(FieldsV1(fields)),
            time: None,
        }
    }

    #[test]
    fn a_created_objects_fields_become_the_syncers_applied_ones() {
        let syncer = crds::wellknown::FIELD_MANAGER_SYNCER;
        let created =
            json!({"f:metadata": {"f:labels": {".": {}, "f:stage": {}}}, "f:spec": {"f:containers": {}}});
        let entries = vec![
            entry(syncer, "Update", None, created.clone()),
            entry("kubelet", "Update", Some("status"), json!({"f:status": {}})),
            entry(syncer, "Update", Some("resize"), json!({"f:spec": {}})),
            entry(
                "kube-scheduler",
                "Update",
                None,
                json!({"f:spec": {"f:nodeName": {}}}),
            ),
        ];
        let folded = applied_ownership(&entries, syncer).expect("an Update entry to fold");
        assert_eq!(folded.len(), 4, "{folded:?}");
        let applied: Vec<&ManagedFieldsEntry> = folded
            .iter()
            .filter(|e| e.manager.as_deref() == Some(syncer) && e.subresource.is_none())
            .collect();
        assert_eq!(applied.len(), 1);
        assert_eq!(applied[0].operation.as_deref(), Some("Apply"));
        assert_eq!(applied[0].fields_v1.as_ref().map(|f| &f.0), Some(&created));
        // Subresource entries and other managers' entries are kept as they are.
        assert!(folded.contains(&entries[1]) && folded.contains(&entries[2]) && folded.contains(&entries[3]));
        // Nothing to fold once it is done.
        assert!(applied_ownership(&folded, syncer).is_none());
    }

    #[test]
    fn an_update_entry_beside_an_applied_one_is_added_to_it() {
        let syncer = crds::wellknown::FIELD_MANAGER_SYNCER;
        let entries = vec![
            entry(
                syncer,
                "Apply",
                None,
                json!({"f:metadata": {"f:labels": {"f:a": {}}}}),
            ),
            entry(
                syncer,
                "Update",
                None,
                json!({"f:metadata": {"f:labels": {"f:b": {}}, "f:annotations": {"f:c": {}}}}),
            ),
        ];
        let folded = applied_ownership(&entries, syncer).expect("an Update entry to fold");
        assert_eq!(folded.len(), 1);
        assert_eq!(
            folded[0].fields_v1.as_ref().map(|f| f.0.clone()),
            Some(json!({"f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}, "f:annotations": {"f:c": {}}}}))
        );
    }
}
