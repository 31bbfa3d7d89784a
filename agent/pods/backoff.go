package pods

import (
	"sync"
	"time"
)

// backoff is kubelet's restart back-off: the delay starts at base, doubles at each restart
// that follows a short run, is capped at max, and resets when a container ran for longer
// than 2*max (10 minutes with the defaults) before exiting.
type backoff struct {
	base, max time.Duration
	now       func() time.Time

	mu      sync.Mutex // protects entries
	entries map[string]*backoffEntry
}

type backoffEntry struct {
	delay      time.Duration
	lastUpdate time.Time
}

func newBackoff(base, max time.Duration, now func() time.Time) *backoff {
	return &backoff{base: base, max: max, now: now, entries: map[string]*backoffEntry{}}
}

// inBackOff reports whether a restart must still wait: the container finished less than the
// current delay ago.
func (b *backoff) inBackOff(key string, finishedAt time.Time) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[key]
	if !ok {
		return false, 0
	}
	return b.now().Sub(finishedAt) < e.delay, e.delay
}

// next records a restart of the container that ran from startedAt to finishedAt, and grows
// the delay for the one after.
func (b *backoff) next(key string, startedAt, finishedAt time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[key]
	switch {
	case !ok || (!startedAt.IsZero() && finishedAt.Sub(startedAt) > 2*b.max):
		b.entries[key] = &backoffEntry{delay: b.base, lastUpdate: b.now()}
	default:
		e.delay = min(2*e.delay, b.max)
		e.lastUpdate = b.now()
	}
}

// forget drops the entries of a pod that is gone.
func (b *backoff) forget(podUID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.entries {
		if len(k) > len(podUID) && k[:len(podUID)] == podUID && k[len(podUID)] == '/' {
			delete(b.entries, k)
		}
	}
}
