package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/wasm"
)

// Defaults of Options.
const (
	// DefaultAdmissionTimeout bounds an admission call when the policy sets
	// no limits.timeout (Kubewarden's policy-server default).
	DefaultAdmissionTimeout = 2 * time.Second
	// DefaultReloadDelay is how long file events settle before a reload, so
	// that a module being copied is read once, complete.
	DefaultReloadDelay = 300 * time.Millisecond
	// maxModuleBytes bounds a module file.
	maxModuleBytes = 64 << 20
)

// Options configure a Manager.
type Options struct {
	// Dir is the policies directory, holding policies.yaml and (usually)
	// the modules. Required.
	Dir string
	// CacheDir keeps compiled modules across restarts (wazero's compilation
	// cache). Defaults to "" (compile at every start, about 1.5 s per Go
	// module instead of 0.1 s).
	CacheDir string
	// Logger receives reloads, errors and the guests' log lines. Defaults to
	// discarding.
	Logger *slog.Logger
	// AdmissionTimeout bounds admission calls of policies without
	// limits.timeout. Defaults to DefaultAdmissionTimeout (2 s).
	AdmissionTimeout time.Duration
	// ReloadDelay debounces file events. Defaults to DefaultReloadDelay.
	ReloadDelay time.Duration
	// Metrics records each evaluation (holdfast_policy_*); nil: none.
	Metrics *metrics.Metrics
	// Modules keeps the modules of policies delivered from registries
	// (module: oci://...), pulled in the background by Run; nil: such
	// policies cannot load.
	Modules ModuleStore
	// Registry says how registries are reached.
	Registry RegistryOptions
	// OnFailure is told when a policy's module fails to pull or to load,
	// once per new error (not at each retry). nil: only logged.
	OnFailure func(Failure)
}

// Manager holds the loaded policies. It is safe for concurrent use: Admit
// and Probe read an immutable snapshot that Reload replaces atomically, so a
// call in flight finishes on the policies it started with.
type Manager struct {
	opts   Options
	logger *slog.Logger
	engine *wasm.Engine

	// current is the snapshot calls use; replaced whole by Reload.
	current atomic.Pointer[snapshot]
	// reloadMu serializes reloads (the watcher's and explicit ones).
	reloadMu sync.Mutex

	// pulls fetches registry modules into opts.Modules (ocipull.go).
	pulls *puller
}

// snapshot is an immutable view of the configuration and its modules.
type snapshot struct {
	policies []*loaded // in configuration order
	byName   map[string]*loaded
	// configErr is the last error reading policies.yaml, if the file now on
	// disk could not be used (the policies are those of the last good one).
	configErr error
	// refs are the registry modules the configuration last read names,
	// whether or not they loaded: what the puller fetches.
	refs []ociRef
}

// loaded is one policy as it runs.
type loaded struct {
	cfg    PolicyConfig
	path   string // module file
	digest string // of the file serving calls (the module, or an OPA bundle)
	module *wasm.Module
	// entrypoint is the export (or OPA entrypoint) a call runs.
	entrypoint string
	// err is the last load error: with module nil the policy cannot run;
	// with module set an older module keeps serving.
	err      error
	loadedAt time.Time
}

// Open creates the engine and loads dir/policies.yaml. An invalid
// configuration file is an error (the agent decides whether to start
// without policies); a module that fails to load is not: the policy is kept,
// reported by Status, and treated by its failurePolicy at each call.
func Open(ctx context.Context, opts Options) (*Manager, error) {
	if opts.Dir == "" {
		return nil, errors.New("policy: Options.Dir is required")
	}
	if opts.AdmissionTimeout <= 0 {
		opts.AdmissionTimeout = DefaultAdmissionTimeout
	}
	if opts.ReloadDelay <= 0 {
		opts.ReloadDelay = DefaultReloadDelay
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg := wasm.NewConfig().WithLogger(logger.With("component", "wasm"))
	if opts.CacheDir != "" {
		cfg = cfg.WithCacheDir(opts.CacheDir)
	}
	engine, err := wasm.NewEngine(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("policy: start wasm engine: %w", err)
	}
	m := &Manager{opts: opts, logger: logger, engine: engine, pulls: newPuller(opts.Registry)}
	m.current.Store(&snapshot{byName: map[string]*loaded{}})
	if err := m.Reload(ctx); err != nil {
		if m.current.Load().configErr != nil {
			_ = engine.Close(ctx)
			return nil, err
		}
		logger.Error("some policies failed to load", "err", err)
	}
	return m, nil
}

// Close releases every module and the engine; calls in flight are stopped.
// Cancel Run's context first: a reload after Close fails.
func (m *Manager) Close(ctx context.Context) error {
	return m.engine.Close(ctx)
}

// Reload reads policies.yaml and the modules again and swaps in the result
// atomically. A policy whose configuration and module bytes are unchanged
// keeps its loaded module (and its warm instances). A policy whose new
// module fails to load keeps its old module and configuration, and the
// error is returned and reported by Status. An unreadable policies.yaml
// keeps every policy as it was.
func (m *Manager) Reload(ctx context.Context) error {
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	old := m.current.Load()

	cfg, err := ReadConfig(m.opts.Dir)
	if err != nil {
		next := *old
		next.configErr = err
		m.current.Store(&next)
		m.logger.Error("policy configuration not reloaded; keeping the previous one", "file", filepath.Join(m.opts.Dir, ConfigFileName), "err", err)
		return err
	}

	next := &snapshot{byName: map[string]*loaded{}, refs: configRefs(cfg)}
	var errs []error
	for _, pc := range cfg.Policies {
		l, err := m.reloadPolicy(ctx, pc, old.byName[pc.Name])
		if err != nil {
			errs = append(errs, err)
			m.reportFailure(pc, old.byName[pc.Name], l, err)
		}
		next.policies = append(next.policies, l)
		next.byName[pc.Name] = l
	}
	m.current.Store(next)
	if !slices.Equal(old.refs, next.refs) {
		m.pulls.wakeUp()
	}
	if len(errs) == 0 {
		m.collectModules(next)
	}

	// Retire the modules no longer used; calls in flight finish on them.
	inUse := map[*wasm.Module]bool{}
	for _, l := range next.policies {
		inUse[l.module] = true
	}
	for _, l := range old.policies {
		if l.module != nil && !inUse[l.module] {
			_ = l.module.Close(ctx)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) modulePath(pc PolicyConfig) string {
	if filepath.IsAbs(pc.Module) || isOCI(pc.Module) {
		return pc.Module
	}
	return filepath.Join(m.opts.Dir, pc.Module)
}

func (m *Manager) reloadPolicy(ctx context.Context, pc PolicyConfig, old *loaded) (*loaded, error) {
	path := m.modulePath(pc)
	b, readErr := m.moduleBytes(path)
	digest := ""
	if readErr == nil {
		digest = wasm.Digest(b)
	}
	// Unchanged module and load-relevant configuration: keep the module.
	if old != nil && old.module != nil && readErr == nil && old.digest == digest && sameLoad(old.cfg, pc) {
		l := *old
		l.cfg = pc // settings and failurePolicy may have changed
		l.err = nil
		return &l, nil
	}
	var mod *wasm.Module
	var spec wasm.Spec
	err := readErr
	if err == nil {
		spec, err = m.spec(pc, b)
	}
	if err == nil {
		mod, err = m.engine.Load(ctx, spec)
	}
	if err != nil {
		err = fmt.Errorf("policy %q: module %s: %w", pc.Name, path, err)
		if old != nil && old.module != nil {
			m.logger.Error("policy not reloaded; the previous module keeps serving", "policy", pc.Name, "digest", old.digest, "err", err)
			l := *old // old module with its old configuration
			l.err = err
			return &l, err
		}
		m.logger.Error("policy not loaded", "policy", pc.Name, "failurePolicy", pc.FailurePolicy, "err", err)
		return &loaded{cfg: pc, path: path, digest: digest, err: err}, err
	}
	m.logger.Info("policy loaded", "policy", pc.Name, "kind", pc.Kind, "digest", digest)
	return &loaded{cfg: pc, path: path, digest: digest, module: mod, entrypoint: spec.Entrypoints[0], loadedAt: time.Now()}, nil
}

// spec is what the engine loads for a policy whose file holds b.
func (m *Manager) spec(pc PolicyConfig, b []byte) (wasm.Spec, error) {
	if pc.Kind == KindOPA {
		return opaSpec(pc, b, m.opts.AdmissionTimeout)
	}
	return wasm.Spec{
		Name:        pc.Name,
		Wasm:        b,
		Grants:      pc.wasmGrants(),
		Limits:      pc.wasmLimits(m.opts.AdmissionTimeout),
		Entrypoints: []string{entrypoint(pc.Kind)},
	}, nil
}

// sameLoad reports whether two configurations load the same module the same
// way (settings and failurePolicy are per call, and do not count, except for
// an OPA policy, whose settings are part of the data document it loads).
func sameLoad(a, b PolicyConfig) bool {
	if a.Kind == KindOPA && !bytes.Equal(a.Settings, b.Settings) {
		return false
	}
	return a.Kind == b.Kind && a.Module == b.Module && a.Entrypoint == b.Entrypoint &&
		a.Grants.HTTP == b.Grants.HTTP && a.Grants.TCP == b.Grants.TCP && a.Grants.Clock == b.Grants.Clock &&
		slices.Equal(a.Grants.Files, b.Grants.Files) &&
		a.Limits.Timeout == b.Limits.Timeout && a.Limits.MaxInstances == b.Limits.MaxInstances &&
		quantityEqual(a.Limits, b.Limits)
}

func quantityEqual(a, b Limits) bool {
	if a.Memory == nil || b.Memory == nil {
		return a.Memory == nil && b.Memory == nil
	}
	return a.Memory.Cmp(*b.Memory) == 0
}

func entrypoint(k Kind) string {
	if k == KindProbe {
		return "probe"
	}
	return "admit"
}

func readModule(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxModuleBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxModuleBytes {
		return nil, fmt.Errorf("module is over %d MiB", maxModuleBytes>>20)
	}
	return b, nil
}

// Status describes one configured policy.
type Status struct {
	Name          string
	Kind          Kind
	FailurePolicy FailurePolicy
	Module        string
	// Digest is the digest of the module serving calls ("" if none).
	Digest string
	// Loaded reports whether a module serves calls.
	Loaded   bool
	LoadedAt time.Time
	// Error is the last load error; with Loaded, an older module serves.
	Error string
}

// Status lists the configured policies and the configuration file's error,
// if the file on disk could not be used.
func (m *Manager) Status() ([]Status, error) {
	snap := m.current.Load()
	out := make([]Status, 0, len(snap.policies))
	for _, l := range snap.policies {
		s := Status{Name: l.cfg.Name, Kind: l.cfg.Kind, FailurePolicy: l.cfg.FailurePolicy, Module: l.path, Loaded: l.module != nil, LoadedAt: l.loadedAt}
		if l.module != nil {
			s.Digest = l.digest
		}
		if l.err != nil {
			s.Error = l.err.Error()
		}
		out = append(out, s)
	}
	return out, snap.configErr
}

// Run watches the policies directory (and the directories of modules kept
// elsewhere) and reloads when a file changes, until ctx is done. Reload
// errors are logged and keep the previous policies.
func (m *Manager) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policy: watch %s: %w", m.opts.Dir, err)
	}
	defer w.Close()
	// The puller fetches the registry modules the configuration names; it
	// stops with Run (cancel runs before Wait).
	var pulling sync.WaitGroup
	defer pulling.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pulling.Go(func() { m.pullLoop(ctx) })
	watched := map[string]bool{}
	watch := func() {
		dirs := []string{m.opts.Dir}
		for _, l := range m.current.Load().policies {
			if !isOCI(l.path) {
				dirs = append(dirs, filepath.Dir(l.path))
			}
		}
		for _, d := range dirs {
			if watched[d] {
				continue
			}
			if err := w.Add(d); err != nil {
				m.logger.Warn("cannot watch policy directory; changes there need a restart", "dir", d, "err", err)
				continue
			}
			watched[d] = true
		}
	}
	watch()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if m.relevant(ev.Name) {
				timer.Reset(m.opts.ReloadDelay)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			m.logger.Warn("policy directory watch error", "err", err)
		case <-timer.C:
			if err := m.Reload(ctx); err != nil {
				m.logger.Error("policy reload", "err", err)
			}
			watch()
		}
	}
}

// relevant reports whether a changed file is the configuration or a module.
func (m *Manager) relevant(name string) bool {
	if filepath.Clean(name) == filepath.Join(m.opts.Dir, ConfigFileName) {
		return true
	}
	for _, l := range m.current.Load().policies {
		if filepath.Clean(name) == filepath.Clean(l.path) {
			return true
		}
	}
	// A module not yet loaded (new in the configuration) or renamed into
	// place by an editor: any .wasm (or OPA bundle) change is worth a look.
	return filepath.Ext(name) == ".wasm" || strings.HasSuffix(name, ".tar.gz")
}
