#!/usr/bin/env bash
# Runs the upstream Kubernetes conformance suite against a plain cluster and against a tenant of the same
# sandbox, and compares them: pass counts of each, and every test that passes on the plain cluster but not in
# the tenant, with its failure. It runs the suite; it does not build Kubernetes (see README.md here).
#
#   e2e/conformance/run.sh --e2e-test PATH --ginkgo PATH --agnhost PATH [--out DIR] [--procs N]
#                          [--focus REGEX] [--skip REGEX] [--only plain|tenant] [--tenant native|adopted]
#                          [--passed-in PLAIN.json] [--tenant-pod-policy open|default] [--nodes N]
#
# The plain cluster is the sandbox's super cluster (real etcd, kube-apiserver, controller-manager, scheduler
# and --nodes real nodes, 2 by default, each in its own network namespace: kubelet, containerd, kube-proxy);
# the tenant is a native tenant of it (its etcd, apiserver and controller-manager run as pods on those
# nodes; --tenant adopted: an apiserver process the sandbox starts and hands over) whose pods the syncer
# runs on those nodes. The platform is installed as it ships (helm install of the chart, every component a pod
# on those nodes). Both see the same nodes and images.
# --passed-in PLAIN.json: run the tenant alone on the tests that passed in that earlier plain run, and
# compare against it (the tests failing on the plain cluster take most of a full run's time).
# --tenant-pod-policy open (the default) lets the tenant's pods do what the plain cluster's may (privileged
# containers, hostPath, host namespaces and ports: spec.podPolicy of its VirtualCluster, and the Pod Security
# level `privileged` on its super namespaces, the syncer's --pod-security-enforce); default keeps the
# platform's defaults, under which the tests that need those are refused with PodPolicyViolation.
set -euo pipefail
cd "$(dirname "$0")/../.."

e2e_test="" ginkgo="" agnhost="" out="" procs=2 only="" tenant_kind=native passed_in="" pod_policy=open nodes=2
focus='\[Conformance\]'
skip='\[Disruptive\]|\[Flaky\]'
while [ $# -gt 0 ]; do
  case "$1" in
    --e2e-test) e2e_test="$2"; shift 2 ;;
    --ginkgo) ginkgo="$2"; shift 2 ;;
    --agnhost) agnhost="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --procs) procs="$2"; shift 2 ;;
    --focus) focus="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --tenant) tenant_kind="$2"; shift 2 ;;
    --passed-in) passed_in="$2"; shift 2 ;;
    --tenant-pod-policy) pod_policy="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for pair in "e2e-test:$e2e_test" "ginkgo:$ginkgo" "agnhost:$agnhost"; do
  name="${pair%%:*}" path="${pair#*:}"
  if [ -z "$path" ] || [ ! -x "$path" ]; then
    echo "run.sh: --$name must name an executable (got '${path}'); see e2e/conformance/README.md" >&2
    exit 2
  fi
done
case "$only" in ""|plain|tenant) ;; *) echo "run.sh: --only takes plain or tenant" >&2; exit 2 ;; esac
case "$nodes" in [1-9]) ;; *) echo "run.sh: --nodes takes 1 to 9 (the suite wants 2 for its multi-node tests)" >&2; exit 2 ;; esac
case "$pod_policy" in open|default) ;; *) echo "run.sh: --tenant-pod-policy takes open or default" >&2; exit 2 ;; esac
case "$tenant_kind" in
  native) tenant_args=(--tenants 0 --native conformance) ;;
  adopted) tenant_args=(--tenant conformance) ;;
  *) echo "run.sh: --tenant takes native or adopted" >&2; exit 2 ;;
esac
# A plain run needs no tenant: the sandbox starts none (and is up sooner).
[ "$only" = plain ] && tenant_args=(--tenants 0)
if [ -n "$passed_in" ]; then
  [ -s "$passed_in" ] || { echo "run.sh: --passed-in must name ginkgo's JSON report of a plain run" >&2; exit 2; }
  passed_in="$(realpath "$passed_in")"
  only=tenant
fi
e2e_test="$(realpath "$e2e_test")" ginkgo="$(realpath "$ginkgo")" agnhost="$(realpath "$agnhost")"
out="$(realpath -m "${out:-target/conformance/$(date -u +%Y%m%dT%H%M%SZ)}")"
mkdir -p "$out"
assets="${KUBEBUILDER_ASSETS:-/usr/local/kubebuilder/bin}"

target_dir="${CARGO_TARGET_DIR:-target}"
echo "==> building vc-sandbox and conformance_report"
cargo build --release -q -p local-cluster --bin vc-sandbox
cargo build --release -q -p e2e --bin conformance_report

if [ -n "$passed_in" ]; then
  focus="$("$target_dir/release/conformance_report" --focus-on-passed "$passed_in")"
  echo "==> the tenant runs only the tests that passed in $passed_in"
fi

echo "==> starting the sandbox (log: $out/sandbox.log)"
sandbox_args=()
[ "$pod_policy" = open ] && sandbox_args+=(--pod-security-enforce privileged)
"$target_dir/release/vc-sandbox" --nodes "$nodes" "${tenant_args[@]}" "${sandbox_args[@]}" --vnode-mode usable --dir "$out/sandbox" \
  --conformance-images "$e2e_test" --agnhost "$agnhost" >"$out/sandbox.log" 2>&1 &
sandbox_pid=$!
stop_sandbox() {
  if kill -0 "$sandbox_pid" 2>/dev/null; then
    kill -INT "$sandbox_pid" 2>/dev/null || true
    wait "$sandbox_pid" 2>/dev/null || true
  fi
}
trap stop_sandbox EXIT
for _ in $(seq 1 1800); do
  # "virtualcluster-rs is up" (the Helm-installed platform on real nodes) or "... sandbox is up" (in process).
  grep -q " is up (" "$out/sandbox.log" && break
  if ! kill -0 "$sandbox_pid" 2>/dev/null; then
    echo "run.sh: the sandbox stopped before it was up:" >&2
    tail -20 "$out/sandbox.log" >&2
    exit 1
  fi
  sleep 1
done
grep -q " is up (" "$out/sandbox.log" || { echo "run.sh: the sandbox was not up in 1800 s" >&2; exit 1; }
grep "not serving" "$out/sandbox.log" || true
if [ "$pod_policy" = open ] && [ "$only" != plain ]; then
  echo "==> the tenant's pods may do what the plain cluster's may (spec.podPolicy)"
  "$assets/kubectl" --kubeconfig "$out/sandbox/super.kubeconfig" -n default patch virtualcluster conformance \
    --type merge -p '{"spec":{"podPolicy":{"privileged":true,"hostPath":true,"hostNetwork":true,"hostPID":true,"hostIPC":true,"hostPorts":true,"unconfined":true}}}'
fi

run_suite() { # name kubeconfig
  local name="$1" kubeconfig="$2"
  echo "==> conformance against the $name ($procs processes; log: $out/$name.log)"
  local started=$SECONDS
  # The suite's own exit status is its failures, which the report counts.
  # An absolute report path and no --output-dir: with one, a second run in the same folder writes its
  # report under a suite-prefixed name instead.
  "$ginkgo" --procs="$procs" --timeout=24h --json-report="$out/$name.json" \
    --focus="$focus" --skip="$skip" --no-color "$e2e_test" -- \
    --kubeconfig="$kubeconfig" --provider=skeleton --kubectl-path="$assets/kubectl" \
    --report-dir="$out/$name" --disable-log-dump >"$out/$name.log" 2>&1 || true
  echo "    $name: $(( SECONDS - started )) s"
  # An empty list or none at all: the suite did not run (a report of a run lists thousands of specs).
  if [ ! -s "$out/$name.json" ] || [ "$(wc -c <"$out/$name.json")" -lt 100 ]; then
    echo "run.sh: ginkgo wrote no report of the $name run ($out/$name.json); see $out/$name.log" >&2
    exit 1
  fi
}
[ "$only" = tenant ] || run_suite plain "$out/sandbox/super.kubeconfig"
if [ "$only" != plain ]; then
  # The RuntimeClass tests create a class with handler `test-handler` and check that a pod of it is
  # scheduled; a tenant's own class runs as the published class with its handler, so the platform
  # publishes one (no runtime has that handler here: on either cluster those pods never start).
  echo "==> publishing a RuntimeClass with the handler the RuntimeClass tests name"
  "$assets/kubectl" --kubeconfig "$out/sandbox/super.kubeconfig" apply -f - <<'YAML'
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: conformance-test-handler
  labels:
    tenancy.x-k8s.io/super.public: "true"
handler: test-handler
YAML
  run_suite tenant "$out/sandbox/conformance.kubeconfig"
fi

if [ -z "$only" ] || [ -n "$passed_in" ]; then
  plain_report="${passed_in:-$out/plain.json}"
  echo "==> comparison (also in $out/report.txt)"
  "$target_dir/release/conformance_report" "$plain_report" "$out/tenant.json" | tee "$out/report.txt"
fi
