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
// The tests are in *_integration_test.go, one file per theme. What more than one file uses
// lives in helpers_*_test.go: the environment and its starters (helpers_env_test.go), pods and
// containers as tests write them (helpers_pods_test.go), waiting for what the agent reports
// (helpers_wait_test.go), looking into the runtime beside the agent (helpers_runtime_test.go),
// and the agent's own endpoints, metrics and state (helpers_agent_test.go). A helper only one
// test file uses stays in that file.
//
// Under go test -short every test skips (testenv.RequireIntegration); otherwise a missing
// prerequisite fails the test.
package integration
