// Package conformance runs Kubernetes' own end-to-end node tests (the e2e.test binary of the
// release holdfast follows) against holdfast as the only node of a real cluster, and against
// the upstream kubelet through the same harness as the anchor. Each failure's cause is read
// from its message (causes.go), whichever agent failed it: a failure both share is not the
// environment's by rule, and the message says whose it is.
//
// The cluster is built from the project's cache (hack/build-tools.sh,
// hack/build-conformance-tools.sh, hack/build-kubelet.sh): etcd and kube-apiserver
// (test/testenv), kube-controller-manager and kube-scheduler with identities of their own
// (client certificates of a CA made per run), a private containerd and CNI network, and a
// distribution registry on loopback holding every image the selected tests run, built here
// (agnhost and nnp from the Kubernetes module, busybox from the host's busybox-static) and
// pushed over HTTP: the suite is pointed at it with KUBE_TEST_REPO_LIST, so every image in the
// suite is a real pull.
//
// `make conformance` runs the whole selection for both agents and writes docs/conformance.md
// (TestConformance, gated by -conformance.full). The selection is computed from the suite's
// own listing (e2e.test --list-tests, suite.go), its exclusions with their counts. A run with
// another -conformance.focus keeps its page and results in docs/conformance-runs/, which the
// whole selection's page cites for a test it failed that passed there later.
package conformance
