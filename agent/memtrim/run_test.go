package memtrim

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeExecutable stands for the executable's resident pages, as Run sees them through trim
// and executableResident.
type fakeExecutable struct {
	mu       sync.Mutex
	resident func(sinceFirstTrim time.Duration) int64 // the steady state's, the trim's pages faulted back in
	first    time.Time
	trims    int
}

func (f *fakeExecutable) install(t *testing.T) {
	trim = func() (Result, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.first.IsZero() {
			f.first = time.Now()
		}
		f.trims++
		// Right after a trim only the pages the trim itself ran are resident.
		return Result{ExecutableBefore: f.resident(time.Since(f.first)), ExecutableAfter: 2 << 20}, nil
	}
	executableResident = func() (int64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.resident(time.Since(f.first)), nil
	}
	t.Cleanup(func() { trim, executableResident = Trim, ExecutableResident })
}

// TestRunQuietAfterTheWorkingSetFaultsBack: after a trim the steady state faults its own
// code back in (here 9 MiB, more than Growth: a TLS and JSON round trip of this test binary
// faults back 5 MiB); that is not growth, and a quiet steady state is not trimmed again.
func TestRunQuietAfterTheWorkingSetFaultsBack(t *testing.T) {
	f := &fakeExecutable{resident: func(time.Duration) int64 { return 11 << 20 }}
	f.install(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := Run(ctx, Config{After: time.Millisecond, Period: 2 * time.Millisecond, MinInterval: 20 * time.Millisecond, Growth: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	if f.trims != 1 {
		t.Errorf("%d trims of a steady state whose resident pages never grew past what it faulted back in after the first, want 1", f.trims)
	}
}

// TestRunTrimsAgainOnGrowth: growth by Growth past the settled steady state is trimmed
// again, once.
func TestRunTrimsAgainOnGrowth(t *testing.T) {
	f := &fakeExecutable{resident: func(since time.Duration) int64 {
		if since < 150*time.Millisecond {
			return 11 << 20
		}
		return 20 << 20 // a burst of pods: new code paths
	}}
	f.install(t)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	if err := Run(ctx, Config{After: time.Millisecond, Period: 2 * time.Millisecond, MinInterval: 20 * time.Millisecond, Growth: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	if f.trims != 2 {
		t.Errorf("%d trims, want 2: the first, and one after the growth", f.trims)
	}
}
