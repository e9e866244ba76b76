//! The conversion, table by table: a typical pod, DNS, refusals, runtime classes, hardening, the token
//! Secret's volumes, a running pod's changes and ephemeral containers.

use k8s_openapi::api::core::v1::{EphemeralContainer, PodDNSConfig, Volume};
use serde_json::json;

use super::*;
use crate::cache::pods::ContainerImage;

fn identity() -> TenantIdentity {
    TenantIdentity {
        cluster_key: "default-abc123-team".into(),
        vc_name: "team".into(),
        vc_namespace: "default".into(),
        vc_uid: "vc-uid".into(),
    }
}

/// A pod as a tenant apiserver stores it: admission added the kube-api-access volume and priority.
fn tenant_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "pod-uid", "labels": {"app": "web"}},
        "spec": {
            "priority": 0,
            "serviceAccountName": "default",
            "containers": [{
                "name": "web", "image": "nginx:1",
                "env": [
                    {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "volumeMounts": [{"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
            }],
            "volumes": [{"name": "kube-api-access-x1", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}}],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": "web"}},
                "namespaces": ["shop"],
                "topologyKey": "kubernetes.io/hostname"
            }]}}
        }
    }))
    .expect("pod")
}

fn convert(pod: &Pod, policy: &PodPolicy, endpoints: &TenantEndpoints) -> Result<Converted, Refusal> {
    convert_with_runtime(pod, policy, endpoints, Some("kata"), &published("kata", json!([])))
}

/// A published (or forcible) RuntimeClass with these scheduling tolerations.
fn published(name: &str, tolerations: serde_json::Value) -> RuntimeClassChoice {
    RuntimeClassChoice::Published(crate::resources::runtime_class::ChosenClass {
        name: name.to_owned(),
        tolerations: serde_json::from_value(tolerations).expect("tolerations"),
    })
}

/// [`convert`], with the VirtualCluster's forced RuntimeClass and the pod's own choice.
fn convert_with_runtime(
    pod: &Pod,
    policy: &PodPolicy,
    endpoints: &TenantEndpoints,
    forced: Option<&str>,
    chosen: &RuntimeClassChoice,
) -> Result<Converted, Refusal> {
    let identity = identity();
    let platform = PlatformPodPolicy::default();
    let cx = PodConversion {
        identity: &identity,
        meta: &Default::default(),
        super_namespace: "default-abc123-team-shop",
        cluster_domain: "cluster.local",
        runtime_class_name: forced,
        runtime_class: chosen,
        node_selection: None,
        pod_policy: policy,
        platform_policy: &platform,
        published_priority_class: &|_| false,
        published_storage_class: &|class| class == "shared",
        published_default_storage_class: None,
        hardening: Hardening {
            always_pull: true,
            drop_net_raw: true,
        },
        endpoints,
        ndots: 5,
        upstream_nameservers: &[],
        token_secret: "shard-0.vc-tokens",
        token_key_prefix: "web-1",
    };
    to_super(pod, &cx)
}

fn endpoints() -> TenantEndpoints {
    TenantEndpoints {
        dns_ip: Some("10.96.0.10".into()),
        apiserver: Some(("10.96.0.1".into(), 443)),
    }
}

#[test]
fn a_typical_pod_is_rewritten_for_the_super_cluster() {
    let converted = convert(&tenant_pod(), &PodPolicy::default(), &endpoints()).expect("converted");
    let pod = converted.pod;
    assert_eq!(
        pod.metadata.namespace.as_deref(),
        Some("default-abc123-team-shop")
    );
    assert_eq!(
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crds::wellknown::LABEL_CLUSTER))
            .map(String::as_str),
        Some("default-abc123-team")
    );
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.priority, None);
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.runtime_class_name.as_deref(), Some("kata"));

    // DNS: the tenant's kube-dns and search paths.
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    let dns = spec.dns_config.expect("dns config");
    assert_eq!(dns.nameservers, Some(vec!["10.96.0.10".to_owned()]));
    assert_eq!(
        dns.searches.expect("searches")[..3],
        ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    );

    // The tenant apiserver, by env and host alias.
    let env = spec.containers[0].env.clone().expect("env");
    let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
    // By a name every tenant apiserver's certificate holds, aliased to the super cluster IP.
    assert_eq!(
        value("KUBERNETES_SERVICE_HOST").as_deref(),
        Some("kubernetes.default.svc")
    );
    assert_eq!(
        value("KUBERNETES_PORT_443_TCP_ADDR").as_deref(),
        Some("10.96.0.1")
    );
    // Downward namespace becomes the tenant's; the name is the same on both sides.
    assert_eq!(value("MY_NS").as_deref(), Some("shop"));
    assert!(env.iter().any(|e| e.name == "MY_NAME" && e.value_from.is_some()));
    let aliases = spec.host_aliases.expect("host aliases");
    assert!(
        aliases[0]
            .hostnames
            .as_ref()
            .expect("names")
            .contains(&"kubernetes.default.svc.cluster.local".to_owned())
    );

    // The kube-api-access volume reads token, CA and namespace from the token Secret.
    let sources = spec.volumes.expect("volumes")[0]
        .projected
        .clone()
        .expect("projected")
        .sources
        .expect("sources");
    assert_eq!(sources.len(), 3);
    for (source, key) in sources.iter().zip(["web-1.token-", "ca.crt", "namespace"]) {
        let secret = source.secret.as_ref().expect("secret source");
        assert_eq!(secret.name, "shard-0.vc-tokens");
        assert!(
            secret.items.as_ref().expect("items")[0].key.starts_with(key),
            "{key}"
        );
    }
    assert!(converted.needs_secret);
    assert_eq!(converted.tokens.len(), 1);
    assert_eq!(converted.tokens[0].expiration_seconds, Some(3607));

    // Anti-affinity stays within the tenant.
    let term = &spec
        .affinity
        .expect("affinity")
        .pod_anti_affinity
        .expect("anti")
        .required_during_scheduling_ignored_during_execution
        .expect("terms")[0];
    assert_eq!(term.namespaces, Some(vec!["default-abc123-team-shop".to_owned()]));
    let requirement = &term
        .label_selector
        .as_ref()
        .expect("selector")
        .match_expressions
        .as_ref()
        .expect("expressions")[0];
    assert_eq!(requirement.key, crds::wellknown::LABEL_CLUSTER);
    assert_eq!(requirement.values, Some(vec!["default-abc123-team".to_owned()]));
}

#[test]
fn without_tenant_dns_pods_use_the_node_resolver_not_the_super_dns() {
    let converted =
        convert(&tenant_pod(), &PodPolicy::default(), &TenantEndpoints::default()).expect("converted");
    let spec = converted.pod.spec.expect("spec");
    assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
    assert!(spec.host_aliases.is_none());
}

#[test]
fn an_opted_out_pod_keeps_its_dns_but_never_gets_the_super_clusters() {
    let mut pod = tenant_pod();
    pod.metadata.annotations =
        Some([(ANNOTATION_DISABLE_DNS_MUTATION.to_owned(), "true".to_owned())].into());
    // ClusterFirst (the default) would be the super cluster's DNS: the node's resolver instead.
    let spec = convert(&pod, &PodPolicy::default(), &endpoints())
        .expect("converted")
        .pod
        .spec
        .expect("spec");
    assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
    assert!(spec.dns_config.is_none());

    // With the platform's upstream nameservers: those, then the pod's own, and its own searches.
    pod.spec.as_mut().expect("spec").dns_config = Some(PodDNSConfig {
        nameservers: Some(vec!["192.0.2.53".into()]),
        searches: Some(vec!["corp.example".into()]),
        options: None,
    });
    let identity = identity();
    let platform = PlatformPodPolicy::default();
    let endpoints = endpoints();
    let upstream = ["10.0.0.2".to_owned()];
    // (Host networking allowed, for the last case below.)
    let policy = PodPolicy {
        host_network: true,
        ..Default::default()
    };
    let cx = PodConversion {
        identity: &identity,
        meta: &Default::default(),
        super_namespace: "default-abc123-team-shop",
        cluster_domain: "cluster.local",
        runtime_class_name: None,
        runtime_class: &RuntimeClassChoice::Unnamed,
        node_selection: None,
        pod_policy: &policy,
        platform_policy: &platform,
        published_priority_class: &|_| false,
        published_storage_class: &|_| false,
        published_default_storage_class: None,
        hardening: Hardening::default(),
        endpoints: &endpoints,
        ndots: 5,
        upstream_nameservers: &upstream,
        token_secret: "shard-0.vc-tokens",
        token_key_prefix: "web-1",
    };
    let spec = to_super(&pod, &cx).expect("converted").pod.spec.expect("spec");
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    let config = spec.dns_config.expect("dns config");
    assert_eq!(
        config.nameservers,
        Some(vec!["10.0.0.2".to_owned(), "192.0.2.53".to_owned()])
    );
    assert_eq!(config.searches, Some(vec!["corp.example".to_owned()]));

    // Policies that never meant cluster DNS stay as written.
    for (policy, host_network) in [("Default", false), ("None", false), ("ClusterFirst", true)] {
        let mut pod = pod.clone();
        let spec = pod.spec.as_mut().expect("spec");
        spec.dns_policy = Some(policy.into());
        spec.host_network = Some(host_network);
        let converted = to_super(&pod, &cx).expect("converted").pod.spec.expect("spec");
        assert_eq!(converted.dns_policy.as_deref(), Some(policy));
    }
}

#[test]
fn cluster_first_with_host_net_means_cluster_dns_also_without_the_host_network() {
    // The kubelet gives such a pod the cluster's DNS: it must be the tenant's.
    let mut pod = tenant_pod();
    pod.spec.as_mut().expect("spec").dns_policy = Some("ClusterFirstWithHostNet".into());
    let spec = convert(&pod, &PodPolicy::default(), &endpoints())
        .expect("converted")
        .pod
        .spec
        .expect("spec");
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    assert_eq!(
        spec.dns_config.and_then(|c| c.nameservers),
        Some(vec!["10.96.0.10".to_owned()])
    );
}

#[test]
fn node_names_and_host_access_are_refused() {
    let mut pod = tenant_pod();
    pod.spec.as_mut().expect("spec").node_name = Some("node-1".into());
    assert_eq!(
        convert(&pod, &PodPolicy::default(), &endpoints()).expect_err("refused"),
        Refusal::NodeNameSet("node-1".into())
    );

    let mut pod = tenant_pod();
    let spec = pod.spec.as_mut().expect("spec");
    spec.host_network = Some(true);
    spec.containers[0].security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    spec.volumes.as_mut().expect("volumes").push(Volume {
        name: "root".into(),
        host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
            path: "/".into(),
            type_: None,
        }),
        ..Default::default()
    });
    let Refusal::Policy(violations) =
        convert(&pod, &PodPolicy::default(), &endpoints()).expect_err("refused")
    else {
        panic!("wrong refusal")
    };
    assert_eq!(violations.len(), 3, "{violations:?}");
    // Allowed by policy: synced.
    let allowed = PodPolicy {
        host_network: true,
        privileged: true,
        host_path: true,
        ..Default::default()
    };
    assert!(convert(&pod, &allowed, &endpoints()).is_ok());
}

#[test]
fn a_pod_runs_with_the_published_runtime_class_its_own_leads_to_or_is_refused() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sandboxed", "namespace": "shop", "uid": "u"},
        "spec": {"runtimeClassName": "my-gvisor", "overhead": {"cpu": "1m"},
            "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .expect("pod");
    let policy = PodPolicy::default();
    let published = published("gvisor", json!([]));
    let spec = convert_with_runtime(&pod, &policy, &endpoints(), None, &published)
        .expect("converted")
        .pod
        .spec
        .expect("spec");
    assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
    // The super cluster's admission sets the published class's overhead; the tenant's is not sent.
    assert_eq!(spec.overhead, None);

    let refused = RuntimeClassChoice::Refused("runtimeClassName \"my-gvisor\" (handler \"x\")".into());
    match convert_with_runtime(&pod, &policy, &endpoints(), None, &refused) {
        Err(Refusal::Policy(violations)) => assert!(violations.iter().any(|v| v.contains("my-gvisor")), "{violations:?}"),
        other => panic!("{:?}", other.map(|c| c.pod.spec)),
    }
    // A class never looked up is not passed through.
    match convert_with_runtime(&pod, &policy, &endpoints(), None, &RuntimeClassChoice::Unnamed) {
        Err(Refusal::Policy(violations)) => assert!(violations.iter().any(|v| v.contains("my-gvisor")), "{violations:?}"),
        other => panic!("{:?}", other.map(|c| c.pod.spec)),
    }
    // A forced class is what `choose` resolves the choice to (the policy compares the names).
    let mut forced_pod = pod.clone();
    forced_pod.spec.as_mut().expect("spec").runtime_class_name = Some("kata".into());
    let kata = super::tests::published("kata", json!([]));
    let spec = convert_with_runtime(&forced_pod, &policy, &endpoints(), Some("kata"), &kata)
        .expect("converted")
        .pod
        .spec
        .expect("spec");
    assert_eq!(spec.runtime_class_name.as_deref(), Some("kata"));
}

/// The attack of a VirtualCluster editor: forcing a class whose scheduling tolerates the control plane's
/// taint (the super cluster's admission would add it to every pod), or one the platform does not offer.
#[test]
fn a_runtime_class_is_held_to_the_pods_toleration_policy() {
    let pod = tenant_pod();
    let policy = PodPolicy::default();
    let tolerant = published(
        "platform-nodes",
        json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
               {"operator": "Exists"}]),
    );
    match convert_with_runtime(&pod, &policy, &endpoints(), Some("platform-nodes"), &tolerant) {
        Err(Refusal::Policy(violations)) => {
            assert_eq!(violations.len(), 2, "{violations:#?}");
            assert!(violations[0].starts_with(
                "toleration of taint node-role.kubernetes.io/control-plane of RuntimeClass \"platform-nodes\""
            ));
            assert!(violations[1].starts_with("toleration of every taint of RuntimeClass"));
        }
        other => panic!("{:?}", other.map(|c| c.pod.spec)),
    }
    // Node-condition tolerations (allowed to every pod) are fine.
    let ordinary = published(
        "sandboxed",
        json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]),
    );
    assert!(convert_with_runtime(&pod, &policy, &endpoints(), Some("sandboxed"), &ordinary).is_ok());
    let refused = RuntimeClassChoice::Refused(
        "the VirtualCluster's spec.runtimeClassName \"privileged\", which the platform neither publishes".into(),
    );
    match convert_with_runtime(&pod, &policy, &endpoints(), Some("privileged"), &refused) {
        Err(Refusal::Policy(violations)) => assert!(violations[0].contains("neither publishes"), "{violations:?}"),
        other => panic!("{:?}", other.map(|c| c.pod.spec)),
    }
}

/// Generic ephemeral volumes mount the tenant's own claim (made by its controller-manager, synced and
/// counted like any claim), never a template the super cluster would make a claim of by itself.
#[test]
fn an_ephemeral_volume_mounts_the_tenants_claim() {
    let mut pod = tenant_pod();
    pod.metadata.name = Some("db-0".into());
    pod.spec.as_mut().expect("spec").volumes = Some(
        serde_json::from_value(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "metadata": {"labels": {"tenancy.x-k8s.io/cluster": "someone-else"}},
            "spec": {"storageClassName": "shared", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}}}]))
        .expect("volumes"),
    );
    let spec = convert(&pod, &PodPolicy::default(), &endpoints())
        .expect("converted")
        .pod
        .spec
        .expect("spec");
    let volume = &spec.volumes.expect("volumes")[0];
    assert!(volume.ephemeral.is_none());
    assert_eq!(
        volume.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()),
        Some("db-0-scratch")
    );
    // Held to the rules of claims.
    for (template, says) in [
        (json!({"storageClassName": "platform-ssd"}), "StorageClass \"platform-ssd\" is not published"),
        (json!({"storageClassName": ""}), "binds pre-made volumes"),
        (json!({}), "names no StorageClass"),
        (json!({"storageClassName": "shared", "selector": {"matchLabels": {"disk": "fast"}}}), "selector"),
        (
            json!({"storageClassName": "shared", "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "db", "namespace": "other"}}),
            "dataSourceRef.namespace \"other\"",
        ),
    ] {
        let mut template = template;
        template["accessModes"] = json!(["ReadWriteOnce"]);
        template["resources"] = json!({"requests": {"storage": "1Gi"}});
        pod.spec.as_mut().expect("spec").volumes = Some(
            serde_json::from_value(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": template}}}]))
                .expect("volumes"),
        );
        match convert(&pod, &PodPolicy::default(), &endpoints()) {
            Err(Refusal::Policy(violations)) => assert!(
                violations.iter().any(|v| v.starts_with("ephemeral volume \"scratch\"") && v.contains(says)),
                "{says}: {violations:#?}"
            ),
            other => panic!("{says}: {:?}", other.map(|c| c.pod.spec)),
        }
    }
}

/// Every container (init and ephemeral ones too) is pulled on every start and loses `NET_RAW`, unless
/// the platform says otherwise or the container adds it itself (which the capability policy judged).
#[test]
fn containers_are_hardened_for_shared_nodes() {
    let spec = convert(&tenant_pod(), &PodPolicy::default(), &endpoints())
        .expect("converted")
        .pod
        .spec
        .expect("spec");
    let container = &spec.containers[0];
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        container
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.drop.clone()),
        Some(vec!["NET_RAW".to_owned()])
    );
    let harden = |hardening: Hardening, security: serde_json::Value| {
        let mut pull = Some("IfNotPresent".to_owned());
        let mut security: Option<SecurityContext> = serde_json::from_value(security).expect("security");
        hardening.apply(&mut pull, &mut security);
        let dropped = security
            .and_then(|s| s.capabilities)
            .and_then(|c| c.drop)
            .unwrap_or_default();
        (pull.unwrap_or_default(), dropped)
    };
    let both = Hardening {
        always_pull: true,
        drop_net_raw: true,
    };
    let table = [
        (both, json!(null), ("Always", vec!["NET_RAW"])),
        (both, json!({"capabilities": {"drop": ["ALL"]}}), ("Always", vec!["ALL"])),
        (both, json!({"capabilities": {"drop": ["CHOWN"]}}), ("Always", vec!["CHOWN", "NET_RAW"])),
        (both, json!({"capabilities": {"add": ["CAP_NET_RAW"]}}), ("Always", vec![])),
        (Hardening::default(), json!(null), ("IfNotPresent", vec![])),
    ];
    for (hardening, security, (pull, dropped)) in table {
        assert_eq!(harden(hardening, security.clone()), (pull.to_owned(), dropped.iter().map(|d| d.to_string()).collect::<Vec<_>>()), "{security}");
    }
}

#[test]
fn a_pod_naming_a_token_secret_of_the_syncer_is_refused() {
    for (reference, name) in [
        (json!({"volumes": [{"name": "v", "secret": {"secretName": "shard-0.vc-tokens"}}]}), "shard-0.vc-tokens"),
        (
            json!({"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "web-1.vc-token"}}]}}]}),
            "web-1.vc-token",
        ),
        (json!({"imagePullSecrets": [{"name": "a.vc-tokens"}]}), "a.vc-tokens"),
    ] {
        let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
        for (key, value) in reference.as_object().expect("object") {
            spec[key] = value.clone();
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "thief", "namespace": "shop", "uid": "u"}, "spec": spec
        }))
        .expect("pod");
        match convert(&pod, &PodPolicy::default(), &endpoints()) {
            Err(Refusal::Policy(violations)) => {
                assert!(violations.iter().any(|v| v.contains(name)), "{violations:?}")
            }
            other => panic!("{name}: {:?}", other.map(|c| c.pod.metadata.name)),
        }
    }
    let env = json!({"metadata": {"name": "thief", "namespace": "shop", "uid": "u"}, "spec": {"containers": [
        {"name": "c", "image": "busybox",
         "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "shard-1.vc-tokens", "key": "web-1.token"}}}],
         "envFrom": [{"secretRef": {"name": "web-1.vc-token"}}]}]}});
    let pod: Pod = serde_json::from_value(env).expect("pod");
    let Err(Refusal::Policy(violations)) = convert(&pod, &PodPolicy::default(), &endpoints()) else {
        panic!("refused");
    };
    assert_eq!(violations.len(), 2, "{violations:?}");
    // The tenant's own Secrets are fine.
    let own: Pod = serde_json::from_value(json!({"metadata": {"name": "ok", "namespace": "shop", "uid": "u"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "v", "secret": {"secretName": "vc-tokens"}}]}}))
    .expect("pod");
    assert!(convert(&own, &PodPolicy::default(), &endpoints()).is_ok());
}

#[test]
fn pods_without_tokens_need_no_secret() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plain", "namespace": "shop", "uid": "u"},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .expect("pod");
    let converted = convert(&pod, &PodPolicy::default(), &endpoints()).expect("converted");
    assert!(!converted.needs_secret);
    assert!(converted.tokens.is_empty());
}

#[test]
fn mutable_views_follow_images_and_deadlines_only() {
    let pod = tenant_pod();
    let mut changed = pod.clone();
    changed.spec.as_mut().expect("spec").containers[0].image = Some("nginx:2".into());
    assert_ne!(
        mutable_view(&cached_spec(&pod)),
        mutable_view(&cached_spec(&changed))
    );
    let mut relabelled = pod.clone();
    relabelled.metadata.labels = None;
    assert_eq!(
        mutable_view(&cached_spec(&pod)),
        mutable_view(&cached_spec(&relabelled))
    );
}

#[test]
fn an_ephemeral_container_gets_the_tenants_apiserver_and_downward_values() {
    let mut pod = tenant_pod();
    let debug: EphemeralContainer = serde_json::from_value(serde_json::json!({
        "name": "debugger", "image": "busybox", "targetContainerName": "web",
        "command": ["sh"], "stdin": true, "tty": true,
        "env": [{"name": "MY_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
        "volumeMounts": [{"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    }))
    .expect("ephemeral container");
    pod.spec.as_mut().expect("spec").ephemeral_containers = Some(vec![debug.clone()]);
    let platform = PlatformPodPolicy::default();
    let policy = PodPolicy::default();
    let cx = EphemeralConversion {
        pod_policy: &policy,
        platform_policy: &platform,
        apiserver: Some(("10.96.0.1", 443)),
        hardening: Hardening {
            always_pull: true,
            drop_net_raw: true,
        },
    };
    let converted = ephemeral_to_super(&pod, &debug, &cx).expect("allowed");
    assert_eq!(converted.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(converted.target_container_name.as_deref(), Some("web"));
    assert_eq!(converted.stdin, Some(true));
    assert_eq!(converted.volume_mounts, debug.volume_mounts);
    let env = converted.env.expect("env");
    let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
    assert_eq!(value("MY_UID").as_deref(), Some("pod-uid"));
    assert_eq!(
        value("KUBERNETES_SERVICE_HOST").as_deref(),
        Some("kubernetes.default.svc")
    );
    assert_eq!(
        value("KUBERNETES_PORT_443_TCP_ADDR").as_deref(),
        Some("10.96.0.1")
    );

    // Privileged: refused, named.
    let mut privileged = debug.clone();
    privileged.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    let refused = ephemeral_to_super(&pod, &privileged, &cx).expect_err("refused");
    assert_eq!(refused, ["privileged ephemeral container \"debugger\""]);

    // A pod created with ephemeral containers (recreated after a pause) gets them afterwards.
    let created = convert(&pod, &PodPolicy::default(), &endpoints()).expect("converted");
    assert_eq!(created.pod.spec.expect("spec").ephemeral_containers, None);
}

#[test]
fn ephemeral_containers_are_compared_by_name_and_image() {
    let spec = |containers: serde_json::Value| -> CachedPodSpec {
        serde_json::from_value(serde_json::json!({"ephemeralContainers": containers})).expect("spec")
    };
    let tenant = spec(serde_json::json!([
        {"name": "dbg", "image": "busybox"},
        {"name": "new", "image": "busybox"},
        {"name": "moved", "image": "busybox:2"}
    ]));
    let super_spec = spec(serde_json::json!([
        {"name": "dbg", "image": "busybox"},
        {"name": "moved", "image": "busybox:1"},
        {"name": "platform-debugger", "image": "netshoot"}
    ]));
    let changes = ephemeral_changes(&tenant, &super_spec);
    let names = |list: &[&ContainerImage]| list.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&changes.missing), ["new"]);
    assert_eq!(names(&changes.changed), ["moved"]);
    assert!(ephemeral_changes(&super_spec, &super_spec).is_empty());
}
