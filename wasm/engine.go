package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Engine compiles, sandboxes and runs modules. One Engine serves every policy
// of the agent; it is safe for concurrent use.
type Engine struct {
	cfg     Config
	logger  *slog.Logger
	cache   wazero.CompilationCache
	runtime wazero.Runtime
	// validator compiles modules as written, to validate them before they
	// are rewritten; it is made at the first need and never instantiates.
	validatorOnce sync.Once
	validator     wazero.Runtime

	// mu protects modules and closed.
	mu      sync.Mutex
	modules map[*Module]struct{}
	closed  bool
}

// NewEngine starts a wazero runtime with the
// compilation cache of cfg, and with the host modules (sandboxed WASI and
// holdfast's) instantiated once. A guest stops when its call's context is
// done through the checkpoints compile inserts (see checkpoint.go), not
// wazero's WithCloseOnContextDone, which costs far more.
func NewEngine(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ceilingPages == 0 {
		cfg.ceilingPages = DefaultMemoryCeilingPages
	}
	logger := cfg.logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var cache wazero.CompilationCache
	if cfg.cacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(cfg.cacheDir)
		if err != nil {
			return nil, fmt.Errorf("wasm compilation cache %s: %w", cfg.cacheDir, err)
		}
		cache = c
	} else {
		cache = wazero.NewCompilationCache()
	}
	rc := wazero.NewRuntimeConfig().
		WithCompilationCache(cache).
		WithMemoryLimitPages(cfg.ceilingPages).
		WithCoreFeatures(engineFeatures)
	if cfg.closeOnContextDone {
		rc = rc.WithCloseOnContextDone(true)
	}
	r := wazero.NewRuntimeWithConfig(ctx, rc)
	e := &Engine{cfg: cfg, logger: logger, cache: cache, runtime: r, modules: map[*Module]struct{}{}}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		_ = r.Close(ctx)
		_ = cache.Close(ctx)
		return nil, fmt.Errorf("instantiate WASI: %w", err)
	}
	if err := e.instantiateCheckpointModule(ctx); err != nil {
		_ = r.Close(ctx)
		_ = cache.Close(ctx)
		return nil, fmt.Errorf("instantiate checkpoint module: %w", err)
	}
	if err := e.instantiateHostModule(ctx); err != nil {
		_ = r.Close(ctx)
		_ = cache.Close(ctx)
		return nil, fmt.Errorf("instantiate host module: %w", err)
	}
	if err := e.instantiateOPAHostModule(ctx); err != nil {
		_ = r.Close(ctx)
		_ = cache.Close(ctx)
		return nil, fmt.Errorf("instantiate OPA host module: %w", err)
	}
	return e, nil
}

// engineFeatures are the WebAssembly features guests may use: 2.0's.
const engineFeatures = api.CoreFeaturesV2

// Spec says what to load.
type Spec struct {
	// Name identifies the module in errors and logs, e.g. the policy name.
	Name string
	// Wasm is the module's binary.
	Wasm []byte
	// Grants lists the capabilities given to the module; GrantLog is implied.
	Grants []Grant
	// Limits bounds the module; zero fields take the Engine's defaults.
	Limits Limits
	// Entrypoints are exports the module must have, each with the ABI's entry
	// signature (i32 ptr, i32 len) -> i64, e.g. "admit" or "probe". Load
	// fails with ErrMissingExport if one is absent. For ABIOPA they are OPA
	// entrypoints, e.g. "kubernetes/admission/deny".
	Entrypoints []string
	// ABI is the module's contract; the zero value is ABIHoldfast.
	ABI ABI
	// Data is the data document of an ABIOPA module, a JSON object (a
	// bundle's data.json); empty means {}.
	Data []byte
}

// Digest returns "sha256:<hex>" of b, the identity of a module in messages.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Load compiles (or fetches from the compilation cache) a module, checks it
// against the ABI and its grants, and instantiates a first instance, so that
// a module that cannot run fails here rather than at its first call.
func (e *Engine) Load(ctx context.Context, spec Spec) (*Module, error) {
	fail := func(kind error, detail string, cause error) (*Module, error) {
		return nil, newError(kind, spec.Name, "load", detail, cause)
	}
	if spec.Name == "" {
		return fail(ErrInvalidModule, "spec has no name", nil)
	}
	grants, err := newGrantSet(spec.Grants)
	if err != nil {
		return fail(ErrInvalidModule, err.Error(), nil)
	}
	limits := spec.Limits.withDefaults(e.cfg.limits)
	if limits.MemoryPages > e.cfg.ceilingPages {
		return fail(ErrInvalidModule, fmt.Sprintf("memory limit %d pages is over the engine's ceiling of %d pages", limits.MemoryPages, e.cfg.ceilingPages), nil)
	}

	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return fail(ErrClosed, "engine closed", nil)
	}

	compiled, info, err := e.compile(ctx, spec.Name, spec.Wasm, spec.ABI)
	if err != nil {
		return nil, err
	}
	var cerr *Error
	if spec.ABI == ABIOPA {
		cerr = checkOPAModule(compiled, limits)
	} else {
		cerr = checkModule(compiled, grants, spec.Entrypoints, limits)
	}
	if cerr != nil {
		_ = compiled.Close(ctx)
		cerr.Module = spec.Name
		return nil, cerr
	}

	m := newModule(e, spec.Name, info.Digest, compiled, info, grants, limits)
	if spec.ABI == ABIOPA {
		m.opa = &opaModule{data: spec.Data}
	}
	inst, err := m.instantiate(ctx)
	if err != nil {
		_ = compiled.Close(ctx)
		return nil, err
	}
	if err := m.checkInstance(ctx, inst, spec.Entrypoints); err != nil {
		inst.close(ctx)
		_ = compiled.Close(ctx)
		return nil, err
	}
	m.putIdle(inst)

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		m.teardown(ctx)
		return fail(ErrClosed, "engine closed", nil)
	}
	e.modules[m] = struct{}{}
	e.mu.Unlock()
	return m, nil
}

// compile checks b, instruments it with checkpoints and compiles it.
// ModuleInfo describes b as its author built it. A module of OPA's ABI first
// gets the memory it imports defined in itself (defineImportedMemory).
//
// Nothing derived from b is compiled unless b itself is a valid module:
// checkStructure first (so that wazero never decodes counts its bytes do not
// back), then wazero's own validation of b as written, then the rewrite. The
// rewrite appends globals and functions of its own, so an index that is past
// the module's end as written would name them once rewritten: a guest
// writing global 0 while declaring none would reset the checkpoint counter
// and never be stopped.
func (e *Engine) compile(ctx context.Context, name string, b []byte, abi ABI) (wazero.CompiledModule, ModuleInfo, error) {
	invalid := func(detail string, cause error) (wazero.CompiledModule, ModuleInfo, error) {
		return nil, ModuleInfo{}, newError(ErrInvalidModule, name, "load", detail, cause)
	}
	if detail := notBinary(b); detail != "" {
		return invalid(detail, nil)
	}
	layout, err := checkStructure(b)
	if err != nil {
		if errors.Is(err, errReservedImport) {
			return nil, ModuleInfo{}, newError(ErrUngrantedImport, name, "load", err.Error(), nil)
		}
		return invalid("malformed: "+err.Error(), err)
	}
	digest := Digest(b)
	b = dropUnreadableNames(b, layout)
	src := b
	if abi == ABIOPA {
		if src, err = defineImportedMemory(b); err != nil {
			return invalid("OPA module: "+err.Error(), err)
		}
	}
	// The rewrite is cached by what it rewrites: the same bytes loaded
	// under another ABI are another module.
	instrumented, cached, err := e.rewrite(ctx, Digest(src), b, src)
	if err != nil {
		return nil, ModuleInfo{}, newError(ErrInvalidModule, name, "load", err.Error(), err)
	}
	compiled, err := compileRecovered(ctx, e.runtime, instrumented)
	if err != nil && cached {
		// A damaged cache entry: check and rewrite again.
		_ = os.Remove(e.rewritePath(Digest(src)))
		if instrumented, err = e.checkAndInstrument(ctx, b, src); err == nil {
			compiled, err = compileRecovered(ctx, e.runtime, instrumented)
		}
	}
	if err != nil {
		return invalid("compile: "+firstLine(err.Error()), err)
	}
	info := describe(compiled, b)
	info.Digest = digest
	return compiled, info, nil
}

// checkAndInstrument validates b, the module as its author built it, and
// returns src (b, or what the engine made of it for its ABI) instrumented.
// Its error is the detail of an ErrInvalidModule.
func (e *Engine) checkAndInstrument(ctx context.Context, b, src []byte) ([]byte, error) {
	if err := e.validate(ctx, b); err != nil {
		// The rewrite checks the indices it copies and names their section
		// and index, which wazero's message does not always do. It reads
		// what checkStructure passed, so it is safe on an invalid module.
		if _, rerr := instrumentCheckpoints(src); rerr != nil {
			return nil, fmt.Errorf("%w (%v)", err, rerr)
		}
		return nil, err
	}
	out, err := instrumentCheckpoints(src)
	if err != nil {
		return nil, fmt.Errorf("instrument: %w", err)
	}
	return out, nil
}

// validate runs wazero's validation of b, every index, type and instruction
// as the WebAssembly spec defines them, with the features the engine
// enables. It compiles b with an interpreter that is never instantiated:
// the engine's own runtime would compile b to machine code, and cache it,
// for nothing. b has passed checkStructure.
func (e *Engine) validate(ctx context.Context, b []byte) error {
	e.validatorOnce.Do(func() {
		e.validator = wazero.NewRuntimeWithConfig(context.Background(), wazero.NewRuntimeConfigInterpreter().
			WithMemoryLimitPages(e.cfg.ceilingPages).
			WithCoreFeatures(engineFeatures))
	})
	c, err := compileRecovered(ctx, e.validator, b)
	if err != nil {
		return fmt.Errorf("invalid as written: %s", firstLine(err.Error()))
	}
	return c.Close(ctx)
}

// notBinary says why b is obviously not a binary module, in the words an
// author needs, or returns "" (wazero then explains what else is wrong).
func notBinary(b []byte) string {
	if len(b) == 0 {
		return "empty file"
	}
	if bytes.HasPrefix(b, []byte("\x00asm")) {
		return ""
	}
	if bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		return "this is a gzip file, not a module: an OPA bundle (opa build -t wasm) is a policy of kind opa"
	}
	// The text format starts with "(module" or a comment, after white space.
	text := bytes.TrimLeft(b, " \t\r\n")
	if bytes.HasPrefix(text, []byte("(")) || bytes.HasPrefix(text, []byte(";;")) || bytes.HasPrefix(text, []byte("(;")) {
		return "this is WebAssembly text format (.wat), not a binary module: compile it with wat2wasm first"
	}
	return ""
}

// compileRecovered compiles b, turning a panic of wazero's into an error: its
// decoder and validator read what a guest wrote, and a panic there must
// refuse the module, not end the agent.
func compileRecovered(ctx context.Context, r wazero.Runtime, b []byte) (c wazero.CompiledModule, err error) {
	defer func() {
		if p := recover(); p != nil {
			c, err = nil, fmt.Errorf("wazero failed on this module: %v", p)
		}
	}()
	return r.CompileModule(ctx, b)
}

// rewriteVersion names the output of instrumentCheckpoints in the cache;
// change it whenever the rewrite changes. An entry exists only for a module
// that was validated before it was rewritten (checkpoints-4 and later).
const rewriteVersion = "checkpoints-4"

func (e *Engine) rewritePath(digest string) string {
	return filepath.Join(e.cfg.cacheDir, "holdfast-rewrite", rewriteVersion+"-"+strings.TrimPrefix(digest, "sha256:")+".wasm")
}

// rewrite returns src validated (as b) and instrumented, from the on-disk
// cache if the engine has one: validating and rewriting a Go policy takes
// tens of milliseconds, a good part of a cold start from the compilation
// cache. The cache directory is the agent's own, trusted as much as wazero's
// compiled code next to it; writes are atomic and best effort.
func (e *Engine) rewrite(ctx context.Context, digest string, b, src []byte) (out []byte, cached bool, err error) {
	if e.cfg.cacheDir == "" {
		out, err = e.checkAndInstrument(ctx, b, src)
		return out, false, err
	}
	path := e.rewritePath(digest)
	if out, err := os.ReadFile(path); err == nil {
		return out, true, nil
	}
	if out, err = e.checkAndInstrument(ctx, b, src); err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		e.logger.Warn("cache the rewritten module", "path", path, "err", err)
	} else if err := fsutil.WriteFileAtomic(path, out, 0o600); err != nil {
		e.logger.Warn("cache the rewritten module", "path", path, "err", err)
	}
	return out, false, nil
}

func (e *Engine) forget(m *Module) {
	e.mu.Lock()
	delete(e.modules, m)
	e.mu.Unlock()
}

// Close closes every module (waiting for none: in-flight calls are stopped)
// and the runtime. The on-disk compilation cache stays for the next start.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	mods := make([]*Module, 0, len(e.modules))
	for m := range e.modules {
		mods = append(mods, m)
	}
	e.mu.Unlock()
	for _, m := range mods {
		m.teardown(ctx)
	}
	err := e.runtime.Close(ctx)
	if cerr := e.cache.Close(ctx); err == nil {
		err = cerr
	}
	e.validatorOnce.Do(func() {}) // no validator is made after Close
	if e.validator != nil {
		if verr := e.validator.Close(ctx); err == nil {
			err = verr
		}
	}
	return err
}
