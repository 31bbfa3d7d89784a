package events

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/test/poll"
)

// flakySink is the apiserver's sink, down while down is set: every call fails as a refused
// connection does.
type flakySink struct {
	record.EventSink
	mu    sync.Mutex
	down  bool
	calls int
}

func (f *flakySink) fail() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	}
	return nil
}

func (f *flakySink) setDown(d bool) { f.mu.Lock(); f.down = d; f.mu.Unlock() }

func (f *flakySink) Create(e *v1.Event) (*v1.Event, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	return f.EventSink.Create(e)
}

func (f *flakySink) Update(e *v1.Event) (*v1.Event, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	return f.EventSink.Update(e)
}

func (f *flakySink) Patch(e *v1.Event, p []byte) (*v1.Event, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	return f.EventSink.Patch(e, p)
}

func podRef(name string) *v1.ObjectReference {
	return &v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: name, UID: types.UID("uid-" + name), APIVersion: "v1"}
}

// Events recorded through client-go's broadcaster while the apiserver is down reach it once it
// is back: repeats coalesced into one event with their count, one created before the outage
// updated; the backlog holds at most its size, the oldest dropped and counted.
func TestBacklogDeliversWhatTheOutageRecorded(t *testing.T) {
	client := fake.NewClientset()
	sink := &flakySink{EventSink: &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}}
	b := NewBacklog(sink, 5, slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.retry = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = b.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(b)
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "holdfast", Host: "gw"})

	recorder.Event(podRef("before"), v1.EventTypeNormal, "Started", "Started container main")
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the event before the outage", func() error { return count(client, "before", "Started", 1) })

	sink.setDown(true)
	recorder.Event(podRef("before"), v1.EventTypeNormal, "Started", "Started container main") // count 2
	for range 3 {
		recorder.Event(podRef("crashy"), v1.EventTypeWarning, "BackOff", "Back-off restarting failed container")
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the outage's events queued, coalesced", func() error {
		if n := b.Len(); n != 2 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	sink.setDown(false)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the repeat of the event from before the outage", func() error { return count(client, "before", "Started", 2) })
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the outage's BackOff, three of them", func() error { return count(client, "crashy", "BackOff", 3) })

	// More distinct events than the backlog holds: the oldest go, counted.
	sink.setDown(true)
	for i := range 7 {
		recorder.Event(podRef(fmt.Sprintf("other-%d", i)), v1.EventTypeNormal, "Pulled", "Image pulled")
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the backlog full", func() error {
		if n, d := b.Len(), b.Dropped(); n != 5 || d != 2 {
			b.mu.Lock()
			defer b.mu.Unlock()
			var q []string
			for _, e := range b.queue {
				q = append(q, e.InvolvedObject.Name+"/"+e.Reason)
			}
			return fmt.Errorf("%d queued, %d dropped: %v", n, d, q)
		}
		return nil
	})
	sink.setDown(false)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, "the backlog delivered", func() error {
		if n := b.Len(); n != 0 {
			return fmt.Errorf("%d still queued", n)
		}
		return nil
	})
	for i := range 7 {
		want := int32(1)
		if i < 2 {
			want = 0
		}
		if err := count(client, fmt.Sprintf("other-%d", i), "Pulled", want); err != nil {
			t.Error(err)
		}
	}
}

// The apiserver refusing an event (not unreachable) is the broadcaster's business: the error
// goes back to it and nothing is queued.
func TestBacklogPassesRejections(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "x", errors.New("no"))
	b := NewBacklog(rejectingSink{forbidden}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := b.Create(&v1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x"}}); !apierrors.IsForbidden(err) || b.Len() != 0 {
		t.Errorf("err %v, queued %d; want the Forbidden back and nothing queued", err, b.Len())
	}
	unavailable := apierrors.NewServiceUnavailable("etcd is down")
	b = NewBacklog(rejectingSink{unavailable}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := b.Create(&v1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x"}}); err != nil || b.Len() != 1 {
		t.Errorf("err %v, queued %d; want a 503 queued", err, b.Len())
	}
}

type rejectingSink struct{ err error }

func (r rejectingSink) Create(*v1.Event) (*v1.Event, error)        { return nil, r.err }
func (r rejectingSink) Update(*v1.Event) (*v1.Event, error)        { return nil, r.err }
func (r rejectingSink) Patch(*v1.Event, []byte) (*v1.Event, error) { return nil, r.err }

// count checks the apiserver holds one event of reason about the pod with that count (0: none).
func count(client *fake.Clientset, pod, reason string, want int32) error {
	evs, err := client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err
	}
	var got []int32
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == pod && e.Reason == reason {
			got = append(got, e.Count)
		}
	}
	if (want == 0 && len(got) == 0) || (len(got) == 1 && got[0] == want) {
		return nil
	}
	return fmt.Errorf("%s %s: counts %v, want %d", pod, reason, got, want)
}
