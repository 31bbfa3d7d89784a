package bench

import (
	"strings"
	"testing"
	"time"
)

// testPolicyRun is a run of the policy benchmarks with the figures of the make bench run of
// 2026-12-05 03:50 UTC (docs/benchmarks.md), Probe and Instrument among them as make bench
// runs them, and one admission benchmark the renderer does not know.
func testPolicyRun() PolicyRun {
	out := `goos: linux
goarch: amd64
pkg: github.com/holdfast-dev/holdfast/wasm
BenchmarkInstrument-2   	      86	  13552430 ns/op	 274.89 MB/s
BenchmarkAdmit/go/allowed-registries-2         	   10920	    111128 ns/op	  18.54 MB/s	    110926 cpu-ns/op	    1736 B/op	      19 allocs/op
BenchmarkAdmit/go/resource-caps-2              	    9624	    106375 ns/op	  19.12 MB/s	    106875 cpu-ns/op	    1905 B/op	      19 allocs/op
BenchmarkAdmit/c/deny-host-network-2           	  237572	      6306 ns/op	 317.81 MB/s	      6406 cpu-ns/op	     680 B/op	      19 allocs/op
BenchmarkAdmit/rust/new-2                      	  100000	     12000 ns/op
BenchmarkProbe/go/http-json-2                  	    1737	    734993 ns/op	    777509 cpu-ns/op	   28582 B/op	     186 allocs/op
BenchmarkColdStart/from-cache-2                	      10	 108978998 ns/op	 116334100 cpu-ns/op
BenchmarkColdStart/compile-2                   	       2	 965369344 ns/op	 973618000 cpu-ns/op
BenchmarkColdStart/opa-from-cache-2            	     211	   5464252 ns/op	   5917152 cpu-ns/op
BenchmarkAdmitOPA/holdfast-2                   	   27920	     43339 ns/op	  53.07 MB/s	     43523 cpu-ns/op	     688 B/op	      11 allocs/op
PASS
ok  	github.com/holdfast-dev/holdfast/wasm	21.886s
BenchmarkAdmitOPA/opa-go-evaluator	   29186	     39348 ns/op	    9860 B/op	     211 allocs/op
BenchmarkAdmitOPA/opa-wasm-engine	    5049	    223586 ns/op	   28683 B/op	     122 allocs/op
`
	return PolicyRun{
		Target: "make bench",
		Machine: Machine{CPU: "Oxide Virtual Turin-like Processor", Cores: 2, MemoryGiB: 8, OS: "Debian GNU/Linux 12 (bookworm)",
			Kernel: "6.1.0-27-amd64", Go: "go1.26.0"},
		Wasm: &WasmResult{Pattern: ".", Benchtime: "1s", Commit: "9e3bee7", Start: time.Date(2026, 12, 5, 3, 50, 0, 0, time.UTC),
			Took: "25s", LoadBefore: "0.52 0.61 0.70", LoadAfter: "1.10 0.75 0.72", OPAVersion: "v1.22.4",
			Commands:   []string{"nice -n 10 go test -run '^$' -bench . -benchtime 1s -count 1 ./wasm/", "nice -n 10 opa bench -t rego ..."},
			Output:     out,
			Benchmarks: parseBenchOutput(out)},
	}
}

// TestPolicyFiguresRendering: the figures block and the summary line say what the numbers of
// the run say, comparisons included, and nothing of the benchmarks that are not policy ones.
func TestPolicyFiguresRendering(t *testing.T) {
	run := testPolicyRun()
	figures := run.Figures()
	for _, want := range []string{
		"Run of 2026-12-05 03:50 UTC (`make bench` at commit `9e3bee7`, the policy benchmarks took 25s). Machine: Oxide Virtual Turin-like Processor, 2 cores, 8 GiB, " +
			"Debian GNU/Linux 12 (bookworm), kernel 6.1.0-27-amd64; go1.26.0; OPA v1.22.4. Load average (1, 5, 15 min) 0.52 0.61 0.70 before, 1.10 0.75 0.72 after.",
		"```\nnice -n 10 go test -run '^$' -bench . -benchtime 1s -count 1 ./wasm/\nnice -n 10 opa bench -t rego ...\n```",
		"| policy | benchmark | wall time per call | CPU per call | Go heap per call |\n|---|---|---:|---:|---:|\n" +
			"| C, `deny-host-network` (holdfast ABI) | `Admit/c/deny-host-network` | 6.31 us | 6.41 us | 680 B, 19 allocs |\n" +
			"| Rego, the allowed-registries rule (`wasm/testdata/opa/registries.rego`) compiled by `opa build -t wasm`, in holdfast | `AdmitOPA/holdfast` | 43.3 us | 43.5 us | 688 B, 11 allocs |\n" +
			"| the same Rego, data and input, OPA's Go evaluator (`opa bench -t rego`) | `AdmitOPA/opa-go-evaluator` | 39.3 us |  | 9860 B, 211 allocs |\n",
		"| Go, `allowed-registries` (holdfast ABI, Go SDK): the rule the Rego above translates | `Admit/go/allowed-registries` | 111 us | 111 us | 1736 B, 19 allocs |\n" +
			"| (not described in test/bench/policies.go) | `Admit/rust/new` | 12.0 us |  |  |\n\nA cold start",
		"| the Rego policy above, from the compilation cache | `ColdStart/opa-from-cache` | 5.46 ms | 5.92 ms |  |\n" +
			"| Go, `allowed-registries`, from the compilation cache | `ColdStart/from-cache` | 109 ms | 116 ms |  |\n" +
			"| Go, `allowed-registries`, compiled (no cache) | `ColdStart/compile` | 965 ms | 974 ms |  |\n",
		"- Rego in holdfast against OPA's Go evaluator, on the same Rego, data and input: 43.3 us against 39.3 us, holdfast/OPA's Go evaluator 1.10 (holdfast slower); " +
			"11 allocations per call against 211.\n",
		"- Rego in holdfast against OPA's own Wasm engine (OPA's Wasm SDK, running the module OPA compiles): 43.3 us against 224 us, holdfast/OPA's Wasm engine 0.19 (holdfast faster).\n",
		"- The allowed-registries rule in Rego against the same rule in Go (Go SDK), both in holdfast: 43.3 us against 111 us, Rego/Go 0.39 (Rego faster).\n",
		"- A Go SDK policy against the C one: 106-111 us against 6.31 us per call, Go/C 17-18.\n",
		"- A cold start from the compilation cache, the Rego policy against the Go one: 5.46 ms against 109 ms, Rego/Go 0.05 (Rego faster).\n",
		"<details><summary>What the commands printed</summary>\n\n```\ngoos: linux\n",
		"BenchmarkAdmitOPA/opa-wasm-engine\t    5049\t    223586 ns/op\t   28683 B/op\t     122 allocs/op\n```\n</details>\n",
	} {
		if !strings.Contains(figures, want) {
			t.Errorf("figures lack\n%s\nin:\n%s", want, figures)
		}
	}
	// Probe and Instrument are in the raw output only, not in the tables.
	for _, unwanted := range []string{"| `Probe/", "| `Instrument"} {
		if strings.Contains(figures, unwanted) {
			t.Errorf("figures have %q, which is no policy benchmark of theirs:\n%s", unwanted, figures)
		}
	}
	if !policyHeaderPattern.MatchString(run.Header()) {
		t.Errorf("header %q does not match %s", run.Header(), policyHeaderPattern)
	}
	wantSummary := "One Wasm admission policy call on a 2 KB pod, wall time, in the [run of 2026-12-05 03:50 UTC](docs/policies.md#figures) " +
		"(`make bench` at `9e3bee7`, 2 cores, load average 0.52 0.61 0.70 before): Go (SDK) 106-111 us, C 6.31 us, Rego compiled by OPA 43.3 us " +
		"(OPA's Go evaluator on the same Rego: 39.3 us; holdfast/OPA 1.10)."
	if got := run.Summary("docs/policies.md#figures"); got != wantSummary {
		t.Errorf("summary\n%s\nwant\n%s", got, wantSummary)
	}
}

// TestPolicyComparisonWithinNoise: a ratio within 5% of 1 is not called faster or slower.
func TestPolicyComparisonWithinNoise(t *testing.T) {
	for _, c := range []struct {
		x, y float64
		want string
	}{
		{40, 39.3, "40.0 us against 39.3 us, holdfast/OPA 1.02 (no difference this machine can tell)"},
		{30, 39.3, "30.0 us against 39.3 us, holdfast/OPA 0.76 (holdfast faster)"},
		{45, 39.3, "45.0 us against 39.3 us, holdfast/OPA 1.15 (holdfast slower)"},
	} {
		if got := against(c.x, c.y, "us", "holdfast", "OPA"); got != c.want {
			t.Errorf("against(%v, %v) = %q, want %q", c.x, c.y, got, c.want)
		}
	}
}

// TestPolicyRunMissingBenchmarks: a run without OPA's half (opa bench failed, or an old run)
// renders what it has and states no comparison it cannot make.
func TestPolicyRunMissingBenchmarks(t *testing.T) {
	run := testPolicyRun()
	var kept []WasmBenchmark
	for _, b := range run.Wasm.Benchmarks {
		if !strings.HasPrefix(b.Name, "BenchmarkAdmitOPA/opa-") {
			kept = append(kept, b)
		}
	}
	run.Wasm.Benchmarks = kept
	figures := run.Figures()
	if strings.Contains(figures, "OPA's Go evaluator") || strings.Contains(figures, "OPA's own Wasm engine") {
		t.Errorf("figures compare with OPA's evaluators, which did not run:\n%s", figures)
	}
	if !strings.Contains(figures, "Rego/Go 0.39 (Rego faster)") {
		t.Errorf("figures lack the comparisons that can be made:\n%s", figures)
	}
	if s := run.Summary("#figures"); !strings.HasSuffix(s, "C 6.31 us, Rego compiled by OPA 43.3 us.") {
		t.Errorf("summary %q", s)
	}
	run.Wasm.Errors = []string{"opa bench -t rego: exit status 1"}
	if err := WritePolicyDocs(t.TempDir(), run); err == nil || !strings.Contains(err.Error(), "opa bench -t rego") {
		t.Errorf("a run with a failed command was written (err %v)", err)
	}
}

func TestReplaceGenerated(t *testing.T) {
	doc := "# Page\n\nbefore\n" + beginMarker("x") + "\nold\nlines\n" + endMarker("x") + "\nafter\n"
	got, err := replaceGenerated(doc, "x", "new\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Page\n\nbefore\n" + beginMarker("x") + "\nnew\n" + endMarker("x") + "\nafter\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if again, err := replaceGenerated(got, "x", "new"); err != nil || again != got {
		t.Errorf("replacing again changed the page (%v):\n%s", err, again)
	}
	if body, ok := GeneratedBlock(got, "x"); !ok || body != "new\n" {
		t.Errorf("GeneratedBlock = %q, %v", body, ok)
	}
	for name, bad := range map[string]string{
		"no block":         "# Page\n",
		"no end":           beginMarker("x") + "\nold\n",
		"two blocks":       doc + doc,
		"end before begin": endMarker("x") + "\n" + beginMarker("x") + "\n",
	} {
		if _, err := replaceGenerated(bad, "x", "new"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
