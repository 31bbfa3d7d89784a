package pods

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
)

// terminationOrder is kubelet's termination ordering for a pod with sidecars (restartable
// init containers): every container's preStop hook runs at once, but a sidecar is signalled
// only once every app container and every sidecar declared after it has exited. App
// containers can so still reach their sidecars (a proxy, a log shipper, the server a preStop
// hook calls) while they shut down.
type terminationOrder struct {
	mu      sync.Mutex
	exited  map[string]chan struct{} // closed when the container has exited
	waitFor map[string][]chan struct{}
}

// newTerminationOrder orders the stop of the pod's containers that are running; the others
// count as exited already.
func newTerminationOrder(pod *v1.Pod, running map[string]bool) *terminationOrder {
	o := &terminationOrder{exited: map[string]chan struct{}{}, waitFor: map[string][]chan struct{}{}}
	channel := func(name string) chan struct{} {
		ch := make(chan struct{})
		if !running[name] {
			close(ch)
		}
		o.exited[name] = ch
		return ch
	}
	var apps []chan struct{}
	for _, c := range pod.Spec.Containers {
		apps = append(apps, channel(c.Name))
	}
	var later chan struct{} // the next sidecar in declaration order
	for i := len(pod.Spec.InitContainers) - 1; i >= 0; i-- {
		c := &pod.Spec.InitContainers[i]
		ch := channel(c.Name)
		if !isSidecar(c) {
			continue
		}
		o.waitFor[c.Name] = append(o.waitFor[c.Name], apps...)
		if later != nil {
			o.waitFor[c.Name] = append(o.waitFor[c.Name], later)
		}
		later = ch
	}
	return o
}

// waitTurn blocks until the containers name must outlive have exited, for at most budget
// (what is left of its grace period), and returns how long it waited.
func (o *terminationOrder) waitTurn(ctx context.Context, name string, budget time.Duration) time.Duration {
	if budget <= 0 {
		return 0
	}
	start := time.Now()
	timer := time.NewTimer(budget)
	defer timer.Stop()
	for _, ch := range o.waitFor[name] {
		select {
		case <-ch:
		case <-timer.C:
			return time.Since(start)
		case <-ctx.Done():
			return time.Since(start)
		}
	}
	return time.Since(start)
}

// exitedNow records that name has exited (or will not be waited for any longer).
func (o *terminationOrder) exitedNow(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ch, ok := o.exited[name]; ok {
		close(ch)
		delete(o.exited, name)
	}
}
