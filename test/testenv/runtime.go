package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/holdfast-dev/holdfast/agent/config"
)

// RuntimeUnderTest is the runtime backend the agent's integration tests run on:
// $HOLDFAST_TEST_RUNTIME, config.RuntimeContainerd (the default) or config.RuntimeCRI. One
// switch for the whole suite: the tests are the same, the backend differs.
func RuntimeUnderTest() string {
	if os.Getenv("HOLDFAST_TEST_RUNTIME") == config.RuntimeCRI {
		return config.RuntimeCRI
	}
	return config.RuntimeContainerd
}

// AgentNamespace is the containerd namespace the agent's images and containers are in on the
// backend under test: holdfast's own, or the CRI plugin's.
func AgentNamespace() string {
	if RuntimeUnderTest() == config.RuntimeCRI {
		return "k8s.io"
	}
	return "holdfast"
}

// CrictlVersion is the crictl hack/build-tools.sh builds (hack/tools/crictl).
const CrictlVersion = "v1.37.0"

// Crictl runs crictl against the CRI endpoint with args and returns its output; a failure
// fails the test with what crictl said.
func Crictl(t testing.TB, endpoint string, args ...string) string {
	t.Helper()
	bin := filepath.Join(BinDir(), "crictl-"+CrictlVersion)
	if err := checkExecutable(bin); err != nil {
		t.Fatalf("%v (HOLDFAST_TEST_BIN=%s; built by hack/build-tools.sh)", err, BinDir())
	}
	cmd := exec.Command(bin, append([]string{"--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "30s"}, args...)...)
	cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("crictl %v: %v\n%s", args, err, out)
	}
	return string(out)
}
