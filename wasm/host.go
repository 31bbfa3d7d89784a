package wasm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/tetratelabs/wazero/api"
)

// Log levels of holdfast.log.
const (
	LogDebug = 0
	LogInfo  = 1
	LogWarn  = 2
	LogError = 3
)

// GuestLogKey is the attribute, set to true, of the records that carry a
// guest's own log lines (holdfast.log), telling them from the engine's.
const GuestLogKey = "guest"

// instantiateHostModule defines the "holdfast" import module. Every function
// is defined once for the whole runtime; whether a module may import it is
// decided at Load (checkImport), and checked again at each call.
//
// Functions that answer with data (http_request, tcp_dial, read_file,
// stat_file) return the length of a JSON answer that the guest then copies
// into memory it allocated itself with response_read. The host never calls
// back into the guest. See policies/ABI.md.
func (e *Engine) instantiateHostModule(ctx context.Context) error {
	b := e.runtime.NewHostModuleBuilder(HostModule)
	def := func(name string, fn api.GoModuleFunc, params, results []api.ValueType, names ...string) {
		b.NewFunctionBuilder().WithGoModuleFunction(fn, params, results).WithParameterNames(names...).Export(name)
	}
	def("log", e.hostLog, []api.ValueType{i32, i32, i32}, nil, "level", "ptr", "len")
	def("response_read", hostResponseRead, []api.ValueType{i32, i32}, []api.ValueType{i32}, "ptr", "len")
	def("http_request", e.jsonHostFunc(GrantHTTP, "http_request", e.httpRequest), []api.ValueType{i32, i32}, []api.ValueType{i32}, "ptr", "len")
	def("tcp_dial", e.jsonHostFunc(GrantTCP, "tcp_dial", tcpDial), []api.ValueType{i32, i32}, []api.ValueType{i32}, "ptr", "len")
	def("read_file", e.jsonHostFunc(GrantFile, "read_file", readFile), []api.ValueType{i32, i32}, []api.ValueType{i32}, "ptr", "len")
	def("stat_file", e.jsonHostFunc(GrantFile, "stat_file", statFile), []api.ValueType{i32, i32}, []api.ValueType{i32}, "ptr", "len")
	_, err := b.Instantiate(ctx)
	return err
}

// guestBytes returns a copy of guest memory [ptr, ptr+n), or raises
// ErrBadPointer in the guest (the call fails, the instance is discarded).
func guestBytes(mod api.Module, fn string, ptr, n uint32) []byte {
	view, ok := mod.Memory().Read(ptr, n)
	if !ok {
		panic(newError(ErrBadPointer, "", "", fmt.Sprintf("%s.%s got %#x+%d, outside the guest's %d bytes of memory", HostModule, fn, ptr, n, mod.Memory().Size()), nil))
	}
	return append([]byte(nil), view...)
}

func mustState(ctx context.Context, fn string) *callState {
	st := stateFrom(ctx)
	if st == nil {
		// Only reachable if a guest is run outside Module.call/instantiate.
		panic(newError(ErrTrap, "", "", fmt.Sprintf("%s.%s called outside a holdfast call", HostModule, fn), nil))
	}
	return st
}

func (e *Engine) hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	st := mustState(ctx, "log")
	level, ptr, n := int32(uint32(stack[0])), uint32(stack[1]), uint32(stack[2])
	// Check the whole range, then read at most a line's worth.
	if _, ok := mod.Memory().Read(ptr, n); !ok {
		guestBytes(mod, "log", ptr, n) // raises ErrBadPointer
	}
	lim := st.m.limits
	if !st.m.logs.allow() {
		st.dropped++
		if st.dropped > lim.LogFlood {
			panic(newError(ErrLogFlood, "", "", fmt.Sprintf("more than %d log lines over the budget of %g lines/s (burst %d) in one call", lim.LogFlood, lim.LogRate, lim.LogBurst), nil))
		}
		return
	}
	msg := guestBytes(mod, "log", ptr, min(n, uint32(lim.LogLineBytes)))
	truncated := n > uint32(lim.LogLineBytes)
	text := string(msg)
	if !utf8.ValidString(text) {
		text = fmt.Sprintf("%q", msg)
	}
	if truncated {
		text += " [truncated]"
	}
	var sl slog.Level
	switch {
	case level <= LogDebug:
		sl = slog.LevelDebug
	case level == LogInfo:
		sl = slog.LevelInfo
	case level == LogWarn:
		sl = slog.LevelWarn
	default:
		sl = slog.LevelError
	}
	e.logger.Log(context.Background(), sl, text, "module", st.m.name, GuestLogKey, true)
}

func hostResponseRead(ctx context.Context, mod api.Module, stack []uint64) {
	st := mustState(ctx, "response_read")
	ptr, n := uint32(stack[0]), uint32(stack[1])
	k := min(int(n), len(st.pending))
	if !mod.Memory().Write(ptr, st.pending[:k]) {
		guestBytes(mod, "response_read", ptr, uint32(k)) // raises ErrBadPointer
	}
	st.pending = nil
	stack[0] = uint64(k)
}

// hostError is the answer of a host function that could not do what was
// asked. Code is one of "denied", "invalid", "not_found", "timeout", "io".
type hostError struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// jsonHostFunc adapts a func(request JSON) -> answer to the ABI: read the
// request, check the grant again, run, keep the JSON answer pending and
// return its length.
func (e *Engine) jsonHostFunc(g Grant, name string, fn func(ctx context.Context, st *callState, req []byte) any) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		st := mustState(ctx, name)
		req := guestBytes(mod, name, uint32(stack[0]), uint32(stack[1]))
		var answer any
		if !st.m.grants[g] {
			answer = hostError{Error: fmt.Sprintf("%s needs the %q grant", name, g), Code: "denied"}
		} else {
			answer = fn(ctx, st, req)
		}
		b, err := json.Marshal(answer)
		if err != nil {
			b, _ = json.Marshal(hostError{Error: "encode answer: " + err.Error(), Code: "io"})
		}
		st.pending = b
		stack[0] = uint64(len(b))
	}
}

// rateLimiter is a token bucket shared by all instances of a module.
type rateLimiter struct {
	mu     sync.Mutex // protects tokens and last
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

func (r *rateLimiter) allow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.tokens = min(r.burst, r.tokens+now.Sub(r.last).Seconds()*r.rate)
	r.last = now
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}
