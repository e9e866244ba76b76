//! Wiring: watches and caches, the two controllers, and what they do with the runtime's Lease.
//!
//! The process plumbing (admin endpoint, signals, client, logging) is [`vc_runtime::Runtime`]'s. Every
//! replica keeps its caches warm (so `/readyz` means "caches synced" on standbys too); only the replica
//! holding the `vc-manager` Lease reconciles. On becoming leader it reconciles everything; on losing the
//! Lease it stops with an error, and the binary exits so that Kubernetes restarts it as a standby.

use std::{future::Future, net::SocketAddr, sync::Arc};

use crds::{ClusterVersion, VirtualCluster, v1alpha1::Adoption, wellknown::LABEL_VC_NAME};
use futures::{StreamExt, stream};
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Namespace, Secret, Service},
};
use kube::{
    Api, Client, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt, controller,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::watch;
use vc_runtime::{Runtime, admin::Health};

pub use vc_runtime::leader::LeaderElection;

use crate::{
    Error, Result,
    cached::CachedClusterVersion,
    cluster_version,
    context::{Context, Settings, synced},
    identity::{managed_selector, owner_of},
    leader::LeaderFlag,
    metrics::Metrics,
    probe::{KubeconfigProbe, TenantProbe},
    virtual_cluster,
};

/// Name of the leader-election Lease.
pub const LEASE_NAME: &str = "vc-manager";

/// Prefix of vc-manager's metric names.
const METRICS_PREFIX: &str = "vc_manager";

/// A configured vc-manager, ready to run.
pub struct Manager {
    client: Client,
    settings: Settings,
    leader_election: Option<LeaderElection>,
    admin_address: Option<SocketAddr>,
    probe: Arc<dyn TenantProbe>,
    metrics: Metrics,
    health: Health,
}

impl Manager {
    /// vc-manager on `client`, without leader election or admin endpoint.
    pub fn new(client: Client, settings: Settings) -> Self {
        let probe = Arc::new(KubeconfigProbe {
            timeouts: settings.tenant_timeouts,
        });
        Self {
            client,
            settings,
            leader_election: None,
            admin_address: None,
            probe,
            metrics: Metrics::new(),
            health: Health::new(),
        }
    }

    /// Elect a leader among replicas through the `vc-manager` Lease (for [`run`](Self::run); with
    /// [`run_in`](Self::run_in) the runtime's Lease decides).
    #[must_use]
    pub fn with_leader_election(mut self, election: LeaderElection) -> Self {
        self.leader_election = Some(election);
        self
    }

    /// Serve `/metrics`, `/healthz` and `/readyz` on `address` (for [`run`](Self::run)).
    #[must_use]
    pub fn with_admin_endpoint(mut self, address: SocketAddr) -> Self {
        self.admin_address = Some(address);
        self
    }

    /// The metrics (shared with the running manager).
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Liveness and readiness (shared with the manager [`run`](Self::run) starts; [`run_in`](Self::run_in)
    /// reports through the runtime's).
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Runs inside this program until `shutdown` resolves (then `Ok`) or leadership is lost (then an
    /// error): [`run_in`](Self::run_in) on a runtime built from this manager's client, admin endpoint and
    /// leader election.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let mut builder = Runtime::builder()
            .with_client(self.client.clone())
            .with_health(self.health.clone())
            .with_leader_election(LEASE_NAME, self.leader_election.clone())
            .with_shutdown_on(shutdown);
        if let Some(address) = self.admin_address {
            builder = builder.with_admin(address);
        }
        let runtime = builder.build().await.map_err(Error::Runtime)?;
        self.run_in(runtime).await
    }

    /// Runs on `runtime` (its client, admin endpoint, Lease and shutdown) until it is asked to stop (then
    /// `Ok`, once the controllers have finished what they were doing) or leadership is lost (then an
    /// error).
    pub async fn run_in(self, mut runtime: Runtime) -> Result<()> {
        let Self {
            settings,
            probe,
            metrics,
            ..
        } = self;
        let (client, health, shutdown, lease) = (
            runtime.client(),
            runtime.health(),
            runtime.shutdown(),
            runtime.lease(),
        );

        let leader = match lease {
            Some(_) => LeaderFlag::default(),
            None => LeaderFlag::always(),
        };
        metrics.set_leader(leader.is_leader());
        // Becoming leader reconciles everything.
        let (became_leader_tx, became_leader_rx) = watch::channel(0u64);

        let watcher_config = watcher::Config::default().any_semantic();
        let vc_api: Api<VirtualCluster> = Api::all(client.clone());
        let cv_api: Api<CachedClusterVersion> = Api::all(client.clone());

        let vc_controller = Controller::new(vc_api.clone(), watcher_config.clone());
        let cv_controller = Controller::new(cv_api.clone(), watcher_config.clone());
        let vc_store = vc_controller.store();
        let cv_store = cv_controller.store();

        let (sts_store, sts_writer) = reflector::store::<StatefulSet>();
        let statefulsets = watcher(
            Api::<StatefulSet>::all(client.clone()),
            watcher::Config::default().labels(&managed_selector()),
        )
        .default_backoff()
        .modify(|sts| sts.managed_fields_mut().clear())
        .reflect(sts_writer)
        .touched_objects();

        let context = Arc::new(
            Context::new(
                client.clone(),
                settings.clone(),
                vc_store.clone(),
                cv_store.clone(),
                sts_store.clone(),
                leader.clone(),
                probe,
                metrics.clone(),
            )
            .with_queued_events(),
        );

        let vc_controller = vc_controller
            .with_config(
                controller::Config::default()
                    .concurrency(settings.concurrency)
                    .debounce(settings.debounce),
            )
            .watches_stream(statefulsets, |sts| owner_of(&sts.metadata))
            .watches(
                Api::<PartialObjectMeta<ClusterVersion>>::all(client.clone()),
                watcher_config.clone(),
                {
                    let vcs = vc_store.clone();
                    move |cv: PartialObjectMeta<ClusterVersion>| users_of(&vcs, &cv.name_any())
                },
            )
            .watches(
                Api::<PartialObjectMeta<Service>>::all(client.clone()),
                watcher::Config::default().labels(&managed_selector()),
                |service| owner_of(&service.metadata),
            )
            .watches(
                Api::<PartialObjectMeta<Secret>>::all(client.clone()),
                watcher::Config::default(),
                {
                    let vcs = vc_store.clone();
                    move |secret: PartialObjectMeta<Secret>| secret_users(&vcs, &secret)
                },
            )
            .watches(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default().labels(&managed_selector()),
                |namespace| owner_of(&namespace.metadata),
            )
            .watches(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default().labels(LABEL_VC_NAME),
                tenant_namespace_owner,
            )
            .reconcile_all_on(leadership_stream(became_leader_rx.clone()))
            .graceful_shutdown_on(shutdown.requested());
        let cv_controller = cv_controller
            .with_config(controller::Config::default().concurrency(4))
            .watches(vc_api, watcher_config, {
                let cvs = cv_store.clone();
                move |vc: VirtualCluster| versions_of(&cvs, &vc)
            })
            .reconcile_all_on(leadership_stream(became_leader_rx))
            .graceful_shutdown_on(shutdown.requested());

        metrics.register(
            runtime.registry_mut().sub_registry_with_prefix(METRICS_PREFIX),
            vc_store.clone(),
        );

        let mut tasks = tokio::task::JoinSet::new();
        {
            let health = health.clone();
            let (vcs, cvs, sts) = (vc_store.clone(), cv_store.clone(), sts_store.clone());
            tasks.spawn(async move {
                synced(&vcs).await;
                synced(&cvs).await;
                synced(&sts).await;
                health.set_ready(true);
                tracing::info!("caches synced");
                Ok(())
            });
        }
        if let Some(reference) = settings.kubelet_client_ca_bundle.clone() {
            let (client, leader, stop) = (client.clone(), leader.clone(), shutdown.requested());
            tasks.spawn(async move {
                crate::ca_bundle::maintain(client, reference, leader, stop).await;
                Ok(())
            });
        }
        if let Some(lease) = lease {
            let leader = leader.clone();
            let metrics = metrics.clone();
            tasks.spawn(async move {
                let mut leadership = lease.acquire().await.map_err(Error::Runtime)?;
                leader.set(true);
                metrics.set_leader(true);
                became_leader_tx.send_modify(|n| *n += 1);
                let lost = leadership.lost().await;
                leader.set(false);
                metrics.set_leader(false);
                Err(Error::Runtime(lost))
            });
        } else {
            drop(became_leader_tx);
        }

        // Boxed: the controllers' state machines are large.
        let controllers = {
            let context = context.clone();
            Box::pin(async move {
                let vcs = vc_controller
                    .run(
                        virtual_cluster::reconcile,
                        virtual_cluster::error_policy,
                        context.clone(),
                    )
                    .for_each(|result| async move {
                        if let Err(error) = result {
                            log_controller_error("virtualcluster", &error);
                        }
                    });
                let cvs = cv_controller
                    .run(cluster_version::reconcile, cluster_version::error_policy, context)
                    .for_each(|result| async move {
                        if let Err(error) = result {
                            log_controller_error("clusterversion", &error);
                        }
                    });
                // Each controller on a task of its own (shallower stacks than polling both here); the
                // set aborts them if this future is dropped.
                let mut running = tokio::task::JoinSet::new();
                running.spawn(vcs);
                running.spawn(cvs);
                while let Some(ended) = running.join_next().await {
                    if let Err(error) = ended {
                        tracing::error!(error = %error, "controller task failed");
                    }
                }
            })
        };

        let work = async move {
            let mut controllers = controllers;
            let stop = shutdown.requested();
            tokio::pin!(stop);
            let outcome = loop {
                tokio::select! {
                    () = &mut stop => {
                        // Let the controllers finish what they are doing.
                        (&mut controllers).await;
                        break Ok(());
                    }
                    () = &mut controllers => break Ok(()),
                    Some(finished) = tasks.join_next() => match finished {
                        Ok(Ok(())) => continue,
                        Ok(Err(error)) => break Err(error),
                        Err(join_error) => {
                            tracing::error!(error = %join_error, "vc-manager task panicked");
                            health.set_dead();
                            continue;
                        }
                    },
                }
            };
            tasks.abort_all();
            outcome
        };
        runtime.run(work).await
    }
}

fn log_controller_error<E, Q>(controller: &str, error: &controller::Error<E, Q>)
where
    E: std::error::Error + 'static,
    Q: std::error::Error + 'static,
{
    match error {
        // Already logged by the error policy with the object's name.
        controller::Error::ReconcilerFailed(..) => {}
        other => tracing::warn!(controller, error = other as &dyn std::error::Error, "controller"),
    }
}

/// A stream that yields each time leadership is (re)gained.
fn leadership_stream(rx: watch::Receiver<u64>) -> impl futures::Stream<Item = ()> + Send + 'static {
    stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// VirtualClusters provisioned from ClusterVersion `name`.
fn users_of(vcs: &Store<VirtualCluster>, name: &str) -> Vec<ObjectRef<VirtualCluster>> {
    vcs.state()
        .iter()
        .filter(|vc| cluster_version::provisioned_from(vc, name))
        .map(|vc| ObjectRef::from_obj(vc.as_ref()))
        .collect()
}

/// ClusterVersions whose status must change because of a VirtualCluster: the one it uses and any that
/// still list it.
fn versions_of(
    cvs: &Store<CachedClusterVersion>,
    vc: &VirtualCluster,
) -> Vec<ObjectRef<CachedClusterVersion>> {
    let mut refs: Vec<ObjectRef<CachedClusterVersion>> = vc
        .spec
        .cluster_version_name
        .iter()
        .map(|name| ObjectRef::new(name))
        .collect();
    let (namespace, name) = (vc.namespace().unwrap_or_default(), vc.name_any());
    refs.extend(
        cvs.state()
            .iter()
            .filter(|cv| {
                cv.status.as_ref().is_some_and(|s| {
                    s.virtual_clusters
                        .iter()
                        .any(|u| u.namespace == namespace && u.name == name)
                })
            })
            .map(|cv| ObjectRef::from_obj(cv.as_ref())),
    );
    refs
}

/// VirtualClusters a Secret matters to: the one it was made for, or adopted ones reading their kubeconfig
/// from it.
fn secret_users(
    vcs: &Store<VirtualCluster>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<VirtualCluster>> {
    if secret
        .labels()
        .get(crds::wellknown::LABEL_MANAGED_BY)
        .map(String::as_str)
        == Some(crate::identity::MANAGED_BY)
    {
        return owner_of(&secret.metadata).into_iter().collect();
    }
    let (namespace, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
    vcs.state()
        .iter()
        .filter(|vc| vc.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|vc| matches!(vc.adoption(), Some(Adoption::Secret(r)) if r.name == name))
        .map(|vc| ObjectRef::from_obj(vc.as_ref()))
        .collect()
}

/// A syncer tenant namespace matters to its VirtualCluster only while it is being deleted (deletion waits
/// for it).
fn tenant_namespace_owner(namespace: PartialObjectMeta<Namespace>) -> Option<ObjectRef<VirtualCluster>> {
    namespace.metadata.deletion_timestamp.as_ref()?;
    let labels = namespace.labels();
    let name = labels.get(LABEL_VC_NAME)?;
    let vc_namespace = labels.get(crds::wellknown::LABEL_VC_NAMESPACE)?;
    Some(ObjectRef::new(name).within(vc_namespace))
}

#[cfg(test)]
mod tests {
    use crds::{ClusterVersionStatus, KubeconfigSecretRef, VirtualClusterRef, VirtualClusterSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use kube::runtime::watcher;

    use super::*;

    fn vc(name: &str, spec: VirtualClusterSpec) -> VirtualCluster {
        let mut vc = VirtualCluster::new(name, spec);
        vc.metadata.namespace = Some("team".into());
        vc
    }

    fn store(vcs: Vec<VirtualCluster>) -> Store<VirtualCluster> {
        let (store, mut writer) = reflector::store();
        for vc in vcs {
            writer.apply_watcher_event(&watcher::Event::Apply(vc));
        }
        store
    }

    fn meta<K: kube::Resource<DynamicType = ()>>(
        name: &str,
        namespace: &str,
        labels: &[(&str, &str)],
    ) -> PartialObjectMeta<K> {
        let mut object = PartialObjectMeta::<K> {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            _phantom: Default::default(),
        };
        object.metadata.annotations = Some(Default::default());
        object
    }

    #[test]
    fn cluster_version_events_reach_the_virtual_clusters_provisioned_from_it() {
        let adopted_with_name = {
            let mut v = vc(
                "adopted",
                VirtualClusterSpec {
                    cluster_version_name: Some("cv".into()),
                    ..Default::default()
                },
            );
            v.metadata.annotations =
                Some([("tenancy.x-k8s.io/admin-kubeconfig".to_owned(), "eA==".to_owned())].into());
            v
        };
        let vcs = store(vec![
            vc(
                "a",
                VirtualClusterSpec {
                    cluster_version_name: Some("cv".into()),
                    ..Default::default()
                },
            ),
            vc(
                "b",
                VirtualClusterSpec {
                    cluster_version_name: Some("other".into()),
                    ..Default::default()
                },
            ),
            adopted_with_name,
        ]);
        assert_eq!(users_of(&vcs, "cv"), vec![ObjectRef::new("a").within("team")]);
    }

    #[test]
    fn a_virtual_cluster_event_reaches_its_cluster_version_and_any_listing_it() {
        let (cvs, mut writer) = reflector::store::<CachedClusterVersion>();
        let mut old = CachedClusterVersion::default();
        old.metadata.name = Some("old".into());
        old.status = Some(ClusterVersionStatus {
            virtual_clusters: vec![VirtualClusterRef {
                namespace: "team".into(),
                name: "a".into(),
            }],
            ..Default::default()
        });
        writer.apply_watcher_event(&watcher::Event::Apply(old));
        let moved = vc(
            "a",
            VirtualClusterSpec {
                cluster_version_name: Some("new".into()),
                ..Default::default()
            },
        );
        let refs = versions_of(&cvs, &moved);
        assert_eq!(refs, vec![ObjectRef::new("new"), ObjectRef::new("old")]);
    }

    #[test]
    fn secrets_reach_their_tenant_or_the_adopted_clusters_reading_them() {
        let adopted = vc(
            "beta",
            VirtualClusterSpec {
                kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                    name: "beta-kubeconfig".into(),
                    key: "value".into(),
                }),
                ..Default::default()
            },
        );
        let vcs = store(vec![adopted]);
        let kubeconfig = meta::<Secret>("beta-kubeconfig", "team", &[]);
        assert_eq!(
            secret_users(&vcs, &kubeconfig),
            vec![ObjectRef::new("beta").within("team")]
        );
        let elsewhere = meta::<Secret>("beta-kubeconfig", "other", &[]);
        assert!(secret_users(&vcs, &elsewhere).is_empty());
        let mut managed = meta::<Secret>(
            "root-ca",
            "team-abc-vc",
            &[("app.kubernetes.io/managed-by", "vc-manager")],
        );
        managed.metadata.annotations = Some(
            [
                ("tenancy.x-k8s.io/vcname".to_owned(), "alpha".to_owned()),
                ("tenancy.x-k8s.io/vcnamespace".to_owned(), "team".to_owned()),
            ]
            .into(),
        );
        assert_eq!(
            secret_users(&vcs, &managed),
            vec![ObjectRef::new("alpha").within("team")]
        );
    }

    #[test]
    fn tenant_namespaces_matter_only_while_being_deleted() {
        let labels = [
            ("tenancy.x-k8s.io/vcname", "alpha"),
            ("tenancy.x-k8s.io/vcnamespace", "team"),
        ];
        let mut namespace = meta::<Namespace>("team-abc-alpha-default", "", &labels);
        assert_eq!(tenant_namespace_owner(namespace.clone()), None);
        namespace.metadata.deletion_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::from_second(1).expect("time")));
        assert_eq!(
            tenant_namespace_owner(namespace),
            Some(ObjectRef::new("alpha").within("team"))
        );
    }
}
