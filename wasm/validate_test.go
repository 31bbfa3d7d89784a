package wasm

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// invalidAsWritten are modules invalid in each way that matters to the
// rewrite: an index past the module's own names, once rewritten, what the
// rewrite appends (the counter and stack globals, the checkpoint import and
// helpers, the types it adds). wat2wasm --no-check writes them as they are.
var invalidAsWritten = []struct {
	name, wat string
	// mention is what the rewrite's own refusal names (section and index).
	mention string
}{
	// The attack reproduced on 5efb521, a whole admission policy of the
	// holdfast ABI: accepted, its loop spun for as long as the agent ran.
	{"global.set past the globals (resets the counter)", `(module
  (memory (export "memory") 1)
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64) (loop (global.set 0 (i32.const 100000)) (br 0)) (i64.const 0)))`,
		"code section: function 3: global.set: global index 0 out of range: the module has 0"},
	{"global.get past the globals", `(module (global i32 (i32.const 1)) (func (drop (global.get 1))))`, "code section: function 0: global.get: global index 1 out of range: the module has 1"},
	{"global.get past the globals in an initializer", `(module (global i32 (global.get 5)))`, "global section: global.get: global index 5 out of range"},
	{"call past the functions", `(module (func (call 7)))`, "code section: function 0: call: function index 7 out of range: the module has 1"},
	{"ref.func past the functions", `(module (func (drop (ref.func 9))))`, "code section: function 0: ref.func: function index 9 out of range"},
	{"call_indirect of a type past the types", `(module (table 1 funcref) (func (call_indirect (type 9) (i32.const 0))))`, "call_indirect: type index 9 out of range"},
	{"call_indirect without a table", `(module (type (func)) (func (call_indirect (type 0) (i32.const 0))))`, "call_indirect: table index 0 out of range: the module has 0"},
	{"table.get past the tables", `(module (func (drop (table.get 2 (i32.const 0)))))`, "table.get: table index 2 out of range"},
	{"memory.size without a memory", `(module (func (drop (memory.size))))`, "memory.size: memory index 0 out of range"},
	{"load without a memory", `(module (func (drop (i32.load (i32.const 0)))))`, "memory index 0 out of range"},
	{"memory.init of a data segment past the segments", `(module (memory 1) (func (memory.init 2 (i32.const 0) (i32.const 0) (i32.const 0))))`, "data segment index 2 out of range"},
	{"function of a type past the types", `(module (type (func)) (func (type 4)))`, "type index 4 out of range"},
	{"export of a function past the functions", `(module (func) (export "f" (func 5)))`, "export section: export 0: function index 5 out of range: the module has 1"},
	{"export of a global past the globals (the counter)", `(module (export "g" (global 0)))`, "export section: export 0: global index 0 out of range: the module has 0"},
	{"export of a memory past the memories", `(module (export "m" (memory 0)))`, "export 0: memory index 0 out of range"},
	{"element segment of a function past the functions", `(module (table 1 funcref) (func) (elem (i32.const 0) func 4))`, "element section: element segment 0: function index 4 out of range"},
	{"element segment of a table past the tables", `(module (table 1 funcref) (func) (elem (table 3) (i32.const 0) func 0))`, "element segment 0: table index 3 out of range"},
	{"start function past the functions", `(module (func) (start 3))`, "start section: function index 3 out of range: the module has 1"},
}

// A module invalid as written is refused at Load, by wazero's validation
// of the bytes as written, before any rewrite; and the rewrite refuses it on
// its own too, naming the section and the index. The first case is the
// attack that was reproduced on 5efb521: the module was accepted, its
// global 0 became the engine's checkpoint counter, and a loop resetting it
// was never stopped.
func TestInvalidAsWrittenRefused(t *testing.T) {
	ctx := context.Background()
	e, err := NewEngine(ctx, NewConfig().WithCacheDir(t.TempDir()).WithDefaultLimits(Limits{CallTimeout: 200 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	for _, tc := range invalidAsWritten {
		t.Run(tc.name, func(t *testing.T) {
			b := wasmtest.AssembleWAT(t, tc.wat, "--no-check")
			if _, err := instrumentCheckpoints(b); err == nil || !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("the rewrite alone: got %v, want an error naming %q", err, tc.mention)
			}
			m, err := e.Load(ctx, Spec{Name: "invalid", Wasm: b, Entrypoints: entrypoints(b)})
			if err == nil {
				// What 5efb521 did: show whether the guest can still be
				// stopped, without hanging the test if it cannot.
				done := make(chan error, 1)
				go func() { _, err := m.Call(ctx, "admit", []byte(`{}`)); done <- err }()
				select {
				case err := <-done:
					t.Fatalf("Load accepted a module invalid as written; its call ended with %v", err)
				case <-time.After(5 * time.Second):
					t.Fatal("Load accepted a module invalid as written, and its call was not stopped 5 s after its 200ms deadline")
				}
			}
			if !errors.Is(err, ErrInvalidModule) {
				t.Fatalf("Load: got %v, want ErrInvalidModule", err)
			}
			if msg := err.Error(); !(strings.Contains(msg, "invalid as written") || strings.Contains(msg, "malformed")) || strings.Contains(msg, "\n") {
				t.Errorf("Load's error %q should say the module is invalid as written, on one line", msg)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// Every declared size is checked against the bytes behind it before wazero
// decodes anything: its decoder allocates by the counts a module declares.
// On 5efb521 the locals bomb ended the test binary ("fatal error: runtime:
// out of memory") and the function-count bomb made the agent allocate
// 1 GiB, each from a module of a few dozen bytes.
func TestStructureBombs(t *testing.T) {
	header := "\x00asm\x01\x00\x00\x00"
	sec := func(id byte, body string) string { return string(appendU32([]byte{id}, uint32(len(body)))) + body }
	typeVoid := sec(1, "\x01\x60\x00\x00")
	oneFunc := sec(3, "\x01\x00")
	bombs := []struct{ name, module, mention string }{
		{"function count", header + sec(3, "\xff\xff\xff\xff\x0f"), "function section: a vector of 4294967295 elements"},
		{"locals", header + typeVoid + oneFunc + sec(10, "\x01\x08\x01\xff\xff\xff\xff\x0f\x7f\x0b"), "4294967295 locals, over the limit of 50000"},
		// 100 bodies of 49,999 locals each, in 700 bytes.
		{"locals over many bodies", header + typeVoid + sec(3, "\x64"+strings.Repeat("\x00", 100)) + sec(10, "\x64"+strings.Repeat("\x06\x01\xcf\x86\x03\x7f\x0b", 100)), "more than 4194304 locals in all"},
		{"export count", header + sec(7, "\xff\xff\xff\x7f"), "export section: a vector of"},
		{"import count", header + sec(2, "\xff\xff\xff\x7f"), "import section: a vector of"},
		{"element count", header + sec(9, "\xff\xff\xff\x7f"), "element section: a vector of"},
		{"element's functions", header + sec(4, "\x01\x70\x00\x01") + sec(9, "\x01\x00\x41\x00\x0b\xff\xff\xff\x7f"), "a vector of"},
		{"data segment's size", header + sec(5, "\x01\x00\x01") + sec(11, "\x01\x01\xff\xff\xff\x7f"), "data section"},
		{"code body's size", header + typeVoid + oneFunc + sec(10, "\x01\xff\xff\xff\x7f"), "code section"},
		{"type's parameters", header + sec(1, "\x01\x60\xff\xff\xff\x7f"), "type section"},
		// A malformed name section does not make a module invalid: it is
		// dropped unread, and this module is refused for what it lacks.
		{"name section's functions", header + sec(0, "\x04name\x01\x05\xff\xff\xff\xff\x0f"), `no exported memory named "memory"`},
		{"table's initial size", header + sec(4, "\x01\x70\x00\xff\xff\xff\xff\x0f"), "initial size 4294967295 elements, over holdfast's limit"},
		{"tables", header + sec(4, "\x11"+strings.Repeat("\x70\x00\x01", 17)), "more than 16 tables"},
		{"bodies without functions", header + typeVoid + sec(10, "\x01\x02\x00\x0b"), "1 bodies for 0 functions"},
	}
	ctx := context.Background()
	e, err := NewEngine(ctx, NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	for _, tc := range bombs {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := e.Load(ctx, Spec{Name: "bomb", Wasm: []byte(tc.module)})
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("Load: got %v, want a refusal naming %q", err, tc.mention)
			}
			// The engine's first validation makes wazero's interpreter
			// runtime; a few MiB is that and noise, a bomb is gigabytes.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("refusing a %d-byte module allocated %d MiB", len(tc.module), grew>>20)
			}
		})
	}
}

// entrypoints names admit when the module exports it.
func entrypoints(b []byte) []string {
	if strings.Contains(string(b), "admit") {
		return []string{"admit"}
	}
	return nil
}

// A table lives on the agent's heap, outside the guest's memory limit, and
// table.grow takes any count up to 2^32-1 elements of 8 bytes: the rewrite
// lowers every table's maximum to MaxTableElements, so that a grow past it
// fails (returns -1, as the spec allows any grow to) instead of allocating.
// Without the lowering, the grow of 2^24 elements below took 128 MiB.
func TestTableGrowBounded(t *testing.T) {
	ctx := context.Background()
	e, err := NewEngine(ctx, NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	b := wasmtest.AssembleWAT(t, `(module
  (table $declared 1 funcref)
  (table $large 1 1073741824 funcref)
  (func (export "grow") (param i32) (result i32) (table.grow $declared (ref.null func) (local.get 0)))
  (func (export "grow_large") (param i32) (result i32) (table.grow $large (ref.null func) (local.get 0))))`)
	mod, err := e.InstantiateRawForTest(ctx, b, true)
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close(ctx)
	call := func(export string, n uint32) int32 {
		t.Helper()
		res, err := mod.ExportedFunction(export).Call(ctx, uint64(n))
		if err != nil {
			t.Fatalf("%s(%d): %v", export, n, err)
		}
		return int32(res[0])
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, export := range []string{"grow", "grow_large"} {
		if got := call(export, 1<<24); got != -1 {
			t.Errorf("%s by 2^24 elements returned %d, want -1 (the maximum is %d)", export, got, MaxTableElements)
		}
		if got := call(export, MaxTableElements); got != -1 {
			t.Errorf("%s to one past the maximum returned %d, want -1", export, got)
		}
		if got := call(export, MaxTableElements-1); got != 1 {
			t.Errorf("%s to the maximum returned %d, want 1 (the size before)", export, got)
		}
	}
	runtime.ReadMemStats(&after)
	// Two tables grown to the maximum: 2 x 2 MiB, and the copies of growing.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Errorf("growing the tables allocated %d MiB on the host", grew>>20)
	}
}
