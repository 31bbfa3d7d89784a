package events

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/holdfast-dev/holdfast/agent/events/record"
)

// DefaultBacklogSize is how many events a Backlog holds while the apiserver is out of reach:
// client-go's own queue length (maxQueuedEvents). An event is about 1 KiB, so about 1 MiB.
const DefaultBacklogSize = 1000

// backlogRetry is how often delivery of the backlog is tried while the apiserver is out of
// reach: client-go's sleep between two tries of an event.
const backlogRetry = 10 * time.Second

// Backlog is the record.EventSink events go through to the apiserver. While the apiserver is
// out of reach it holds them in memory, coalesced (a repeat of an event, which the
// broadcaster's correlator gives the same name and a higher count, replaces its earlier copy),
// at most size of them, the oldest dropped and counted past that; Run delivers them, oldest
// first with their original timestamps, once the apiserver answers again.
//
// Without it, client-go's broadcaster tries each event 12 times 10 s apart, one event at a
// time: during an outage of more than two minutes the events of the outage (the restarts and
// probe failures an operator wants to see afterwards) were dropped, and the first one blocked
// every other for those two minutes. The backlog is not written to disk (flash is not spent on
// events): an agent restart loses it, as the kubelet's queue.
type Backlog struct {
	sink  record.EventSink
	size  int
	retry time.Duration
	log   *slog.Logger

	mu    sync.Mutex // protects queue, inflight, dropped
	queue []*v1.Event
	// inflight is the event being delivered, out of the queue meanwhile: neither dropped nor
	// counted twice if the queue fills during its delivery.
	inflight *v1.Event
	dropped  uint64
	wake     chan struct{}
}

// NewBacklog makes a backlog of at most size events (DefaultBacklogSize when size <= 0) in front
// of the apiserver's sink.
func NewBacklog(sink record.EventSink, size int, log *slog.Logger) *Backlog {
	if size <= 0 {
		size = DefaultBacklogSize
	}
	return &Backlog{sink: sink, size: size, retry: backlogRetry, log: log, wake: make(chan struct{}, 1)}
}

// Create implements record.EventSink.
func (b *Backlog) Create(e *v1.Event) (*v1.Event, error) {
	return b.send(e, func() (*v1.Event, error) { return b.sink.Create(e) })
}

// Update implements record.EventSink.
func (b *Backlog) Update(e *v1.Event) (*v1.Event, error) {
	return b.send(e, func() (*v1.Event, error) { return b.sink.Update(e) })
}

// Patch implements record.EventSink. The correlator hands the whole event, its count and
// timestamps updated, with the patch: that event is what the backlog keeps.
func (b *Backlog) Patch(e *v1.Event, patch []byte) (*v1.Event, error) {
	return b.send(e, func() (*v1.Event, error) { return b.sink.Patch(e, patch) })
}

// send delivers e through deliver, unless events are already waiting (they go first, so the
// apiserver gets them in order) or the apiserver does not answer: then e waits in the
// backlog, and the broadcaster is told it was recorded.
func (b *Backlog) send(e *v1.Event, deliver func() (*v1.Event, error)) (*v1.Event, error) {
	if b.Len() == 0 {
		out, err := deliver()
		if err == nil || !unreachable(err) {
			return out, err
		}
	}
	b.add(e.DeepCopy())
	return e, nil
}

// add queues e, replacing an earlier copy of the same event, dropping the oldest when full.
func (b *Backlog) add(e *v1.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, q := range b.queue {
		if q.Namespace == e.Namespace && q.Name == e.Name {
			b.queue[i] = e
			return
		}
	}
	b.queue = append(b.queue, e)
	b.trimLocked()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// trimLocked drops the oldest events past the backlog's size.
func (b *Backlog) trimLocked() {
	for len(b.queue) > b.size {
		b.queue = b.queue[1:]
		b.dropped++
		if b.dropped == 1 || b.dropped%100 == 0 {
			b.log.Warn("event backlog full while the apiserver is out of reach: oldest events dropped",
				"size", b.size, "dropped", b.dropped)
		}
	}
}

// Len is how many events wait for the apiserver, the one being delivered included.
func (b *Backlog) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight != nil {
		return len(b.queue) + 1
	}
	return len(b.queue)
}

// Dropped is how many events were dropped because the backlog was full.
func (b *Backlog) Dropped() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}

// Run delivers the backlog until ctx ends: at once when an event is queued, then every retry
// period while the apiserver does not answer.
func (b *Backlog) Run(ctx context.Context) error {
	t := time.NewTicker(b.retry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-b.wake:
		case <-t.C:
		}
		b.flush()
	}
}

// flush delivers the queued events oldest first, until the apiserver stops answering.
func (b *Backlog) flush() {
	delivered := 0
	defer func() {
		if delivered > 0 {
			b.log.Info("events recorded while the apiserver was out of reach delivered", "events", delivered, "waiting", b.Len())
		}
	}()
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.mu.Unlock()
			return
		}
		e := b.queue[0]
		b.queue, b.inflight = b.queue[1:], e
		b.mu.Unlock()

		err := b.deliver(e)
		b.mu.Lock()
		b.inflight = nil
		if err != nil && unreachable(err) {
			// Back to the front, unless a newer copy of it was queued meanwhile.
			if !slices.ContainsFunc(b.queue, func(q *v1.Event) bool { return q.Namespace == e.Namespace && q.Name == e.Name }) {
				b.queue = append([]*v1.Event{e}, b.queue...)
				b.trimLocked()
			}
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		if err != nil {
			b.log.Warn("event rejected by the apiserver; dropped", "object", e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name,
				"reason", e.Reason, "err", err)
		} else {
			delivered++
		}
	}
}

// deliver creates e, or updates it when it was created before the outage (the apiserver
// updates an Event with no resourceVersion unconditionally).
func (b *Backlog) deliver(e *v1.Event) error {
	create := e.DeepCopy()
	create.ResourceVersion = ""
	_, err := b.sink.Create(create)
	if apierrors.IsAlreadyExists(err) {
		update := e.DeepCopy()
		update.ResourceVersion = ""
		_, err = b.sink.Update(update)
	}
	return err
}

// unreachable says whether err means the apiserver did not take the event for now (no answer,
// or an answer that asks to come back later), rather than rejecting it.
func unreachable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}
