package wasm

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// FuzzInstrument holds the checkpoint rewrite to its promise on modules the
// fuzzer derives from the spec suite's: a module wazero refuses, the
// engine's load path (Engine.compile) refuses; a module wazero accepts, the
// engine accepts, and it computes the same. "The same": instantiated on
// both sides (the reference is plain wazero, stopped at a deadline by
// WithCloseOnContextDone; the instrumented side must stop by its
// checkpoints), each exported function whose parameters are numbers (or
// references, passed null) is called in turn with arguments derived from
// argSeed (all zero for 0), and the calls return the same results or trap
// alike; then the exported globals and memories hold the same. A call that
// times out on both sides ends the comparison (inconclusive); on one side
// only, the input is run again with a longer deadline, and fails if one
// side still times out alone. The instrumented side must always stop: a
// call still running well past its deadline fails the input.
func FuzzInstrument(f *testing.F) {
	dir := wasmtest.SpecSuiteDir(f, "v2")
	host, err := os.ReadFile(filepath.Join(dir, "..", "..", "testdata", "spectest.wasm"))
	if err != nil {
		f.Fatalf("the suite's spectest module: %v", err)
	}
	for _, seed := range fuzzInstrumentSeeds(f, dir) {
		f.Add(seed, uint64(0))
	}
	f.Fuzz(func(t *testing.T, module []byte, argSeed uint64) {
		if reason := fuzzTooCostly(module); reason != "" {
			// skip-ok: a fuzz input too costly to run
			t.Skip(reason)
		}
		// A first run with a short deadline keeps the fuzzer fast on the
		// many inputs that loop for ever; a timeout on one side alone is
		// then run again, with a deadline that the machine's load cannot
		// explain away.
		for _, deadline := range []time.Duration{25 * time.Millisecond, time.Second} {
			if !compareInstrumented(t, host, module, argSeed, deadline) {
				return
			}
		}
		t.Fatal("one side timed out alone, twice")
	})
}

// fuzzMemoryPages is both sides' memory ceiling in the fuzz target (4 MiB),
// so that a module growing its memory costs the fuzzer little.
const fuzzMemoryPages = 64

// fuzzInstrumentSeeds returns modules of the spec suite (TestSpecSuite runs
// them all): the first two of every script (a module, then most often a
// module or a module the script expects refused) when fuzzing, of every
// eighth script in an ordinary test run; those of 4 KiB or less, as the
// fuzzer compiles each input twice, its first pass over the seeds (its
// baseline) included.
func fuzzInstrumentSeeds(f *testing.F, dir string) [][]byte {
	fuzzing := false
	if fl := flag.Lookup("test.fuzz"); fl != nil && fl.Value.String() != "" {
		fuzzing = true
	}
	scripts, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	var seeds [][]byte
	for i, script := range scripts {
		if !fuzzing && i%8 != 0 {
			continue
		}
		for _, n := range []string{".0.wasm", ".1.wasm"} {
			b, err := os.ReadFile(strings.TrimSuffix(script, ".json") + n)
			if errors.Is(err, fs.ErrNotExist) { // the text of a malformed module
				continue
			}
			if err != nil {
				f.Fatal(err)
			}
			if len(b) <= 4<<10 {
				seeds = append(seeds, b)
			}
		}
	}
	return seeds
}

// fuzzTooCostly says why the fuzzer should not run a module, or returns "":
// what would make wazero allocate gigabytes of the test's memory rather
// than test the rewrite. wazero's decoder allocates every vector at the
// length the module declares before it reads the elements, so that a
// module of a few bytes declaring 2^32-1 of something (names, imports,
// element expressions, locals) takes it gigabytes, or kills the process
// ("fatal error: runtime: out of memory"); an engine that hands untrusted
// bytes to wazero must check those lengths first. Declared tables by the
// million and table.grow (2^32-1 references are 32 GiB of Go heap, outside
// any memory limit) are left out too.
func fuzzTooCostly(b []byte) string {
	if bytes.Contains(b, []byte{0xfc, 0x0f}) {
		return "may contain table.grow"
	}
	// wazero decodes section by section until the first error, each with
	// one reader over the whole module, which this walk mirrors: a length
	// is implausible if it is more than what is left of the module.
	r := &reader{b: b, off: min(8, len(b))}
	for r.more() {
		id, size := r.byte(), r.u32()
		if r.err != nil {
			break
		}
		start := r.off
		if reason := fuzzSectionTooCostly(id, size, &reader{b: b, off: start}); reason != "" {
			return fmt.Sprintf("section %d: %s", id, reason)
		}
		if uint64(size) > uint64(len(b)-start) {
			break
		}
		r.off = start + int(size)
	}
	return ""
}

// fuzzMost is the most elements of a table, locals of a function, or
// entries of a vector the fuzz target lets wazero allocate for.
const fuzzMost = 1 << 16

// fuzzSectionTooCostly walks a section of size bytes from r as far as it
// understands it (a malformed rest is wazero's to refuse, which it does
// before it reads the next section) and says what in it is too costly, or
// returns "".
func fuzzSectionTooCostly(id byte, size uint32, r *reader) string {
	var c lengthCheck
	more := func() bool { return r.err == nil && c.bad == "" }
	expr := func() { _ = skipConstExpr(r) }
	switch id {
	case secCustom:
		start := r.off
		if name := r.bytes(c.count(r, "custom section name")); string(name) != "name" {
			break
		}
		// Like wazero's decodeNameSection: the known subsections are read
		// whatever their size says, until the section's size (counted in
		// an unsigned integer that a wrong size wraps round) runs out.
		limit := uint64(size) - uint64(r.off-start)
		for limit > 0 && r.more() && c.bad == "" {
			sub := r.byte()
			before := r.off
			subsize := r.u32()
			limit -= 1 + uint64(r.off-before)
			if sub <= 2 {
				fuzzNamesTooCostly(&c, sub, r)
			} else {
				r.bytes(subsize)
			}
			limit -= uint64(subsize)
		}
	case secType:
		for n := c.count(r, "types"); n > 0 && more(); n-- {
			r.byte()
			c.skip(r, "parameters")
			c.skip(r, "results")
		}
	case secImport:
		for n := c.count(r, "imports"); n > 0 && more(); n-- {
			c.skip(r, "import module")
			c.skip(r, "import name")
			switch r.byte() {
			case 0:
				r.u32()
			case 1:
				r.byte()
				if fuzzLimitsMin(r) > fuzzMost {
					return "imports a big table"
				}
			case 2:
				r.limits()
			case 3:
				r.byte()
				r.byte()
			default:
				return c.bad
			}
		}
	case secFunction, 5, secGlobal: // functions, memories, globals
		c.count(r, "entries")
	case 4: // tables
		for n := c.count(r, "tables"); n > 0 && more(); n-- {
			r.byte()
			if fuzzLimitsMin(r) > fuzzMost {
				return "declares a big table"
			}
		}
	case secExport:
		for n := c.count(r, "exports"); n > 0 && more(); n-- {
			c.skip(r, "export name")
			r.byte()
			r.u32()
		}
	case secElem:
		for n := c.count(r, "element segments"); n > 0 && more(); n-- {
			flags := r.u32()
			if flags > 7 {
				return c.bad
			}
			if flags&2 != 0 && flags&1 == 0 {
				r.u32()
			}
			if flags&1 == 0 {
				expr()
			}
			if flags&3 != 0 {
				r.byte()
			}
			for m := c.count(r, "elements"); m > 0 && more(); m-- {
				if flags&4 == 0 {
					r.u32()
				} else {
					expr()
				}
			}
		}
	case secCode:
		for n := c.count(r, "function bodies"); n > 0 && more(); n-- {
			fr := &reader{b: r.bytes(c.count(r, "function body"))}
			var locals uint64
			for g := fr.u32(); g > 0 && fr.err == nil; g-- {
				locals += uint64(fr.u32())
				fr.byte()
			}
			if locals > fuzzMost {
				return fmt.Sprintf("%d locals in a function", locals)
			}
		}
	case 11: // data
		for n := c.count(r, "data segments"); n > 0 && more(); n-- {
			switch r.u32() {
			case 0:
				expr()
			case 1:
			case 2:
				r.u32()
				expr()
			default:
				return c.bad
			}
			c.skip(r, "data bytes")
		}
	}
	return c.bad
}

// fuzzNamesTooCostly checks the lengths of a subsection of the name
// section.
func fuzzNamesTooCostly(c *lengthCheck, sub byte, r *reader) {
	switch sub {
	case 0:
		c.skip(r, "module name")
	case 1:
		for n := c.count(r, "function names"); n > 0 && r.err == nil && c.bad == ""; n-- {
			r.u32()
			c.skip(r, "function name")
		}
	case 2:
		for n := c.count(r, "functions' local names"); n > 0 && r.err == nil && c.bad == ""; n-- {
			r.u32()
			for m := c.count(r, "local names"); m > 0 && r.err == nil && c.bad == ""; m-- {
				r.u32()
				c.skip(r, "local name")
			}
		}
	}
}

// lengthCheck reads lengths and keeps the first that is implausible: more
// than the bytes left, each element taking one at least.
type lengthCheck struct{ bad string }

func (c *lengthCheck) count(r *reader, what string) uint32 {
	n := r.u32()
	if r.err == nil && uint64(n) > uint64(len(r.b)-r.off) && c.bad == "" {
		c.bad = fmt.Sprintf("%s of %d, in %d bytes", what, n, len(r.b)-r.off)
	}
	return n
}

func (c *lengthCheck) skip(r *reader, what string) { r.bytes(c.count(r, what)) }

func fuzzLimitsMin(r *reader) uint32 {
	flags := r.byte()
	lo := r.u32()
	if flags&1 != 0 {
		r.u32()
	}
	return lo
}

// fuzzSide is one side of the comparison: a runtime with the suite's
// spectest module and, once loaded, the module under test.
type fuzzSide struct {
	name string
	rt   wazero.Runtime
	mod  api.Module
}

// fuzzInstrumentedSide names the engine's side in messages.
const fuzzInstrumentedSide = "the engine"

// fuzzOutcome is what a call (or the instantiation) did on one side.
type fuzzOutcome struct {
	results  []uint64
	err      error
	timedOut bool
}

func (o fuzzOutcome) String() string {
	switch {
	case o.timedOut:
		return "timed out"
	case o.err != nil:
		return fmt.Sprintf("failed with %q", firstLine(o.err.Error()))
	}
	return fmt.Sprintf("returned %#x", o.results)
}

// compareInstrumented loads and runs module on both sides with deadline
// per call, fails t on a difference, and says whether one side alone timed
// out (the caller then tries a longer deadline).
func compareInstrumented(t *testing.T, host, module []byte, argSeed uint64, deadline time.Duration) (oneSidedTimeout bool) {
	ctx := context.Background()
	ref := &fuzzSide{name: "the reference", rt: wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().
		WithCoreFeatures(api.CoreFeaturesV2).
		WithMemoryLimitPages(fuzzMemoryPages).
		WithCloseOnContextDone(true))}
	defer ref.rt.Close(ctx)
	eng, err := NewEngine(ctx, NewConfig().WithMemoryCeilingPages(fuzzMemoryPages))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	ins := &fuzzSide{name: fuzzInstrumentedSide, rt: eng.runtime}
	for _, s := range []*fuzzSide{ref, ins} {
		if _, err := s.rt.InstantiateWithConfig(ctx, host, wazero.NewModuleConfig().WithName("spectest")); err != nil {
			t.Fatal(err)
		}
	}

	// wazero's validation panics on some invalid modules: on the reference
	// that is a refusal; the engine must refuse them too, with an error.
	// The reference compiles the module without its name sections: wazero
	// refuses a module whose name section it cannot read, where the spec
	// (5.5.3) says errors in a custom section's data must not make a module
	// invalid, and the engine drops such a section. Names do not change
	// what a module computes; a name section the engine rewrites wrongly
	// still shows, as a module the engine refuses and the reference accepts.
	var refCompiled, insCompiled wazero.CompiledModule
	refErr := fuzzNoPanic(func() (err error) {
		refCompiled, err = ref.rt.CompileModule(ctx, withoutNameSections(module))
		return err
	})
	insErr := fuzzNoPanic(func() (err error) {
		insCompiled, _, err = eng.compile(ctx, "fuzz", module, ABIHoldfast)
		return err
	})
	if p := (fuzzPanic{}); errors.As(insErr, &p) {
		t.Fatalf("the engine's load path panics (%v); wazero: %v", p.value, refErr)
	}
	switch {
	case refErr != nil && insErr == nil:
		t.Fatalf("the engine accepts a module wazero refuses (%v)", firstLine(refErr.Error()))
	case refErr == nil && insErr != nil && errors.Is(insErr, ErrUngrantedImport):
		return false // it imports the engine's own checkpoint module
	case refErr == nil && insErr != nil && dataCountCutAtEnd(module):
		// wazero reads the data count from the module's reader, not the section's,
		// and takes an end of input as "no count" (v1.12.0, binary/section.go:302):
		// a data count section that ends the module with its count cut short (empty,
		// or a LEB128 whose last byte says more follow) loads. The spec calls it
		// malformed (a section's content is its u32); the engine refuses it, which
		// costs nobody a module a compiler writes.
		return false
	case refErr == nil && insErr != nil:
		t.Fatalf("the engine refuses a module wazero accepts: %v", insErr)
	case refErr != nil:
		return false
	}

	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions()
	outcomes := map[*fuzzSide]fuzzOutcome{}
	for _, s := range []*fuzzSide{ref, ins} {
		compiled := refCompiled
		if s == ins {
			compiled = insCompiled
		}
		outcomes[s] = fuzzRun(t, s, deadline, func(ctx context.Context) ([]uint64, error) {
			m, err := s.rt.InstantiateModule(ctx, compiled, cfg)
			s.mod = m
			return nil, err
		})
	}
	if stop, oneSided := fuzzCompare(t, "instantiation", nil, outcomes[ref], outcomes[ins]); stop {
		return oneSided
	}

	for i, name := range fuzzCallable(ref.mod) {
		fn := ref.mod.ExportedFunction(name)
		def := fn.Definition()
		args := fuzzArgs(def.ParamTypes(), argSeed+uint64(i))
		for _, s := range []*fuzzSide{ref, ins} {
			outcomes[s] = fuzzRun(t, s, deadline, func(ctx context.Context) ([]uint64, error) {
				f := s.mod.ExportedFunction(name)
				if f == nil {
					return nil, fmt.Errorf("no export %q", name)
				}
				return f.Call(ctx, args...)
			})
		}
		what := fmt.Sprintf("%s(%#x)", name, args)
		if stop, oneSided := fuzzCompare(t, what, def.ResultTypes(), outcomes[ref], outcomes[ins]); stop {
			return oneSided
		}
	}

	for _, name := range exportedGlobals(module) {
		rg, ig := ref.mod.ExportedGlobal(name), ins.mod.ExportedGlobal(name)
		if rg == nil || ig == nil {
			t.Fatalf("global %q is not exported on both sides", name)
		}
		same := rg.Get() == ig.Get() // of a v128, Get has the low half only
		if t := rg.Type(); t != valueTypeV128 {
			same = sameResults([]api.ValueType{t}, []uint64{rg.Get()}, []uint64{ig.Get()})
		}
		if !same {
			t.Fatalf("global %q differs after the calls: the reference has %#x, the engine %#x", name, rg.Get(), ig.Get())
		}
	}
	for name := range refCompiled.ExportedMemories() {
		rm, im := ref.mod.ExportedMemory(name), ins.mod.ExportedMemory(name)
		if rm == nil || im == nil {
			t.Fatalf("memory %q is not exported on both sides", name)
		}
		rb, _ := rm.Read(0, rm.Size())
		ib, _ := im.Read(0, im.Size())
		if !bytes.Equal(rb, ib) {
			t.Fatalf("memory %q differs after the calls (%d and %d bytes)", name, len(rb), len(ib))
		}
	}
	return false
}

// fuzzNoPanic returns f's error, or a panic of f as a fuzzPanic.
func fuzzNoPanic(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fuzzPanic{r}
		}
	}()
	return f()
}

type fuzzPanic struct{ value any }

func (p fuzzPanic) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// fuzzRun runs f on one side with deadline. The instrumented side must stop
// by its checkpoints: a call still running long past its deadline fails
// the test. Such a call spins in compiled code, which the Go runtime cannot
// preempt: the next garbage collection would wait for it to stop, and the
// whole test binary with it, watchdog included. So the garbage collector is
// off while the instrumented side runs, and a call that does not stop
// panics the test binary: its goroutine would spin on for as long as the
// binary runs, the next garbage collection would hang it, and a second such
// goroutine would take the last core of two. (The fuzzer records the input
// of a panicking worker like that of a failing one.) The reference stops by
// wazero's WithCloseOnContextDone, whose checks are also points where the
// runtime can preempt it.
func fuzzRun(t *testing.T, s *fuzzSide, deadline time.Duration, f func(context.Context) ([]uint64, error)) fuzzOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if s.name == fuzzInstrumentedSide {
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
	}
	done := make(chan fuzzOutcome, 1)
	go func() {
		res, err := f(ctx)
		var exit *sys.ExitError
		timedOut := errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded
		done <- fuzzOutcome{results: res, err: err, timedOut: timedOut}
	}()
	const grace = 10 * time.Second
	watchdog := time.NewTimer(deadline + grace)
	defer watchdog.Stop()
	select {
	case o := <-done:
		return o
	case <-watchdog.C:
		msg := fmt.Sprintf("%s: %s did not stop %s after its deadline of %s: a loop or a call without a checkpoint", t.Name(), s.name, grace, deadline)
		t.Error(msg)
		panic(msg)
	}
}

// fuzzCompare fails t if the two sides' outcomes differ, and says whether
// to stop comparing (a timeout, a module that did not instantiate) and if
// so whether one side alone timed out.
func fuzzCompare(t *testing.T, what string, types []api.ValueType, ref, ins fuzzOutcome) (stop, oneSidedTimeout bool) {
	t.Helper()
	switch {
	case ref.timedOut && ins.timedOut:
		return true, false
	case ref.timedOut || ins.timedOut:
		return true, true
	case ins.err != nil && ref.err == nil && isStackBudgetTrap(ins.err):
		// The rewrite's stack budget is smaller than wazero's own limit,
		// by design (StackBudgetBytes): inconclusive.
		return true, false
	case (ref.err == nil) != (ins.err == nil):
		t.Fatalf("%s: the reference %s, the engine %s", what, ref, ins)
	case ref.err != nil:
		if strings.Contains(ref.err.Error(), "stack overflow") && strings.Contains(ins.err.Error(), "stack overflow") {
			return true, false
		}
		if firstLine(ref.err.Error()) != firstLine(ins.err.Error()) {
			t.Fatalf("%s: the reference %s, the engine %s", what, ref, ins)
		}
		// After a trap the engine would replace the instance; and the
		// instrumented one's stack budget may be short of what a trap
		// unwound (see leftOutSpent in spectest_test.go).
		return true, false
	case types != nil && !sameResults(types, ref.results, ins.results):
		t.Fatalf("%s: the reference %s, the engine %s", what, ref, ins)
	}
	return false, false
}

// fuzzCallable lists, sorted, the exported functions whose parameters are
// all numbers or references, at most 32.
func fuzzCallable(m api.Module) []string {
	var names []string
	for name, def := range m.ExportedFunctionDefinitions() {
		ok := true
		for _, p := range def.ParamTypes() {
			switch p {
			case api.ValueTypeI32, api.ValueTypeI64, api.ValueTypeF32, api.ValueTypeF64, valueTypeV128, api.ValueTypeExternref, valueTypeFuncref:
			default:
				ok = false
			}
		}
		if ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names[:min(len(names), 32)]
}

// fuzzArgs derives arguments from seed: all zero for seed 0, otherwise a
// mix of small numbers and arbitrary bits; references are always null.
func fuzzArgs(types []api.ValueType, seed uint64) []uint64 {
	var args []uint64
	for i, p := range types {
		words := 1
		if p == valueTypeV128 {
			words = 2
		}
		for w := 0; w < words; w++ {
			var v uint64
			if seed != 0 && p != api.ValueTypeExternref && p != valueTypeFuncref {
				v = splitmix64(seed ^ uint64(i)<<8 ^ uint64(w))
				if v&3 == 0 {
					v = v >> 2 % 16
				}
				if p == api.ValueTypeI32 || p == api.ValueTypeF32 {
					v = uint64(uint32(v))
				}
			}
			args = append(args, v)
		}
	}
	return args
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// exportedGlobals lists the names of a module's exported globals.
func exportedGlobals(b []byte) []string {
	secs, err := splitSections(b)
	if err != nil {
		return nil
	}
	var names []string
	for _, s := range secs {
		if s.id != secExport {
			continue
		}
		r := &reader{b: s.body}
		for n := r.u32(); n > 0 && r.err == nil; n-- {
			name := r.name()
			if kind := r.byte(); kind == 3 {
				names = append(names, name)
			}
			r.u32()
		}
	}
	return names
}

// dataCountCutAtEnd reports whether module's last section is a data count
// section whose content is not a whole unsigned LEB128 (see compareInstrumented).
func dataCountCutAtEnd(module []byte) bool {
	secs, err := splitSections(module)
	if err != nil || len(secs) == 0 {
		return false
	}
	last := secs[len(secs)-1]
	if last.id != secDataCount {
		return false
	}
	for _, c := range last.body {
		if c&0x80 == 0 {
			return false // a LEB128's last byte: the count is whole
		}
	}
	return true // empty, or every byte says more follow
}
