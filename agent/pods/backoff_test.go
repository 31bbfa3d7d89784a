package pods

import (
	"testing"
	"time"
)

// TestPullBackoff: kubelet's image back-off: 10s after the first failure, doubling to the cap,
// over once the delay has passed, reset by a success, started over after 2*max idle.
func TestPullBackoff(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newBackoff(10*time.Second, 40*time.Second, func() time.Time { return now })
	const key = "uid/img"
	if wait, _ := b.waiting(key); wait {
		t.Fatal("waiting before any failure")
	}
	for _, want := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second} {
		if got := b.failed(key); got != want {
			t.Fatalf("delay %s, want %s", got, want)
		}
		now = now.Add(want - time.Second)
		if wait, left := b.waiting(key); !wait || left != time.Second {
			t.Fatalf("%s after a failure with delay %s: waiting %v, %s left", want-time.Second, want, wait, left)
		}
		now = now.Add(time.Second)
		if wait, _ := b.waiting(key); wait {
			t.Fatalf("still waiting once the delay %s passed", want)
		}
	}
	now = now.Add(81 * time.Second)
	if got := b.failed(key); got != 10*time.Second {
		t.Errorf("after 2*max idle: delay %s, want it started over at 10s", got)
	}
	b.reset(key)
	if wait, _ := b.waiting(key); wait {
		t.Error("waiting after a success")
	}
}
