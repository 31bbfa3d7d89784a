// Package fleet measures what a fleet of nodes costs one control plane: N hollow holdfast
// nodes (`holdfast hollow`, agent/runtime/hollow: real apiserver clients, containers simulated in
// memory), then N hollow kubelets (upstream kubemark, hack/build-kubemark.sh) as the anchor,
// each against a control plane of its own (test/testenv: etcd and kube-apiserver), with
// the same pods bound to every node. Over a steady window it reads the apiserver's and etcd's
// CPU and memory from /proc and the apiserver's request counts (apiserver_request_total) by
// verb and resource. `make fleet` runs it at 100 nodes; docs/fleet.md holds the dated run and
// the extrapolation to 10,000 gateways.
//
// What is fair: both agents get the same node identities (a token each, user
// system:node:NAME, Node authorization and NodeRestriction), their own defaults for heartbeats
// (Lease renewed every 10 s, node status every 10 s, reported every 5 min: the same for both),
// the same pods (bound by spec.nodeName, no scheduler), and a control plane that served
// nothing before. The control plane's own load with no node is measured first (Idle) and
// reported beside, so that the per-node figures are the fleet's alone.
package fleet
