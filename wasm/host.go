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
//
// What the host holds for the guest is bounded by the policy's limits: a
// request longer than Limits.OutputBytes (what a guest may hand the host in
// one piece) is refused without being copied, and an answer is at most
// Limits.HostResponseBytes as JSON: each function cuts its one large string
// (a body, a file's data, what was received) to fit (fitAnswer), and an
// error's message is clipped.
func (e *Engine) jsonHostFunc(g Grant, name string, fn func(ctx context.Context, st *callState, req []byte) any) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		st := mustState(ctx, name)
		ptr, n := uint32(stack[0]), uint32(stack[1])
		if _, ok := mod.Memory().Read(ptr, n); !ok {
			guestBytes(mod, name, ptr, n) // raises ErrBadPointer
		}
		lim := st.m.limits
		var answer any
		switch {
		case !st.m.grants[g]:
			answer = hostError{Error: fmt.Sprintf("%s needs the %q grant", name, g), Code: "denied"}
		case int64(n) > int64(lim.OutputBytes):
			answer = hostError{Error: fmt.Sprintf("a request of %d bytes is over the limit of %d bytes for what a policy hands the host", n, lim.OutputBytes), Code: "invalid"}
		default:
			answer = fn(ctx, st, guestBytes(mod, name, ptr, n))
		}
		if he, ok := answer.(hostError); ok {
			he.Error = clipText(he.Error, maxHostErrorBytes)
			answer = he
		}
		b, err := json.Marshal(answer)
		if err != nil {
			b, _ = json.Marshal(hostError{Error: "encode answer: " + clipText(err.Error(), maxHostErrorBytes), Code: "io"})
		}
		if len(b) > lim.HostResponseBytes {
			// Not reached: the functions fit their answers. Kept so that
			// the bound holds whatever a future answer carries.
			b, _ = json.Marshal(hostError{Error: fmt.Sprintf("the answer of %d bytes is over the limit of %d bytes", len(b), lim.HostResponseBytes), Code: "io"})
		}
		st.pending = b
		stack[0] = uint64(len(b))
	}
}

// maxHostErrorBytes clips the message of a host function's error answer,
// which may quote what the guest sent (a URL, a path).
const maxHostErrorBytes = 1 << 10

// clipText cuts s to at most n bytes, at a UTF-8 boundary, marking the cut.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " [...]"
	cut := max(n-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// fitAnswer cuts *s, the one large string of the answer v, so that v as
// JSON is at most limit bytes, and sets *cut if it did. JSON may write a
// byte of *s as six (a control character as \u0001), so a string read up
// to the limit may not fit as it is.
func fitAnswer(v any, s *string, cut *bool, limit int) {
	full, wasCut := *s, *cut
	*s, *cut = "", true // the rest of the answer, at its longest
	rest, err := json.Marshal(v)
	*s, *cut = full, wasCut
	if err != nil {
		return // jsonHostFunc answers with the error
	}
	if n := jsonFitPrefix(full, limit-len(rest)); n < len(full) {
		*s, *cut = full[:n], true
	}
}

// jsonFitPrefix returns the length of the longest prefix of s, cut at a
// rune boundary, whose escaped form in a JSON string written by
// encoding/json (HTML characters escaped) is at most room bytes. Each
// character is counted at its longest escape.
func jsonFitPrefix(s string, room int) int {
	used := 0
	for i := 0; i < len(s); {
		c, size := s[i], 1
		var n int
		switch {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n = 2
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			n = 6
		case c < utf8.RuneSelf:
			n = 1
		default:
			var r rune
			r, size = utf8.DecodeRuneInString(s[i:])
			n = size
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				n = 6
			}
		}
		if used+n > room {
			return i
		}
		used += n
		i += size
	}
	return len(s)
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
