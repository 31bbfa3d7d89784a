package memtrim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// TestRunStopsOnErrorWithoutFailing: a trim that fails (a kernel without MADV_PAGEOUT, or
// anything else) or a resident size that cannot be read stops trimming, logged, and never
// fails the agent: Run returns nil, before ctx ends.
func TestRunStopsOnErrorWithoutFailing(t *testing.T) {
	for _, tt := range []struct {
		name          string
		trimErr       error
		residentErr   error
		wantTrimCalls int
	}{
		{"no MADV_PAGEOUT", fmt.Errorf("madvise MADV_PAGEOUT on 0x400000-0x500000: %w", unix.EINVAL), nil, 1},
		{"trim failed", errors.New("read /proc/self/smaps: permission denied"), nil, 1},
		{"resident unreadable", nil, errors.New("read /proc/self/smaps: permission denied"), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls int
			trim = func() (Result, error) { calls++; return Result{ExecutableAfter: 2 << 20}, tt.trimErr }
			executableResident = func() (int64, error) { return 64 << 20, tt.residentErr }
			t.Cleanup(func() { trim, executableResident = Trim, ExecutableResident })
			var warnings int
			log := slog.New(levelCounter{slog.LevelWarn, &warnings})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := Run(ctx, Config{After: time.Millisecond, Period: time.Millisecond, MinInterval: time.Nanosecond, Log: log}); err != nil {
				t.Errorf("Run: %v, want nil: a trim never fails the agent", err)
			}
			if ctx.Err() != nil {
				t.Errorf("Run went on until ctx ended; want it to stop trimming")
			}
			if calls != tt.wantTrimCalls || warnings != 1 {
				t.Errorf("%d trims, %d warnings; want %d, 1", calls, warnings, tt.wantTrimCalls)
			}
		})
	}
}

// TestRunWaitsAfter: no trim before After, none when ctx ends first.
func TestRunWaitsAfter(t *testing.T) {
	var calls int
	trim = func() (Result, error) { calls++; return Result{}, nil }
	t.Cleanup(func() { trim = Trim })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := Run(ctx, Config{After: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if calls != 0 {
		t.Errorf("%d trims before After", calls)
	}
}

// levelCounter counts the records at its level.
type levelCounter struct {
	level slog.Level
	n     *int
}

func (h levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h levelCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level == h.level {
		*h.n++
	}
	return nil
}
func (h levelCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h levelCounter) WithGroup(string) slog.Handler      { return h }
