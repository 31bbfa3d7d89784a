package wasm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// TestSpecSuite proves the checkpoint rewrite (checkpoint.go) behaviour-
// preserving on code no one here wrote: the WebAssembly spec test suite, as
// wazero keeps it (the 2.0 core features, which the engine enables), run
// command by command on two sides. The reference is plain wazero with the
// engine's features and memory ceiling (specReferenceConfig); the other side
// is the engine's load path, Engine.compile (the rewrite, then wazero's
// compile of its output), instantiated in the engine's runtime beside its
// checkpoint host module.
//
//   - module: loads on both sides, with the same exported functions;
//   - assert_return, action: no trap on either side, the results the script
//     expects on both (action: the same results on both);
//   - assert_trap: both sides trap with the same message; assert_exhaustion:
//     both run out of stack (the rewrite's stack budget counts);
//   - assert_invalid, assert_malformed, assert_unlinkable,
//     assert_uninstantiable: the engine refuses the module exactly when
//     wazero does, at the same step (compile or instantiation).
//
// Modules that import the suite's "spectest" module get it on both sides
// (wazero's spectest.wasm, not rewritten: it stands for the host), and a
// registered module is importable by later modules of its side, so nothing
// is left out for its imports. What is left out, and why, is counted and
// logged at the end.
//
// The 148 scripts run in parallel, each with its own runtimes; the suite
// takes about 6 s of CPU, 30 s under -race (8 s and 52 s on 2 shared cores,
// 2026-12-05), half of it in the few scripts -short leaves out
// (specHeavyScripts).
func TestSpecSuite(t *testing.T) {
	dir := wasmtest.SpecSuiteDir(t, "v2")
	scripts, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.ReadFile(filepath.Join(dir, "..", "..", "testdata", "spectest.wasm"))
	if err != nil {
		t.Fatalf("the suite's spectest module: %v", err)
	}
	tally := &specTally{counts: map[specOutcome]int{}}
	start := time.Now()
	t.Run("v2", func(t *testing.T) {
		for _, path := range scripts {
			name := strings.TrimSuffix(filepath.Base(path), ".json")
			if testing.Short() && specHeavyScripts[name] {
				tally.add("script", leftOutShort)
				continue
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				runSpecScript(t, path, host, tally)
			})
		}
	})
	t.Logf("spec suite v2 (%s), %d scripts in %s:\n%s", dir, len(scripts), time.Since(start).Round(time.Millisecond), tally)
}

// specHeavyScripts take most of the suite's time (together a third of it
// without -race, half with it: growing memories by megabytes, compiling
// functions of a thousand locals, recursing until the stack runs out); a
// run with -short leaves them out.
var specHeavyScripts = map[string]bool{"memory_grow": true, "memory_init": true, "memory_copy": true, "skip-stack-guard-page": true}

// specMemoryPages is the memory ceiling of both sides: wazero's default and
// the most the spec allows, so that the scripts' memory.grow expectations
// hold. (The engine's default ceiling is lower; a lower ceiling changes
// both sides alike.)
const specMemoryPages = 65536

// specCallTimeout bounds a call on the instrumented side (its checkpoints
// stop it); the reference is not stoppable. Spec calls take microseconds,
// runaway recursion on the reference under -race some seconds.
const specCallTimeout = 2 * time.Minute

// specReferenceConfig is the runtime configuration NewEngine gives wazero
// (its features and memory ceiling), without the compilation cache, on
// wazero's interpreter: plain wazero as the engine would run a module if it
// did not rewrite it. The interpreter decodes and validates with the same
// code as the compiler (the verdicts compared are the same), passes the same
// suite, and costs far less here: it compiles nothing, and it stops runaway
// recursion at 2000 frames, where the compiler first grows its stack to
// 50 MB (20-30 s for each assert_exhaustion under -race). The engine's
// side compiles, as in production.
func specReferenceConfig() wazero.RuntimeConfig {
	return wazero.NewRuntimeConfigInterpreter().
		WithCoreFeatures(api.CoreFeaturesV2).
		WithMemoryLimitPages(specMemoryPages)
}

// Why a command is not compared. Each is a legitimate exclusion:
const (
	// The script asserts that a text module (.wat) is malformed: a test of
	// a text parser. Neither side reads the text format (the engine refuses
	// it before anything else, notBinary), so there is nothing of the
	// rewrite to compare. The binary modules the suite asserts malformed
	// are all compared.
	leftOutText = "text format (a test of the text parser; both sides read binary only)"
	// A call on the instrumented side ran out of the rewrite's stack budget
	// (assert_exhaustion). The rewrite gives back a frame's budget when the
	// frame returns, not when a trap unwinds it, so the instance's budget
	// stays spent and every later call on it traps. The engine never calls
	// an instance again after a failed call (it closes it and instantiates
	// a fresh one, module.go), so no guest meets that state; the scripts
	// carry on with the same instance, which is a state the engine does
	// not have.
	leftOutSpent = "after an exhaustion on the same instance (its stack budget stays spent; the engine replaces an instance after any failure)"
)

// leftOutShort counts the scripts a run with -short leaves out.
const leftOutShort = "left out under -short (specHeavyScripts)"

// specOutcome is a line of the tally: a command type and what became of it.
type specOutcome struct{ command, outcome string }

// Outcomes other than a reason to leave out.
const (
	outcomeCompared  = "compared"
	outcomeMismatch  = "compared, differ (failed)"
	outcomeNotLoaded = "not run: its module failed (reported above)"
	// The instrumented instance ran out of stack budget where the script
	// expected no exhaustion (a failure, reported).
	outcomeSpentInFailure = "not run: its instance ran out of stack budget in a failed command (reported above)"
	// The reference itself does not do what the script says (wazero's
	// known deviations, e.g. an element segment out of table bounds after
	// instantiation, linking.wast); the engine is held to the reference.
	outcomeRefDeviates = "of those, the reference deviates from the script"
)

// specTally counts the commands of every script by outcome.
type specTally struct {
	mu     sync.Mutex // protects counts
	counts map[specOutcome]int
}

func (s *specTally) add(command, outcome string) {
	s.mu.Lock()
	s.counts[specOutcome{command, outcome}]++
	s.mu.Unlock()
}

func (s *specTally) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]specOutcome, 0, len(s.counts))
	for k := range s.counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b specOutcome) int {
		if c := strings.Compare(a.command, b.command); c != 0 {
			return c
		}
		return strings.Compare(a.outcome, b.outcome)
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\t%-22s %7d  %s\n", k.command, s.counts[k], k.outcome)
	}
	return b.String()
}

// specInstance is one module of a script, instantiated on both sides.
type specInstance struct {
	ref, ins api.Module
	// spent says why the instance is no longer called, if it is not: its
	// instrumented side ran out of its stack budget (leftOutSpent, or a
	// failure).
	spent string
}

// specRun runs one script.
type specRun struct {
	t      *testing.T
	ctx    context.Context
	dir    string
	source string // the .wast file, for messages
	ref    wazero.Runtime
	eng    *Engine
	tally  *specTally
	// named holds the modules the script names ("$M"); nil for a module
	// that did not load.
	named map[string]*specInstance
	last  *specInstance
}

func runSpecScript(t *testing.T, path string, host []byte, tally *specTally) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var script specScript
	if err := json.Unmarshal(raw, &script); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	ctx := context.Background()
	ref := wazero.NewRuntimeWithConfig(ctx, specReferenceConfig())
	defer ref.Close(ctx)
	eng, err := NewEngine(ctx, NewConfig().WithMemoryCeilingPages(specMemoryPages))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	for _, rt := range []wazero.Runtime{ref, eng.runtime} {
		if _, err := rt.InstantiateWithConfig(ctx, host, wazero.NewModuleConfig().WithName("spectest")); err != nil {
			t.Fatalf("instantiate spectest: %v", err)
		}
	}
	tally.add("script", outcomeCompared)
	r := &specRun{t: t, ctx: ctx, dir: filepath.Dir(path), source: filepath.Base(script.SourceFile), ref: ref, eng: eng, tally: tally, named: map[string]*specInstance{}}
	cmds := script.Commands
	for i := 0; i < len(cmds); i++ {
		c := &cmds[i]
		switch c.Type {
		case "module":
			// wazero names a module when it instantiates it: a register
			// command, always right after its module in the suite, is
			// done then.
			var as string
			if i+1 < len(cmds) && cmds[i+1].Type == "register" && (cmds[i+1].Name == "" || cmds[i+1].Name == c.Name) {
				as = cmds[i+1].As
				i++
				tally.add("register", outcomeCompared)
			}
			r.module(c, as)
		case "register":
			r.errorf(c, "register of %q is not right after its module: the harness cannot rename an instantiated module", c.Name)
		case "assert_return", "action":
			r.returns(c)
		case "assert_trap", "assert_exhaustion":
			r.traps(c)
		case "assert_invalid", "assert_malformed", "assert_unlinkable", "assert_uninstantiable":
			r.refuses(c)
		default:
			r.errorf(c, "unknown command")
		}
	}
}

func (r *specRun) errorf(c *specCommand, format string, args ...any) {
	r.t.Helper()
	r.t.Errorf("%s:%d: %s: %s", r.source, c.Line, c.Type, fmt.Sprintf(format, args...))
}

// specStage is where a side refused a module: "" (it did not), "compile"
// or "instantiate".
type specStage string

func (s specStage) describe(err error) string {
	if s == "" {
		return "accepts it"
	}
	return fmt.Sprintf("refuses it at %s (%s)", s, firstLine(err.Error()))
}

// loadRef compiles and instantiates b on the reference side.
func (r *specRun) loadRef(b []byte, name string) (api.Module, specStage, error) {
	compiled, err := r.ref.CompileModule(r.ctx, b)
	if err != nil {
		return nil, "compile", err
	}
	mod, err := r.ref.InstantiateModule(r.ctx, compiled, wazero.NewModuleConfig().WithName(name).WithStartFunctions())
	if err != nil {
		_ = compiled.Close(r.ctx)
		return nil, "instantiate", err
	}
	return mod, "", nil
}

// loadIns loads b as the engine does (Engine.compile: the rewrite and
// wazero's compile of its output) and instantiates it in the engine's
// runtime.
func (r *specRun) loadIns(c *specCommand, b []byte, name string) (api.Module, specStage, error) {
	compiled, _, err := r.eng.compile(r.ctx, fmt.Sprintf("%s:%d", r.source, c.Line), b, ABIHoldfast)
	if err != nil {
		return nil, "compile", err
	}
	mod, err := r.eng.runtime.InstantiateModule(r.ctx, compiled, wazero.NewModuleConfig().WithName(name).WithStartFunctions())
	if err != nil {
		_ = compiled.Close(r.ctx)
		return nil, "instantiate", err
	}
	return mod, "", nil
}

func (r *specRun) read(c *specCommand) []byte {
	b, err := os.ReadFile(filepath.Join(r.dir, c.Filename))
	if err != nil {
		r.t.Fatalf("%s:%d: %v", r.source, c.Line, err)
	}
	return b
}

func (r *specRun) module(c *specCommand, as string) {
	b := r.read(c)
	r.last = nil
	if c.Name != "" {
		r.named[c.Name] = nil
	}
	ref, refStage, refErr := r.loadRef(b, as)
	ins, insStage, insErr := r.loadIns(c, b, as)
	if refStage != "" || insStage != "" {
		r.tally.add(c.Type, outcomeMismatch)
		r.errorf(c, "%s: the reference %s, the engine %s", c.Filename, refStage.describe(refErr), insStage.describe(insErr))
		return
	}
	if diff := diffExports(ref, ins); diff != "" {
		r.tally.add(c.Type, outcomeMismatch)
		r.errorf(c, "%s: exported functions differ: %s", c.Filename, diff)
		return
	}
	r.tally.add(c.Type, outcomeCompared)
	inst := &specInstance{ref: ref, ins: ins}
	r.last = inst
	if c.Name != "" {
		r.named[c.Name] = inst
	}
}

// diffExports compares the exported functions' names and signatures.
func diffExports(ref, ins api.Module) string {
	rd, id := ref.ExportedFunctionDefinitions(), ins.ExportedFunctionDefinitions()
	for name, d := range rd {
		o, ok := id[name]
		if !ok {
			return fmt.Sprintf("%q is missing", name)
		}
		if !slices.Equal(d.ParamTypes(), o.ParamTypes()) || !slices.Equal(d.ResultTypes(), o.ResultTypes()) {
			return fmt.Sprintf("%q is %v -> %v, want %v -> %v", name, o.ParamTypes(), o.ResultTypes(), d.ParamTypes(), d.ResultTypes())
		}
	}
	if len(rd) != len(id) {
		return fmt.Sprintf("%d exports, want %d", len(id), len(rd))
	}
	return ""
}

// instance returns the module an action acts on, or nil (counted) if it
// is not to be run.
func (r *specRun) instance(c *specCommand) *specInstance {
	inst := r.last
	if c.Action.Module != "" {
		inst = r.named[c.Action.Module]
	}
	switch {
	case inst == nil:
		r.tally.add(c.Type, outcomeNotLoaded)
	case inst.spent != "":
		r.tally.add(c.Type, inst.spent)
	default:
		return inst
	}
	return nil
}

// specCall is the outcome of an invoke on one side.
type specCall struct {
	results []uint64
	err     error
}

func (r *specRun) invoke(c *specCommand, inst *specInstance) (ref, ins specCall, types []api.ValueType, ok bool) {
	args, err := specArgs(c.Action.Args)
	if err != nil {
		r.t.Fatalf("%s:%d: %v", r.source, c.Line, err)
	}
	rf, inf := inst.ref.ExportedFunction(c.Action.Field), inst.ins.ExportedFunction(c.Action.Field)
	if rf == nil || inf == nil {
		r.tally.add(c.Type, outcomeMismatch)
		r.errorf(c, "no export %q (reference %t, engine %t)", c.Action.Field, rf != nil, inf != nil)
		return ref, ins, nil, false
	}
	ctx, cancel := context.WithTimeout(r.ctx, specCallTimeout)
	defer cancel()
	ref.results, ref.err = rf.Call(ctx, args...)
	ins.results, ins.err = inf.Call(ctx, args...)
	if isStackBudgetTrap(ins.err) {
		inst.spent = outcomeSpentInFailure
		if c.Type == "assert_exhaustion" {
			inst.spent = leftOutSpent
		}
	}
	return ref, ins, rf.Definition().ResultTypes(), true
}

// isStackBudgetTrap says whether err is the trap of the rewrite's stack
// budget (checkpoint).
func isStackBudgetTrap(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == ErrTrap && strings.Contains(e.Detail, "stack overflow")
}

func (r *specRun) returns(c *specCommand) {
	inst := r.instance(c)
	if inst == nil {
		return
	}
	if c.Action.Type == "get" {
		rg, ig := inst.ref.ExportedGlobal(c.Action.Field), inst.ins.ExportedGlobal(c.Action.Field)
		if rg == nil || ig == nil {
			r.tally.add(c.Type, outcomeMismatch)
			r.errorf(c, "no global %q (reference %t, engine %t)", c.Action.Field, rg != nil, ig != nil)
			return
		}
		r.compareResults(c, []api.ValueType{rg.Type()}, specCall{results: []uint64{rg.Get()}}, specCall{results: []uint64{ig.Get()}})
		return
	}
	ref, ins, types, ok := r.invoke(c, inst)
	if ok {
		r.compareResults(c, types, ref, ins)
	}
}

func (r *specRun) compareResults(c *specCommand, types []api.ValueType, ref, ins specCall) {
	var diffs []string
	if ref.err != nil || ins.err != nil {
		diffs = append(diffs, fmt.Sprintf("the reference returned %#x, %v; the engine %#x, %v", ref.results, errLine(ref.err), ins.results, errLine(ins.err)))
	} else if c.Type == "action" {
		if !sameResults(types, ref.results, ins.results) {
			diffs = append(diffs, fmt.Sprintf("the reference returned %#x, the engine %#x", ref.results, ins.results))
		}
	} else {
		for _, side := range []struct {
			name string
			call specCall
		}{{"the reference", ref}, {"the engine", ins}} {
			diff, err := matchResults(c.Expected, side.call.results)
			if err != nil {
				r.t.Fatalf("%s:%d: %v", r.source, c.Line, err)
			}
			if diff != "" {
				diffs = append(diffs, side.name+": "+diff)
			}
		}
	}
	if len(diffs) > 0 {
		r.tally.add(c.Type, outcomeMismatch)
		r.errorf(c, "%s(%v): %s", c.Action.Field, c.Action.Args, strings.Join(diffs, "; "))
		return
	}
	r.tally.add(c.Type, outcomeCompared)
}

func errLine(err error) string {
	if err == nil {
		return "no error"
	}
	return firstLine(err.Error())
}

func (r *specRun) traps(c *specCommand) {
	inst := r.instance(c)
	if inst == nil {
		return
	}
	if c.Action.Type != "invoke" {
		r.t.Fatalf("%s:%d: %s of a %s action", r.source, c.Line, c.Type, c.Action.Type)
	}
	ref, ins, _, ok := r.invoke(c, inst)
	if !ok {
		return
	}
	var diff string
	switch {
	case ref.err == nil || ins.err == nil:
		diff = fmt.Sprintf("the reference returned %#x, %v; the engine %#x, %v", ref.results, errLine(ref.err), ins.results, errLine(ins.err))
	case c.Type == "assert_exhaustion":
		// Either side's own stack limit: wazero's, or the rewrite's
		// budget, which is smaller.
		if !strings.Contains(ref.err.Error(), "stack overflow") || !strings.Contains(ins.err.Error(), "stack overflow") {
			diff = fmt.Sprintf("the reference failed with %q, the engine %q; want both out of stack", errLine(ref.err), errLine(ins.err))
		}
	case errLine(ref.err) != errLine(ins.err):
		diff = fmt.Sprintf("the reference trapped with %q, the engine %q", errLine(ref.err), errLine(ins.err))
	}
	if diff != "" {
		r.tally.add(c.Type, outcomeMismatch)
		r.errorf(c, "%s(%v): %s", c.Action.Field, c.Action.Args, diff)
		return
	}
	r.tally.add(c.Type, outcomeCompared)
}

func (r *specRun) refuses(c *specCommand) {
	if c.ModuleType == "text" {
		r.tally.add(c.Type, leftOutText)
		return
	}
	b := r.read(c)
	// Modules that load stay: an instance the script expected refused may
	// still have written to the tables and memories it imports, on both
	// sides alike (linking.wast).
	_, refStage, refErr := r.loadRef(b, "")
	_, insStage, insErr := r.loadIns(c, b, "")
	if refStage != insStage {
		r.tally.add(c.Type, outcomeMismatch)
		r.errorf(c, "%s (%s): the reference %s, the engine %s", c.Filename, c.Text, refStage.describe(refErr), insStage.describe(insErr))
		return
	}
	r.tally.add(c.Type, outcomeCompared)
	if refStage == "" {
		r.tally.add(c.Type, outcomeRefDeviates)
	}
}
