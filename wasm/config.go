package wasm

import (
	"fmt"
	"log/slog"
	"time"
)

// Default limits, applied to every zero field of Limits.
const (
	// DefaultMemoryPages is 1024 pages of 64 KiB: 64 MiB per instance. A Go
	// policy starts at about 2-4 MiB and a JSON decode of a pod adds little.
	DefaultMemoryPages = 1024
	// DefaultOutputBytes caps a call's JSON output, and each piece a guest
	// hands the host (a host function's request, an OPA builtin's argument).
	DefaultOutputBytes = 64 << 10
	// DefaultHostResponseBytes caps what the host hands the guest in one
	// piece, as JSON (a host function's answer, an OPA builtin's result).
	DefaultHostResponseBytes = 1 << 20
	// DefaultLogRate is the sustained log lines per second a module may write.
	DefaultLogRate = 10
	// DefaultLogBurst is how many log lines a module may write at once.
	DefaultLogBurst = 50
	// DefaultLogLineBytes truncates longer log lines.
	DefaultLogLineBytes = 1 << 10
	// DefaultLogFlood is how many log lines over budget fail the call.
	DefaultLogFlood = 1000
	// DefaultMaxInstances is how many instances of one module may run at once.
	DefaultMaxInstances = 2
	// DefaultMemoryCeilingPages is the runtime-wide hard ceiling (256 MiB).
	DefaultMemoryCeilingPages = 4096
)

// Limits bound what one module may use. A zero field takes its default.
type Limits struct {
	// MemoryPages caps the linear memory of each instance, in 64 KiB pages.
	// Defaults to DefaultMemoryPages (64 MiB). A grow past it fails and, if
	// the call then fails, the call returns ErrMemoryLimit.
	MemoryPages uint32
	// CallTimeout bounds each Call on top of the context's own deadline.
	// Defaults to DefaultCallTimeout (2 s; 8 s where wazero interprets).
	CallTimeout time.Duration
	// InitTimeout bounds the instantiation of one instance (_initialize).
	// Defaults to DefaultInitTimeout (10 s; 40 s where wazero interprets).
	InitTimeout time.Duration
	// OutputBytes caps a call's output (ErrOutputTooLarge), and each piece
	// of data a guest hands the host: a host function's request (answered
	// "invalid" beyond it, without being copied) and an OPA builtin's
	// argument (the call fails with ErrOutputTooLarge).
	// Defaults to DefaultOutputBytes (64 KiB).
	OutputBytes int
	// HostResponseBytes caps each piece of data the host hands the guest,
	// as JSON: a host function's answer (an HTTP body, a file, what a TCP
	// peer sent, cut to fit and marked truncated) and an OPA builtin's
	// result (a sprintf that would print more fails the call with
	// ErrOutputTooLarge). What the host allocates for one host call is a
	// small multiple of it (policies/ABI.md).
	// Defaults to DefaultHostResponseBytes (1 MiB).
	HostResponseBytes int
	// LogRate is the sustained number of log lines per second, shared by all
	// instances of the module. Lines over budget are dropped and counted.
	// Defaults to DefaultLogRate (10/s).
	LogRate float64
	// LogBurst is the number of lines that may be logged at once.
	// Defaults to DefaultLogBurst (50).
	LogBurst int
	// LogLineBytes truncates longer lines. Defaults to DefaultLogLineBytes (1 KiB).
	LogLineBytes int
	// LogFlood is the number of dropped lines within one call that fails the
	// call with ErrLogFlood. Defaults to DefaultLogFlood (1000).
	LogFlood int
	// MaxInstances is how many instances may exist (and so run concurrently).
	// Defaults to DefaultMaxInstances (2).
	MaxInstances int
}

// withDefaults fills zero fields from d, then from the package defaults.
func (l Limits) withDefaults(d Limits) Limits {
	pick := func(v, dv, def int) int {
		if v > 0 {
			return v
		}
		if dv > 0 {
			return dv
		}
		return def
	}
	pickD := func(v, dv, def time.Duration) time.Duration {
		if v > 0 {
			return v
		}
		if dv > 0 {
			return dv
		}
		return def
	}
	out := l
	out.MemoryPages = uint32(pick(int(l.MemoryPages), int(d.MemoryPages), DefaultMemoryPages))
	out.CallTimeout = pickD(l.CallTimeout, d.CallTimeout, DefaultCallTimeout)
	out.InitTimeout = pickD(l.InitTimeout, d.InitTimeout, DefaultInitTimeout)
	out.OutputBytes = pick(l.OutputBytes, d.OutputBytes, DefaultOutputBytes)
	out.HostResponseBytes = pick(l.HostResponseBytes, d.HostResponseBytes, DefaultHostResponseBytes)
	if out.LogRate <= 0 {
		out.LogRate = d.LogRate
		if out.LogRate <= 0 {
			out.LogRate = DefaultLogRate
		}
	}
	out.LogBurst = pick(l.LogBurst, d.LogBurst, DefaultLogBurst)
	out.LogLineBytes = pick(l.LogLineBytes, d.LogLineBytes, DefaultLogLineBytes)
	out.LogFlood = pick(l.LogFlood, d.LogFlood, DefaultLogFlood)
	out.MaxInstances = pick(l.MaxInstances, d.MaxInstances, DefaultMaxInstances)
	return out
}

// Config configures an Engine. It is immutable: each With method returns a
// copy, so a Config can be shared and specialised safely.
//
//	cfg := wasm.NewConfig().WithCacheDir("/run/holdfast/wasm-cache")
//	eng, err := wasm.NewEngine(ctx, cfg)
type Config struct {
	cacheDir     string
	logger       *slog.Logger
	limits       Limits
	ceilingPages uint32
	// closeOnContextDone turns on wazero's WithCloseOnContextDone on top of
	// the checkpoints. Only the tests and benchmarks that measure it as a
	// backstop set it (export_test.go); see RATIONALE.md.
	closeOnContextDone bool
}

// NewConfig returns the default configuration: no on-disk cache, logs
// discarded, default limits.
func NewConfig() Config { return Config{} }

// WithCacheDir keeps compiled modules in dir (wazero's compilation cache), so
// that a restart loads a module in about 0.1 s instead of recompiling it
// (about 1.5 s for a Go module). The directory is created if missing.
// Defaults to "" (compile in memory only). Its entries are machine code the
// engine runs, checked by a CRC only: keep dir where only the agent writes,
// and not on a disk an attacker can hold (the agent's default is on tmpfs).
func (c Config) WithCacheDir(dir string) Config { c.cacheDir = dir; return c }

// WithLogger receives the guests' log lines, each with a "module" attribute.
// Defaults to a logger that discards everything.
func (c Config) WithLogger(l *slog.Logger) Config { c.logger = l; return c }

// WithDefaultLimits sets the limits applied to zero fields of a Spec's
// Limits. Zero fields here take the package defaults (see Limits).
func (c Config) WithDefaultLimits(l Limits) Config { c.limits = l; return c }

// WithMemoryCeilingPages sets the runtime-wide memory ceiling, in 64 KiB
// pages, given to wazero's WithMemoryLimitPages: no instance can grow past it
// whatever its Limits say. Defaults to DefaultMemoryCeilingPages (256 MiB).
func (c Config) WithMemoryCeilingPages(pages uint32) Config { c.ceilingPages = pages; return c }

func (c Config) validate() error {
	if c.ceilingPages > 65536 {
		return fmt.Errorf("memory ceiling %d pages is over the 65536 pages WebAssembly allows", c.ceilingPages)
	}
	return nil
}
