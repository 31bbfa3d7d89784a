package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a buffer that goroutines write to while the test reads it: a command's or a
// container's output, copied by goroutines of their own.
type SyncBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
