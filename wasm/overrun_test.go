package wasm

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// syncBuffer is a log sink the timer's goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The backstop behind the checkpoints: a guest they do not stop (here, a
// module compiled without the rewrite, which only a defect could produce)
// disables its module once its call outlives its deadline and the slack;
// every later call fails at once with ErrTimeout, and the agent's log says
// which module. The guest polls the real clock, so it stays preemptible and
// ends by itself after 3 s.
func TestOverrunDisablesModule(t *testing.T) {
	ctx := context.Background()
	logs := &syncBuffer{}
	e, err := NewEngine(ctx, NewConfig().WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	raw := wasmtest.AssembleWAT(t, `(module
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64) (local $t0 i64)
    (drop (call $clock (i32.const 1) (i64.const 0) (i32.const 0)))
    (local.set $t0 (i64.load (i32.const 0)))
    (loop
      (drop (call $clock (i32.const 1) (i64.const 0) (i32.const 0)))
      (br_if 0 (i64.lt_u (i64.sub (i64.load (i32.const 0)) (local.get $t0)) (i64.const 3000000000))))
    (i64.const 0)))`)
	compiled, err := e.runtime.CompileModule(ctx, raw) // not rewritten: what the backstop is for
	if err != nil {
		t.Fatal(err)
	}
	grants, err := newGrantSet([]Grant{GrantClock})
	if err != nil {
		t.Fatal(err)
	}
	limits := Limits{CallTimeout: 100 * time.Millisecond}.withDefaults(e.cfg.limits)
	m := newModule(e, "runaway", Digest(raw), compiled, ModuleInfo{}, grants, limits)
	defer m.Close(ctx)

	first := make(chan error, 1)
	go func() { _, err := m.Call(ctx, "admit", []byte(`{}`)); first <- err }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m.mu.Lock()
		runaway := m.runaway
		m.mu.Unlock()
		if runaway != "" {
			break
		}
		select {
		case err := <-first:
			t.Fatalf("the guest's call ended (%v) before its module was disabled", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the module was not disabled 20 s after its call's deadline")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	_, err = m.Call(ctx, "admit", []byte(`{}`))
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "module disabled") {
		t.Errorf("a call after the overrun: got %v, want ErrTimeout saying the module is disabled", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a call of the disabled module took %s, want it refused at once", d)
	}
	if !strings.Contains(logs.String(), "Wasm module disabled") || !strings.Contains(logs.String(), "module=runaway") {
		t.Errorf("the log does not name the disabled module:\n%s", logs)
	}
	<-first
}
