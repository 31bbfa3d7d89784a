package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// WasmResult is the output of wasm/'s Go benchmarks.
type WasmResult struct {
	Benchtime  string          `json:"benchtime"`
	Output     string          `json:"output"`
	Benchmarks []WasmBenchmark `json:"benchmarks"`
}

// WasmBenchmark is one line of `go test -bench` output: its name (without the -GOMAXPROCS
// suffix), iterations and every "value unit" pair (ns/op, cpu-ns/op, B/op, allocs/op, MB/s).
type WasmBenchmark struct {
	Name       string             `json:"name"`
	Iterations int64              `json:"iterations"`
	Metrics    map[string]float64 `json:"metrics"`
}

// runWasmBench runs `go test -run ^$ -bench . -benchtime B ./wasm/` at the module root, at low
// priority. Missing package: nil, noted. A failing benchmark fails t but keeps the output.
func runWasmBench(t *testing.T, benchtime string) *WasmResult {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Errorf("wasm: %v", err)
		return nil
	}
	if _, err := os.Stat(filepath.Join(root, "wasm")); err != nil {
		t.Logf("wasm: no ./wasm/ package, Wasm figures left out")
		return nil
	}
	cmd := exec.Command("nice", "-n", "10", "go", "test", "-run", "^$", "-bench", ".", "-benchtime", benchtime, "-count", "1", "./wasm/")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("wasm benchmarks: %v\n%s", err, out)
	}
	res := &WasmResult{Benchtime: benchtime, Output: string(out), Benchmarks: parseBenchOutput(string(out))}
	opa := runOPABench(t, root)
	res.Output += opa
	res.Benchmarks = append(res.Benchmarks, parseBenchOutput(opa)...)
	return res
}

// runOPABench runs OPA's own evaluators, its Go evaluator (`opa bench -t rego`) and its Wasm
// engine (`-t wasm`), on the policy, data and input BenchmarkAdmitOPA gives holdfast's engine
// (wasm/testdata/opa), each for OPA's default second. It returns their result lines named
// BenchmarkAdmitOPA/opa-go-evaluator and BenchmarkAdmitOPA/opa-wasm-engine.
func runOPABench(t *testing.T, root string) string {
	t.Helper()
	dir := filepath.Join(root, "wasm", "testdata", "opa")
	var out strings.Builder
	for _, target := range []struct{ flag, name string }{{"rego", "opa-go-evaluator"}, {"wasm", "opa-wasm-engine"}} {
		cmd := exec.Command("nice", "-n", "10", testenv.OPAPath(), "bench", "--format", "gobench", "--metrics=false", "-t", target.flag,
			"-d", filepath.Join(dir, "registries.rego"), "-d", filepath.Join(dir, "data.json"), "-i", filepath.Join(dir, "input.json"),
			"data.holdfast.admission.deny")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("opa bench -t %s: %v\n%s", target.flag, err, b)
			continue
		}
		out.WriteString(strings.ReplaceAll(string(b), "BenchmarkOPAEval", "BenchmarkAdmitOPA/"+target.name))
	}
	return out.String()
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// parseBenchOutput reads the result lines of `go test -bench` output.
func parseBenchOutput(out string) []WasmBenchmark {
	var res []WasmBenchmark
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		b := WasmBenchmark{Name: name, Iterations: n, Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			b.Metrics[f[i+1]] = v
		}
		res = append(res, b)
	}
	return res
}
