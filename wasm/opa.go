package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero/api"
)

// ABI selects the contract a module is loaded under.
type ABI int

const (
	// ABIHoldfast is policies/ABI.md: alloc, free, holdfast_abi_version and
	// entry points (ptr, len) -> packed output.
	ABIHoldfast ABI = iota
	// ABIOPA is Open Policy Agent's Wasm ABI, version 1.2 or later: what
	// `opa build -t wasm` produces. The module imports its memory and the
	// env.opa_* functions, and is evaluated with opa_eval; a call's export
	// is an OPA entrypoint ("pkg/rule") and its output is OPA's result set,
	// [{"result": value}] or [] when the rule is undefined.
	ABIOPA
)

// opaHostModule is the import module of OPA's host functions.
const opaHostModule = "env"

// OPA's exports the engine uses, and their signatures.
var opaExports = []struct {
	name string
	sig  signature
}{
	{"opa_eval", signature{[]api.ValueType{i32, i32, i32, i32, i32, i32, i32}, []api.ValueType{i32}}},
	{"opa_malloc", signature{[]api.ValueType{i32}, []api.ValueType{i32}}},
	{"opa_json_parse", signature{[]api.ValueType{i32, i32}, []api.ValueType{i32}}},
	{"opa_json_dump", signature{[]api.ValueType{i32}, []api.ValueType{i32}}},
	{"opa_heap_ptr_get", signature{nil, []api.ValueType{i32}}},
	{"builtins", signature{nil, []api.ValueType{i32}}},
	{"entrypoints", signature{nil, []api.ValueType{i32}}},
}

// opaImports are the functions an OPA module may import from env, with
// their signatures; nothing else is provided.
var opaImports = map[string]signature{
	"opa_abort":    {[]api.ValueType{i32}, nil},
	"opa_println":  {[]api.ValueType{i32}, nil},
	"opa_builtin0": {[]api.ValueType{i32, i32}, []api.ValueType{i32}},
	"opa_builtin1": {[]api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	"opa_builtin2": {[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}},
	"opa_builtin3": {[]api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32}},
	"opa_builtin4": {[]api.ValueType{i32, i32, i32, i32, i32, i32}, []api.ValueType{i32}},
}

// opaModule is what the engine knows of a loaded OPA module, the same for
// every instance: read from the first one at Load, read-only afterwards.
type opaModule struct {
	// data is the data document (JSON) each instance parses once.
	data []byte
	// entrypoints maps the module's entrypoint names to their ids.
	entrypoints map[string]int32
	// builtins maps the module's builtin ids to the host's implementations.
	builtins map[int32]opaBuiltin
}

// opaInstance is one instance's side of OPA's calling convention.
type opaInstance struct {
	eval, malloc, jsonParse, jsonDump api.Function
	// dataAddr is the parsed data document.
	dataAddr uint32
	// heapPtr is the "data heap pointer" of OPA's ABI: every evaluation's
	// input is written there and its heap starts after the input, so that
	// evaluations reuse the same memory instead of growing it.
	heapPtr uint32
}

// checkOPAModule refuses, before any guest code runs, an OPA module that
// imports anything but OPA's host functions or lacks what evaluation needs.
func checkOPAModule(c interface {
	ImportedFunctions() []api.FunctionDefinition
	ExportedFunctions() map[string]api.FunctionDefinition
	ExportedMemories() map[string]api.MemoryDefinition
}, limits Limits) *Error {
	for _, def := range c.ImportedFunctions() {
		mod, name, _ := def.Import()
		if mod == checkpointModule {
			continue
		}
		sig, ok := opaImports[name]
		if mod != opaHostModule || !ok {
			return newError(ErrUngrantedImport, "", "load", fmt.Sprintf("imports %s.%s; an OPA module may import only env.memory, env.opa_abort, env.opa_println and env.opa_builtin0-4", mod, name), nil)
		}
		if !sig.matches(def) {
			return newError(ErrUngrantedImport, "", "load", fmt.Sprintf("imports %s.%s with signature %s, want %s", mod, name, signature{def.ParamTypes(), def.ResultTypes()}, sig), nil)
		}
	}
	mem, ok := c.ExportedMemories()[exportMemory]
	if !ok {
		return newError(ErrMissingExport, "", "load", `no exported memory named "memory" (OPA ABI 1.1 or later exports it)`, nil)
	}
	if mem.Min() > limits.MemoryPages {
		return newError(ErrMemoryLimit, "", "load", fmt.Sprintf("the module's initial memory is %d pages, over its limit of %d pages (%d MiB)", mem.Min(), limits.MemoryPages, limits.MemoryPages/16), nil)
	}
	exports := c.ExportedFunctions()
	for _, x := range opaExports {
		def, ok := exports[x.name]
		if !ok {
			detail := fmt.Sprintf("no export %q %s: not a module of OPA's Wasm ABI (opa build -t wasm)", x.name, x.sig)
			if x.name == "opa_eval" {
				detail = `no export "opa_eval": the module is of OPA's Wasm ABI before 1.2; build it again with a current opa (opa build -t wasm)`
			}
			return newError(ErrMissingExport, "", "load", detail, nil)
		}
		if !x.sig.matches(def) {
			return newError(ErrMissingExport, "", "load", fmt.Sprintf("export %q has signature %s, want %s", x.name, signature{def.ParamTypes(), def.ResultTypes()}, x.sig), nil)
		}
	}
	return nil
}

// prepare follows OPA's calling convention on a fresh instance: initialise
// the heap, parse the data document, stash the free heap blocks (ABI 1.3)
// and record the data heap pointer.
func (o *opaModule) prepare(ctx context.Context, mod api.Module) (*opaInstance, error) {
	major, minor := mod.ExportedGlobal("opa_wasm_abi_version"), mod.ExportedGlobal("opa_wasm_abi_minor_version")
	if major == nil || minor == nil {
		return nil, fmt.Errorf("no exported globals opa_wasm_abi_version and opa_wasm_abi_minor_version: not a module of OPA's Wasm ABI")
	}
	if v, mv := int32(major.Get()), int32(minor.Get()); v != 1 || mv < 2 {
		return nil, fmt.Errorf("OPA Wasm ABI %d.%d; holdfast evaluates 1.2 and later (opa_eval)", v, mv)
	}
	oi := &opaInstance{
		eval:      mod.ExportedFunction("opa_eval"),
		malloc:    mod.ExportedFunction("opa_malloc"),
		jsonParse: mod.ExportedFunction("opa_json_parse"),
		jsonDump:  mod.ExportedFunction("opa_json_dump"),
	}
	if _, err := oi.malloc.Call(ctx, 0); err != nil {
		return nil, err
	}
	data := o.data
	if len(data) == 0 {
		data = []byte("{}")
	}
	addr, err := oi.load(ctx, mod, data)
	if err != nil {
		return nil, fmt.Errorf("data document: %w", err)
	}
	oi.dataAddr = addr
	if int32(minor.Get()) >= 3 {
		if _, err := mod.ExportedFunction("opa_heap_blocks_stash").Call(ctx); err != nil {
			return nil, err
		}
	}
	res, err := mod.ExportedFunction("opa_heap_ptr_get").Call(ctx)
	if err != nil {
		return nil, err
	}
	oi.heapPtr = uint32(res[0])
	return oi, nil
}

// describe reads the module's entrypoints and builtins from its first
// instance, and refuses a module that needs a builtin the host lacks or
// lacks an entrypoint the caller needs.
func (o *opaModule) describe(ctx context.Context, mod api.Module, oi *opaInstance, want []string) error {
	read := func(export string) (map[string]int32, error) {
		res, err := mod.ExportedFunction(export).Call(ctx)
		if err != nil {
			return nil, err
		}
		b, err := oi.dump(ctx, mod, uint32(res[0]), 1<<20)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", export, err)
		}
		var m map[string]int32
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", export, err)
		}
		return m, nil
	}
	eps, err := read("entrypoints")
	if err != nil {
		return err
	}
	names, err := read("builtins")
	if err != nil {
		return err
	}
	for _, w := range want {
		if _, ok := eps[w]; !ok {
			have := slices.Sorted(mapKeys(eps))
			return newError(ErrMissingExport, "", "load", fmt.Sprintf("no entrypoint %q; the module has %s (opa build -t wasm -e %s)", w, strings.Join(have, ", "), w), nil)
		}
	}
	o.entrypoints = eps
	o.builtins = map[int32]opaBuiltin{}
	var missing []string
	for name, id := range names {
		b, ok := opaBuiltins[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		b.name = name
		o.builtins[id] = b
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return newError(ErrUngrantedImport, "", "load", fmt.Sprintf("the policy uses OPA built-in functions that OPA's Wasm compiler leaves to the host and holdfast does not provide: %s (holdfast provides %s)", strings.Join(missing, ", "), strings.Join(slices.Sorted(mapKeys(opaBuiltins)), ", ")), nil)
	}
	return nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// load parses JSON into an OPA value in the guest's memory.
func (oi *opaInstance) load(ctx context.Context, mod api.Module, b []byte) (uint32, error) {
	res, err := oi.malloc.Call(ctx, uint64(len(b)))
	if err != nil {
		return 0, err
	}
	p := uint32(res[0])
	if !mod.Memory().Write(p, b) {
		return 0, fmt.Errorf("opa_malloc(%d) returned %#x, outside the guest's memory", len(b), p)
	}
	res, err = oi.jsonParse.Call(ctx, uint64(p), uint64(len(b)))
	if err != nil {
		return 0, err
	}
	if res[0] == 0 {
		return 0, fmt.Errorf("opa_json_parse refused %.80q", b)
	}
	return uint32(res[0]), nil
}

// dump serializes the OPA value at addr to JSON, of at most max bytes.
func (oi *opaInstance) dump(ctx context.Context, mod api.Module, addr uint32, max int) ([]byte, error) {
	res, err := oi.jsonDump.Call(ctx, uint64(addr))
	if err != nil {
		return nil, err
	}
	return cString(mod.Memory(), uint32(res[0]), max)
}

// errNoTerminator and errTooLong say why cString failed.
var (
	errNoTerminator = fmt.Errorf("string at an address outside the guest's memory, or not NUL-terminated")
	errTooLong      = fmt.Errorf("string longer than the limit")
)

// cString returns a copy of the NUL-terminated string at p, of at most max
// bytes.
func cString(mem api.Memory, p uint32, max int) ([]byte, error) {
	size := mem.Size()
	if p >= size {
		return nil, errNoTerminator
	}
	n := min(uint64(size-p), uint64(max)+1)
	view, ok := mem.Read(p, uint32(n))
	if !ok {
		return nil, errNoTerminator
	}
	end := bytes.IndexByte(view, 0)
	switch {
	case end >= 0:
		return bytes.Clone(view[:end]), nil
	case n > uint64(max):
		return nil, errTooLong
	default:
		return nil, errNoTerminator
	}
}

// evalOPA runs one evaluation of entrypoint with input (JSON) on inst.
func (m *Module) evalOPA(callCtx context.Context, inst *instance, entrypoint string, input []byte, fail func(error) ([]byte, error), bad func(error, string, ...any) ([]byte, error)) ([]byte, error) {
	oi := inst.opa
	// OPA's module reads input it cannot parse as no input at all, so that
	// rules about it do not fire: a policy would allow what it never saw.
	if !json.Valid(input) {
		return bad(ErrBadInput, "input of %d bytes is not JSON", len(input))
	}
	mem := inst.mod.Memory()
	end := uint64(oi.heapPtr) + uint64(len(input))
	if size := uint64(mem.Size()); end > size {
		if _, ok := mem.Grow(uint32((end - size + 65535) / 65536)); !ok {
			return bad(ErrMemoryLimit, "an input of %d bytes does not fit in the guest's memory limit of %d pages", len(input), m.limits.MemoryPages)
		}
	}
	if !mem.Write(oi.heapPtr, input) {
		return bad(ErrBadPointer, "input at %#x+%d is outside the guest's %d bytes of memory", oi.heapPtr, len(input), mem.Size())
	}
	res, err := oi.eval.Call(callCtx, 0, uint64(m.opa.entrypoints[entrypoint]), uint64(oi.dataAddr), uint64(oi.heapPtr), uint64(len(input)), end, 0)
	if err != nil {
		return fail(err)
	}
	out, err := cString(mem, uint32(res[0]), m.limits.OutputBytes)
	switch {
	case err == errTooLong:
		return bad(ErrOutputTooLarge, "result set over the limit of %d bytes", m.limits.OutputBytes)
	case err != nil:
		return bad(ErrBadPointer, "opa_eval returned %#x: %v", res[0], err)
	case !json.Valid(out) || len(bytes.TrimSpace(out)) == 0 || bytes.TrimSpace(out)[0] != '[':
		return bad(ErrBadOutput, "opa_eval's result is not a JSON result set: %.80q", out)
	}
	return out, nil
}

// instantiateOPAHostModule defines env: OPA's host functions, for every OPA
// module of the runtime (each finds its own instance and builtins through
// the call's state).
func (e *Engine) instantiateOPAHostModule(ctx context.Context) error {
	b := e.runtime.NewHostModuleBuilder(opaHostModule)
	def := func(name string, fn api.GoModuleFunc) {
		sig := opaImports[name]
		b.NewFunctionBuilder().WithGoModuleFunction(fn, sig.params, sig.results).Export(name)
	}
	def("opa_abort", opaAbort)
	def("opa_println", e.opaPrintln)
	for n := range 5 {
		def(fmt.Sprintf("opa_builtin%d", n), e.opaBuiltin(n))
	}
	_, err := b.Instantiate(ctx)
	return err
}

// opaAbort is OPA's internal error (an invalid entrypoint, a failed
// allocation, a conflict of complete rules): the call fails with its
// message.
func opaAbort(ctx context.Context, mod api.Module, stack []uint64) {
	msg, err := cString(mod.Memory(), uint32(stack[0]), 1024)
	if err != nil {
		msg = []byte("(unreadable message)")
	}
	panic(newError(ErrTrap, "", "", "opa_abort: "+Printable(string(msg)), nil))
}

// opaPrintln carries Rego's print() to the log as the guest's own line,
// under the module's log budget.
func (e *Engine) opaPrintln(ctx context.Context, mod api.Module, stack []uint64) {
	st := mustState(ctx, "opa_println")
	if !st.m.logs.allow() {
		st.dropped++
		return
	}
	msg, err := cString(mod.Memory(), uint32(stack[0]), st.m.limits.LogLineBytes)
	text := string(msg)
	if err == errTooLong {
		b, _ := mod.Memory().Read(uint32(stack[0]), uint32(st.m.limits.LogLineBytes))
		text = string(b) + " [truncated]"
	} else if err != nil {
		text = "(unreadable message)"
	}
	e.logger.Log(context.Background(), slog.LevelInfo, text, "module", st.m.name, GuestLogKey, true)
}

// opaBuiltin dispatches opa_builtinN(id, ctx, args...) to the host's
// implementation of the builtin the module declared with that id.
func (e *Engine) opaBuiltin(n int) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		st := mustState(ctx, "opa_builtin")
		id := int32(uint32(stack[0]))
		b, ok := st.m.opa.builtins[id]
		if !ok || b.arity != n {
			panic(newError(ErrTrap, "", "", fmt.Sprintf("opa_builtin%d called with id %d, which is no declared builtin of %d arguments", n, id, n), nil))
		}
		oi := &opaInstance{
			malloc:    mod.ExportedFunction("opa_malloc"),
			jsonParse: mod.ExportedFunction("opa_json_parse"),
			jsonDump:  mod.ExportedFunction("opa_json_dump"),
		}
		args := make([][]byte, n)
		for i := range n {
			raw, err := oi.dump(ctx, mod, uint32(stack[2+i]), st.m.limits.OutputBytes)
			switch {
			case err == errTooLong:
				panic(newError(ErrOutputTooLarge, "", "", fmt.Sprintf("argument %d of builtin %s is over the limit of %d bytes for what a policy hands the host", i+1, b.name, st.m.limits.OutputBytes), nil))
			case err == errNoTerminator:
				panic(newError(ErrBadPointer, "", "", fmt.Sprintf("argument %d of builtin %s: opa_json_dump returned %v", i+1, b.name, err), nil))
			case err != nil:
				panic(fmt.Errorf("builtin %s: argument %d: %w", b.name, i+1, err))
			case !json.Valid(raw):
				panic(newError(ErrTrap, "", "", fmt.Sprintf("argument %d of builtin %s: opa_json_dump wrote no valid JSON: %.80q", i+1, b.name, raw), nil))
			}
			args[i] = raw
		}
		out, err := b.fn(ctx, args, st.m.limits.HostResponseBytes)
		var over *overBudgetError
		switch {
		case errors.As(err, &over):
			panic(newError(ErrOutputTooLarge, "", "", over.msg, nil))
		case err != nil && ctx.Err() != nil:
			panic(ctx.Err()) // the call's deadline: classified as ErrTimeout
		case err != nil:
			// OPA's evaluator (not in strict mode, its default) and its
			// own Wasm SDK make an expression whose builtin failed
			// undefined: the rule does not apply. The same here, logged.
			if st.m.logs.allow() {
				e.logger.Warn("OPA builtin failed; the expression is undefined", "module", st.m.name, "builtin", b.name, "err", err)
			}
			stack[0] = 0
			return
		}
		addr, err := oi.load(ctx, mod, out)
		if err != nil {
			panic(fmt.Errorf("builtin %s: result: %w", b.name, err))
		}
		stack[0] = uint64(addr)
	}
}
