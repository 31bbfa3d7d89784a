package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"
)

// Module is a loaded module: compiled once, with a pool of live instances
// reused across calls. It is safe for concurrent use; each instance serves
// one call at a time.
type Module struct {
	e        *Engine
	name     string
	digest   string
	compiled wazero.CompiledModule
	exports  map[string]api.FunctionDefinition
	info     ModuleInfo
	grants   grantSet
	limits   Limits
	logs     *rateLimiter
	// opa is set for a module of OPA's ABI (Spec.ABI == ABIOPA).
	opa *opaModule

	// slots holds one token per instance that may exist; a call holds one for
	// its whole duration, so at most MaxInstances calls run at once.
	slots chan struct{}
	// fileOps holds one token per file system access under way, which may
	// outlive its call (fileOp): at most MaxInstances.
	fileOps chan struct{}

	// bgCtx is canceled at teardown; it bounds background replacements,
	// which bg tracks so that teardown waits for them.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	// mu protects idle, replacing, changed, inflight, closed and tornDown.
	mu   sync.Mutex
	idle []*instance
	// replacing counts background replacements under way; a call that
	// finds no idle instance waits for them rather than instantiating a
	// second one in parallel.
	replacing int
	// changed is closed (and renewed) when idle or replacing changes.
	changed  chan struct{}
	inflight int
	closed   bool
	tornDown bool
	// runaway, once set, says why the module is disabled: a call of it
	// outlived its deadline by more than overrunSlack (see watchOverrun).
	runaway string
}

// instance is one live guest. The pool hands it to one call at a time.
type instance struct {
	mod     api.Module
	alloc   api.Function
	free    api.Function
	entries map[string]api.Function
	budget  *memoryBudget
	output  *tailWriter
	opa     *opaInstance // for a module of OPA's ABI
	// watch fires if the call the instance serves outlives its deadline and
	// overrunSlack (watchOverrun); made at the instance's first call.
	watch *overrunWatch
}

func newModule(e *Engine, name, digest string, compiled wazero.CompiledModule, info ModuleInfo, grants grantSet, limits Limits) *Module {
	ctx, cancel := context.WithCancel(context.Background())
	return &Module{
		e:        e,
		name:     name,
		digest:   digest,
		compiled: compiled,
		exports:  compiled.ExportedFunctions(),
		info:     info,
		grants:   grants,
		limits:   limits,
		logs:     newRateLimiter(limits.LogRate, limits.LogBurst),
		slots:    make(chan struct{}, limits.MaxInstances),
		fileOps:  make(chan struct{}, limits.MaxInstances),
		changed:  make(chan struct{}),
		bgCtx:    ctx,
		bgCancel: cancel,
	}
}

// Name returns Spec.Name.
func (m *Module) Name() string { return m.name }

// Digest returns "sha256:<hex>" of the module's bytes.
func (m *Module) Digest() string { return m.digest }

// Info describes the module's ABI version, exports and imports.
func (m *Module) Info() ModuleInfo { return m.info }

// Limits returns the module's limits, defaults filled in.
func (m *Module) Limits() Limits { return m.limits }

// CallOption supplies what a host function may reach during one call.
type CallOption func(*callOptions)

type callOptions struct {
	network []netTarget
	files   *fileAccess
}

// Call runs export with input (JSON) on a pooled instance and returns its
// JSON output. The call is bounded by ctx and by Limits.CallTimeout. If the
// guest fails in any way the instance is discarded and a fresh one is made in
// the background; the module stays usable.
func (m *Module) Call(ctx context.Context, export string, input []byte, opts ...CallOption) ([]byte, error) {
	if m.opa != nil {
		if _, ok := m.opa.entrypoints[export]; !ok {
			return nil, newError(ErrMissingExport, m.name, export, fmt.Sprintf("no entrypoint %q", export), nil)
		}
	} else if def, ok := m.exports[export]; !ok || !sigEntry.matches(def) {
		return nil, newError(ErrMissingExport, m.name, export, fmt.Sprintf("no export %q %s", export, sigEntry), nil)
	}
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, newError(ErrClosed, m.name, export, "module closed", nil)
	}
	if m.runaway != "" {
		why := m.runaway
		m.mu.Unlock()
		return nil, newError(ErrTimeout, m.name, export, "module disabled: "+why, nil)
	}
	m.inflight++
	m.mu.Unlock()
	defer m.callDone()

	select {
	case m.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, m.ctxError(ctx, export, "waiting for a free instance")
	}
	defer func() { <-m.slots }()

	inst, err := m.takeIdle(ctx)
	if err != nil {
		return nil, m.ctxError(ctx, export, "waiting for a replacement instance")
	}
	if inst == nil {
		if inst, err = m.instantiate(ctx); err != nil {
			return nil, err
		}
	}
	out, err := m.call(ctx, inst, export, input, o)
	if err != nil {
		m.discard(inst)
		return nil, err
	}
	m.putIdle(inst)
	return out, nil
}

// callState is what host functions see of the call they serve, through the
// context wazero hands them.
type callState struct {
	m    *Module
	opts callOptions
	// pending is the last host function's answer, waiting for response_read.
	pending []byte
	// dropped counts log lines over budget in this call.
	dropped int
}

type callStateKey struct{}

func stateFrom(ctx context.Context) *callState {
	st, _ := ctx.Value(callStateKey{}).(*callState)
	return st
}

func (m *Module) call(ctx context.Context, inst *instance, export string, input []byte, o callOptions) ([]byte, error) {
	start := time.Now()
	callCtx, cancel := context.WithTimeout(ctx, m.limits.CallTimeout)
	defer cancel()
	defer m.watchOverrun(inst, callCtx, export, start).disarm()
	st := &callState{m: m, opts: o}
	callCtx = context.WithValue(callCtx, callStateKey{}, st)
	inst.output.reset(callCtx)
	defer func() {
		if st.dropped > 0 {
			m.e.logger.Warn("guest log lines dropped over budget", "module", m.name, "dropped", st.dropped)
		}
	}()
	fail := func(err error) ([]byte, error) {
		return nil, m.classify(ctx, callCtx, inst, export, start, err)
	}
	bad := func(kind error, format string, args ...any) ([]byte, error) {
		e := newError(kind, m.name, export, fmt.Sprintf(format, args...), nil)
		e.Guest = inst.output.String()
		return nil, e
	}
	if m.opa != nil {
		return m.evalOPA(callCtx, inst, export, input, fail, bad)
	}

	res, err := inst.alloc.Call(callCtx, uint64(len(input)))
	if err != nil {
		return fail(err)
	}
	inPtr := uint32(res[0])
	if inPtr == 0 && len(input) > 0 {
		if inst.budget.refused.Load() {
			return bad(ErrMemoryLimit, "alloc(%d) returned 0 after a refused memory grow (limit %d pages)", len(input), m.limits.MemoryPages)
		}
		return bad(ErrBadPointer, "alloc(%d) returned 0", len(input))
	}
	if !inst.mod.Memory().Write(inPtr, input) {
		return bad(ErrBadPointer, "alloc(%d) returned %#x, outside the guest's %d bytes of memory", len(input), inPtr, inst.mod.Memory().Size())
	}
	res, err = inst.entries[export].Call(callCtx, uint64(inPtr), uint64(len(input)))
	if err != nil {
		return fail(err)
	}
	outPtr, outLen := uint32(res[0]>>32), uint32(res[0])
	if outLen == 0 {
		return bad(ErrBadOutput, "empty output (returned %#x)", res[0])
	}
	if int64(outLen) > int64(m.limits.OutputBytes) {
		return bad(ErrOutputTooLarge, "output of %d bytes is over the limit of %d bytes", outLen, m.limits.OutputBytes)
	}
	view, ok := inst.mod.Memory().Read(outPtr, outLen)
	if !ok {
		return bad(ErrBadPointer, "output at %#x+%d is outside the guest's %d bytes of memory", outPtr, outLen, inst.mod.Memory().Size())
	}
	out := bytes.Clone(view)
	if _, err := inst.free.Call(callCtx, uint64(inPtr), uint64(len(input))); err != nil {
		return fail(err)
	}
	if _, err := inst.free.Call(callCtx, uint64(outPtr), uint64(outLen)); err != nil {
		return fail(err)
	}
	if !isJSONObject(out) {
		return bad(ErrBadOutput, "output is not a JSON object: %.80q", out)
	}
	return out, nil
}

// overrunSlack is how long past its deadline a call may run before its
// module is disabled. The checkpoints stop a guest within about a
// millisecond of work past its deadline, plus one bulk operation (tens of
// milliseconds for a whole memory; wasm/RATIONALE.md): a call still running
// a whole deadline and a second later was not stopped by them.
func overrunSlack(timeout time.Duration) time.Duration { return timeout + time.Second }

// watchOverrun is the backstop for a guest the checkpoints do not stop, which
// only a defect of the rewrite would allow: at its deadline plus
// overrunSlack, a call still running disables its module (no new call starts
// on it: each fails at once with ErrTimeout, so failurePolicy applies as for
// any timeout) and is logged as an error naming the module. The guest's
// goroutine cannot be stopped from outside compiled code; see RATIONALE.md
// for what bounds it then. It returns the watch to disarm when the call
// returns.
//
// One timer per instance, re-armed for each of its calls: a timer and a
// closure made per call cost about 400 ns and two allocations, a few
// percent of a small policy's call, for a path only a defect takes.
func (m *Module) watchOverrun(inst *instance, callCtx context.Context, export string, start time.Time) *overrunWatch {
	if inst.watch == nil {
		w := &overrunWatch{}
		w.timer = time.AfterFunc(time.Hour, func() { m.overran(w) })
		w.timer.Stop()
		inst.watch = w
	}
	deadline, _ := callCtx.Deadline()
	inst.watch.arm(export, start, time.Until(deadline)+overrunSlack(m.limits.CallTimeout))
	return inst.watch
}

// overran disables m: the call that w watches outlived its deadline.
func (m *Module) overran(w *overrunWatch) {
	export, start := w.current()
	why := fmt.Sprintf("a call of %s was still running %s after it started, past its deadline and its slack: the sandbox did not stop it", export, time.Since(start).Round(time.Millisecond))
	m.mu.Lock()
	first := m.runaway == ""
	if first {
		m.runaway = why
	}
	m.mu.Unlock()
	if first {
		m.e.logger.Error("Wasm module disabled: a call outlived its deadline", "module", m.name, "digest", m.digest, "export", export, "err", why)
	}
}

// overrunWatch is an instance's timer for watchOverrun; an instance serves
// one call at a time, so the call it describes is the one running.
type overrunWatch struct {
	timer *time.Timer
	mu    sync.Mutex // protects export and start, read by the timer's goroutine
	// export and start describe the call being watched.
	export string
	start  time.Time
}

func (w *overrunWatch) arm(export string, start time.Time, after time.Duration) {
	w.mu.Lock()
	w.export, w.start = export, start
	w.mu.Unlock()
	w.timer.Reset(after)
}

func (w *overrunWatch) disarm() { w.timer.Stop() }

func (w *overrunWatch) current() (string, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.export, w.start
}

func isJSONObject(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// classify turns what wazero returned into one of our classes.
func (m *Module) classify(ctx, callCtx context.Context, inst *instance, op string, start time.Time, err error) *Error {
	var ours *Error
	if errors.As(err, &ours) {
		// Raised by a host function (a bad pointer, a log flood).
		c := *ours
		c.Module, c.Op, c.Err = m.name, op, err
		c.Guest = inst.output.String()
		if c.Kind == ErrTrap && inst.budget.refused.Load() {
			// The guest gave up on its own after a refused grow (OPA's
			// opa_malloc aborts): the limit is why.
			c.Kind = ErrMemoryLimit
			c.Detail = fmt.Sprintf("the guest asked for more than its %d pages (%d MiB) of memory: %s", m.limits.MemoryPages, m.limits.MemoryPages/16, c.Detail)
		}
		return &c
	}
	e := newError(ErrTrap, m.name, op, "", err)
	e.Guest = inst.output.String()
	var exit *sys.ExitError
	isExit := errors.As(err, &exit)
	switch {
	case (isExit && exit.ExitCode() == sys.ExitCodeContextCanceled) || errors.Is(ctx.Err(), context.Canceled):
		e.Kind, e.Detail = ErrCanceled, "the caller canceled the call"
	case (isExit && exit.ExitCode() == sys.ExitCodeDeadlineExceeded) || callCtx.Err() != nil:
		limit := m.limits.CallTimeout
		if dl, ok := ctx.Deadline(); ok && dl.Sub(start) < limit {
			limit = dl.Sub(start).Round(time.Millisecond)
		}
		e.Kind, e.Detail = ErrTimeout, fmt.Sprintf("no answer within %s; the guest was stopped", limit)
	case inst.budget.refused.Load():
		e.Kind, e.Detail = ErrMemoryLimit, fmt.Sprintf("the guest asked for more than its %d pages (%d MiB) of memory", m.limits.MemoryPages, m.limits.MemoryPages/16)
	case isExit:
		e.Detail = fmt.Sprintf("the guest exited with code %d", exit.ExitCode())
	default:
		e.Detail = firstLine(err.Error())
	}
	return e
}

func (m *Module) ctxError(ctx context.Context, op, doing string) *Error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return newError(ErrCanceled, m.name, op, doing, ctx.Err())
	}
	return newError(ErrTimeout, m.name, op, doing, ctx.Err())
}

// instantiate makes a fresh instance and runs its _initialize, bounded by
// Limits.InitTimeout. The guest gets no filesystem, environment, arguments
// or sockets; a real clock only with GrantClock.
func (m *Module) instantiate(ctx context.Context) (*instance, error) {
	start := time.Now()
	ictx, cancel := context.WithTimeout(ctx, m.limits.InitTimeout)
	defer cancel()
	budget := &memoryBudget{limitBytes: uint64(m.limits.MemoryPages) * 65536}
	output := newTailWriter(2048)
	output.reset(ictx)
	ictx = experimental.WithMemoryAllocator(ictx, budget)
	ictx = context.WithValue(ictx, callStateKey{}, &callState{m: m})
	cfg := wazero.NewModuleConfig().
		WithName(""). // anonymous: many instances of one module coexist
		WithStartFunctions(exportInitialize).
		WithStdout(output).
		WithStderr(output)
	if m.grants[GrantClock] {
		cfg = cfg.WithSysWalltime().WithSysNanotime().WithNanosleep(boundedSleep)
	}
	mod, err := m.e.runtime.InstantiateModule(ictx, m.compiled, cfg)
	if err != nil {
		inst := &instance{budget: budget, output: output}
		e := m.classify(ctx, ictx, inst, "instantiate", start, err)
		// Instantiation also fails before any guest code runs (a data or
		// element segment out of range, a start section that traps): blame
		// _initialize only in a module that has one.
		_, hasInit := m.exports[exportInitialize]
		running := "instantiation"
		if hasInit {
			running = "_initialize"
		}
		if e.Kind == ErrTrap {
			e.Kind = ErrInvalidModule
			if hasInit {
				e.Detail = "_initialize failed: " + e.Detail
			}
		}
		if e.Kind == ErrTimeout {
			e.Detail = fmt.Sprintf("%s did not finish within %s", running, m.limits.InitTimeout)
		}
		return nil, e
	}
	inst := &instance{
		mod:     mod,
		alloc:   mod.ExportedFunction(exportAlloc),
		free:    mod.ExportedFunction(exportFree),
		entries: map[string]api.Function{},
		budget:  budget,
		output:  output,
	}
	for name, def := range m.exports {
		if sigEntry.matches(def) {
			inst.entries[name] = mod.ExportedFunction(name)
		}
	}
	if m.opa != nil {
		if inst.opa, err = m.opa.prepare(ictx, mod); err != nil {
			e := m.classify(ctx, ictx, inst, "instantiate", start, err)
			if e.Kind == ErrTrap {
				e.Kind = ErrInvalidModule
			}
			inst.close(ctx)
			return nil, e
		}
	}
	return inst, nil
}

// checkInstance checks a module's first instance against its ABI: the
// version holdfast_abi_version returns, or OPA's entrypoints and builtins.
func (m *Module) checkInstance(ctx context.Context, inst *instance, entrypoints []string) error {
	if m.opa != nil {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, m.limits.CallTimeout)
		defer cancel()
		cctx = context.WithValue(cctx, callStateKey{}, &callState{m: m})
		inst.output.reset(cctx)
		if err := m.opa.describe(cctx, inst.mod, inst.opa, entrypoints); err != nil {
			return m.classify(ctx, cctx, inst, "load", start, err)
		}
		return nil
	}
	v, err := m.abiVersion(ctx, inst)
	if err != nil {
		return err
	}
	if v != ABIVersion {
		return unsupportedABI(m.name, v)
	}
	m.info.ABIVersion = v
	return nil
}

// boundedSleep backs the guest's sleeps when it has the clock: each sleep is
// cut to 10 ms so that a sleeping guest still notices its deadline (wazero
// checks it in guest code, not during a host sleep).
func boundedSleep(ns int64) {
	const most = int64(10 * time.Millisecond)
	time.Sleep(time.Duration(min(ns, most)))
}

func (m *Module) abiVersion(ctx context.Context, inst *instance) (int, error) {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, m.limits.CallTimeout)
	defer cancel()
	cctx = context.WithValue(cctx, callStateKey{}, &callState{m: m})
	inst.output.reset(cctx)
	res, err := inst.mod.ExportedFunction(exportABIVersion).Call(cctx)
	if err != nil {
		return 0, m.classify(ctx, cctx, inst, exportABIVersion, start, err)
	}
	return int(int32(uint32(res[0]))), nil
}

func (inst *instance) close(ctx context.Context) {
	if inst.watch != nil {
		inst.watch.disarm()
	}
	if inst.mod != nil {
		_ = inst.mod.Close(ctx)
	}
}

// takeIdle returns an idle instance, waiting for a replacement under way if
// there is none; nil means the caller must instantiate.
func (m *Module) takeIdle(ctx context.Context) (*instance, error) {
	for {
		m.mu.Lock()
		if n := len(m.idle); n > 0 {
			inst := m.idle[n-1]
			m.idle = m.idle[:n-1]
			m.mu.Unlock()
			return inst, nil
		}
		if m.replacing == 0 {
			m.mu.Unlock()
			return nil, nil
		}
		changed := m.changed
		m.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// signalLocked wakes the calls waiting in takeIdle. m.mu must be held.
func (m *Module) signalLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Module) putIdle(inst *instance) {
	m.mu.Lock()
	if m.tornDown || len(m.idle) >= m.limits.MaxInstances {
		m.mu.Unlock()
		inst.close(context.Background())
		return
	}
	m.idle = append(m.idle, inst)
	m.signalLocked()
	m.mu.Unlock()
}

// discard closes a broken instance and starts a replacement in the
// background, so that the next call does not pay for instantiation.
func (m *Module) discard(inst *instance) {
	inst.close(context.Background())
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.tornDown {
		return
	}
	m.replacing++
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		defer func() {
			m.mu.Lock()
			m.replacing--
			m.signalLocked()
			m.mu.Unlock()
		}()
		fresh, err := m.instantiate(m.bgCtx)
		if err != nil {
			if m.bgCtx.Err() == nil {
				m.e.logger.Warn("replace broken instance", "module", m.name, "err", err)
			}
			return
		}
		m.putIdle(fresh)
	}()
}

func (m *Module) callDone() {
	m.mu.Lock()
	m.inflight--
	last := m.closed && m.inflight == 0
	m.mu.Unlock()
	if last {
		m.teardown(context.Background())
	}
}

// Close retires the module: new calls fail with ErrClosed, calls in flight
// finish on it, and the last of them releases its instances. Close does not
// wait for them.
func (m *Module) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	idleNow := m.inflight == 0
	m.mu.Unlock()
	if idleNow {
		m.teardown(ctx)
	}
	return nil
}

// teardown releases everything. It is idempotent.
func (m *Module) teardown(ctx context.Context) {
	m.mu.Lock()
	if m.tornDown {
		m.mu.Unlock()
		return
	}
	m.tornDown = true
	m.closed = true
	idle := m.idle
	m.idle = nil
	m.mu.Unlock()
	m.bgCancel()
	m.bg.Wait()
	for _, inst := range idle {
		inst.close(ctx)
	}
	_ = m.compiled.Close(ctx)
	m.e.forget(m)
}

// tailWriter keeps the last bytes a guest wrote to stdout/stderr, to explain
// a failure. Guests cannot use it to flood the agent's log.
type tailWriter struct {
	mu  sync.Mutex // protects buf and ctx
	max int
	buf []byte
	// ctx is the context of the guest code running now (a call, an
	// instantiation): once it is done, writes fail, so that one fd_write of
	// millions of buffers ends at the deadline instead of running on in the
	// host, where the engine's checkpoints cannot stop it.
	ctx context.Context
	// written counts what was written under ctx: past outputWriteBudget,
	// writes fail at once, so that one fd_write of millions of buffers as
	// large as the memory ends at its first refused buffer, not after
	// copying the tail of each (seconds, up to the deadline).
	written uint64
}

// outputWriteBudget bounds what one call (or instantiation) may write to
// stdout and stderr together; the tail kept is max bytes of it.
const outputWriteBudget = 64 << 20

// errWriteBudget is what a write past outputWriteBudget gets (the guest sees
// an I/O error).
var errWriteBudget = errors.New("over the budget of what one call may write to stdout and stderr")

func newTailWriter(max int) *tailWriter { return &tailWriter{max: max, buf: make([]byte, 0, 2*max)} }

// Write keeps the last max bytes of what was written. p is a view of guest
// memory (wazero hands fd_write's buffers over as they are), as large as the
// guest's memory: only its tail is copied, so a write costs the host at most
// max bytes, whatever its size.
func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx != nil && w.ctx.Err() != nil {
		return 0, w.ctx.Err()
	}
	if w.written += uint64(len(p)); w.written > outputWriteBudget {
		return 0, errWriteBudget
	}
	n := len(p)
	if len(p) > w.max {
		p = p[len(p)-w.max:]
	}
	if over := len(w.buf) + len(p) - w.max; over > 0 {
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	w.buf = append(w.buf, p...)
	return n, nil
}

// reset empties the tail before guest code runs under ctx.
func (w *tailWriter) reset(ctx context.Context) {
	w.mu.Lock()
	w.buf = w.buf[:0]
	w.ctx = ctx
	w.written = 0
	w.mu.Unlock()
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(bytes.TrimSpace(w.buf))
}
