// Package integration is holdfast's integration suite: the real holdfast binary, built by the
// test (test/testenv), runs as the node gw-test against a real kube-apiserver and etcd, a
// private containerd with runc, and a CNI bridge, and each test drives it as users and faults
// would (pods through the apiserver or static manifests, agent and containerd kills, reboots,
// a link cut, hostile pods and policies) and checks what it reports and what runs.
//
// Every test starts its agent through startEnv (or startEnvOn, startEnvFor), which picks the
// runtime backend from HOLDFAST_TEST_RUNTIME (testenv.RuntimeUnderTest): the same tests run
// on the containerd backend and, with HOLDFAST_TEST_RUNTIME=cri, on the CRI one (make test
// runs CRI_SLICE of them there; make test-cri all of them).
//
// The tests are in *_integration_test.go, one file per theme.
//
// Under go test -short every test skips (testenv.RequireIntegration); otherwise a missing
// prerequisite fails the test.
package integration
