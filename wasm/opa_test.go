package wasm_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/testenv"
	"github.com/holdfast-dev/holdfast/wasm"
)

// registriesRego denies containers whose image is not under an allowed prefix, with messages
// built by sprintf: the builtin OPA's Wasm compiler leaves to the host. Its %v of an array, an
// object, a float and an integer checks the host's sprintf against OPA's own.
const registriesRego = `package holdfast.admission

import rego.v1

deny contains msg if {
	some c in input.request.object.spec.containers
	not startswith(c.image, data.allowed_prefix)
	msg := sprintf("image %q of container %s is not from %s", [c.image, c.name, data.allowed_prefix])
}

deny contains msg if {
	count(input.request.object.spec.containers) > data.max_containers
	msg := sprintf("%d containers, over %v; limits %v, ratio %v, ports %v", [count(input.request.object.spec.containers), data.max_containers, data.limits, 2.5, [80, 443]])
}

deny contains msg if {
	msg := sprintf(input.format, input.args)
}
`

const registriesData = `{"allowed_prefix": "registry.local/", "max_containers": 1, "limits": {"cpu": "1", "memory": 64}}`

func opaInputs() map[string]string {
	return map[string]string{
		"allowed": `{"request":{"object":{"spec":{"containers":[{"name":"app","image":"registry.local/app:1"}]}}}}`,
		"denied":  `{"request":{"object":{"spec":{"containers":[{"name":"app","image":"docker.io/evil:1"},{"name":"side","image":"registry.local/side"}]}}}}`,
		// sprintf's second operand is not an array: OPA makes the expression undefined.
		"builtin error": `{"format":"%s","args":"not an array","request":{"object":{"spec":{"containers":[]}}}}`,
		"format args":   `{"format":"%s and %d","args":["a", 7],"request":{"object":{"spec":{"containers":[]}}}}`,
	}
}

// TestOPAModuleAsOPAEvaluatesIt compiles Rego with opa build -t wasm, as a user does, and
// checks that the engine's evaluation gives, for each input, the result OPA's own evaluator
// (opa eval) gives for the same policy, data and input.
func TestOPAModuleAsOPAEvaluatesIt(t *testing.T) {
	bundle := testenv.OPABundle(t, registriesRego, registriesData, "holdfast/admission/deny")
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{
		Name: "registries", Wasm: testenv.OPAModule(t, bundle), ABI: wasm.ABIOPA,
		Data: []byte(registriesData), Entrypoints: []string{"holdfast/admission/deny"},
	})
	for name, input := range opaInputs() {
		t.Run(name, func(t *testing.T) {
			out, err := m.Call(context.Background(), "holdfast/admission/deny", []byte(input))
			if err != nil {
				t.Fatal(err)
			}
			got := resultValue(t, out)
			want := opaEval(t, registriesRego, registriesData, input, "data.holdfast.admission.deny")
			if got != want {
				t.Errorf("holdfast: %s\nopa eval: %s", got, want)
			}
			if name == "denied" && !strings.Contains(got, `image \"docker.io/evil:1\" of container app is not from registry.local/`) {
				t.Errorf("no deny message for the foreign image: %s", got)
			}
		})
	}
	// Input OPA's module would read as no input at all is refused.
	if _, err := m.Call(context.Background(), "holdfast/admission/deny", []byte(`{"request":`)); !errors.Is(err, wasm.ErrBadInput) {
		t.Errorf("truncated input: got %v, want ErrBadInput", err)
	}
	// Many calls on the pooled instances: the heap is reset after each, so memory stays put.
	for range 500 {
		if _, err := m.Call(context.Background(), "holdfast/admission/deny", []byte(opaInputs()["denied"])); err != nil {
			t.Fatal(err)
		}
	}
}

// resultValue returns the JSON of the result of a one-row result set, its keys sorted and sets
// in OPA's JSON order, for comparison.
func resultValue(t *testing.T, out []byte) string {
	t.Helper()
	var set []struct {
		Result any `json:"result"`
	}
	if err := json.Unmarshal(out, &set); err != nil || len(set) != 1 {
		t.Fatalf("result set %s: %v", out, err)
	}
	b, _ := json.Marshal(set[0].Result)
	return string(b)
}

// opaEval evaluates query with OPA's Go evaluator (the opa binary) and returns its value as
// resultValue does.
func opaEval(t *testing.T, rego, data, input, query string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{"policy.rego": rego, "data.json": data, "input.json": input} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(testenv.OPAPath(), "eval", "--format", "json",
		"-d", filepath.Join(dir, "policy.rego"), "-d", filepath.Join(dir, "data.json"), "-i", filepath.Join(dir, "input.json"), query)
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("opa eval: %v", err)
	}
	var res struct {
		Result []struct {
			Expressions []struct {
				Value any `json:"value"`
			} `json:"expressions"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res.Result) != 1 {
		t.Fatalf("opa eval output %s: %v", b, err)
	}
	v, _ := json.Marshal(res.Result[0].Expressions[0].Value)
	return string(v)
}

// TestOPAModuleBounded checks that an OPA module gets the same sandbox as any other: a call
// that computes too long is stopped at its deadline, one that builds too large a value fails
// at its memory limit, and the module keeps serving afterwards.
func TestOPAModuleBounded(t *testing.T) {
	const rego = `package bounded

import rego.v1

spin if {
	input.spin
	r := numbers.range(1, 30000)
	count([i | some i in r; some j in r; i == j; i > 1000000]) == 0
}

big if {
	input.big
	count(numbers.range(1, 50000000)) > 0
}

ok := true
`
	bundle := testenv.OPABundle(t, rego, "", "bounded/spin", "bounded/big", "bounded/ok")
	e := newEngine(t, wasm.Limits{CallTimeout: 500 * time.Millisecond, MemoryPages: 1024})
	m := e.load(t, wasm.Spec{Name: "bounded", Wasm: testenv.OPAModule(t, bundle), ABI: wasm.ABIOPA,
		Entrypoints: []string{"bounded/spin", "bounded/big", "bounded/ok"}})

	start := time.Now()
	_, err := m.Call(context.Background(), "bounded/spin", []byte(`{"spin": true}`))
	if !errors.Is(err, wasm.ErrTimeout) {
		t.Errorf("spin: got %v, want ErrTimeout", err)
	}
	t.Logf("spin stopped after %s: %v", time.Since(start).Round(time.Millisecond), err)

	// The same module with room in time but not in memory.
	small := e.load(t, wasm.Spec{Name: "bounded-small", Wasm: testenv.OPAModule(t, bundle), ABI: wasm.ABIOPA,
		Limits: wasm.Limits{CallTimeout: time.Minute, MemoryPages: 256}, Entrypoints: []string{"bounded/big"}})
	_, err = small.Call(context.Background(), "bounded/big", []byte(`{"big": true}`))
	if !errors.Is(err, wasm.ErrMemoryLimit) {
		t.Errorf("big: got %v, want ErrMemoryLimit", err)
	}
	t.Logf("big: %v", err)

	out, err := m.Call(context.Background(), "bounded/ok", []byte(`{}`))
	if err != nil || string(out) != `[{"result":true}]` {
		t.Errorf("after the failures: %s, %v", out, err)
	}
}

// TestOPAModuleRefusedAtLoad: a policy that needs a builtin the host does not provide, an
// entrypoint the module does not have, or imports beyond OPA's is refused before it runs,
// with an error that says which.
func TestOPAModuleRefusedAtLoad(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	const clockRego = `package clock

import rego.v1

deny contains "too late" if time.now_ns() > input.deadline
`
	mod := testenv.OPAModule(t, testenv.OPABundle(t, clockRego, "", "clock/deny"))
	_, err := e.Load(context.Background(), wasm.Spec{Name: "clock", Wasm: mod, ABI: wasm.ABIOPA, Entrypoints: []string{"clock/deny"}})
	if !errors.Is(err, wasm.ErrUngrantedImport) || !strings.Contains(err.Error(), "time.now_ns") || !strings.Contains(err.Error(), "sprintf") {
		t.Errorf("time.now_ns: got %v, want ErrUngrantedImport naming time.now_ns and what is provided", err)
	}

	mod = testenv.OPAModule(t, testenv.OPABundle(t, registriesRego, registriesData, "holdfast/admission/deny"))
	_, err = e.Load(context.Background(), wasm.Spec{Name: "registries", Wasm: mod, ABI: wasm.ABIOPA, Entrypoints: []string{"holdfast/admission/allow"}})
	if !errors.Is(err, wasm.ErrMissingExport) || !strings.Contains(err.Error(), "holdfast/admission/deny") {
		t.Errorf("missing entrypoint: got %v, want ErrMissingExport listing the module's entrypoints", err)
	}

	// The same module under holdfast's ABI: refused, as it imports its memory.
	_, err = e.Load(context.Background(), wasm.Spec{Name: "registries", Wasm: mod, Entrypoints: []string{"admit"}})
	if !errors.Is(err, wasm.ErrInvalidModule) || !strings.Contains(err.Error(), "configure it as a policy of kind opa") {
		t.Errorf("an OPA module under holdfast's ABI: got %v, want it named an OPA module", err)
	}
	// A bundle where a module is expected.
	bundle, err := os.ReadFile(testenv.OPABundle(t, registriesRego, registriesData, "holdfast/admission/deny"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Load(context.Background(), wasm.Spec{Name: "bundle", Wasm: bundle, Entrypoints: []string{"admit"}})
	if !errors.Is(err, wasm.ErrInvalidModule) || !strings.Contains(err.Error(), "an OPA bundle") {
		t.Errorf("a bundle loaded as a module: got %v", err)
	}

	// A holdfast module under OPA's ABI: refused for its imports or exports.
	_, err = e.Load(context.Background(), wasm.Spec{Name: "echo", Wasm: wat(t, "echo"), ABI: wasm.ABIOPA})
	if !errors.Is(err, wasm.ErrMissingExport) && !errors.Is(err, wasm.ErrUngrantedImport) {
		t.Errorf("a holdfast module under OPA's ABI: got %v", err)
	}
}
