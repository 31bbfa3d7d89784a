package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// With the Node watched, an unchanged status costs no request: the controller neither GETs
// nor patches the Node at every UpdateFrequency. A condition someone else changed (the node
// lifecycle controller's Unknown) arrives through the watch and is set right at the next sync.
func TestNodeStatusFromTheWatch(t *testing.T) {
	client := fake.NewClientset()
	version := func(context.Context) (string, error) { return "containerd://test", nil }
	c := NewController(Config{
		NodeName:        "gw-unit",
		MaxPods:         10,
		StorageDir:      t.TempDir(),
		LeaseDuration:   40 * time.Second,
		RenewInterval:   10 * time.Second,
		UpdateFrequency: 50 * time.Millisecond,
		ReportFrequency: time.Hour,
		Watch:           kubetest.Wrap(client),
		Reachability:    &Reachability{},
	}, kubetest.Wrap(client), version, func() error { return nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })

	ready := func() (v1.ConditionStatus, error) {
		node, err := client.CoreV1().Nodes().Get(ctx, "gw-unit", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == v1.NodeReady {
				return cond.Status, nil
			}
		}
		return "", errors.New("no Ready condition yet")
	}
	testenv.Eventually(t, 30*time.Second, "node Ready", func() error {
		if st, err := ready(); err != nil || st != v1.ConditionTrue {
			return errors.New("not Ready yet")
		}
		return nil
	})
	// Let the watch deliver the controller's own write, then count its requests for Nodes.
	time.Sleep(500 * time.Millisecond)
	nodeRequests := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetResource().Resource == "nodes" && (a.GetVerb() == "get" || a.GetVerb() == "patch") {
				n++
			}
		}
		return n
	}
	before := nodeRequests()
	time.Sleep(20 * c.cfg.UpdateFrequency)
	if n := nodeRequests() - before; n != 0 {
		t.Errorf("%d GETs or patches of an unchanged Node in %s (%d status syncs)", n, 20*c.cfg.UpdateFrequency, 20)
	}

	node, err := client.CoreV1().Nodes().Get(ctx, "gw-unit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == v1.NodeReady {
			node.Status.Conditions[i].Status = v1.ConditionUnknown
		}
	}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "Ready again after someone set it Unknown", func() error {
		if st, err := ready(); err != nil || st != v1.ConditionTrue {
			return errors.New("Ready is " + string(st))
		}
		return nil
	})
}

// Reachability follows the latest answer: a transport error or a 5xx is an unreachable
// apiserver, any other answer a reachable one, and a cancelled request says nothing.
func TestReachability(t *testing.T) {
	code := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }))
	defer srv.Close()
	var r Reachability
	if r.Err() == nil || r.Down() {
		t.Fatalf("before any request: Err %v, Down %v; want an error, and not down (nothing learnt)", r.Err(), r.Down())
	}
	client := &http.Client{Transport: r.Wrap(http.DefaultTransport)}
	do := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	do(context.Background())
	if err := r.Err(); err != nil {
		t.Errorf("after a 200: %v", err)
	}
	if r.Down() {
		t.Error("down after a 200")
	}
	code = http.StatusServiceUnavailable
	do(context.Background())
	if r.Err() == nil || !r.Down() {
		t.Errorf("after a 503: Err %v, Down %v", r.Err(), r.Down())
	}
	code = http.StatusConflict
	do(context.Background())
	if err := r.Err(); err != nil {
		t.Errorf("after a 409: %v", err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	do(cancelled)
	if err := r.Err(); err != nil {
		t.Errorf("a cancelled request changed it: %v", err)
	}
	srv.Close()
	do(context.Background())
	if r.Err() == nil {
		t.Error("reachable with the server gone")
	}
}
