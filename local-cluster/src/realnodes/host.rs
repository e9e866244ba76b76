//! What real nodes change on the host, and how it is all undone: bridges, forwarding, iptables rules,
//! mounts, containers and processes.
//!
//! Every node has a network namespace of its own (`vc-e2e-node<N>`), as a machine of its own would: its
//! address `10.243.0.<N+10>` on `eth0`, one end of a veth pair whose other end hangs on the host's bridge
//! `vcbr-host` (`10.243.0.1/24`, the host's address towards the nodes, where the apiservers, the image
//! registry and the super cluster's DNS answer), its own iptables (its own kube-proxy), its own ports (a
//! host-network pod binds them on that node alone) and its pod bridge `cni0` (`10.244.<N>.1/24`). The host
//! routes each node's pod subnet to the node, and the super cluster's service range to node 0, whose
//! kube-proxy masquerades what comes from outside the pod range, so that the test process and the
//! apiservers reach pods, nodes and cluster IPs as a machine on the nodes' network would. Nothing of the
//! nodes' traffic may leave the machine: a FORWARD rule rejects anything from the bridge to any other
//! interface.
//!
//! Teardown never relies on the processes' goodwill: containers are killed and deleted through runc's state,
//! shims and daemons by their command lines, mounts below the harness's folders detached, and rules found
//! by their comments. The same sweep runs before every start, so a run killed half-way leaves nothing that
//! outlives the next start.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{Error, Result};

/// Prefix of the bridges' names (at most 15 characters in all).
pub const BRIDGE_PREFIX: &str = "vcbr";
/// The host's bridge, which every node's veth joins.
pub const HOST_BRIDGE: &str = "vcbr-host";
/// The host's address on [`HOST_BRIDGE`]: what nodes and pods reach the apiservers and the registry at.
pub const HOST_IP: &str = "10.243.0.1";
/// The host's second address on [`HOST_BRIDGE`], the super cluster's DNS server's alone (the endpoint of
/// `kube-system/kube-dns`), as a DNS pod has an address of its own: a NetworkPolicy that keeps pods from
/// the DNS leaves the apiservers on [`HOST_IP`] reachable.
pub const HOST_DNS_IP: &str = "10.243.0.2";
/// Prefix of the nodes' network namespaces (`ip netns`).
pub const NETNS_PREFIX: &str = "vc-e2e-node";
/// Prefix of the host ends of the nodes' veth pairs.
const VETH_PREFIX: &str = "vcv";
/// The pod bridge inside each node's network namespace.
pub const POD_BRIDGE: &str = "cni0";
/// Name of the CNI network, found in the comments of the rules the CNI plugins add.
pub const CNI_NETWORK: &str = "vc-e2e";
/// Comment on the harness's own iptables rules.
const GUARD_COMMENT: &str = "vc-e2e: pod traffic stays on this machine";
/// Pod addresses: node N has `10.244.N.0/24`.
pub const POD_CIDR: &str = "10.244.0.0/16";
/// Marker in the folder names of real nodes (`vc-e2e-<pid>-realnode-...`), for the sweep.
pub const FOLDER_MARK: &str = "-realnode-";

/// The address of node `index` (its InternalIP, on its `eth0`).
pub fn node_ip(index: usize) -> String {
    format!("10.243.0.{}", index + 10)
}

/// The gateway of node `index`'s pods (on its pod bridge).
pub fn pod_gateway(index: usize) -> String {
    format!("10.244.{index}.1")
}

/// The network namespace of node `index`.
pub fn netns(index: usize) -> String {
    format!("{NETNS_PREFIX}{index}")
}

/// Where `ip netns` keeps node `index`'s network namespace, for `nsenter --net=`.
pub fn netns_path(index: usize) -> PathBuf {
    PathBuf::from("/run/netns").join(netns(index))
}

/// The pod subnet of node `index`.
pub fn node_subnet(index: usize) -> String {
    format!("10.244.{index}.0/24")
}

/// Runs a command and fails with its stderr when it fails.
pub fn run(context: &str, program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(Error::io(format!("{context}: starting {program}")))?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(Error::Command {
        context: context.to_owned(),
        command: format!("{program} {}", args.join(" ")),
        status: output.status.to_string(),
        stderr: stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | "),
    })
}

/// Runs a cleanup command; failures are only logged (the thing may already be gone).
fn run_quiet(program: &str, args: &[&str]) {
    if let Err(error) = run("cleanup", program, args) {
        tracing::debug!(%error, "real-node cleanup step");
    }
}

/// Finds a host tool in `PATH` and the usual system folders.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for extra in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        dirs.push(PathBuf::from(extra));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn tool(name: &str) -> String {
    find_tool(name)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| name.to_owned())
}

/// Creates the host's bridge with [`HOST_IP`], replacing a leftover one.
pub fn create_host_bridge() -> Result<()> {
    let ip = tool("ip");
    run_quiet(&ip, &["link", "delete", HOST_BRIDGE]);
    run(
        "creating the host bridge",
        &ip,
        &["link", "add", HOST_BRIDGE, "type", "bridge"],
    )?;
    for address in [HOST_IP, HOST_DNS_IP] {
        run(
            "addressing the host bridge",
            &ip,
            &["addr", "add", &format!("{address}/24"), "dev", HOST_BRIDGE],
        )?;
    }
    run(
        "bringing the host bridge up",
        &ip,
        &["link", "set", HOST_BRIDGE, "up"],
    )?;
    Ok(())
}

/// Creates node `index`'s network namespace: `lo`, `eth0` on the host bridge with [`node_ip`], a default
/// route through the host, forwarding on (its pods' traffic passes through it), and the host's route to its
/// pod subnet. A leftover namespace of the same name is replaced.
pub fn create_node_network(index: usize) -> Result<()> {
    let ip = tool("ip");
    let namespace = netns(index);
    let veth = format!("{VETH_PREFIX}{index}");
    run_quiet(&ip, &["netns", "delete", &namespace]);
    run_quiet(&ip, &["link", "delete", &veth]);
    let context = format!("the network of node {index}");
    run(&context, &ip, &["netns", "add", &namespace])?;
    run(
        &context,
        &ip,
        &[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &namespace,
        ],
    )?;
    run(
        &context,
        &ip,
        &["link", "set", &veth, "master", HOST_BRIDGE, "up"],
    )?;
    let inside = |args: &[&str]| {
        let mut all = vec!["-n", namespace.as_str()];
        all.extend_from_slice(args);
        run(&context, &ip, &all).map(|_| ())
    };
    inside(&["link", "set", "lo", "up"])?;
    inside(&["addr", "add", &format!("{}/24", node_ip(index)), "dev", "eth0"])?;
    inside(&["link", "set", "eth0", "up"])?;
    inside(&["route", "add", "default", "via", HOST_IP])?;
    // Sysctls of the network namespace: written from a process inside it.
    run(
        &context,
        &tool("nsenter"),
        &[
            &format!("--net={}", netns_path(index).display()),
            "--",
            "/bin/sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward && \
             { [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables; }",
        ],
    )?;
    run(
        &context,
        &ip,
        &["route", "replace", &node_subnet(index), "via", &node_ip(index)],
    )?;
    Ok(())
}

/// Routes `cidr` (the super cluster's service range) from the host to node `index`, whose kube-proxy
/// answers for cluster IPs.
pub fn route_services(cidr: &str, index: usize) -> Result<()> {
    run(
        "routing the service range to a node",
        &tool("ip"),
        &["route", "replace", cidr, "via", &node_ip(index)],
    )
    .map(|_| ())
}

/// What the host had before real nodes changed it, to put back.
#[derive(Debug)]
pub struct HostState;

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// Where the host's own `ip_forward` value is kept while real nodes run, so that a sweep after a killed
/// run still knows what to put back.
fn saved_ip_forward() -> PathBuf {
    std::env::temp_dir().join("vc-e2e-realnodes.ip_forward")
}

/// Turns forwarding on (pods on different bridges reach each other through the host) and adds the rule
/// that keeps pod traffic on this machine.
pub fn prepare() -> Result<HostState> {
    let ip_forward = std::fs::read_to_string(IP_FORWARD)
        .map_err(Error::io("reading net.ipv4.ip_forward"))?
        .trim()
        .to_owned();
    if !saved_ip_forward().exists() {
        std::fs::write(saved_ip_forward(), &ip_forward).map_err(Error::io("saving net.ipv4.ip_forward"))?;
    }
    std::fs::write(IP_FORWARD, "1").map_err(Error::io("turning net.ipv4.ip_forward on"))?;
    let iptables = tool("iptables");
    run(
        "adding the rule that keeps pod traffic on this machine",
        &iptables,
        &[
            "-w",
            "-I",
            "FORWARD",
            "1",
            "-i",
            &format!("{BRIDGE_PREFIX}+"),
            "!",
            "-o",
            &format!("{BRIDGE_PREFIX}+"),
            "-m",
            "comment",
            "--comment",
            GUARD_COMMENT,
            "-j",
            "REJECT",
        ],
    )?;
    Ok(HostState)
}

/// Puts back what [`prepare`] changed.
pub fn restore(_state: &HostState) {
    remove_guard_rules();
    restore_ip_forward();
}

fn restore_ip_forward() {
    let Ok(saved) = std::fs::read_to_string(saved_ip_forward()) else {
        return;
    };
    match std::fs::write(IP_FORWARD, saved.trim()) {
        Ok(()) => {
            let _ = std::fs::remove_file(saved_ip_forward());
        }
        Err(error) => tracing::warn!(%error, "restoring net.ipv4.ip_forward"),
    }
}

fn remove_guard_rules() {
    remove_rules_where(|rule| rule.contains(GUARD_COMMENT));
}

/// Deletes every iptables rule (in every table) for which `matches` holds, and the chains those rules jump
/// to when nothing else refers to them.
fn remove_rules_where(matches: impl Fn(&str) -> bool) {
    let iptables = tool("iptables");
    for table in ["filter", "nat", "mangle"] {
        let Ok(rules) = run("listing iptables rules", &iptables, &["-w", "-t", table, "-S"]) else {
            continue;
        };
        let mut chains = Vec::new();
        for rule in rules.lines().filter(|r| r.starts_with("-A ") && matches(r)) {
            if let Some(target) = jump_target(rule) {
                chains.push(target);
            }
            let mut args = vec!["-w".to_owned(), "-t".to_owned(), table.to_owned()];
            args.extend(split_rule(&rule.replacen("-A ", "-D ", 1)));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_quiet(&iptables, &args);
        }
        for chain in chains.iter().filter(|c| c.starts_with("CNI-")) {
            run_quiet(&iptables, &["-w", "-t", table, "-F", chain]);
            run_quiet(&iptables, &["-w", "-t", table, "-X", chain]);
        }
    }
}

/// Deletes every `KUBE-*` chain of iptables and ip6tables, and the rules that jump to them.
fn remove_kube_chains() {
    for program in ["iptables", "ip6tables"] {
        let program = tool(program);
        for table in ["filter", "nat", "mangle"] {
            let Ok(rules) = run("listing iptables rules", &program, &["-w", "-t", table, "-S"]) else {
                continue;
            };
            let chains: Vec<&str> = rules
                .lines()
                .filter_map(|r| r.strip_prefix("-N "))
                .filter(|c| c.starts_with("KUBE-"))
                .collect();
            for rule in rules.lines().filter(|r| r.starts_with("-A ")) {
                let words = split_rule(rule);
                let from_builtin = words.get(1).is_some_and(|c| !c.starts_with("KUBE-"));
                if from_builtin && jump_target(rule).is_some_and(|t| t.starts_with("KUBE-")) {
                    let mut args = vec!["-w".to_owned(), "-t".to_owned(), table.to_owned()];
                    args.extend(split_rule(&rule.replacen("-A ", "-D ", 1)));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    run_quiet(&program, &args);
                }
            }
            for chain in &chains {
                run_quiet(&program, &["-w", "-t", table, "-F", chain]);
            }
            for chain in &chains {
                run_quiet(&program, &["-w", "-t", table, "-X", chain]);
            }
        }
    }
}

fn jump_target(rule: &str) -> Option<String> {
    let words = split_rule(rule);
    words
        .iter()
        .position(|w| w == "-j")
        .and_then(|i| words.get(i + 1).cloned())
}

/// Splits an `iptables -S` line into words, keeping quoted comments whole.
fn split_rule(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut chars = rule.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Everything real nodes may have left: containers (through runc's state below `folders`), shims and
/// daemons started for them, mounts below them, the CNI plugins' and kube-proxy's rules, the bridges and
/// the hostpath provisioner's volumes.
pub fn sweep(folders: &[PathBuf], kube_proxy: Option<&Path>) {
    for folder in folders {
        kill_containers(folder);
    }
    kill_processes_referring_to(folders);
    for folder in folders {
        unmount_below(folder);
    }
    if let Some(kube_proxy) = kube_proxy {
        // kube-proxy removes its own chains in every mode it knows...
        run_quiet(&kube_proxy.display().to_string(), &["--cleanup"]);
    }
    // ...but not the ones it shares with kubelets (KUBE-FIREWALL, the canaries). No other Kubernetes node
    // runs on a machine that runs real nodes (they hold the machine's lock and own its KUBE-* chains).
    remove_kube_chains();
    remove_rules_where(|rule| rule.contains(&format!("name: \\\"{CNI_NETWORK}\\\"")));
    remove_guard_rules();
    restore_ip_forward();
    delete_node_networks();
    delete_bridges();
    // The hostpath provisioner of the controller-manager keeps volumes in this fixed folder.
    let _ = std::fs::remove_dir_all("/tmp/hostpath_pv");
    // Folders of earlier runs: nothing is mounted below them any more. This run's own are removed by
    // their owners.
    for folder in folders.iter().filter(|f| !is_own(f)) {
        let _ = std::fs::remove_dir_all(folder);
    }
}

fn is_own(folder: &Path) -> bool {
    folder
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(&format!("vc-e2e-{}-", std::process::id())))
}

/// Kills and deletes every container whose runc state lies below `folder`.
fn kill_containers(folder: &Path) {
    let runc = tool("runc");
    for root in runc_roots(folder) {
        let root = root.display().to_string();
        let Ok(list) = run("listing containers", &runc, &["--root", &root, "list", "-q"]) else {
            continue;
        };
        for id in list.lines().filter(|l| !l.trim().is_empty()) {
            run_quiet(&runc, &["--root", &root, "delete", "--force", id.trim()]);
        }
    }
}

/// runc state folders: `<folder>/**/runc/<namespace>`.
fn runc_roots(folder: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let mut stack = vec![folder.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { continue };
            if !kind.is_dir() {
                continue;
            }
            if entry.file_name() == "runc" {
                if let Ok(namespaces) = std::fs::read_dir(&path) {
                    roots.extend(namespaces.flatten().map(|n| n.path()));
                }
            } else if path.components().count() < folder.components().count() + 3 {
                stack.push(path);
            }
        }
    }
    roots
}

/// Kills processes whose command line names one of `folders` (containerd shims, kubelets, containerd,
/// dnsmasq, kube-proxy), other than this process.
fn kill_processes_referring_to(folders: &[PathBuf]) {
    if folders.is_empty() {
        return;
    }
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let needles: Vec<String> = folders.iter().map(|f| f.display().to_string()).collect();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if needles.iter().any(|n| cmdline.contains(n.as_str())) {
            run_quiet("kill", &["-KILL", &pid.to_string()]);
        }
    }
}

/// Detaches every mount below `folder`, deepest first, so that removing the folder never reaches through a
/// mount into something else.
pub fn unmount_below(folder: &Path) {
    let prefix = folder.display().to_string();
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    for point in points {
        run_quiet(&tool("umount"), &["-l", &point]);
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(path: &str) -> String {
    let mut out = String::new();
    let bytes = path.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(code) = u8::from_str_radix(&path[i + 1..i + 4], 8)
        {
            out.push(code as char);
            i += 4;
            continue;
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

/// The nodes' network namespaces that exist (of this run or an earlier one).
fn node_networks() -> Vec<String> {
    let Ok(list) = run("listing network namespaces", &tool("ip"), &["netns", "list"]) else {
        return Vec::new();
    };
    list.lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(NETNS_PREFIX))
        .map(str::to_owned)
        .collect()
}

/// Kills what still runs in the nodes' network namespaces and deletes them, with everything inside (their
/// interfaces, routes and iptables rules); the host ends of their veths go with them.
fn delete_node_networks() {
    let ip = tool("ip");
    for namespace in node_networks() {
        if let Ok(pids) = run(
            "listing a namespace's processes",
            &ip,
            &["netns", "pids", &namespace],
        ) {
            for pid in pids.split_whitespace() {
                run_quiet("kill", &["-KILL", pid]);
            }
        }
        run_quiet(&ip, &["netns", "delete", &namespace]);
    }
    if let Ok(links) = run("listing links", &ip, &["-o", "link", "show", "type", "veth"]) {
        for name in links.lines().filter_map(|l| l.split(':').nth(1).map(str::trim)) {
            let name = name.split('@').next().unwrap_or(name);
            if name.starts_with(VETH_PREFIX) {
                run_quiet(&ip, &["link", "delete", name]);
            }
        }
    }
}

fn delete_bridges() {
    let ip = tool("ip");
    let Ok(links) = run("listing links", &ip, &["-o", "link", "show", "type", "bridge"]) else {
        return;
    };
    for line in links.lines() {
        let Some(name) = line.split(':').nth(1).map(str::trim) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        if name.starts_with(BRIDGE_PREFIX) {
            run_quiet(&ip, &["link", "delete", name]);
        }
    }
}

/// What real nodes left on the host, described one item a line (empty after a clean teardown): bridges,
/// mounts and processes of `folders`, the folders themselves, and rules of the CNI network or the guard.
pub fn leftovers(folders: &[PathBuf]) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(links) = run(
        "listing links",
        &tool("ip"),
        &["-o", "link", "show", "type", "bridge"],
    ) {
        found.extend(
            links
                .lines()
                .filter_map(|l| l.split(':').nth(1).map(str::trim))
                .filter(|n| n.starts_with(BRIDGE_PREFIX))
                .map(|n| format!("bridge {n}")),
        );
    }
    found.extend(
        node_networks()
            .into_iter()
            .map(|namespace| format!("network namespace {namespace}")),
    );
    if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
        for point in mountinfo.lines().filter_map(|l| l.split(' ').nth(4)) {
            if folders
                .iter()
                .any(|f| point.starts_with(&f.display().to_string()))
            {
                found.push(format!("mount {point}"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if folders.iter().any(|f| cmdline.contains(&f.display().to_string())) {
                found.push(format!(
                    "process {}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    found.extend(
        folders
            .iter()
            .filter(|f| f.exists())
            .map(|f| format!("folder {}", f.display())),
    );
    for program in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            if let Ok(rules) = run(
                "listing iptables rules",
                &tool(program),
                &["-w", "-t", table, "-S"],
            ) {
                found.extend(
                    rules
                        .lines()
                        .filter(|r| {
                            r.contains(GUARD_COMMENT)
                                || r.contains("KUBE-")
                                || r.contains(&format!("name: \\\"{CNI_NETWORK}\\\""))
                        })
                        .map(|r| format!("{program} -t {table}: {r}")),
                );
            }
        }
    }
    if saved_ip_forward().exists() {
        found.push("net.ipv4.ip_forward not restored".to_owned());
    }
    found
}

/// Real-node folders of processes that are gone (`vc-e2e-<pid>-realnode-...` in the temporary folder).
pub fn stale_folders() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_owned();
            let rest = name.strip_prefix("vc-e2e-")?;
            if !rest.contains(FOLDER_MARK.trim_start_matches('-')) {
                return None;
            }
            let pid: u32 = rest.split('-').next()?.parse().ok()?;
            let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
            (!alive).then(|| entry.path())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_split_with_quoted_comments() {
        let rule = r#"-A POSTROUTING -s 10.244.0.5/32 -m comment --comment "name: \"vc-e2e\" id: \"abc\"" -j CNI-1234"#;
        let words = split_rule(rule);
        assert_eq!(words[0], "-A");
        assert!(words.contains(&r#"name: "vc-e2e" id: "abc""#.to_owned()));
        assert_eq!(jump_target(rule).as_deref(), Some("CNI-1234"));
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_path("/tmp/plain"), "/tmp/plain");
    }

    #[test]
    fn node_addresses() {
        assert_eq!(node_ip(2), "10.243.0.12");
        assert_eq!(pod_gateway(2), "10.244.2.1");
        assert_eq!(node_subnet(0), "10.244.0.0/24");
        assert!(HOST_BRIDGE.len() <= 15 && POD_BRIDGE.len() <= 15);
        assert!(format!("{VETH_PREFIX}199").len() <= 15);
        assert_eq!(netns_path(3), PathBuf::from("/run/netns/vc-e2e-node3"));
    }
}
