package pods_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
	"github.com/holdfast-dev/holdfast/offline"
)

// exitOnUsage stops the init container the first time its usage is read: it exits between
// the plan (which saw it running) and its update, as a regular init container finishing its
// work while the resize is applied.
type exitOnUsage struct {
	rt    *hollow.Runtime
	once  sync.Once
	fired chan struct{}
}

func (u *exitOnUsage) Usage(ctx context.Context, c runtime.Container) (cgroups.Usage, error) {
	if c.Name == "init" {
		u.once.Do(func() {
			_ = u.rt.StopContainer(ctx, c.ID, 0)
			close(u.fired)
		})
	}
	return cgroups.Usage{MemoryUsage: 1 << 20}, nil
}

// TestInitContainerExitsMidResize: a running regular init container whose memory is lowered
// exits between the plan (which saw it running) and its update. Its update finds it gone:
// no Error, no ResizeError event, as the kubelet sees none from containerd's CRI (found by the
// review of b4be292, when regular init containers became resizable).
func TestInitContainerExitsMidResize(t *testing.T) {
	rt := hollow.NewRuntime()
	u := &exitOnUsage{rt: rt, fired: make(chan struct{})}
	rec := record.NewFakeRecorder(100)
	n := &hollowNode{rt: rt, store: offline.NewMemStore(nil), usage: u, recorder: rec}
	n.ready.Store(true)
	n.staticReady.Store(true)
	n.start(t, nodeOf{cpu: 2000, mem: 1 << 30})
	pod := resizablePod("initexit", 100, 128<<20)
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	pod.Spec.InitContainers = []v1.Container{*pod.Spec.Containers[0].DeepCopy()}
	pod.Spec.InitContainers[0].Name = "init"
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "init running", func(st v1.PodStatus) bool {
		return len(st.InitContainerStatuses) == 1 && st.InitContainerStatuses[0].State.Running != nil
	})
	n.mgr.Update(resizedInit(pod, 100, 64<<20))
	select {
	case <-u.fired:
	case <-time.After(10 * time.Second):
		t.Fatal("usage never read")
	}
	var seen *v1.PodCondition
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		st, _ := n.status.Get(pod.UID)
		if c := condition(st, v1.PodResizeInProgress); c != nil && c.Reason == v1.PodReasonError {
			seen = c
			break
		}
	}
	time.Sleep(time.Second)
	for len(rec.Events) > 0 {
		ev := <-rec.Events
		if strings.Contains(ev, "Resize") {
			t.Logf("event: %s", ev)
		}
		if strings.Contains(ev, "ResizeError") {
			t.Errorf("an init container exiting mid-resize gave a ResizeError event")
		}
	}
	if seen != nil {
		t.Errorf("an init container exiting mid-resize made the resize an Error: %s", seen.Message)
	}
}
