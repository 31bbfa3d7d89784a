package poll

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of ending the test, so that the
// failure path can be asserted. Fatalf must not return: it ends the goroutine as the real one
// does (runtime.Goexit), which is why each case runs in a goroutine of its own.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func run(f func(r *recorder)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func TestUntil(t *testing.T) {
	// A condition that holds on its third call: no failure, three calls.
	calls := 0
	r := run(func(r *recorder) {
		Until(r, time.Second, time.Millisecond, "third call", func() error {
			if calls++; calls < 3 {
				return fmt.Errorf("call %d", calls)
			}
			return nil
		})
	})
	if r.failed != "" || calls != 3 {
		t.Errorf("a condition true at the third call: failed %q after %d calls", r.failed, calls)
	}

	// A condition that never holds: the test fails after the timeout, not before, with what
	// and the last error.
	start := time.Now()
	n := 0
	r = run(func(r *recorder) {
		Until(r, 50*time.Millisecond, 5*time.Millisecond, "the impossible", func() error {
			n++
			return fmt.Errorf("attempt %d", n)
		})
	})
	if elapsed := time.Since(start); elapsed < 50*time.Millisecond {
		t.Errorf("failed after %v, before the 50ms timeout", elapsed)
	}
	want := fmt.Sprintf("the impossible: not true after 50ms: attempt %d", n)
	if r.failed != want {
		t.Errorf("failure %q, want %q", r.failed, want)
	}
}

func TestUntilTrue(t *testing.T) {
	r := run(func(r *recorder) {
		UntilTrue(r, 20*time.Millisecond, time.Millisecond, "never", func() bool { return false })
	})
	if r.failed != "never: not true after 20ms: still false" {
		t.Errorf("failure %q", r.failed)
	}
	r = run(func(r *recorder) {
		UntilTrue(r, 20*time.Millisecond, time.Millisecond, "always", func() bool { return true })
	})
	if r.failed != "" {
		t.Errorf("a true condition failed: %q", r.failed)
	}
}
