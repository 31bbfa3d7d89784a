package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// readiness is what the tracker knows of one object's readiness, as the watch showed it.
type readiness struct {
	ready bool
	// since is when the object was last seen turning ready (zero if never).
	since time.Time
}

func (r *readiness) observe(ready bool, now time.Time) {
	if ready && !r.ready {
		r.since = now
	}
	r.ready = ready
}

// tracker watches, through informers (list + watch, as any controller), the pods bound to one
// node and the Node itself, and stamps each transition to ready with the time its event
// arrived. Startup latencies are measured against those stamps.
type tracker struct {
	mu   sync.Mutex
	pods map[string]*readiness // by pod name (namespace default)
	node readiness
	// nodeConds records every change of the Node's Ready condition (status, reason and
	// message), for the log of the restart measurement.
	nodeConds []string
	changed   chan struct{} // closed and replaced at every change
}

func podReady(p *v1.Pod) bool {
	if p.Status.Phase != v1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// startTracker starts the informers; they stop when ctx ends. It returns once both have
// listed.
func startTracker(ctx context.Context, client kubernetes.Interface, node string) (*tracker, error) {
	tr := &tracker{pods: map[string]*readiness{}, changed: make(chan struct{})}
	rest := client.CoreV1().RESTClient()
	_, podInf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewListWatchFromClient(rest, "pods", metav1.NamespaceDefault,
			fields.OneTermEqualSelector("spec.nodeName", node)),
		ObjectType: &v1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { tr.podEvent(obj, false) },
			UpdateFunc: func(_, obj any) { tr.podEvent(obj, false) },
			DeleteFunc: func(obj any) { tr.podEvent(obj, true) },
		},
	})
	_, nodeInf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewListWatchFromClient(rest, "nodes", metav1.NamespaceAll,
			fields.OneTermEqualSelector("metadata.name", node)),
		ObjectType: &v1.Node{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { tr.nodeEvent(obj) },
			UpdateFunc: func(_, obj any) { tr.nodeEvent(obj) },
			DeleteFunc: func(any) { tr.nodeGone() },
		},
	})
	go podInf.RunWithContext(ctx)
	go nodeInf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), podInf.HasSynced, nodeInf.HasSynced) {
		return nil, fmt.Errorf("informers for node %s did not sync", node)
	}
	return tr, nil
}

func (tr *tracker) notifyLocked() {
	close(tr.changed)
	tr.changed = make(chan struct{})
}

func (tr *tracker) podEvent(obj any, deleted bool) {
	now := time.Now()
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if deleted {
		delete(tr.pods, p.Name)
	} else {
		r := tr.pods[p.Name]
		if r == nil {
			r = &readiness{}
			tr.pods[p.Name] = r
		}
		r.observe(podReady(p), now)
	}
	tr.notifyLocked()
}

func (tr *tracker) nodeEvent(obj any) {
	now := time.Now()
	n, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.node.observe(nodeReady(n), now)
	for _, c := range n.Status.Conditions {
		if c.Type != v1.NodeReady {
			continue
		}
		desc := fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
		if l := len(tr.nodeConds); l == 0 || !strings.HasSuffix(tr.nodeConds[l-1], desc) {
			tr.nodeConds = append(tr.nodeConds, now.Format("15:04:05.000")+" "+desc)
		}
	}
	tr.notifyLocked()
}

// nodeConditionsSince returns the Ready condition changes recorded from index i on.
func (tr *tracker) nodeConditionsSince(i int) ([]string, int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if i > len(tr.nodeConds) {
		i = len(tr.nodeConds)
	}
	return append([]string(nil), tr.nodeConds[i:]...), len(tr.nodeConds)
}

func (tr *tracker) nodeGone() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.node.ready = false
	tr.notifyLocked()
}

// wait calls cond, under the tracker's lock, at every change until it returns nil or
// timeout passes.
func (tr *tracker) wait(timeout time.Duration, what string, cond func() error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		tr.mu.Lock()
		err := cond()
		changed := tr.changed
		tr.mu.Unlock()
		if err == nil {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("%s: not true after %s: %v", what, timeout, err)
		}
	}
}

// podsReadyAfter waits until every named pod has turned ready after t0 (or, with t0 zero,
// is ready) and returns the latest of those moments.
func (tr *tracker) podsReadyAfter(names []string, t0 time.Time, timeout time.Duration) (time.Time, error) {
	var last time.Time
	err := tr.wait(timeout, fmt.Sprintf("%d pods ready", len(names)), func() error {
		last = time.Time{}
		notReady := 0
		var example string
		for _, n := range names {
			r := tr.pods[n]
			if r == nil || !r.ready || r.since.Before(t0) {
				notReady++
				example = n
				continue
			}
			if r.since.After(last) {
				last = r.since
			}
		}
		if notReady > 0 {
			return fmt.Errorf("%d not ready, e.g. %s", notReady, example)
		}
		return nil
	})
	return last, err
}

// podsNotReady waits until the watch shows every named pod not ready (or gone).
func (tr *tracker) podsNotReady(names []string, timeout time.Duration) error {
	return tr.wait(timeout, "pods not ready", func() error {
		for _, n := range names {
			if r := tr.pods[n]; r != nil && r.ready {
				return fmt.Errorf("%s still ready", n)
			}
		}
		return nil
	})
}

// nodeReadyAfter waits until the Node has turned Ready after t0 (with t0 zero: is Ready).
func (tr *tracker) nodeReadyAfter(t0 time.Time, timeout time.Duration) (time.Time, error) {
	var at time.Time
	err := tr.wait(timeout, "node Ready", func() error {
		if !tr.node.ready || tr.node.since.Before(t0) {
			return fmt.Errorf("node not Ready")
		}
		at = tr.node.since
		return nil
	})
	return at, err
}

// nodeNotReady waits until the watch shows the Node not Ready.
func (tr *tracker) nodeNotReady(timeout time.Duration) error {
	return tr.wait(timeout, "node not Ready", func() error {
		if tr.node.ready {
			return fmt.Errorf("node still Ready")
		}
		return nil
	})
}

// podsGone waits until the watch has seen every named pod deleted from the API.
func (tr *tracker) podsGone(names []string, timeout time.Duration) error {
	return tr.wait(timeout, fmt.Sprintf("%d pods deleted", len(names)), func() error {
		left := 0
		for _, n := range names {
			if tr.pods[n] != nil {
				left++
			}
		}
		if left > 0 {
			return fmt.Errorf("%d still in the API", left)
		}
		return nil
	})
}
