package hollow

import (
	"context"
	"errors"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

var _ runtime.Runtime = (*Runtime)(nil)
var _ runtime.Network = (*Network)(nil)

func TestExitStatusOf(t *testing.T) {
	for _, tc := range []struct {
		argv   []string
		code   int32
		exits  bool
		reason string
	}{
		{argv: nil, reason: "the image's command: runs"},
		{argv: []string{"sleep", "infinity"}, reason: "runs"},
		{argv: []string{"true"}, code: 0, exits: true},
		{argv: []string{"/bin/false"}, code: 1, exits: true},
		{argv: []string{"sh", "-c", "exit 3"}, code: 3, exits: true},
		{argv: []string{"sh", "-c", "echo hi; exit 3"}, reason: "more than an exit: runs"},
		{argv: []string{"sh", "-c", "exit 300"}, reason: "not a status: runs"},
	} {
		code, exits := exitStatusOf(tc.argv)
		if exits != tc.exits || code != tc.code {
			t.Errorf("exitStatusOf(%q) = %d, %v; want %d, %v (%s)", tc.argv, code, exits, tc.code, tc.exits, tc.reason)
		}
	}
}

// TestLifecycle goes through what the pods manager does with a container: pull, create,
// start, observe, stop, record, remove; and an exit reaching the subscriber as an event.
func TestLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := NewRuntime()
	cfg := runtime.ContainerConfig{PodUID: "uid-1", PodName: "p", PodNamespace: "default", Name: "app", Image: "busybox", Command: []string{"sleep", "infinity"}}

	if _, err := r.EnsureImage(ctx, "busybox", v1.PullNever, nil); !errors.Is(err, runtime.ErrImageNeverPull) {
		t.Fatalf("an image never used with pull policy Never: %v, want ErrImageNeverPull", err)
	}
	if _, err := r.CreateContainer(ctx, cfg); !errors.Is(err, runtime.ErrCreateContainer) {
		t.Fatalf("create without the image: %v, want ErrCreateContainer", err)
	}
	res, err := r.EnsureImage(ctx, "busybox", v1.PullIfNotPresent, nil)
	if err != nil || !res.Pulled || res.Digest == "" {
		t.Fatalf("first pull: %+v, %v", res, err)
	}
	if res, _ := r.EnsureImage(ctx, "docker.io/library/busybox:latest", v1.PullIfNotPresent, nil); res.Pulled {
		t.Errorf("the same image by its full name was pulled again")
	}

	id, err := r.CreateContainer(ctx, cfg)
	if err != nil || id != runtime.ContainerID("uid-1", "app", 0) {
		t.Fatalf("create: %q, %v", id, err)
	}
	if again, err := r.CreateContainer(ctx, cfg); err != nil || again != id {
		t.Fatalf("create again: %q, %v; want the same container", again, err)
	}
	if err := r.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	list, _ := r.ListPod(ctx, "uid-1")
	if len(list) != 1 || list[0].State != runtime.StateRunning || list[0].Pid == 0 {
		t.Fatalf("after start: %+v", list)
	}
	if _, err := r.Exec(ctx, id, []string{"true"}, runtime.ExecOptions{}); err != nil {
		t.Errorf("exec in a running container: %v", err)
	}
	if err := r.Attach(ctx, id, runtime.ExecStreams{}); !errors.Is(err, ErrNoProcess) {
		t.Errorf("attach: %v, want ErrNoProcess", err)
	}

	if err := r.StopContainer(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	list, _ = r.List(ctx)
	if len(list) != 1 || list[0].State != runtime.StateExited || list[0].ExitCode != 143 || !list[0].Recorded {
		t.Fatalf("after a graceful stop: %+v", list)
	}
	if _, err := r.Exec(ctx, id, []string{"true"}, runtime.ExecOptions{}); !errors.Is(err, runtime.ErrContainerNotRunning) {
		t.Errorf("exec in a stopped container: %v, want ErrContainerNotRunning", err)
	}

	// A container whose command exits: its exit reaches the subscriber, once recorded.
	cfg.Attempt, cfg.Command = 1, []string{"sh", "-c", "exit 2"}
	id2, err := r.CreateContainer(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan runtime.TaskEvent, 4)
	subCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.SubscribeTaskEvents(subCtx, func() {}, func(ev runtime.TaskEvent) { events <- ev }) }()
	if err := r.StartContainer(ctx, id2); err != nil {
		t.Fatal(err)
	}
	// The graceful stop above sent an event too: the one for id2 comes after it.
	for seen := false; !seen; {
		select {
		case ev := <-events:
			seen = ev.ContainerID == id2
		case <-time.After(5 * time.Second):
			t.Fatal("no task event for the container that exited")
		}
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("subscription ended with %v", err)
	}
	if uid, err := r.PodOf(ctx, id2); err != nil || uid != "uid-1" {
		t.Errorf("PodOf: %q, %v", uid, err)
	}
	if reason, err := r.RecordExit(ctx, id2); err != nil || reason != runtime.ReasonError {
		t.Errorf("first RecordExit: %q, %v; want %q", reason, err, runtime.ReasonError)
	}
	if reason, _ := r.RecordExit(ctx, id2); reason != "" {
		t.Errorf("second RecordExit recorded %q again", reason)
	}
	for _, id := range []string{id, id2, "gone"} {
		if err := r.RemoveContainer(ctx, id); err != nil {
			t.Errorf("remove %s: %v", id, err)
		}
	}
	if list, _ := r.List(ctx); len(list) != 0 {
		t.Errorf("after removal: %+v", list)
	}
}

func TestNetwork(t *testing.T) {
	ctx := context.Background()
	n := NewNetwork("node-a")
	a, err := n.Setup(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid-a", Namespace: "default", Name: "a"}})
	if err != nil || len(a.IPs) != 1 || !a.Complete {
		t.Fatalf("setup: %+v, %v", a, err)
	}
	b, _ := n.Setup(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid-b", Namespace: "default", Name: "b"}})
	if a.IPs[0] == b.IPs[0] {
		t.Errorf("two pods of one node share %s", a.IPs[0])
	}
	if again, _ := n.Setup(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid-a", Namespace: "default", Name: "a"}}); again.IPs[0] != a.IPs[0] {
		t.Errorf("setup again changed the address: %s, was %s", again.IPs[0], a.IPs[0])
	}
	if got := n.Known(); len(got) != 2 {
		t.Errorf("known: %v", got)
	}
	if err := n.Teardown(ctx, "uid-a", "default", "a"); err != nil || n.Get("uid-a") != nil || n.NetNSPath("uid-a") != "" {
		t.Errorf("after teardown: %v, %+v", err, n.Get("uid-a"))
	}
}
