package services

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
)

// TestOnKnownRunsOnceServicesAreRead: an API pod's env waits with ErrNotSynced until the
// informer has listed services; the hook that lets waiting pods sync again runs then, once.
func TestOnKnownRunsOnceServicesAreRead(t *testing.T) {
	client := fake.NewClientset(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       v1.ServiceSpec{ClusterIP: "10.0.0.7", Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	})
	c := NewCache(kubetest.Wrap(client), t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}
	if _, err := c.EnvVars(pod, false); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("before the first list: err %v, want ErrNotSynced", err)
	}
	if _, err := c.EnvVars(pod, true); err != nil {
		t.Fatalf("a static pod does not wait for services: %v", err)
	}
	var mu sync.Mutex
	calls := 0
	known := make(chan struct{})
	c.OnKnown(func() {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			close(known)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-known:
	case <-time.After(30 * time.Second):
		t.Fatal("OnKnown never ran after the informer synced")
	}
	env, err := c.EnvVars(pod, false)
	if err != nil || env["WEB_SERVICE_HOST"] != "10.0.0.7" {
		t.Fatalf("after the first list: env %v err %v", env, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Fatalf("OnKnown ran %d times, want 1", calls)
	}
}
