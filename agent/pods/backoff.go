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

// failed records a failed attempt of key (an image pull) and returns the delay before the
// next one: base at the first failure, doubling to max. A key idle for longer than 2*max
// starts over at base, as kubelet's image back-off (flowcontrol.Backoff) does.
func (b *backoff) failed(key string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	e, ok := b.entries[key]
	if !ok || now.Sub(e.lastUpdate) > 2*b.max {
		e = &backoffEntry{delay: b.base}
		b.entries[key] = e
	} else {
		e.delay = min(2*e.delay, b.max)
	}
	e.lastUpdate = now
	return e.delay
}

// waiting reports whether key failed less than its current delay ago, and how long is left.
func (b *backoff) waiting(key string) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[key]
	if !ok {
		return false, 0
	}
	left := e.delay - b.now().Sub(e.lastUpdate)
	return left > 0, left
}

// reset forgets key after a success.
func (b *backoff) reset(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.entries, key)
}
