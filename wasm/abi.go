package wasm

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// ABIVersion is the version of policies/ABI.md this host implements.
const ABIVersion = 1

// The ABI's fixed exports.
const (
	exportMemory     = "memory"
	exportABIVersion = "holdfast_abi_version"
	exportAlloc      = "alloc"
	exportFree       = "free"
	exportInitialize = "_initialize"
	exportStart      = "_start"
)

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

type signature struct{ params, results []api.ValueType }

func (s signature) String() string {
	name := func(ts []api.ValueType) string {
		parts := make([]string, len(ts))
		for i, t := range ts {
			parts[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(parts, ", ") + ")"
	}
	return name(s.params) + " -> " + name(s.results)
}

func (s signature) matches(def api.FunctionDefinition) bool {
	return slices.Equal(def.ParamTypes(), s.params) && slices.Equal(def.ResultTypes(), s.results)
}

var (
	sigABIVersion = signature{nil, []api.ValueType{i32}}
	sigAlloc      = signature{[]api.ValueType{i32}, []api.ValueType{i32}}
	sigFree       = signature{[]api.ValueType{i32, i32}, nil}
	sigEntry      = signature{[]api.ValueType{i32, i32}, []api.ValueType{i64}}
	sigInitialize = signature{nil, nil}
)

// ModuleInfo describes a module: what `holdfast policy inspect` prints.
type ModuleInfo struct {
	// Digest is "sha256:<hex>" of the module's bytes.
	Digest string
	// Size is the module's size in bytes.
	Size int
	// ABIVersion is what holdfast_abi_version returned; 0 if not called.
	ABIVersion int
	// Exports lists exported functions as "name(params) -> (results)".
	Exports []string
	// Imports lists imported functions as "module.name".
	Imports []string
	// Entrypoints lists the exports with the entry signature, e.g. "admit".
	Entrypoints []string
	// MemoryMinPages is the exported memory's initial size, in 64 KiB pages.
	MemoryMinPages uint32
}

func describe(c wazero.CompiledModule, b []byte) ModuleInfo {
	info := ModuleInfo{Digest: Digest(b), Size: len(b)}
	for name, def := range c.ExportedFunctions() {
		sig := signature{def.ParamTypes(), def.ResultTypes()}
		info.Exports = append(info.Exports, name+sig.String())
		if sigEntry.matches(def) && name != exportAlloc {
			info.Entrypoints = append(info.Entrypoints, name)
		}
	}
	for _, def := range c.ImportedFunctions() {
		mod, name, _ := def.Import()
		if mod == checkpointModule {
			continue // added by the engine
		}
		info.Imports = append(info.Imports, mod+"."+name)
	}
	if mem, ok := c.ExportedMemories()[exportMemory]; ok {
		info.MemoryMinPages = mem.Min()
	}
	slices.Sort(info.Exports)
	slices.Sort(info.Entrypoints)
	slices.Sort(info.Imports)
	return info
}

// checkModule refuses, before any guest code runs, a module that imports
// what it was not granted or lacks what the ABI needs.
func checkModule(c wazero.CompiledModule, grants grantSet, entrypoints []string, limits Limits) *Error {
	if _, ok := c.ExportedFunctions()["opa_eval"]; ok && len(c.ImportedMemories()) > 0 {
		return newError(ErrInvalidModule, "", "load", "this is a module of OPA's Wasm ABI (opa build -t wasm), not of holdfast's: configure it as a policy of kind opa", nil)
	}
	for _, def := range c.ImportedFunctions() {
		mod, name, _ := def.Import()
		if mod == checkpointModule {
			continue // added by the engine, which refuses a guest's own
		}
		if err := grants.checkImport(mod, name); err != nil {
			return newError(ErrUngrantedImport, "", "load", err.Error(), nil)
		}
	}
	if mems := c.ImportedMemories(); len(mems) > 0 {
		mod, name, _ := mems[0].Import()
		return newError(ErrUngrantedImport, "", "load", fmt.Sprintf("imports memory %s.%s; a module must define and export its own memory", mod, name), nil)
	}
	exports := c.ExportedFunctions()
	if _, ok := exports[exportStart]; ok {
		if _, ok := exports[exportInitialize]; !ok {
			return newError(ErrInvalidModule, "", "load", "this is a command module (it exports _start); build a reactor: for Go, GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared", nil)
		}
	}
	mem, ok := c.ExportedMemories()[exportMemory]
	if !ok {
		return newError(ErrMissingExport, "", "load", `no exported memory named "memory"`, nil)
	}
	if mem.Min() > limits.MemoryPages {
		return newError(ErrMemoryLimit, "", "load", fmt.Sprintf("the module's initial memory is %d pages, over its limit of %d pages (%d MiB)", mem.Min(), limits.MemoryPages, limits.MemoryPages/16), nil)
	}
	need := []struct {
		name string
		sig  signature
	}{
		{exportABIVersion, sigABIVersion},
		{exportAlloc, sigAlloc},
		{exportFree, sigFree},
	}
	for _, ep := range entrypoints {
		need = append(need, struct {
			name string
			sig  signature
		}{ep, sigEntry})
	}
	for _, n := range need {
		def, ok := exports[n.name]
		if !ok {
			return newError(ErrMissingExport, "", "load", fmt.Sprintf("no export %q %s", n.name, n.sig), nil)
		}
		if !n.sig.matches(def) {
			return newError(ErrMissingExport, "", "load", fmt.Sprintf("export %q has signature %s, want %s", n.name, signature{def.ParamTypes(), def.ResultTypes()}, n.sig), nil)
		}
	}
	if def, ok := exports[exportInitialize]; ok && !sigInitialize.matches(def) {
		return newError(ErrMissingExport, "", "load", fmt.Sprintf("export %q has signature %s, want %s", exportInitialize, signature{def.ParamTypes(), def.ResultTypes()}, sigInitialize), nil)
	}
	return nil
}

// Inspect describes a module without loading it as a policy: it compiles the
// module, lists its imports and exports, and, if the module is a valid
// reactor of this ABI, instantiates it with every grant its imports ask for
// (and no call targets, so no network or file is reachable) to read its ABI
// version. A module that cannot be instantiated, or of another ABI version,
// still gets its lists; the error says why. name identifies the module in
// errors, e.g. its file.
func (e *Engine) Inspect(ctx context.Context, name string, b []byte) (ModuleInfo, error) {
	compiled, info, err := e.compile(ctx, name, b, ABIHoldfast)
	if err != nil {
		return ModuleInfo{}, err
	}
	defer compiled.Close(ctx)
	var grants []Grant
	for _, def := range compiled.ImportedFunctions() {
		mod, name, _ := def.Import()
		if g, ok := hostFunctionGrants[name]; ok && mod == HostModule {
			grants = append(grants, g)
		}
	}
	gs, _ := newGrantSet(grants)
	limits := Limits{}.withDefaults(e.cfg.limits)
	if cerr := checkModule(compiled, gs, nil, limits); cerr != nil {
		cerr.Module = name
		return info, cerr
	}
	m := newModule(e, name, info.Digest, compiled, info, gs, limits)
	inst, err := m.instantiate(ctx)
	if err != nil {
		return info, err
	}
	defer inst.close(ctx)
	v, err := m.abiVersion(ctx, inst)
	if err != nil {
		return info, err
	}
	info.ABIVersion = v
	if v != ABIVersion {
		return info, unsupportedABI(name, v)
	}
	return info, nil
}

// unsupportedABI refuses a module of another ABI version.
func unsupportedABI(name string, v int) *Error {
	return newError(ErrInvalidModule, name, "load", fmt.Sprintf("ABI version %d is not supported by this host (it supports %d); rebuild the module against policies/ABI.md version %d", v, ABIVersion, ABIVersion), nil)
}
