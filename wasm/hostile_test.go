package wasm_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
)

// Each misbehaviour fails its own call with its class, within its deadline,
// and leaves the module (a fresh instance), another module and the engine
// healthy.
func TestHostileWAT(t *testing.T) {
	e := newEngine(t, wasm.Limits{CallTimeout: 500 * time.Millisecond, MemoryPages: 64, LogFlood: 100})
	bystander := e.load(t, wasm.Spec{Name: "echo", Wasm: wat(t, "echo"), Entrypoints: []string{"admit"}})
	hostile := e.load(t, wasm.Spec{Name: "hostile", Wasm: wat(t, "hostile")})
	cases := []struct {
		export  string
		kind    error
		mention string
	}{
		{"loop", wasm.ErrTimeout, "500ms"},
		{"membomb", wasm.ErrMemoryLimit, "64 pages"},
		{"trap", wasm.ErrTrap, "unreachable"},
		{"divzero", wasm.ErrTrap, "divide by zero"},
		{"badptr", wasm.ErrBadPointer, "0x7ffffff0"},
		{"wrapptr", wasm.ErrBadPointer, "0xfffffff0"},
		{"oversized", wasm.ErrOutputTooLarge, "4194304 bytes"},
		{"notjson", wasm.ErrBadOutput, "not a JSON object"},
		{"empty", wasm.ErrBadOutput, "empty"},
		{"logflood", wasm.ErrLogFlood, "log lines"},
		{"hostbadptr", wasm.ErrBadPointer, "holdfast.log"},
	}
	for _, tc := range cases {
		t.Run(tc.export, func(t *testing.T) {
			start := time.Now()
			out, err := hostile.Call(context.Background(), tc.export, []byte(`{}`))
			if out != nil {
				t.Errorf("a failed call returned output %q", out)
			}
			wantKind(t, err, tc.kind)
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("the call took %s", d)
			}
			healthy(t, hostile, "ok", `{}`)
			healthy(t, bystander, "admit", `{"bystander":true}`)
		})
	}
	// Runaway recursion: the engine's stack budget stops it with a trap
	// (TestStackOverflowHostMemory bounds what it costs the host).
	t.Run("stackoverflow", func(t *testing.T) {
		start := time.Now()
		_, err := hostile.Call(context.Background(), "stackoverflow", []byte(`{}`))
		wantKind(t, err, wasm.ErrTrap)
		if !strings.Contains(err.Error(), "stack overflow") {
			t.Errorf("error %q does not say stack overflow", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("the call took %s", d)
		}
		healthy(t, hostile, "ok", `{}`)
		healthy(t, bystander, "admit", `{"bystander":true}`)
	})
	// A module can still be loaded after all that.
	healthy(t, e.load(t, wasm.Spec{Name: "late", Wasm: wat(t, "echo")}), "probe", `{}`)
}

// The same misbehaviours from a Go guest, whose runtime reacts in its own
// way (a panic exits, an out-of-memory throws).
func TestHostileGo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a Go guest several times")
	}
	e := newEngine(t, wasm.Limits{CallTimeout: time.Second})
	bystander := e.load(t, wasm.Spec{Name: "allowed-registries", Wasm: goModule(t, "policies/examples/admission/allowed-registries"), Entrypoints: []string{"admit"}})
	hostile := goModule(t, "wasm/testdata/gohostile")
	quick := e.load(t, wasm.Spec{Name: "gohostile", Wasm: hostile, Entrypoints: []string{"admit"}})
	// The memory bomb gets time enough to reach its limit even on a loaded
	// machine, so that the limit, not the deadline, stops it.
	bounded := e.load(t, wasm.Spec{Name: "gohostile-16mib", Wasm: hostile, Limits: wasm.Limits{MemoryPages: 256, CallTimeout: 30 * time.Second}})
	// With the real clock, sleeps are real (in 10 ms slices): an hour's
	// sleep still ends at the deadline.
	clocked := e.load(t, wasm.Spec{Name: "gohostile-clock", Wasm: hostile, Grants: []wasm.Grant{wasm.GrantClock}})
	call := func(m *wasm.Module, do string) ([]byte, error) {
		return m.Call(context.Background(), "admit", []byte(`{"pod":{},"node":{"name":"n"},"settings":{"do":"`+do+`"}}`))
	}
	cases := []struct {
		do      string
		m       *wasm.Module
		kind    error
		mention string
	}{
		{"panic", quick, wasm.ErrTrap, "policy bug: index out of range"},
		{"membomb", bounded, wasm.ErrMemoryLimit, "256 pages"},
		{"loop", quick, wasm.ErrTimeout, "1s"},
		{"sleep", quick, wasm.ErrTimeout, "1s"},
		{"sleep", clocked, wasm.ErrTimeout, "1s"},
	}
	for _, tc := range cases {
		t.Run(tc.do+"/"+tc.m.Name(), func(t *testing.T) {
			start := time.Now()
			_, err := call(tc.m, tc.do)
			wantKind(t, err, tc.kind)
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("the call took %s", d)
			}
			if _, err := call(tc.m, "nothing"); err != nil {
				t.Fatalf("the module did not recover: %v", err)
			}
			healthy(t, bystander, "admit", `{"pod":{"spec":{"containers":[{"name":"a","image":"nginx"}]}},"node":{"name":"n"},"settings":{"registries":["docker.io"]}}`)
		})
	}
}

// A guest sees no environment, no files and, without the clock grant, a
// fake clock.
func TestGoGuestSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a Go guest")
	}
	e := newEngine(t, wasm.Limits{})
	t.Setenv("HOME", "/root-of-the-host")
	deny := func(m *wasm.Module, do string) string {
		out, err := m.Call(context.Background(), "admit", []byte(`{"pod":{},"node":{"name":"n"},"settings":{"do":"`+do+`"}}`))
		if err != nil {
			t.Fatal(err)
		}
		return decode(t, out)["message"].(string)
	}
	m := e.load(t, wasm.Spec{Name: "gohostile", Wasm: goModule(t, "wasm/testdata/gohostile")})
	if got := deny(m, "env"); strings.Contains(got, "root-of-the-host") || strings.Contains(got, "passwdErr=nil") {
		t.Fatalf("the guest reached the host: %s", got)
	}
	if got := deny(m, "time"); !strings.HasPrefix(got, "2022-01-01") {
		t.Fatalf("without the clock grant the guest's time is %s, want the fake 2022-01-01", got)
	}
	clocked := e.load(t, wasm.Spec{Name: "gohostile-clock", Wasm: goModule(t, "wasm/testdata/gohostile"), Grants: []wasm.Grant{wasm.GrantClock}})
	if got := deny(clocked, "time"); !strings.HasPrefix(got, time.Now().UTC().Format("2006-01-02")) {
		t.Fatalf("with the clock grant the guest's time is %s", got)
	}
}

// Log lines are tagged, rate-limited and counted when dropped.
func TestLogBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a Go guest")
	}
	e := newEngine(t, wasm.Limits{LogBurst: 5, LogRate: 0.001})
	m := e.load(t, wasm.Spec{Name: "chatty", Wasm: goModule(t, "wasm/testdata/gohostile")})
	if _, err := m.Call(context.Background(), "admit", []byte(`{"pod":{},"node":{"name":"n"},"settings":{"do":"log","n":20}}`)); err != nil {
		t.Fatal(err)
	}
	logs := e.logs.String()
	if n := strings.Count(logs, `msg="line `); n != 5 {
		t.Fatalf("%d lines logged, want the burst of 5:\n%s", n, logs)
	}
	if !strings.Contains(logs, "module=chatty") || !strings.Contains(logs, "dropped=15") {
		t.Fatalf("log lacks the module tag or the dropped count:\n%s", logs)
	}
}

// Runaway recursion costs the host a bounded amount of memory: the guest's
// call stack lives on the host heap (wazero's compiler grows it by
// doubling), and the engine's stack budget stops the guest long before
// wazero's own 50 MB ceiling, which cost about 160 MB of allocations per call
// and 1.1 GiB with eight at once. The bound asserted is what policies/ABI.md
// states: 4 x wasm.StackBudgetBytes per call.
func TestStackOverflowHostMemory(t *testing.T) {
	const perCall = 4 * wasm.StackBudgetBytes
	e := newEngine(t, wasm.Limits{CallTimeout: 10 * time.Second, MaxInstances: 8})
	hostile := e.load(t, wasm.Spec{Name: "hostile", Wasm: wat(t, "hostile")})
	allocated := func(calls int, export string) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		errs := make(chan error, calls)
		for range calls {
			go func() {
				_, err := hostile.Call(context.Background(), export, []byte(`{}`))
				errs <- err
			}()
		}
		for range calls {
			err := <-errs
			wantKind(t, err, wasm.ErrTrap)
			if !strings.Contains(err.Error(), "stack overflow") {
				t.Errorf("error %q does not say stack overflow", err)
			}
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	for _, tc := range []struct {
		export string
		calls  int
	}{
		{"stackoverflow", 1},
		{"stackoverflowwide", 1},
		{"stackoverflow", 8},
		{"stackoverflowwide", 8},
	} {
		got := allocated(tc.calls, tc.export)
		t.Logf("%d x %s: %.1f MiB allocated on the host", tc.calls, tc.export, float64(got)/(1<<20))
		if limit := uint64(tc.calls) * perCall; got > limit {
			t.Errorf("%d x %s allocated %d MiB on the host, over the bound of %d MiB", tc.calls, tc.export, got>>20, limit>>20)
		}
	}
	healthy(t, hostile, "ok", `{}`)
}
