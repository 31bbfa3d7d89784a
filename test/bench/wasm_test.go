package bench

import (
	"testing"

	"github.com/holdfast-dev/holdfast/test/repo"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestOPABench runs the OPA half of make bench's policy comparison, so that it cannot rot
// between bench runs: both of OPA's evaluators judge the benchmark's policy and input, and
// their result lines parse. No timing is asserted.
func TestOPABench(t *testing.T) {
	testenv.RequireIntegration(t)
	root := repo.Root(t)
	var res WasmResult
	runOPABench(t, root, &res)
	out := res.Output
	got := map[string]bool{}
	for _, b := range parseBenchOutput(out) {
		if b.Metrics["ns/op"] > 0 {
			got[b.Name] = true
		}
	}
	for _, name := range []string{"BenchmarkAdmitOPA/opa-go-evaluator", "BenchmarkAdmitOPA/opa-wasm-engine"} {
		if !got[name] {
			t.Errorf("no %s with ns/op in:\n%s", name, out)
		}
	}
}
