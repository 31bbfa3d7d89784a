//go:build !amd64 && !arm64

package wasm

import "time"

// Deadlines where wazero interprets modules (armv7 and the other
// architectures without its compiler). Measured on amd64 with the
// interpreter forced, a Go admission policy takes about 30 times longer per
// call than compiled (4.4 ms against 0.15 ms on a 2 KB pod) and its cold
// start about 180 ms; an armv7 core is several times slower again. The
// deadlines are four times the compiled ones: still far above what the
// example policies need there, and a hung guest is still stopped within
// seconds.
const (
	// DefaultCallTimeout is four times Kubewarden's default evaluation
	// timeout.
	DefaultCallTimeout = 8 * time.Second
	// DefaultInitTimeout bounds instantiation (Go's runtime start).
	DefaultInitTimeout = 40 * time.Second
)
