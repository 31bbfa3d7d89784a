//go:build amd64 || arm64

package wasm

import "time"

// Deadlines where wazero compiles modules to machine code (amd64, arm64).
// config_interpreted.go has those for the other architectures.
const (
	// DefaultCallTimeout is Kubewarden's default evaluation timeout.
	DefaultCallTimeout = 2 * time.Second
	// DefaultInitTimeout bounds instantiation (Go's runtime start takes 30-60
	// ms on a 2-core amd64).
	DefaultInitTimeout = 10 * time.Second
)
