// Package bench measures holdfast side by side with the upstream kubelet on one machine: same
// kube-apiserver, same containerd build and configuration (a fresh daemon for each agent, so
// each starts from a clean state), same CNI bridge configuration, same pod specs. `make bench`
// runs it (see docs/benchmarks.md for what each figure means and a dated run).
//
// Three agents, each on a node of its own: holdfast on its containerd backend (Holdfast:
// containerd's client in namespace holdfast, its own CNI and container logger), the same
// holdfast binary on its CRI backend (HoldfastCRI, "holdfast-cri": containerd's CRI plugin in
// namespace k8s.io, a pause sandbox per pod with the plugin's CNI, logs written by the
// runtime; Options.HoldfastCRI, -bench.cri=false leaves it out), and the kubelet (through
// the same CRI plugin). The report has a column for each and the ratios holdfast/kubelet and
// holdfast-cri/kubelet.
//
// For each agent, one after the other:
//
//  1. floor: a busybox container created and started directly with the containerd client, no
//     agent and no API, several times; min, p50, p99;
//  2. pod startup latency: pods created one after the other, each timed from the Create call
//     to the moment an informer (a watch) sees it Running with condition Ready; min, p50, p99;
//     the uplink meanwhile is the churn: bytes and requests per pod created, started, deleted;
//  3. burst: N pods created at once, wall time until all are seen Running and Ready;
//  4. steady state with those N pods: the agent's RSS, CPU and bytes written to disk (from
//     /proc), and the same for everything the node runs on the agent's behalf (containerd,
//     shims, holdfast's container loggers, the CRI plugin's pause sandboxes of the kubelet and
//     holdfast-cri); and the uplink: bytes each way between the agent and the apiserver,
//     counted by a TCP relay the agent's kubeconfig points at (TLS included), and the agent's
//     requests by verb and resource, from the apiserver's audit log (uplink.go);
//  5. flash wear (flash.go), with the N pods running: one more pod, whose readiness
//     flips every 10 s (its container creates and removes a file an exec readiness probe reads
//     every second), first holds still, Ready, for a window of 60 s with no status change,
//     then flips for a window of 60 s. In each window: the agent's sync calls (fsync,
//     fdatasync, sync_file_range, syncfs, sync, msync MS_SYNC) and the files its sync and
//     write calls went to (strace -f -y attached to it for the window), the bytes it wrote to
//     storage (/proc/PID/io write_bytes), its own log's growth, containerd's and its helpers'
//     write_bytes, its pod status writes (the audit log); and the status changes, the
//     flipping pod's Ready transitions as a watch on the apiserver saw them. The report gives
//     the rates with no status change, and per status change, raw and less the steady rate
//     (issue #28's "done when" 5). -bench.only=flash runs this phase alone, after 10 pods
//     created at once (`make bench BENCH_FLAGS=-bench.only=flash`).
//  6. agent restart: kill -9 with the N pods running; while it is down the harness does what
//     the node lifecycle controller does to a silent node (Node conditions Unknown, pods'
//     Ready False); the agent is started again and timed until the Node is Ready and every pod
//     Ready again in the API; containers restarted are counted in containerd (expected 0);
//  7. holdfast only (both backends): offline boot. apiserver stopped, agent killed, containerd
//     "rebooted" (every task gone), agent started: time until it reports all N cached pods
//     running; the boot floor (the stored containers restarted by a minimal loop through the
//     containerd client) for the containerd backend only.
//
// The floors (1, the network floor, the burst floor of 3) are measured again for each agent;
// the burst floor with holdfast's container logger only for holdfast's containerd backend (on
// the CRI backend the runtime writes the logs). Where holdfast's pod starts went, its start
// trace (its /metrics), is read on both backends.
//
// Then the Wasm figures of `go test -bench . ./wasm/`, when that package exists, with OPA's own
// evaluators beside them; their policy figures are written to docs/policies.md and the README
// (policies.go). TestPolicyFigures (`make bench-policies`) runs and writes those alone.
//
// The harness is a Go test (Run takes a *testing.T) because it stands on test/testenv.
// bench_test.go holds TestSideBySide, the full run, which runs only with -bench.side-by-side,
// and TestHarnessSmoke, a small run in the normal test suite that keeps the harness from
// rotting: it asserts no timing, measures holdfast on its containerd backend only (holdfast-cri
// too with HOLDFAST_BENCH_SMOKE_CRI=1), and leaves the kubelet out when its binary has not been
// built (hack/build-kubelet.sh).
package bench
