package wasm_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// heavyIterationModules are guests whose every loop iteration does a lot
// of work without calling the host: a checkpoint counted per iteration
// lets each of them run 4096 iterations past its deadline. On 5efb521 the
// whole-memory fill overran a 100ms deadline by minutes.
func heavyIterationModules() map[string]string {
	abi := `(memory (export "memory") 1024)
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))`
	var body strings.Builder
	for range 30_000 {
		body.WriteString("(i32.store (i32.const 64) (i32.add (i32.load (i32.const 64)) (i32.const 1)))\n")
	}
	return map[string]string{
		// 30,000 loads and stores an iteration.
		"large body": fmt.Sprintf(`(module %s
  (func (export "admit") (param i32 i32) (result i64) (loop %s (br 0)) (i64.const 0)))`, abi, body.String()),
		// A fill of the whole 64 MiB memory an iteration.
		"memory.fill": fmt.Sprintf(`(module %s
  (func (export "admit") (param i32 i32) (result i64)
    (loop (memory.fill (i32.const 0) (i32.const 7) (i32.const 67108864)) (br 0)) (i64.const 0)))`, abi),
		"memory.copy": fmt.Sprintf(`(module %s
  (func (export "admit") (param i32 i32) (result i64)
    (loop (memory.copy (i32.const 0) (i32.const 33554432) (i32.const 33554432)) (br 0)) (i64.const 0)))`, abi),
		// Straight-line code between two checkpoints: a function entry
		// followed by fills, no loop at all, called from a loop.
		"fills in a called function": fmt.Sprintf(`(module %s
  (func $fills %s)
  (func (export "admit") (param i32 i32) (result i64) (loop (call $fills) (br 0)) (i64.const 0)))`, abi,
			strings.Repeat("(memory.fill (i32.const 0) (i32.const 7) (i32.const 67108864))\n", 64)),
	}
}

// A call ends within its deadline plus a small slack, whatever one
// iteration of the guest's loops costs. The slack asserted here is far
// above what the checkpoints allow (wasm/RATIONALE.md), so that a loaded
// machine does not fail the test; a regression overruns it by seconds.
func TestDeadlineHoldsAgainstHeavyIterations(t *testing.T) {
	const timeout, slack = 100 * time.Millisecond, 2 * time.Second
	e := newEngine(t, wasm.Limits{CallTimeout: timeout, MemoryPages: 1024})
	for name, src := range heavyIterationModules() {
		t.Run(name, func(t *testing.T) {
			m := e.load(t, wasm.Spec{Name: "heavy", Wasm: wasmtest.AssembleWAT(t, src), Entrypoints: []string{"admit"}})
			// While the guest runs, the rest of the process must go on:
			// a guest that never leaves compiled code holds up every
			// garbage collection, and with it every goroutine that
			// allocates (the agent's Lease, status, everything).
			stop := make(chan struct{})
			gcs := make(chan time.Duration, 1)
			go func() {
				var longest time.Duration
				defer func() { gcs <- longest }()
				for {
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					t0 := time.Now()
					runtime.GC()
					longest = max(longest, time.Since(t0))
				}
			}()
			start := time.Now()
			done := make(chan error, 1)
			go func() { _, err := m.Call(context.Background(), "admit", []byte(`{}`)); done <- err }()
			select {
			case err := <-done:
				took := time.Since(start)
				close(stop)
				longestGC := <-gcs
				wantKind(t, err, wasm.ErrTimeout)
				if took > timeout+slack {
					t.Errorf("the call took %s, over its deadline of %s plus %s", took, timeout, slack)
				}
				if longestGC > slack {
					t.Errorf("a garbage collection beside the guest took %s", longestGC)
				}
				t.Logf("stopped after %s; the longest garbage collection beside it took %s", took, longestGC)
			case <-time.After(60 * time.Second):
				t.Fatalf("the call was not stopped 60 s after its %s deadline", timeout)
			}
		})
	}
}
