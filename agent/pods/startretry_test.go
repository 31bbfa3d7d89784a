package pods

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
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
	if held := w.startHeldFor(c.Name); held != 0 {
		t.Errorf("start waiting for services held back %v after the poke that says they were read", held)
	}

	w.noteStart(pod, c, errors.New("failed to create containerd task: boom"))
	if held := w.startHeldFor(c.Name); held != startRetryDelay {
		t.Errorf("failed start held back %v, want %v", held, startRetryDelay)
	}
	now = now.Add(startRetryDelay)
	if held := w.startHeldFor(c.Name); held != 0 {
		t.Errorf("failed start still held back %v after startRetryDelay", held)
	}
	w.noteStart(pod, c, nil)
	if _, ok := w.startFailed[c.Name]; ok {
		t.Error("a container that started is still remembered as failed")
	}
}
