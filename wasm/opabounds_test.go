package wasm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/testenv"
	"github.com/holdfast-dev/holdfast/wasm"
)

// sprintfRego formats what its input says, or a value it builds itself.
const sprintfRego = `package sprintf

import rego.v1

formatted := sprintf(input.format, input.args)

length := count(sprintf(input.format, input.args))

all := {i: s | some i, c in input.cases; s := sprintf(c.format, c.args)}

built_array := count(sprintf(input.format, [numbers.range(1, input.n)]))

built_string := count(sprintf(input.format, [concat("", [s | some i in numbers.range(1, input.n); s := "0123456789"])]))

built_objects := count(sprintf(input.format, [[{} | some i in numbers.range(1, input.n)]]))
`

var sprintfEntrypoints = []string{"sprintf/formatted", "sprintf/length", "sprintf/all", "sprintf/built_array", "sprintf/built_string", "sprintf/built_objects"}

func repeatJSON(elem string, n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat(elem+",", n), ",") + "]"
}

// TestOPASprintfBounded: a Rego policy whose sprintf asks for gigabytes,
// however it asks, fails its call with ErrOutputTooLarge within its
// deadline, and the agent's heap pays at most a small multiple of the
// policy's host answer limit (Limits.HostResponseBytes) for it, the bound
// policies/ABI.md states.
func TestOPASprintfBounded(t *testing.T) {
	bundle := testenv.OPABundle(t, sprintfRego, "", sprintfEntrypoints...)
	// One instance: each call after a failure runs on a fresh instance,
	// so that the guest's own memory grows the same way in each.
	e := newEngine(t, wasm.Limits{CallTimeout: 2 * time.Second, MaxInstances: 1})
	m := e.load(t, wasm.Spec{Name: "sprintf", Wasm: testenv.OPAModule(t, bundle), ABI: wasm.ABIOPA, Entrypoints: sprintfEntrypoints})
	lim := m.Limits()
	input := func(format, args string, n int) string {
		f, _ := json.Marshal(format)
		return fmt.Sprintf(`{"format":%s,"args":%s,"n":%d}`, f, args, n)
	}
	// What a failed call costs the agent's heap: the call, its guest's
	// memory, and the replacement of the instance the failure discarded
	// (the honest call after it waits for it).
	failedCall := func(entrypoint, in string) (err error, took time.Duration, cost heapCost) {
		cost = measureHeap(func() {
			start := time.Now()
			_, err = m.Call(context.Background(), "sprintf/"+entrypoint, []byte(in))
			took = time.Since(start)
			if _, err := m.Call(context.Background(), "sprintf/length", []byte(`{"format":"%d","args":[1]}`)); err != nil {
				t.Error(err)
			}
		})
		return err, took, cost
	}
	cases := []struct {
		name, entrypoint, format, args string
		n                              int
		asks                           string
	}{
		{"wide verbs", "formatted", strings.Repeat("%09999999d", 300), repeatJSON("1", 300), 0, "3 GB"},
		{"precise floats", "formatted", strings.Repeat("%.9999999f", 300), repeatJSON("1.5", 300), 0, "3 GB"},
		{"star widths", "formatted", strings.Repeat("%*d", 3000), repeatJSON("1000000,1", 3000), 0, "3 GB"},
		{"an array built in Rego, reused", "built_array", strings.Repeat("%[1]v", 10000), "[]", 10000, "580 MB"},
		{"a string built in Rego, reused", "built_string", strings.Repeat("%[1]s", 10000), "[]", 6000, "600 MB"},
	}
	// The bound policies/ABI.md states for one builtin call, beyond what
	// the same call refused at its first verb costs.
	bound := 5*uint64(lim.HostResponseBytes) + 4*uint64(lim.OutputBytes)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The same call, its format led by a verb wider than the
			// budget: the host refuses it before formatting anything.
			_, _, twin := failedCall(tc.entrypoint, input(fmt.Sprintf("%%%dd", lim.HostResponseBytes+1)+tc.format, tc.args, tc.n))
			err, took, cost := failedCall(tc.entrypoint, input(tc.format, tc.args, tc.n))
			t.Logf("asks for %s: %v after %s; %s (refused at once: %s)", tc.asks, err, took.Round(time.Millisecond), cost, twin)
			wantKind(t, err, wasm.ErrOutputTooLarge)
			if !strings.Contains(err.Error(), "sprintf") || !strings.Contains(err.Error(), fmt.Sprint(lim.HostResponseBytes)) {
				t.Errorf("error %q does not name sprintf and the limit", err)
			}
			if took > lim.CallTimeout+time.Second {
				t.Errorf("the call took %s, past its deadline of %s", took, lim.CallTimeout)
			}
			if cost.allocated > twin.allocated+bound {
				t.Errorf("the host allocated %.2f MiB for it, over the %.2f MiB of the same call refused at once + the bound of %.2f MiB",
					float64(cost.allocated)/(1<<20), float64(twin.allocated)/(1<<20), float64(bound)/(1<<20))
			}
		})
	}
}

// TestOPASprintfAsOPA: honest formats, and one that is merely large, print
// as OPA's own evaluator prints them.
func TestOPASprintfAsOPA(t *testing.T) {
	bundle := testenv.OPABundle(t, sprintfRego, "", sprintfEntrypoints...)
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: "sprintf", Wasm: testenv.OPAModule(t, bundle), ABI: wasm.ABIOPA, Entrypoints: sprintfEntrypoints})
	cases := `{"cases": [
		{"format": "image %q of container %s is not from %s", "args": ["docker.io/evil:1", "app", "registry.local/"]},
		{"format": "%5d|%-5d|%05d|%+d|% d|%x|%X|%o|%b|%c|%q|%U|%#x", "args": [42, 42, 42, 42, 42, 255, 255, 8, 5, 65, 66, 9731, 255]},
		{"format": "%.3f|%8.2f|%e|%g|%G|%.0f|%v|%v", "args": [3.14159, 2.5, 1234.5678, 1e21, 1e-7, 2.5, 1e100, 0.1]},
		{"format": "%s|%10s|%-10s|%.2s|%q|%x|%.99999999s", "args": ["héllo", "ab", "ab", "héllo", "tab\there", "hi", "short"]},
		{"format": "%v|%d|%x|%.40d", "args": [123456789012345678901234567890, -123456789012345678901234567890, 123456789012345678901234567890, 123456789012345678901234567890]},
		{"format": "%[2]d %[1]d|%[3]*.[2]*[1]f|%*d|%-*d|%.*f", "args": [12.0, 2, 6, 5, 1, 5, 1, 2, 3.14159]},
		{"format": "%d %d|%[5]d|%[x]d|%[1].2d|%5%|%!|%*|%0999999999d", "args": [1]},
		{"format": "%d", "args": [1, "extra", 2.5, [1, 2], {"b": null, "a": true}]},
		{"format": "%v|%v|%s", "args": [{"b": [1, {"c": null}], "a": "x\"y"}, [], "<&>"]}
	]}`
	out, err := m.Call(context.Background(), "sprintf/all", []byte(cases))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resultValue(t, out), opaEval(t, sprintfRego, "{}", cases, "data.sprintf.all"); got != want {
		t.Errorf("holdfast: %s\nopa eval: %s", got, want)
	}
	// Large, within the budget of 1 MiB: printed whole.
	large := `{"format": "%900000d|%s", "args": [7, "end"]}`
	out, err = m.Call(context.Background(), "sprintf/length", []byte(large))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resultValue(t, out), opaEval(t, sprintfRego, "{}", large, "data.sprintf.length"); got != want || got != "900004" {
		t.Errorf("holdfast: %s, opa eval: %s, want 900004", got, want)
	}
}

// TestOPABuiltinArgumentCost: a builtin's argument costs the host about its
// JSON's size, not the 30 to 60 times a decoded tree of interface values
// costs: an argument of 20000 empty objects (60 KB, printed with "%.0v",
// which prints nothing of it) allocates less than 1 MiB, guest memory aside.
func TestOPABuiltinArgumentCost(t *testing.T) {
	bundle := testenv.OPABundle(t, sprintfRego, "", sprintfEntrypoints...)
	e := newEngine(t, wasm.Limits{MaxInstances: 1})
	m := e.load(t, wasm.Spec{Name: "sprintf", Wasm: testenv.OPAModule(t, bundle), ABI: wasm.ABIOPA, Entrypoints: sprintfEntrypoints})
	in := []byte(`{"format":"%.0v","n":20000}`)
	call := func() {
		out, err := m.Call(context.Background(), "sprintf/built_objects", in)
		if err != nil || string(out) != `[{"result":0}]` {
			t.Fatalf("%s, %v", out, err)
		}
	}
	call() // the guest's memory grows to what the evaluation needs, once
	cost := measureHeap(call)
	t.Logf("an argument of 60 KB: %s", cost)
	if cost.allocated > 1<<20 {
		t.Errorf("an argument of 60 KB cost the host %s", cost)
	}
}
