package pods

import "time"

// Failed steps of a pod's sync (its network, a container's creation) are tried again after a
// delay that doubles with each consecutive failure, from retryInitial to retryMax, and is
// reset by a success. A fixed 5 s retry made a gateway whose CNI configuration or runtime is
// broken for a pod create and delete a sandbox, run CNI ADD and DEL, and send an event and a
// status patch over its uplink every 5 s for as long as it lasted; the kubelet backs such
// failures off the same way (its container back-off: 10 s doubling to 5 min).
const (
	retryInitial = 5 * time.Second
	retryMax     = 5 * time.Minute
)

// retryBackOff counts the consecutive failures of one step. The zero value has none.
type retryBackOff struct {
	failures int
	last     time.Time // when the last failure was
}

// failed records a failure at now and returns the delay before the next try.
func (b *retryBackOff) failed(now time.Time) time.Duration {
	b.failures++
	b.last = now
	return b.delay()
}

// delay is the wait after the last failure: retryInitial, doubled per earlier consecutive
// failure, at most retryMax; 0 without failures.
func (b *retryBackOff) delay() time.Duration {
	if b.failures == 0 {
		return 0
	}
	d := retryInitial
	for range b.failures - 1 {
		if d >= retryMax/2 {
			return retryMax
		}
		d *= 2
	}
	return min(d, retryMax)
}

// heldFor is how long the next try must still wait at now (0: it may be tried).
func (b *retryBackOff) heldFor(now time.Time) time.Duration {
	if b.failures == 0 {
		return 0
	}
	return max(0, b.delay()-now.Sub(b.last))
}
