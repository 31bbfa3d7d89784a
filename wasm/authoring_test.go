package wasm_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/wasm"
)

// What policies/ABI.md tells authors about failures they will meet first.

// A refused memory.grow returns -1 to the guest; the call fails only if the
// guest then fails.
func TestRefusedGrowReturnsMinusOne(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: "growrefused", Wasm: wat(t, "growrefused"), Entrypoints: []string{"admit"}})
	out, err := m.Call(context.Background(), "admit", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := decode(t, out)["grow"]; got != float64(-1) {
		t.Fatalf("memory.grow past the limit returned %v to the guest, want -1", got)
	}
}

// A bump allocator whose free does nothing leaks every input: alloc fails
// once its memory is used up, and the call with it; the fresh instance that
// replaces the broken one starts over.
func TestLeakingAllocatorFails(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: "bumpleak", Wasm: wat(t, "bumpleak"), Entrypoints: []string{"admit"}})
	input := []byte(`{"pad":"` + strings.Repeat("x", 990) + `"}`) // 1000 bytes
	// One 64 KiB page, the first 1024 bytes reserved: 64 inputs fit.
	for i := range 64 {
		if _, err := m.Call(context.Background(), "admit", input); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	_, err := m.Call(context.Background(), "admit", input)
	wantKind(t, err, wasm.ErrBadPointer)
	if !strings.Contains(err.Error(), "alloc(1000) returned 0") {
		t.Fatalf("error %q does not say alloc returned 0", err)
	}
	healthy(t, m, "admit", `{}`)
}

// A module that fails to instantiate without running any code of its own
// (here a data segment past its memory) is not said to fail in _initialize,
// which it does not have.
func TestInstantiateFailureWithoutInitialize(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	_, err := e.Load(context.Background(), wasm.Spec{Name: "badsegment", Wasm: wat(t, "badsegment"), Entrypoints: []string{"admit"}})
	wantKind(t, err, wasm.ErrInvalidModule)
	if strings.Contains(err.Error(), "_initialize") || !strings.Contains(err.Error(), "instantiate") {
		t.Fatalf("error %q: want an instantiation error that does not blame _initialize", err)
	}
}

// An empty file and a text-format module are named as such, by Load and by
// Inspect, rather than as an invalid magic number.
func TestNotABinaryModule(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	text := []byte(";; a policy\n(module\n  (memory (export \"memory\") 1))\n")
	for _, tc := range []struct {
		name    string
		b       []byte
		mention string
	}{
		{"empty", nil, "empty file"},
		{"text format", text, "wat2wasm"},
		{"text format, leading space", append([]byte("\n  \t"), text[12:]...), "wat2wasm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Load(context.Background(), wasm.Spec{Name: "p.wasm", Wasm: tc.b})
			wantKind(t, err, wasm.ErrInvalidModule)
			if !strings.Contains(err.Error(), tc.mention) || strings.Contains(err.Error(), "magic") {
				t.Errorf("load: error %q, want it to mention %q", err, tc.mention)
			}
			_, err = e.Inspect(context.Background(), "p.wasm", tc.b)
			wantKind(t, err, wasm.ErrInvalidModule)
			if !strings.Contains(err.Error(), tc.mention) || strings.Contains(err.Error(), "magic") {
				t.Errorf("inspect: error %q, want it to mention %q", err, tc.mention)
			}
		})
	}
}

// response_read into a buffer shorter than the answer copies what fits and
// discards the rest: a second read gets nothing.
func TestResponseReadShortBuffer(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: "shortread", Wasm: wat(t, "shortread"), Grants: []wasm.Grant{wasm.GrantHTTP}, Entrypoints: []string{"admit"}})
	out, err := m.Call(context.Background(), "admit", []byte(`not a request`))
	if err != nil {
		t.Fatal(err)
	}
	got := decode(t, out)
	if n, _ := strconv.Atoi(got["n"].(string)); n <= 10 || got["k1"] != "010" || got["k2"] != "000" {
		t.Fatalf("answer length, first and second read = %v, want n > 10, 10, 0", got)
	}
}
