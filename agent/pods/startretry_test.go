package pods

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/volumes"
)

// servicesNotRead is a ServiceSource whose services were never read.
type servicesNotRead struct{}

func (servicesNotRead) EnvVars(*v1.Pod, bool) (map[string]string, error) {
	return nil, errors.New("services have not yet been read at least once, cannot construct envvars")
}

// A container that waits for the cluster's services is started on the poke that comes once
// they are read, not startRetryDelay after its last try: TestActiveDeadlineSeconds' 5 s
// deadline expired before its container ever ran when the first try raced the Service
// informer's first list. A start that failed for any other reason stays held back.
func TestStartWaitingForServicesIsNotHeldBack(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := NewManager(Config{Services: servicesNotRead{}, Now: func() time.Time { return now }}, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app"}}}}
	w := newWorker(m, pod)
	c := &pod.Spec.Containers[0]

	_, err := w.containerConfig(context.Background(), pod, c, 0, nil, nil, nil)
	if err == nil {
		t.Fatal("containerConfig succeeded without services")
	}
	var cfgErr *errConfig
	if !errors.As(err, &cfgErr) {
		t.Fatalf("error %v is not a configuration error (CreateContainerConfigError)", err)
	}
	if again := w.noteStart(pod, c, err); again <= 0 {
		t.Errorf("no retry timer after a start that waits for services: %v", again)
	}
	now = now.Add(10 * time.Millisecond) // the poke from ResyncAll
	if held := w.startHeldFor(c); held != 0 {
		t.Errorf("start waiting for services held back %v after the poke that says they were read", held)
	}

	w.noteStart(pod, c, errors.New("failed to create containerd task: boom"))
	if held := w.startHeldFor(c); held != startRetryDelay {
		t.Errorf("failed start held back %v, want %v", held, startRetryDelay)
	}
	now = now.Add(startRetryDelay)
	if held := w.startHeldFor(c); held != 0 {
		t.Errorf("failed start still held back %v after startRetryDelay", held)
	}
	w.noteStart(pod, c, nil)
	if _, ok := w.startFailed[c.Name]; ok {
		t.Error("a container that started is still remembered as failed")
	}
}

// failingNetwork is a Network whose Setup fails until ok is set, counting its calls.
type failingNetwork struct {
	calls int
	ok    bool
	err   error // the failure; a CNI plugin's by default
}

func (n *failingNetwork) Setup(context.Context, *v1.Pod) (*network.PodNetwork, error) {
	n.calls++
	if n.ok {
		return &network.PodNetwork{IPs: []string{"10.88.0.9"}}, nil
	}
	if n.err != nil {
		return nil, n.err
	}
	return nil, errors.New("plugin type=\"bridge\" failed (add): failed to allocate for range 0")
}
func (n *failingNetwork) Teardown(context.Context, string, string, string) error { return nil }
func (n *failingNetwork) Get(string) *network.PodNetwork                         { return nil }
func (n *failingNetwork) Known() []string                                        { return nil }

// A step of a pod's sync that keeps failing (its network, a container's creation) is tried
// again after 5 s, then 10, 20... at most 5 min, and pokes in between (the pod's own status
// coming back, a probe) do not bring the next try forward; a success starts over. Before,
// every failure was retried after 5 s for as long as it lasted: a sandbox, CNI ADD and DEL,
// an event and a status patch over the uplink every 5 s.
func TestFailedStepsBackOff(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	net := &failingNetwork{}
	m := NewManager(Config{Now: func() time.Time { return now }, Volumes: volumes.NewManager(t.TempDir(), nil, nil, nil, volumes.Options{})},
		nil, net, nil, nil, slog.New(slog.DiscardHandler))
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app"}}}}
	w := newWorker(m, pod)
	c := &pod.Spec.Containers[0]
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	log := slog.New(slog.DiscardHandler)

	for i, d := range want {
		_, _, _, ok, next := w.prepare(context.Background(), log, pod)
		if ok || next != d {
			t.Fatalf("network failure %d: ok %v, next try in %v; want %v", i+1, ok, next, d)
		}
		calls := net.calls
		now = now.Add(d / 2) // poked halfway
		if _, _, _, _, next := w.prepare(context.Background(), log, pod); net.calls != calls || next != d-d/2 {
			t.Fatalf("poked halfway through back-off %d: Setup called again (%v), next try in %v", i+1, net.calls != calls, next)
		}
		now = now.Add(d - d/2)
	}
	// No CNI configuration yet is waiting, not failing: every retryInitial.
	net.err = fmt.Errorf("%w in /etc/cni/net.d: no network config found", network.ErrNetworkNotReady)
	for i := range 4 {
		now = now.Add(5 * time.Minute)
		if _, _, _, _, next := w.prepare(context.Background(), log, pod); next != retryInitial {
			t.Fatalf("network not ready, try %d: next in %v, want %v", i+1, next, retryInitial)
		}
	}
	net.err = nil
	net.ok = true
	now = now.Add(retryInitial)
	if _, _, _, ok, _ := w.prepare(context.Background(), log, pod); !ok {
		t.Fatal("network setup that works now not taken")
	}
	if w.networkFailed.failures != 0 {
		t.Error("a network that was set up is still backed off")
	}

	boom := errors.New("failed to create containerd task: boom")
	for i, d := range want {
		if again := w.noteStart(pod, c, boom); again != d {
			t.Fatalf("start failure %d: next try in %v, want %v", i+1, again, d)
		}
		if held := w.startHeldFor(c); held != d {
			t.Fatalf("start failure %d held back %v, want %v", i+1, held, d)
		}
		now = now.Add(d)
	}
	// The user fixes the image: tried at once, the back-off starting over.
	c.Image = "registry.example/app:fixed"
	if held := w.startHeldFor(c); held != 0 {
		t.Errorf("a new image held back %v by the old one's failures", held)
	}
	if again := w.noteStart(pod, c, boom); again != retryInitial {
		t.Errorf("first failure of the new image: %v, want %v", again, retryInitial)
	}
	w.noteStart(pod, c, nil)
	if held := w.startHeldFor(c); held != 0 {
		t.Errorf("after a start that worked, held back %v", held)
	}
	if again := w.noteStart(pod, c, boom); again != retryInitial {
		t.Errorf("first failure after a success: %v, want %v", again, retryInitial)
	}
	// Waiting for a ConfigMap key (CreateContainerConfigError) is not a failure of the
	// machinery: tried every retryInitial, so the pod starts soon after the key comes.
	missing := &errConfig{msg: `couldn't find key DSN in ConfigMap default/db`}
	for i := range 5 {
		if again := w.noteStart(pod, c, missing); again != retryInitial {
			t.Fatalf("config error %d: next try in %v, want %v", i+1, again, retryInitial)
		}
		now = now.Add(retryInitial)
	}
}
