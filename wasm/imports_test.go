package wasm_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/test/repo"
)

// The engine knows nothing of pods, containerd or the agent, and of the policy
// side only the ABI's messages (policies/abi); the SDK pulls nothing but the
// standard library into a guest.
func TestImportBoundaries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	cases := []struct {
		pkgs   []string
		goos   string
		forbid func(path string, standard bool) bool
	}{
		{[]string{"./wasm"}, "", func(p string, _ bool) bool {
			return strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "github.com/containerd/") ||
				strings.HasPrefix(p, "github.com/holdfast-dev/holdfast/agent") || (strings.HasPrefix(p, "github.com/holdfast-dev/holdfast/policies") && p != "github.com/holdfast-dev/holdfast/policies/abi")
		}},
		{[]string{"./policies/sdk/go/...", "./policies/examples/..."}, "wasip1", func(p string, std bool) bool {
			return !std && !strings.HasPrefix(p, "github.com/holdfast-dev/holdfast/policies/")
		}},
	}
	for _, tc := range cases {
		cmd := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}"}, tc.pkgs...)...)
		cmd.Dir = repo.Root(t)
		cmd.Env = os.Environ()
		if tc.goos != "" {
			cmd.Env = append(cmd.Env, "GOOS="+tc.goos, "GOARCH=wasm")
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", tc.pkgs, err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			path, std, _ := strings.Cut(line, " ")
			if tc.forbid(path, std == "true") {
				t.Errorf("%v depends on %s", tc.pkgs, path)
			}
		}
	}
}
