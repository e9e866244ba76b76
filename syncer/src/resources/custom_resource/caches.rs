//! The caches of custom resources. Their kinds are known only from CRDs, so the instance caches start
//! when a CRD shows: in the super cluster when the platform's CRD appears, in a tenant once the CRD is
//! published there. Each is a watch of dynamic objects feeding the same queues as the typed kinds.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject},
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{ObjectRef, Store, store::Writer},
        watcher,
    },
};
use tokio::task::JoinHandle;

use super::{convert, item};
use crate::engine::config::custom_kinds::CustomKind;
use crate::{
    cache::{stores::{Cache, Change, OnRelist, trim}, super_stores::{SuperWatch, ours, tenant_key}},
    engine::{budget::CacheBudget, items::{Kind, UpItem}, queue::{FairQueue, TenantId}},
    tenancy::tenant::{Queues, TenantWatch, Tenants},
};

/// Objects per page when a tenant's instances are listed (as for the typed kinds).
const LIST_PAGE_SIZE: u32 = 100;

/// A running watch of one kind's instances, through one API resource.
pub struct Instances {
    /// The API resource the watch reads (and the syncer writes) through.
    pub resource: ApiResource,
    /// The cache.
    pub store: Store<DynamicObject>,
    task: JoinHandle<()>,
}

impl Instances {
    /// Whether the cache has listed once.
    pub fn is_ready(&self) -> bool {
        futures::FutureExt::now_or_never(self.store.wait_until_ready()).is_some()
    }

    /// The cached instance `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
        self.store
            .get(&ObjectRef::new_with(name, self.resource.clone()).within(namespace))
    }
}

impl Drop for Instances {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches the instances `resource` names, trimmed, each admitted by `admit` and passed to `on_change`.
fn watch_instances(
    api: Api<DynamicObject>,
    resource: ApiResource,
    config: watcher::Config,
    on_relist: Option<OnRelist>,
    admit: Option<Arc<Mutex<crate::engine::budget::Ledger<DynamicObject>>>>,
    on_change: impl Fn(&DynamicObject, Change) + Send + 'static,
) -> Instances {
    let writer = Writer::new(resource.clone());
    let store = writer.as_reader();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(trim::<DynamicObject>)
        .filter(move |event| {
            let admitted = match (event, admit.as_ref()) {
                (Ok(event), Some(ledger)) => ledger.lock().unwrap_or_else(|e| e.into_inner()).admit(event),
                _ => true,
            };
            std::future::ready(admitted)
        })
        .reflect(writer);
    let span = tracing::Span::current();
    let task = tokio::spawn(tracing::Instrument::instrument(
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => on_change(&o, Change::Applied),
                    Ok(watcher::Event::Delete(o)) => on_change(&o, Change::Deleted),
                    Ok(watcher::Event::Init) => {
                        if let Some(on_relist) = &on_relist {
                            on_relist();
                        }
                    }
                    Ok(watcher::Event::InitDone) => {}
                    Err(error) => tracing::debug!(%error, "custom resource watch interrupted; retrying"),
                }
            }
        },
        span,
    ));
    Instances {
        resource,
        store,
        task,
    }
}

/// One configured kind in the super cluster: its CRD, and the instances the syncer made once the CRD is
/// there.
pub struct SuperKind {
    /// The kind's settings.
    pub kind: CustomKind,
    /// The platform's CRD of the kind (the watch selects it by name).
    pub crd: Store<CustomResourceDefinition>,
    instances: Arc<Mutex<Option<Arc<Instances>>>>,
}

impl SuperKind {
    /// The instances cache, once the CRD is there.
    pub fn instances(&self) -> Option<Arc<Instances>> {
        self.instances.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The platform's CRD, when it is there.
    pub fn definition(&self) -> Option<Arc<CustomResourceDefinition>> {
        self.crd.get(&ObjectRef::new(&self.kind.name))
    }
}

/// The super cluster's caches of custom resources, one per configured kind.
#[derive(Default)]
pub struct SuperCustomResources {
    /// By CRD name.
    pub kinds: HashMap<String, Arc<SuperKind>>,
}

impl Cache for SuperCustomResources {
    async fn wait_ready(&self) {
        for kind in self.kinds.values() {
            kind.crd.wait_ready().await;
        }
    }

    #[cfg(test)]
    fn empty() -> Self {
        Self::default()
    }
}

/// Starts a watch per configured kind of its CRD, which starts (and restarts, when the version to read
/// changes) the watch of the instances the syncer made, and queues the CRD to every tenant to publish.
pub fn watch_super(supers: &mut SuperWatch<'_>) -> SuperCustomResources {
    let mut kinds = HashMap::new();
    for kind in supers.custom_resources {
        let slot: Arc<Mutex<Option<Arc<Instances>>>> = Arc::default();
        let (client, queues, tenants) = (supers.client.clone(), supers.queues.clone(), supers.tenants.clone());
        let (crd_name, instances) = (kind.name.clone(), slot.clone());
        let by_name = watcher::Config::default().fields(&format!("metadata.name={}", kind.name));
        let crd = supers.watch_with(by_name, trim, move |crd: &CustomResourceDefinition, change| {
            follow_definition(&client, &queues, &instances, &crd_name, crd, change);
            publish_everywhere(&queues.up, &tenants, &crd_name);
        });
        let super_kind = SuperKind {
            kind: kind.clone(),
            crd,
            instances: slot,
        };
        kinds.insert(kind.name.clone(), Arc::new(super_kind));
    }
    SuperCustomResources { kinds }
}

/// Queues the CRD to every attached tenant: each decides whether it is to have it.
fn publish_everywhere(queue: &FairQueue<UpItem>, tenants: &Tenants, crd_name: &str) {
    for tenant in tenants.all() {
        queue.add(&tenant.id, item::definition(crd_name));
    }
}

/// Starts, restarts (another version to read) or stops (CRD gone, or not namespaced) the watch of the
/// syncer's copies, as the platform's CRD shows.
fn follow_definition(
    client: &Client,
    queues: &Queues,
    slot: &Mutex<Option<Arc<Instances>>>,
    crd_name: &str,
    crd: &CustomResourceDefinition,
    change: Change,
) {
    let resource = match change {
        Change::Applied => convert::api_resource(crd),
        Change::Deleted => None,
    };
    let mut current = slot.lock().unwrap_or_else(|e| e.into_inner());
    if current.as_ref().map(|i| &i.resource) == resource.as_ref() {
        return;
    }
    *current = resource.map(|resource| {
        let (down, up) = (queues.down.clone(), queues.up.clone());
        let crd_name = crd_name.to_owned();
        Arc::new(watch_instances(
            Api::all_with(client.clone(), &resource),
            resource,
            ours(),
            None,
            None,
            move |object, _| {
                if let Some((tenant, namespace, name)) = tenant_key(object) {
                    down.add(&tenant, item::instance(&crd_name, &namespace, &name));
                    up.add(&tenant, item::instance(&crd_name, &namespace, &name));
                }
            },
        ))
    });
}

/// A tenant's custom resources: its CRDs (metadata only, to see a published one edited or removed at
/// once), and the instances of every kind published to it.
pub struct TenantCustomResources {
    /// The tenant's CRDs, metadata only.
    pub definitions: Store<PartialObjectMeta<CustomResourceDefinition>>,
    /// The generation each published CRD had when the syncer last applied or checked it: a tenant edit
    /// of the spec moves it.
    pub checked_generations: Mutex<HashMap<String, i64>>,
    instances: Mutex<HashMap<String, TenantInstances>>,
    /// What instance watches are started with; `None` in tests, which fill nothing.
    watch: Option<InstanceWatch>,
}

/// What a tenant's instance watches are started with.
struct InstanceWatch {
    client: Client,
    down: Arc<FairQueue<crate::engine::items::DownItem>>,
    id: TenantId,
    budget: Arc<CacheBudget>,
    on_relist: OnRelist,
}

/// A tenant's instances of one kind, and what they are charged.
struct TenantInstances {
    instances: Arc<Instances>,
    ledger: Arc<Mutex<crate::engine::budget::Ledger<DynamicObject>>>,
}

impl Drop for TenantInstances {
    fn drop(&mut self) {
        // A listing anew releases what a ledger holds: the cache is going away.
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(&watcher::Event::Init);
    }
}

impl Cache for TenantCustomResources {
    async fn wait_ready(&self) {
        self.definitions.wait_ready().await;
    }

    #[cfg(test)]
    fn empty() -> Self {
        Self {
            definitions: Cache::empty(),
            checked_generations: Default::default(),
            instances: Default::default(),
            watch: None,
        }
    }
}

impl TenantCustomResources {
    /// The tenant's instances of a kind, while its CRD is published there.
    pub fn instances(&self, crd: &str) -> Option<Arc<Instances>> {
        self.instances
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(crd)
            .map(|i| i.instances.clone())
    }

    /// Watches the tenant's instances of a kind through `resource` (again, if it was another).
    pub fn follow(&self, crd: &str, resource: &ApiResource) {
        let Some(watch) = &self.watch else {
            return;
        };
        let mut all = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        if all.get(crd).is_some_and(|i| &i.instances.resource == resource) {
            return;
        }
        let ledger = Arc::new(Mutex::new(watch.budget.ledger(Kind::CustomResource.as_str())));
        let (down, id, crd_name) = (watch.down.clone(), watch.id.clone(), crd.to_owned());
        let instances = watch_instances(
            Api::all_with(watch.client.clone(), resource),
            resource.clone(),
            watcher::Config::default().page_size(LIST_PAGE_SIZE),
            Some(watch.on_relist.clone()),
            Some(ledger.clone()),
            move |object: &DynamicObject, _| {
                down.add(
                    &id,
                    item::instance(&crd_name, &object.namespace().unwrap_or_default(), &object.name_any()),
                )
            },
        );
        all.insert(
            crd.to_owned(),
            TenantInstances {
                instances: Arc::new(instances),
                ledger,
            },
        );
    }

    /// Stops watching the tenant's instances of a kind.
    pub fn forget(&self, crd: &str) {
        self.instances.lock().unwrap_or_else(|e| e.into_inner()).remove(crd);
    }
}

/// Starts the watch of the tenant's CRDs and queues every configured kind to be published.
pub fn watch_tenant(tenant: &mut TenantWatch<'_>) -> TenantCustomResources {
    let configured: Vec<String> = tenant.custom_resources.iter().map(|k| k.name.clone()).collect();
    for crd in &configured {
        tenant.queues.up.add(tenant.id, item::definition(crd));
    }
    let (up, id) = (tenant.queues.up.clone(), tenant.id.clone());
    let definitions = tenant.watch(
        Kind::CustomResource,
        None,
        move |crd: &PartialObjectMeta<CustomResourceDefinition>, _| {
            let name = crd.name_any();
            // A tenant's own CRDs are its business; only the configured names and the platform's mark
            // concern the syncer (a marked CRD of a kind no longer configured is removed).
            if configured.contains(&name) || convert::carries_platform_mark(crd.meta()) {
                up.add(&id, item::definition(&name));
            }
        },
    );
    TenantCustomResources {
        definitions,
        checked_generations: Default::default(),
        instances: Default::default(),
        watch: Some(InstanceWatch {
            client: tenant.client.clone(),
            down: tenant.queues.down.clone(),
            id: tenant.id.clone(),
            budget: tenant.budget().clone(),
            on_relist: Arc::new(tenant.doubt_identity()),
        }),
    }
}
