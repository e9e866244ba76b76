//! The policy's tables: what passes, what is named, what podPolicy and the platform's flags widen.

use std::collections::BTreeMap;

use crds::PodPolicy;
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::json;

use super::*;
use crate::resources::pod::flags::PlatformPodPolicy;

fn spec(value: serde_json::Value) -> PodSpec {
    serde_json::from_value(value).expect("spec")
}

fn check(spec: &PodSpec, annotations: serde_json::Value, tenant: &PodPolicy) -> Vec<String> {
    let platform = PlatformPodPolicy {
        grantable_taints: vec!["dedicated".into()],
        grantable_node_labels: vec!["pool".into()],
        ..Default::default()
    };
    let annotations: BTreeMap<String, String> = serde_json::from_value(annotations).expect("map");
    let published = |name: &str| name == "tenant-high";
    let input = PolicyInput {
        tenant,
        platform: &platform,
        forced_runtime_class: Some("kata"),
        published_priority_class: &published,
        node_selection_resolved: false,
        published_storage_class: &|class| class == "shared",
        published_default_storage_class: None,
    };
    violations(spec, Some(&annotations), &input)
}

/// What a pod usually carries: the apiserver's default tolerations, DaemonSet-style affinity on the
/// node's name, well-known node labels, runtime-default profiles, baseline capabilities.
#[test]
fn an_ordinary_pod_passes() {
    let pod = spec(json!({
        "containers": [{"name": "web", "ports": [{"containerPort": 80}],
            "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}}],
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
        ]}}},
        "schedulerName": "default-scheduler",
        "runtimeClassName": "kata",
        "priorityClassName": "tenant-high"
    }));
    let annotations = json!({"container.apparmor.security.beta.kubernetes.io/web": "runtime/default"});
    assert_eq!(
        check(&pod, annotations, &PodPolicy::default()),
        Vec::<String>::new()
    );
}

#[test]
fn every_escape_is_named() {
    let pod = spec(json!({
        "containers": [{"name": "web", "ports": [{"containerPort": 80, "hostPort": 80}],
            "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CAP_NET_RAW"]},
                "seccompProfile": {"type": "Unconfined"}}}],
        "initContainers": [{"name": "setup", "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "x"}}}],
        "ephemeralContainers": [{"name": "debug", "securityContext": {"privileged": true}}],
        "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
        "tolerations": [{"operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference":
            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}]}},
        "schedulerName": "my-scheduler",
        "runtimeClassName": "runc",
        "priorityClassName": "system-node-critical"
    }));
    let annotations = json!({"container.apparmor.security.beta.kubernetes.io/web": "unconfined"});
    let found = check(&pod, annotations, &PodPolicy::default());
    let expected = [
        "privileged ephemeral container \"debug\"",
        "hostPort 80 of container \"web\"",
        "pod seccompProfile Localhost",
        "seccompProfile of container \"web\" Unconfined",
        "appArmorProfile of init container \"setup\" Localhost",
        "annotation container.apparmor.security.beta.kubernetes.io/web Unconfined",
        "capability SYS_ADMIN of container \"web\"",
        "capability CAP_NET_RAW of container \"web\"",
        "priorityClassName \"system-node-critical\"",
        "schedulerName \"my-scheduler\"",
        "runtimeClassName \"runc\"",
        "toleration of every taint",
        "toleration of taint node-role.kubernetes.io/control-plane ",
        "nodeSelector node-role.kubernetes.io/control-plane=",
        "node affinity on label gpu Exists",
    ];
    for want in expected {
        assert!(
            found.iter().any(|f| f.starts_with(want)),
            "{want} not in {found:#?}"
        );
    }
    assert_eq!(found.len(), expected.len(), "{found:#?}");
}

#[test]
fn pod_policy_widens_within_what_the_platform_lets_it_grant() {
    let pod = spec(json!({
        "containers": [{"name": "web", "ports": [{"containerPort": 80, "hostPort": 8080}],
            "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}, "seccompProfile": {"type": "Unconfined"}}}],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "team-a", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "team-a"}
    }));
    let policy = PodPolicy {
        host_ports: true,
        capabilities: vec!["NET_ADMIN".into()],
        unconfined: true,
        allowed_taints: vec!["dedicated=team-a".into()],
        allowed_node_labels: vec!["pool=team-a".into()],
        ..Default::default()
    };
    assert_eq!(check(&pod, json!({}), &policy), Vec::<String>::new());
    // Another value than granted is still refused.
    let other = spec(
        json!({"containers": [{"name": "web"}], "nodeSelector": {"pool": "team-b"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
    );
    assert_eq!(check(&other, json!({}), &policy).len(), 2);
    // Keys the platform does not let VirtualClusters grant stay refused whatever podPolicy says.
    let control_plane = spec(json!({"containers": [{"name": "web"}],
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}));
    let greedy = PodPolicy {
        allowed_taints: vec!["node-role.kubernetes.io/control-plane".into()],
        allowed_node_labels: vec!["node-role.kubernetes.io/control-plane".into()],
        ..Default::default()
    };
    assert_eq!(check(&control_plane, json!({}), &greedy).len(), 2);
}

/// Volume types: the allow-list, CSI by driver, projected sources, hostPath left to host access.
#[test]
fn only_allowed_volume_types_pass() {
    let volumes = json!([
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}, {"configMap": {"name": "cfg"}}]}},
        {"name": "nfs", "nfs": {"server": "10.0.0.5", "path": "/exports/other-tenant"}},
        {"name": "iscsi", "iscsi": {"targetPortal": "10.0.0.6:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}},
        {"name": "rbd", "rbd": {"monitors": ["10.0.0.7:6789"], "image": "other"}},
        {"name": "ceph", "cephfs": {"monitors": ["10.0.0.7:6789"]}},
        {"name": "gluster", "glusterfs": {"endpoints": "gluster", "path": "vol"}},
        {"name": "fc", "fc": {"wwids": ["3600508b400105e210000900000490000"]}},
        {"name": "flex", "flexVolume": {"driver": "example.com/lvm"}},
        {"name": "repo", "gitRepo": {"repository": "https://example.com/x.git"}},
        {"name": "csi-ok", "csi": {"driver": "secrets-store.csi.k8s.io"}},
        {"name": "csi-no", "csi": {"driver": "ebs.csi.aws.com", "volumeAttributes": {"volumeID": "vol-1"}}},
        {"name": "bundle", "projected": {"sources": [{"clusterTrustBundle": {"signerName": "example.com/x", "path": "ca.pem"}}]}},
        {"name": "host", "hostPath": {"path": "/"}}
    ]);
    let pod = spec(json!({"containers": [{"name": "web"}], "volumes": volumes}));
    let platform = PlatformPodPolicy {
        allowed_csi_drivers: vec!["secrets-store.csi.k8s.io".into()],
        ..Default::default()
    };
    let input = PolicyInput {
        tenant: &PodPolicy::default(),
        platform: &platform,
        forced_runtime_class: None,
        published_priority_class: &|_| false,
        node_selection_resolved: false,
        published_storage_class: &|_| false,
        published_default_storage_class: None,
    };
    let found = violations(&pod, None, &input);
    let expected = [
        "hostPath volume \"host\"",
        "nfs volume \"nfs\" (the syncer's --pod-allowed-volume-types)",
        "iscsi volume \"iscsi\"",
        "rbd volume \"rbd\"",
        "cephfs volume \"ceph\"",
        "glusterfs volume \"gluster\"",
        "fc volume \"fc\"",
        "flexVolume volume \"flex\"",
        "gitRepo volume \"repo\"",
        "csi volume \"csi-no\" of driver \"ebs.csi.aws.com\" (the syncer's --pod-allowed-csi-drivers)",
        "clusterTrustBundle source of projected volume \"bundle\"",
    ];
    for want in expected {
        assert!(found.iter().any(|f| f.starts_with(want)), "{want} not in {found:#?}");
    }
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    // More types by the platform's flag; hostPath stays podPolicy's.
    let wider = PlatformPodPolicy {
        allowed_volume_types: vec!["nfs".into()],
        ..Default::default()
    };
    let nfs = spec(json!({"containers": [{"name": "web"}], "volumes": [
        {"name": "nfs", "nfs": {"server": "10.0.0.5", "path": "/x"}},
        {"name": "cfg", "configMap": {"name": "cfg"}}]}));
    let found = violations(&nfs, None, &PolicyInput { platform: &wider, ..input });
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("configMap volume \"cfg\""), "{found:#?}");
}

#[test]
fn host_network_allowed_brings_its_host_ports() {
    let pod = spec(json!({"hostNetwork": true,
        "containers": [{"name": "web", "ports": [{"containerPort": 80, "hostPort": 80}]}]}));
    let allowed = PodPolicy {
        host_network: true,
        ..Default::default()
    };
    assert_eq!(check(&pod, json!({}), &allowed), Vec::<String>::new());
    assert_eq!(check(&pod, json!({}), &PodPolicy::default()).len(), 2);
}

#[test]
fn an_ephemeral_container_is_judged_alone_as_a_pods_own_would_be() {
    let pod = spec(json!({
        "hostNetwork": true,
        "containers": [{"name": "web"}],
        "volumes": [{"name": "data", "emptyDir": {}}]
    }));
    let container = |value: serde_json::Value| -> EphemeralContainer {
        serde_json::from_value(value).expect("ephemeral container")
    };
    let platform = PlatformPodPolicy::default();
    let input = PolicyInput {
        tenant: &PodPolicy::default(),
        platform: &platform,
        forced_runtime_class: None,
        published_priority_class: &|_| false,
        node_selection_resolved: false,
        published_storage_class: &|_| false,
        published_default_storage_class: None,
    };
    let annotations: BTreeMap<String, String> = serde_json::from_value(json!({
        "container.apparmor.security.beta.kubernetes.io/web": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/dbg": "unconfined"
    }))
    .expect("annotations");
    // What `kubectl debug --target=web` writes: the pod's hostNetwork and the other container's
    // annotation were judged at creation and are not this container's.
    let debug = container(json!({"name": "debugger", "image": "busybox", "targetContainerName": "web",
        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}));
    assert_eq!(
        ephemeral_container_violations(&debug, &pod, Some(&annotations), &input),
        Vec::<String>::new()
    );
    let hostile = container(json!({"name": "dbg", "image": "busybox", "targetContainerName": "other",
        "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]}},
        "volumeMounts": [{"name": "host-root", "mountPath": "/host"}]}));
    let found = ephemeral_container_violations(&hostile, &pod, Some(&annotations), &input);
    let expected = [
        "privileged ephemeral container \"dbg\"",
        "annotation container.apparmor.security.beta.kubernetes.io/dbg Unconfined",
        "capability SYS_ADMIN of ephemeral container \"dbg\"",
        "volume \"host-root\" of ephemeral container \"dbg\"",
        "targetContainerName \"other\" of ephemeral container \"dbg\"",
    ];
    for want in expected {
        assert!(found.iter().any(|f| f.starts_with(want)), "{want} not in {found:#?}");
    }
    assert_eq!(found.len(), expected.len(), "{found:#?}");
}
