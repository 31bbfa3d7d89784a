package wasm

import (
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// memoryBudget enforces one instance's memory limit and remembers whether the
// guest ever asked for more.
//
// wazero's WithMemoryLimitPages is runtime-wide and refuses a grow before any
// hook sees it, so a refused grow would be indistinguishable from any other
// trap. The runtime keeps a hard ceiling (Config.WithMemoryCeilingPages);
// this allocator enforces the per-module limit below it and records the
// refusal, which lets Call return ErrMemoryLimit. See RATIONALE.md.
type memoryBudget struct {
	limitBytes uint64
	// refused is set when a grow past limitBytes was refused. Written by the
	// goroutine running the guest, read after the call by the same goroutine
	// or by a closer, hence atomic.
	refused atomic.Bool
}

func (b *memoryBudget) Allocate(capBytes, maxBytes uint64) experimental.LinearMemory {
	capBytes = min(capBytes, b.limitBytes)
	return &linearMemory{budget: b, buf: make([]byte, 0, capBytes)}
}

// linearMemory is used by exactly one instance, which is used by one
// goroutine at a time (the pool guarantees it), so it needs no lock.
type linearMemory struct {
	budget *memoryBudget
	buf    []byte
}

func (m *linearMemory) Reallocate(size uint64) []byte {
	if size > m.budget.limitBytes {
		m.budget.refused.Store(true)
		return nil
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	// Grow geometrically, as append would, but never past the limit.
	newCap := max(size, min(2*uint64(cap(m.buf)), m.budget.limitBytes))
	nb := make([]byte, size, newCap)
	copy(nb, m.buf)
	m.buf = nb
	return nb
}

func (m *linearMemory) Free() { m.buf = nil }
