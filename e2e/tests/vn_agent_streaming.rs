//! The simulated kubelet's streaming endpoints, with real kubectl through a real apiserver and no vn-agent
//! in between: the baseline the vn-agent tests compare against.

use std::time::Duration;

use crate::kubectl_support::Kubectl;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::{Api, api::PostParams};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, NodeSimulator, NodeSimulatorOptions, nodes::wait_pods_running,
};

#[tokio::test]
async fn simulated_kubelet_streams_exec_attach_and_port_forward_to_kubectl() -> anyhow::Result<()> {
    if !local_cluster::require(
        "simulated_kubelet_streams_exec_attach_and_port_forward_to_kubectl",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::Kubectl],
    ) {
        return Ok(());
    }
    let cluster = ControlPlane::start(ControlPlaneOptions::bare("streaming")).await?;
    let client = cluster.client();
    let simulator = NodeSimulator::start(
        &cluster,
        NodeSimulatorOptions {
            node_count: 1,
            ..Default::default()
        },
    )
    .await?;
    simulator.wait_ready(&client).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "shell"}}))?,
        )
        .await?;
    // No controller-manager here: the default service account is made by hand.
    Api::<ServiceAccount>::namespaced(client.clone(), "shell")
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))?,
        )
        .await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "box"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    }))?;
    Api::<Pod>::namespaced(client.clone(), "shell")
        .create(&PostParams::default(), &pod)
        .await?;
    wait_pods_running(&client, "shell", 1, Duration::from_secs(60)).await?;

    let kubectl = Kubectl::new(cluster.apiserver().kubeconfig_path())?;
    let exec = |extra: &'static [&'static str]| {
        let mut args = vec!["-n", "shell", "exec", "box", "-c", "main"];
        args.extend_from_slice(extra);
        args
    };

    let out = kubectl
        .run(&exec(&["--", "echo", "hello", "world"]), None)
        .await?
        .ok()?;
    assert_eq!(out.stdout, "hello world\n");

    let out = kubectl
        .run(&exec(&["-i", "--", "cat"]), Some(b"line one\nline two\n"))
        .await?
        .ok()?;
    assert_eq!(out.stdout, "line one\nline two\n");

    let out = kubectl
        .run(&exec(&["--", "stderr", "to", "stderr"]), None)
        .await?
        .ok()?;
    assert_eq!((out.stdout.as_str(), out.stderr.as_str()), ("", "to stderr\n"));

    let out = kubectl.run(&exec(&["--", "exit", "3"]), None).await?;
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(
        out.stderr.contains("command terminated with exit code 3"),
        "{out:?}"
    );

    let out = kubectl
        .run_in_terminal(&exec(&["-ti", "--", "tty"]))
        .await?
        .ok()?;
    assert!(out.stdout.contains("tty=true size=80x24"), "{out:?}");
    let out = kubectl.run(&exec(&["--", "tty"]), None).await?.ok()?;
    assert_eq!(out.stdout, "tty=false size=none\n");

    let out = kubectl
        .run(
            &["-n", "shell", "attach", "-i", "box", "-c", "main"],
            Some(b"attached input\n"),
        )
        .await?
        .ok()?;
    assert!(
        out.stdout
            .contains("attached to shell/box/main\nattached input\n"),
        "{out:?}"
    );

    let forward = kubectl.port_forward(&["-n", "shell", "pod/box"], 8080).await?;
    for round in 0..2 {
        let payload = format!("round {round}");
        let received = forward.exchange(payload.as_bytes()).await?;
        assert_eq!(
            String::from_utf8_lossy(&received),
            format!("shell/box:8080\n{payload}")
        );
    }
    Ok(())
}
