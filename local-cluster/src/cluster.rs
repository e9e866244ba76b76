use std::sync::Arc;

use kube::Client;

use crate::{ApiServer, ApiServerOptions, ControllerManager, Etcd, Result, Scheduler};

/// What to run in a [`ControlPlane`].
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// The apiserver.
    pub apiserver: ApiServerOptions,
    /// Run kube-controller-manager with this `--controllers` value.
    pub controller_manager: Option<String>,
    /// Run kube-scheduler. Without it, a [`crate::NodeSimulator`] binds pods itself.
    pub scheduler: bool,
    /// More kube-controller-manager flags, appended last.
    pub controller_manager_args: Vec<String>,
}

/// Controllers of a super cluster: everything but what needs a cloud.
pub const SUPER_CONTROLLERS: &str = "*,-nodeipam,-route,-cloud-node-lifecycle,-service";
/// Controllers of a tenant master: like the original project's, without node lifecycle, because vNodes have
/// no kubelet heartbeat of their own.
pub const TENANT_CONTROLLERS: &str = "*,-nodelifecycle,-nodeipam,-route,-cloud-node-lifecycle,-service";
/// What a super cluster's controller-manager needs to provision volumes on real nodes.
const REAL_NODES_CONTROLLER_MANAGER_ARGS: &[&str] = &["--enable-hostpath-provisioner=true"];
/// What a super cluster's apiserver needs for real nodes: kubelets may change only their own Node and pods.
const REAL_NODES_APISERVER_ARGS: &[&str] = &["--enable-admission-plugins=NodeRestriction"];

impl ControlPlaneOptions {
    /// An apiserver alone.
    pub fn bare(name: &str) -> Self {
        Self {
            apiserver: ApiServerOptions::named(name),
            controller_manager: None,
            scheduler: false,
            controller_manager_args: Vec::new(),
        }
    }

    /// A super cluster: apiserver and controller-manager; pods are bound by the node simulator.
    pub fn super_cluster() -> Self {
        Self {
            controller_manager: Some(SUPER_CONTROLLERS.to_owned()),
            ..Self::bare("super")
        }
    }

    /// A tenant master: apiserver and controller-manager, with its own service range.
    pub fn tenant(name: &str) -> Self {
        let mut options = Self {
            controller_manager: Some(TENANT_CONTROLLERS.to_owned()),
            ..Self::bare(name)
        };
        options.apiserver.service_cidr = "10.32.0.0/16".to_owned();
        options
    }

    /// Also run kube-scheduler.
    #[must_use]
    pub fn with_scheduler(mut self) -> Self {
        self.scheduler = true;
        self
    }

    /// Options for a super cluster whose nodes are real ([`crate::RealNodes`]): reachable from the nodes'
    /// network namespaces, a scheduler, the hostpath provisioner, and NodeRestriction.
    #[must_use]
    pub fn with_real_nodes(mut self) -> Self {
        self.scheduler = true;
        self.apiserver.reachable_from_nodes = true;
        self.controller_manager_args
            .extend(REAL_NODES_CONTROLLER_MANAGER_ARGS.iter().map(|a| (*a).to_owned()));
        self.apiserver
            .extra_args
            .extend(REAL_NODES_APISERVER_ARGS.iter().map(|a| (*a).to_owned()));
        self
    }
}

/// A running control plane. Dropping it stops every process (components first) and removes its files.
#[derive(Debug)]
pub struct ControlPlane {
    // Fields drop in order: components, then the apiserver, then (if last owner) etcd.
    scheduler: Option<Scheduler>,
    controller_manager: Option<ControllerManager>,
    apiserver: ApiServer,
    etcd: Arc<Etcd>,
}

impl ControlPlane {
    /// Starts a control plane with its own etcd.
    pub async fn start(options: ControlPlaneOptions) -> Result<Self> {
        Self::start_on(Arc::new(Etcd::start().await?), options).await
    }

    /// Starts a control plane on a shared etcd (its apiserver uses the etcd prefix `/<name>`).
    pub async fn start_on(etcd: Arc<Etcd>, options: ControlPlaneOptions) -> Result<Self> {
        let name = options.apiserver.name.clone();
        let service_cidr = options.apiserver.service_cidr.clone();
        let apiserver = ApiServer::start(&etcd, options.apiserver).await?;
        let controller_manager = match &options.controller_manager {
            Some(controllers) => Some(
                ControllerManager::start(
                    &apiserver,
                    &name,
                    controllers,
                    &service_cidr,
                    &options.controller_manager_args,
                )
                .await?,
            ),
            None => None,
        };
        let scheduler = match options.scheduler {
            true => Some(Scheduler::start(&apiserver, &name).await?),
            false => None,
        };
        Ok(Self {
            scheduler,
            controller_manager,
            apiserver,
            etcd,
        })
    }

    /// A cluster-admin client.
    pub fn client(&self) -> Client {
        self.apiserver.client()
    }

    /// The apiserver.
    pub fn apiserver(&self) -> &ApiServer {
        &self.apiserver
    }

    /// The apiserver, to stop or restart it.
    pub fn apiserver_mut(&mut self) -> &mut ApiServer {
        &mut self.apiserver
    }

    /// The etcd this control plane stores into.
    pub fn etcd(&self) -> &Arc<Etcd> {
        &self.etcd
    }

    /// The controller-manager, when one runs.
    pub fn controller_manager_mut(&mut self) -> Option<&mut ControllerManager> {
        self.controller_manager.as_mut()
    }

    /// Process ids of the controller-manager and scheduler, when they run.
    pub fn component_pids(&self) -> Vec<u32> {
        let controller_manager = self.controller_manager.as_ref().and_then(ControllerManager::pid);
        let scheduler = self.scheduler.as_ref().and_then(Scheduler::pid);
        controller_manager.into_iter().chain(scheduler).collect()
    }

    /// Whether a scheduler runs (otherwise the node simulator should bind pods).
    pub fn has_scheduler(&self) -> bool {
        self.scheduler.is_some()
    }
}
