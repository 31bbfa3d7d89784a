package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/repo"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// WasmResult is one run of wasm/'s Go benchmarks and of OPA's own evaluators beside them:
// what ran, where in the history, under what load, and what it printed.
type WasmResult struct {
	// Pattern is the -bench pattern given to `go test`: "." in make bench,
	// PolicyBenchPattern in make bench-policies.
	Pattern   string `json:"pattern"`
	Benchtime string `json:"benchtime"`
	// Commit is the checkout measured: `git rev-parse --short HEAD`, "-dirty" appended when
	// tracked files other than the pages the figures are written to differ from it.
	Commit string    `json:"commit"`
	Start  time.Time `json:"start"`
	Took   string    `json:"took"`
	// LoadBefore and LoadAfter are /proc/loadavg's 1, 5 and 15 minute averages around the run.
	LoadBefore string `json:"loadBefore"`
	LoadAfter  string `json:"loadAfter"`
	// OPAVersion is the version of the opa binary whose evaluators ran.
	OPAVersion string `json:"opaVersion"`
	// Commands are the commands run, in order, from the module root, as a shell would take them.
	Commands []string `json:"commands"`
	// Errors are the commands that failed: their figures are missing.
	Errors     []string        `json:"errors,omitempty"`
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

// runWasmBench runs `go test -run ^$ -bench PATTERN -benchtime B ./wasm/` at the module root,
// at low priority, then OPA's evaluators (runOPABench). Missing package: nil, noted. A failing
// benchmark fails t but keeps the output.
func runWasmBench(t *testing.T, pattern, benchtime string) *WasmResult {
	t.Helper()
	root := repo.Root(t)
	if _, err := os.Stat(filepath.Join(root, "wasm")); err != nil {
		t.Logf("wasm: no ./wasm/ package, Wasm figures left out")
		return nil
	}
	res := &WasmResult{Pattern: pattern, Benchtime: benchtime, Commit: gitCommit(root), Start: time.Now().UTC(), LoadBefore: loadavg()}
	out, err := res.command(root, "nice", "-n", "10", "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime, "-count", "1", "./wasm/")
	if err != nil {
		t.Errorf("wasm benchmarks: %v\n%s", err, out)
		res.Errors = append(res.Errors, fmt.Sprintf("go test -bench ./wasm/: %v", err))
	}
	res.Output = string(out)
	runOPABench(t, root, res)
	res.Benchmarks = parseBenchOutput(res.Output)
	res.Took = time.Since(res.Start).Round(time.Second).String()
	res.LoadAfter = loadavg()
	return res
}

// runOPABench runs OPA's own evaluators, its Go evaluator (`opa bench -t rego`) and its Wasm
// engine (`-t wasm`), on the policy, data and input BenchmarkAdmitOPA gives holdfast's engine
// (wasm/testdata/opa), each for OPA's default second. It appends their result lines to
// res.Output, named BenchmarkAdmitOPA/opa-go-evaluator and BenchmarkAdmitOPA/opa-wasm-engine.
func runOPABench(t *testing.T, root string, res *WasmResult) {
	t.Helper()
	dir := filepath.Join("wasm", "testdata", "opa")
	res.OPAVersion = testenv.OPAVersion
	for _, target := range []struct{ flag, name string }{{"rego", "opa-go-evaluator"}, {"wasm", "opa-wasm-engine"}} {
		b, err := res.command(root, "nice", "-n", "10", testenv.OPAPath(), "bench", "--format", "gobench", "--metrics=false", "-t", target.flag,
			"-d", filepath.Join(dir, "registries.rego"), "-d", filepath.Join(dir, "data.json"), "-i", filepath.Join(dir, "input.json"),
			"data.holdfast.admission.deny")
		if err != nil {
			t.Errorf("opa bench -t %s: %v\n%s", target.flag, err, b)
			res.Errors = append(res.Errors, fmt.Sprintf("opa bench -t %s: %v", target.flag, err))
			continue
		}
		res.Output += strings.ReplaceAll(string(b), "BenchmarkOPAEval", "BenchmarkAdmitOPA/"+target.name)
	}
}

// command runs argv in dir, records it in Commands, and returns its combined output.
func (w *WasmResult) command(dir string, argv ...string) ([]byte, error) {
	w.Commands = append(w.Commands, shellJoin(argv))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}

// shellJoin writes argv as a shell would take it, quoting only the words that need it.
func shellJoin(argv []string) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,+@") == "" {
			words[i] = a
		} else {
			words[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(words, " ")
}

// outputDetails is the run's whole output, folded under summary, for a Markdown page.
func (w *WasmResult) outputDetails(summary string) string {
	return fmt.Sprintf("<details><summary>%s</summary>\n\n```\n%s\n```\n</details>\n", summary, strings.TrimSpace(w.Output))
}

// gitCommit names the checkout at root: its short commit, "-dirty" if a tracked file differs
// from it or git cannot tell (the pages the figures are written to left aside: a run rewrites
// them), "unknown" outside git.
func gitCommit(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	status, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".",
		":(exclude)"+policyDocsPage, ":(exclude)"+policyDocsReadme, ":(exclude)"+policyRunFile).Output()
	if err != nil || len(strings.TrimSpace(string(status))) > 0 {
		commit += "-dirty"
	}
	return commit
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
