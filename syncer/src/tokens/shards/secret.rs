//! A shard Secret's own API calls: its create, merge patch and delete (with the resourceVersion as
//! precondition), and a read of its metadata (never its values), with the shared CA and namespace it holds.

use std::collections::BTreeMap;

use crds::wellknown::LABEL_POD_TOKEN;
use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    core::PartialObjectMeta,
};
use serde_json::{Value, json};

use crate::{
    engine::context::Context,
    error::{Error, Result, on_super},
    tenancy::{identity, tenant::Tenant},
    tokens::{
        minting::tenant_ca,
        records::{ANNOTATION_TOKEN_MEMBERS, Member, Members, Shard, data_patch, members_of},
    },
};

impl Shard {
    pub(super) fn metadata(
        &self,
        tenant: &Tenant,
        members: &Members,
        resource_version: Option<String>,
    ) -> Result<Value> {
        let mut meta = identity::super_metadata(
            &ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.tenant_namespace.clone()),
                ..Default::default()
            },
            &tenant.identity,
            &Default::default(),
            Some(self.namespace.clone()),
            true,
        );
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(LABEL_POD_TOKEN.to_owned(), "true".to_owned());
        let recorded = serde_json::to_string(members).map_err(|source| Error::Serialize {
            what: format!("members of token Secret {}/{}", self.namespace, self.name),
            source,
        })?;
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION_TOKEN_MEMBERS.to_owned(), recorded);
        meta.resource_version = resource_version;
        serde_json::to_value(meta).map_err(|source| Error::Serialize {
            what: format!("token Secret {}/{}", self.namespace, self.name),
            source,
        })
    }

    pub(super) fn shared_values(&self, tenant: &Tenant) -> (String, String) {
        let ca = tenant_ca(tenant, &self.tenant_namespace).unwrap_or_default();
        (ca, self.tenant_namespace.clone())
    }

    pub(super) async fn create(
        &self,
        ctx: &Context,
        tenant: &Tenant,
        added: &BTreeMap<String, Option<ByteString>>,
        members: &Members,
    ) -> Result<ObjectMeta> {
        let (ca, namespace) = self.shared_values(tenant);
        let values: BTreeMap<String, ByteString> = added
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
            .collect();
        let data = data_patch(&values, &[], &ca, &namespace);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": self.metadata(tenant, members, None)?,
            "type": "Opaque",
            "data": data,
        }))
        .map_err(|source| Error::Serialize {
            what: format!("token Secret {}/{}", self.namespace, self.name),
            source,
        })?;
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let params = PostParams {
            field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
            ..Default::default()
        };
        ctx.metrics.resources.super_write("secret", "create");
        let created = api.create(&params, &secret).await.map_err(on_super(format!(
            "creating token Secret {}/{}",
            self.namespace, self.name
        )))?;
        Ok(created.metadata)
    }

    pub(super) async fn patch(
        &self,
        ctx: &Context,
        tenant: &Tenant,
        added: &BTreeMap<String, Option<ByteString>>,
        removed: &[&Member],
        members: &Members,
        resource_version: Option<String>,
    ) -> Result<ObjectMeta> {
        let (ca, namespace) = self.shared_values(tenant);
        let values: BTreeMap<String, ByteString> = added
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
            .collect();
        let mut data = data_patch(&values, removed, &ca, &namespace);
        for (key, value) in added {
            if value.is_none() {
                data.insert(key.clone(), Value::Null);
            }
        }
        let patch = json!({
            "metadata": self.metadata(tenant, members, resource_version)?,
            "data": data,
        });
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let params = PatchParams {
            field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
            field_validation: Some(kube::api::ValidationDirective::Ignore),
            ..Default::default()
        };
        ctx.metrics.resources.super_write("secret", "patch");
        let patched = api
            .patch(&self.name, &params, &Patch::Merge(&patch))
            .await
            .map_err(on_super(format!(
                "writing token Secret {}/{}",
                self.namespace, self.name
            )))?;
        Ok(patched.metadata)
    }

    pub(super) async fn delete(&self, ctx: &Context, resource_version: Option<String>) -> Result<()> {
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: None,
                resource_version,
            }),
            ..Default::default()
        };
        ctx.metrics.resources.super_write("secret", "delete");
        match api.delete(&self.name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(on_super(format!(
                "deleting token Secret {}/{}",
                self.namespace, self.name
            ))(e)),
        }
    }

    /// Reads the shard's metadata from the super cluster (never its values).
    pub(super) async fn reread(&self, ctx: &Context) -> Result<()> {
        let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), &self.namespace);
        let found: Option<PartialObjectMeta<Secret>> = match api.get_metadata(&self.name).await {
            Ok(meta) => Some(meta),
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => {
                return Err(on_super(format!(
                    "reading token Secret {}/{}",
                    self.namespace, self.name
                ))(e));
            }
        };
        let mut state = self.lock();
        state.exists = found.is_some();
        state.resource_version = found.as_ref().and_then(|f| f.metadata.resource_version.clone());
        state.members = found.map(|f| members_of(&f.metadata)).unwrap_or_default();
        state.loaded = true;
        Ok(())
    }
}
