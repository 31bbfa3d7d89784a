package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The policy figures: what docs/policies.md and the README say a policy call and a cold start
// cost. `make bench-policies` (RunPolicyBench: the policy benchmarks alone) and `make bench`
// (Run, after the agents) each write them from their own run with WritePolicyDocs, between
// the generated markers of those pages, and keep the run's data beside them
// (docs/policy-figures.json). The tables and every sentence comparing two figures are rendered
// here from the numbers, so no figure on those pages is typed by hand, and the two targets
// cannot disagree on what they say.

// PolicyBenchPattern is the -bench pattern of the policy benchmarks in wasm/: one admission
// call (the Go and C examples on holdfast's ABI, the Rego rule in holdfast's engine) and the
// cold starts. make bench runs all of wasm/'s benchmarks; the pages show these.
const PolicyBenchPattern = "^Benchmark(Admit|AdmitOPA|ColdStart)$"

// Where WritePolicyDocs writes, relative to the module root.
const (
	policyDocsPage   = "docs/policies.md"
	policyDocsReadme = "README.md"
	policyRunFile    = "docs/policy-figures.json"
)

// The generated blocks' names: the figures (docs/policies.md's "Figures"), and the summary
// line under docs/policies.md's first table and under the README's performance table.
const (
	figuresBlock = "policy-figures"
	summaryBlock = "policy-summary"
)

// PolicyRun is one run of the policy benchmarks, as the pages show it.
type PolicyRun struct {
	// Target is what ran it: "make bench-policies" or "make bench".
	Target  string      `json:"target"`
	Machine Machine     `json:"machine"`
	Wasm    *WasmResult `json:"wasm"`
}

// RunPolicyBench runs the policy benchmarks alone, wasm/'s (PolicyBenchPattern, -benchtime
// benchtime) and OPA's evaluators beside them: `make bench-policies`.
func RunPolicyBench(t *testing.T, benchtime string) PolicyRun {
	t.Helper()
	run := PolicyRun{Target: "make bench-policies", Machine: describeMachine(), Wasm: runWasmBench(t, PolicyBenchPattern, benchtime)}
	if run.Wasm == nil {
		t.Fatal("no ./wasm/ package: no policy figures")
	}
	run.Machine.LoadAfter = loadavg()
	return run
}

// policyBench is a benchmark the pages know: its name in `go test -bench` output and what it
// measures, in the table.
type policyBench struct{ name, label string }

// The benchmarks of the figures, in the tables' order. A benchmark PolicyBenchPattern selects
// that is not listed here is shown after them, undescribed.
var (
	admissionBenches = []policyBench{
		{"BenchmarkAdmit/c/deny-host-network", "C, `deny-host-network` (holdfast ABI)"},
		{"BenchmarkAdmitOPA/holdfast", "Rego, the allowed-registries rule (`wasm/testdata/opa/registries.rego`) compiled by `opa build -t wasm`, in holdfast"},
		{"BenchmarkAdmitOPA/opa-go-evaluator", "the same Rego, data and input, OPA's Go evaluator (`opa bench -t rego`)"},
		{"BenchmarkAdmitOPA/opa-wasm-engine", "the same Rego, data and input, OPA's own Wasm engine (`opa bench -t wasm`)"},
		{"BenchmarkAdmit/go/resource-caps", "Go, `resource-caps` (holdfast ABI, Go SDK)"},
		{"BenchmarkAdmit/go/allowed-registries", "Go, `allowed-registries` (holdfast ABI, Go SDK): the rule the Rego above translates"},
	}
	coldStartBenches = []policyBench{
		{"BenchmarkColdStart/opa-from-cache", "the Rego policy above, from the compilation cache"},
		{"BenchmarkColdStart/from-cache", "Go, `allowed-registries`, from the compilation cache"},
		{"BenchmarkColdStart/compile", "Go, `allowed-registries`, compiled (no cache)"},
	}
)

const (
	regoHoldfast  = "BenchmarkAdmitOPA/holdfast"
	regoGo        = "BenchmarkAdmitOPA/opa-go-evaluator"
	regoOPAWasm   = "BenchmarkAdmitOPA/opa-wasm-engine"
	cPolicy       = "BenchmarkAdmit/c/deny-host-network"
	goRegistries  = "BenchmarkAdmit/go/allowed-registries"
	goPolicies    = "BenchmarkAdmit/go/"
	coldStartGo   = "BenchmarkColdStart/from-cache"
	coldStartRego = "BenchmarkColdStart/opa-from-cache"
	coldStart     = "BenchmarkColdStart/"
)

// benchmarks returns the run's policy benchmarks by name.
func (p PolicyRun) benchmarks() map[string]WasmBenchmark {
	selected := regexp.MustCompile(PolicyBenchPattern)
	m := map[string]WasmBenchmark{}
	for _, b := range p.Wasm.Benchmarks {
		top, _, _ := strings.Cut(b.Name, "/")
		if _, ok := b.Metrics["ns/op"]; ok && selected.MatchString(top) {
			m[b.Name] = b
		}
	}
	return m
}

// micros is a benchmark's wall time per op in microseconds.
func micros(b WasmBenchmark) float64 { return b.Metrics["ns/op"] / 1e3 }

// Header is the first line of the figures block: when, what, where. TestPolicyDocsGenerated
// parses it back (policyHeaderPattern).
func (p PolicyRun) Header() string {
	w, m := p.Wasm, p.Machine
	return fmt.Sprintf("Run of %s (`%s` at commit `%s`, the policy benchmarks took %s). Machine: %s, %d cores, %d GiB, %s, kernel %s; %s; OPA %s. Load average (1, 5, 15 min) %s before, %s after.",
		w.Start.Format("2006-01-02 15:04 MST"), p.Target, w.Commit, w.Took, m.CPU, m.Cores, m.MemoryGiB, m.OS, m.Kernel, m.Go, w.OPAVersion, w.LoadBefore, w.LoadAfter)
}

// policyHeaderPattern matches Header's line.
var policyHeaderPattern = regexp.MustCompile("^Run of (\\d{4}-\\d{2}-\\d{2} \\d{2}:\\d{2} UTC) \\(`(make bench|make bench-policies)` at commit `([0-9a-f]{7,}(-dirty)?)`")

// Figures renders docs/policies.md's figures block: the header, the commands, a table of the
// admission calls and one of the cold starts, the comparisons, and the raw output.
func (p PolicyRun) Figures() string {
	bs := p.benchmarks()
	var b strings.Builder
	b.WriteString(p.Header() + "\n\nCommands, from the module root:\n\n```\n" + strings.Join(p.Wasm.Commands, "\n") + "\n```\n\n")
	b.WriteString("One admission call on the 2 KB pod, as the agent makes it:\n\n")
	b.WriteString(benchTable(bs, admissionBenches, func(name string) bool { return !strings.HasPrefix(name, coldStart) }, "us"))
	b.WriteString("\nA cold start: a new engine, the module loaded, and its first call (what an agent's start costs per policy):\n\n")
	b.WriteString(benchTable(bs, coldStartBenches, func(name string) bool { return strings.HasPrefix(name, coldStart) }, "ms"))
	if cs := comparisons(bs); len(cs) > 0 {
		b.WriteString("\nSo, in this run:\n\n")
		for _, c := range cs {
			b.WriteString("- " + c + "\n")
		}
	}
	b.WriteString("\n" + p.Wasm.outputDetails("What the commands printed"))
	return b.String()
}

// benchTable tabulates the benchmarks of bs that in selects: known ones first, in their
// order, under their labels, then the others under their names. Times in unit (us or ms).
func benchTable(bs map[string]WasmBenchmark, known []policyBench, in func(name string) bool, unit string) string {
	rows := slices.Clone(known)
	var others []string
	for name := range bs {
		if in(name) && !slices.ContainsFunc(known, func(k policyBench) bool { return k.name == name }) {
			others = append(others, name)
		}
	}
	slices.Sort(others)
	for _, name := range others {
		rows = append(rows, policyBench{name, "(not described in test/bench/policies.go)"})
	}
	scale := map[string]float64{"us": 1e3, "ms": 1e6}[unit]
	var b strings.Builder
	b.WriteString("| policy | benchmark | wall time per call | CPU per call | Go heap per call |\n|---|---|---:|---:|---:|\n")
	for _, r := range rows {
		bm, ok := bs[r.name]
		if !ok {
			continue
		}
		wall := bm.Metrics["ns/op"] / scale
		cpu, heap := "", ""
		if v, ok := bm.Metrics["cpu-ns/op"]; ok {
			v /= scale
			cpu = formatValue(&v, unit, "")
		}
		if by, ok := bm.Metrics["B/op"]; ok {
			heap = fmt.Sprintf("%.0f B, %.0f allocs", by, bm.Metrics["allocs/op"])
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s | %s |\n", r.label, strings.TrimPrefix(r.name, "Benchmark"), formatValue(&wall, unit, ""), cpu, heap)
	}
	return b.String()
}

// comparisons states what the figures of bs say against each other, one sentence each, for
// the pairs that ran.
func comparisons(bs map[string]WasmBenchmark) []string {
	var out []string
	us := func(name string) (float64, bool) {
		b, ok := bs[name]
		return micros(b), ok
	}
	rego, okRego := us(regoHoldfast)
	if v, ok := us(regoGo); ok && okRego {
		s := "Rego in holdfast against OPA's Go evaluator, on the same Rego, data and input: " + against(rego, v, "us", "holdfast", "OPA's Go evaluator")
		if a, b := bs[regoHoldfast].Metrics["allocs/op"], bs[regoGo].Metrics["allocs/op"]; a > 0 && b > 0 {
			s += fmt.Sprintf("; %.0f allocations per call against %.0f", a, b)
		}
		out = append(out, s+".")
	}
	if v, ok := us(regoOPAWasm); ok && okRego {
		out = append(out, "Rego in holdfast against OPA's own Wasm engine (OPA's Wasm SDK, running the module OPA compiles): "+against(rego, v, "us", "holdfast", "OPA's Wasm engine")+".")
	}
	if v, ok := us(goRegistries); ok && okRego {
		out = append(out, "The allowed-registries rule in Rego against the same rule in Go (Go SDK), both in holdfast: "+against(rego, v, "us", "Rego", "Go")+".")
	}
	if lo, hi, ok := goRange(bs); ok {
		if c, okC := us(cPolicy); okC && c > 0 {
			out = append(out, fmt.Sprintf("A Go SDK policy against the C one: %s against %s per call, Go/C %s.", formatRange(lo, hi, "us"), formatValue(&c, "us", ""), formatRange(lo/c, hi/c, "")))
		}
	}
	goCold, okGo := bs[coldStartGo]
	regoCold, okRegoCold := bs[coldStartRego]
	if okGo && okRegoCold {
		out = append(out, "A cold start from the compilation cache, the Rego policy against the Go one: "+against(regoCold.Metrics["ns/op"]/1e6, goCold.Metrics["ns/op"]/1e6, "ms", "Rego", "Go")+".")
	}
	return out
}

// against says "X against Y, a/b R (a faster)", a and b naming x and y; a ratio within 5% of 1
// is called no difference, which this machine's noise cannot resolve.
func against(x, y float64, unit, a, b string) string {
	r := x / y
	verdict := "no difference this machine can tell"
	switch {
	case r < 0.95:
		verdict = a + " faster"
	case r > 1.05:
		verdict = a + " slower"
	}
	return fmt.Sprintf("%s against %s, %s/%s %.2f (%s)", formatValue(&x, unit, ""), formatValue(&y, unit, ""), a, b, r, verdict)
}

// goRange is the range of the Go SDK policies' admission calls, in us.
func goRange(bs map[string]WasmBenchmark) (lo, hi float64, ok bool) {
	for name, b := range bs {
		if !strings.HasPrefix(name, goPolicies) {
			continue
		}
		v := micros(b)
		if !ok || v < lo {
			lo = v
		}
		if !ok || v > hi {
			hi = v
		}
		ok = true
	}
	return lo, hi, ok
}

// formatRange is "lo-hi unit", or one figure when they print the same; unit "" is a ratio.
func formatRange(lo, hi float64, unit string) string {
	f := func(v float64) string {
		if unit == "" {
			return fmt.Sprintf("%.0f", v)
		}
		return strings.TrimSuffix(formatValue(&v, unit, ""), " "+unit)
	}
	s := f(lo)
	if f(hi) != s {
		s += "-" + f(hi)
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}

// Summary is the one line under docs/policies.md's first table and the README's performance
// table: one admission call in each language, linked to the figures (figuresLink).
func (p PolicyRun) Summary(figuresLink string) string {
	bs := p.benchmarks()
	var parts []string
	if lo, hi, ok := goRange(bs); ok {
		parts = append(parts, "Go (SDK) "+formatRange(lo, hi, "us"))
	}
	if b, ok := bs[cPolicy]; ok {
		v := micros(b)
		parts = append(parts, "C "+formatValue(&v, "us", ""))
	}
	if b, ok := bs[regoHoldfast]; ok {
		v := micros(b)
		s := "Rego compiled by OPA " + formatValue(&v, "us", "")
		if g, ok := bs[regoGo]; ok {
			gv := micros(g)
			s += fmt.Sprintf(" (OPA's Go evaluator on the same Rego: %s; holdfast/OPA %.2f)", formatValue(&gv, "us", ""), v/gv)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		parts = append(parts, "no admission benchmark ran")
	}
	return fmt.Sprintf("One Wasm admission policy call on a 2 KB pod, wall time, in the [run of %s](%s) (`%s` at `%s`, %d cores, load average %s before): %s.",
		p.Wasm.Start.Format("2006-01-02 15:04 MST"), figuresLink, p.Target, p.Wasm.Commit, p.Machine.Cores, p.Wasm.LoadBefore, strings.Join(parts, ", "))
}

// beginMarker and endMarker delimit a generated block of a Markdown page.
func beginMarker(name string) string {
	return "<!-- BEGIN GENERATED " + name + ": written by make bench-policies and make bench (test/bench/policies.go); do not edit -->"
}

func endMarker(name string) string { return "<!-- END GENERATED " + name + " -->" }

// replaceGenerated returns doc with the body of its generated block name replaced. The block
// must be there once: its begin marker's line and its end marker's line stay as they are.
func replaceGenerated(doc, name, body string) (string, error) {
	beginPrefix := "<!-- BEGIN GENERATED " + name + ":"
	if n := strings.Count(doc, beginPrefix); n != 1 {
		return "", fmt.Errorf("%d begin markers of the generated block %s (%q...), want 1", n, name, beginPrefix)
	}
	if n := strings.Count(doc, endMarker(name)); n != 1 {
		return "", fmt.Errorf("%d end markers of the generated block %s (%q), want 1", n, name, endMarker(name))
	}
	i := strings.Index(doc, beginPrefix)
	lineEnd := strings.IndexByte(doc[i:], '\n')
	j := strings.Index(doc, endMarker(name))
	if lineEnd < 0 || i+lineEnd > j {
		return "", fmt.Errorf("the generated block %s ends before it begins", name)
	}
	return doc[:i+lineEnd+1] + strings.TrimSpace(body) + "\n" + doc[j:], nil
}

// GeneratedBlock returns the body of doc's generated block name.
func GeneratedBlock(doc, name string) (string, bool) {
	_, rest, ok := strings.Cut(doc, "<!-- BEGIN GENERATED "+name+":")
	if !ok {
		return "", false
	}
	_, rest, ok = strings.Cut(rest, "\n")
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(rest, endMarker(name))
	return body, ok
}

// RenderPolicyDocs returns docs/policies.md and README.md, as read from root, with the generated
// blocks rendered from run.
func RenderPolicyDocs(root string, run PolicyRun) (page, readme string, err error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(root, name))
		return string(b), err
	}
	if page, err = read(policyDocsPage); err != nil {
		return "", "", err
	}
	if readme, err = read(policyDocsReadme); err != nil {
		return "", "", err
	}
	for _, r := range []struct {
		doc         *string
		file, block string
		body        string
	}{
		{&page, policyDocsPage, summaryBlock, run.Summary("#figures")},
		{&page, policyDocsPage, figuresBlock, run.Figures()},
		{&readme, policyDocsReadme, summaryBlock, run.Summary(policyDocsPage + "#figures")},
	} {
		if *r.doc, err = replaceGenerated(*r.doc, r.block, r.body); err != nil {
			return "", "", fmt.Errorf("%s: %w", r.file, err)
		}
	}
	return page, readme, nil
}

// WritePolicyDocs rewrites the generated blocks of docs/policies.md and README.md under root
// from run, and writes run's data to docs/policy-figures.json. A run in which a command failed
// is refused: its figures are incomplete.
func WritePolicyDocs(root string, run PolicyRun) error {
	if len(run.Wasm.Errors) > 0 {
		return fmt.Errorf("not written: %s failed", strings.Join(run.Wasm.Errors, "; "))
	}
	page, readme, err := RenderPolicyDocs(root, run)
	if err != nil {
		return err
	}
	js, err := json.MarshalIndent(run, "", "  ")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{policyDocsPage: []byte(page), policyDocsReadme: []byte(readme), policyRunFile: append(js, '\n')} {
		if err := os.WriteFile(filepath.Join(root, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ReadPolicyRun reads the run WritePolicyDocs last wrote under root.
func ReadPolicyRun(root string) (PolicyRun, error) {
	var run PolicyRun
	b, err := os.ReadFile(filepath.Join(root, policyRunFile))
	if err != nil {
		return run, err
	}
	if err := json.Unmarshal(b, &run); err != nil {
		return run, fmt.Errorf("%s: %w", policyRunFile, err)
	}
	if run.Wasm == nil {
		return run, fmt.Errorf("%s: no wasm run", policyRunFile)
	}
	return run, nil
}
