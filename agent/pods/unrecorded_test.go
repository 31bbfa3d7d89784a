package pods_test

// What a runtime did not record: the memory request of a container created before holdfast
// recorded it, and an exit it could not record. Both must still come out right.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
	"github.com/holdfast-dev/holdfast/offline"
)

// unrecordedMemory is a runtime whose containers were created before holdfast recorded the
// memory request (an agent upgraded under running pods): they list with none.
type unrecordedMemory struct{ *hollow.Runtime }

func (r unrecordedMemory) List(ctx context.Context) ([]runtime.Container, error) {
	cs, err := r.Runtime.List(ctx)
	for i := range cs {
		cs[i].MemoryRequest = nil
	}
	return cs, err
}

func (r unrecordedMemory) ListPod(ctx context.Context, uid string) ([]runtime.Container, error) {
	cs, err := r.Runtime.ListPod(ctx, uid)
	for i := range cs {
		cs[i].MemoryRequest = nil
	}
	return cs, err
}

// A container created before the memory request was recorded (a0335d0: "taken to run with its
// allocation") is taken so for good: every later resize of its memory request alone, with the
// memory resizePolicy RestartContainer, is reported done with no restart, the very bug the
// commit fixes, for every pod that was running at the upgrade, until the container restarts
// for some other reason. The kubelet restarts it (its actuated resources are checkpointed).
func TestResizeMemoryRequestOfAContainerFromBeforeTheRecord(t *testing.T) {
	n := &hollowNode{rt: hollow.NewRuntime(), wrap: func(r *hollow.Runtime) runtime.Runtime { return unrecordedMemory{r} }}
	n.store = offline.NewMemStore(nil)
	n.ready.Store(true)
	n.staticReady.Store(true)
	n.start(t, nodeOf{cpu: 2000, mem: 1 << 30})
	pod := resizablePod("memreq-old", 100, 128<<20, v1.ContainerResizePolicy{ResourceName: v1.ResourceMemory, RestartPolicy: v1.RestartContainer})
	pod.Spec.Containers[0].Resources.Requests[v1.ResourceMemory] = *resource.NewQuantity(96<<20, resource.BinarySI)
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "running with 128Mi", settled(100, 128<<20))
	before, _ := n.container(t, pod)

	next := pod.DeepCopy()
	next.Generation++
	next.Spec.Containers[0].Resources.Requests[v1.ResourceMemory] = *resource.NewQuantity(64<<20, resource.BinarySI)
	n.mgr.Update(next)
	n.waitStatus(t, pod, "restarted for the request of 64Mi, the resize done", func(st v1.PodStatus) bool {
		return settled(100, 128<<20)(st) && st.ContainerStatuses[0].AllocatedResources.Memory().Value() == 64<<20 &&
			st.ContainerStatuses[0].RestartCount == 1
	})
	if after, _ := n.container(t, pod); after.ID == before.ID {
		t.Errorf("the memory request resized 96Mi -> 64Mi with RestartContainer, and container %s never restarted", after.ID)
	}
}

// failingRecord is a runtime that cannot record one container's exit (containerd: the task's
// delete fails, its rootfs busy, or the labels cannot be written), and whose containers write
// their termination message as they start, as a process does before it exits.
type failingRecord struct {
	*hollow.Runtime
	stateDir string
	mu       sync.Mutex
	cfgs     map[string]runtime.ContainerConfig
}

func (r *failingRecord) CreateContainer(ctx context.Context, cfg runtime.ContainerConfig) (string, error) {
	id, err := r.Runtime.CreateContainer(ctx, cfg)
	r.mu.Lock()
	r.cfgs[id] = cfg
	r.mu.Unlock()
	return id, err
}

func (r *failingRecord) StartContainer(ctx context.Context, id string) error {
	r.mu.Lock()
	cfg := r.cfgs[id]
	r.mu.Unlock()
	if cfg.TerminationMessagePath != "" {
		path := filepath.Join(r.stateDir, "pods", cfg.PodUID, "containers", cfg.Name, strconv.Itoa(cfg.Attempt)+".termination-log")
		if err := os.WriteFile(path, []byte("bye"), 0o666); err != nil {
			return err
		}
	}
	return r.Runtime.StartContainer(ctx, id)
}

func (r *failingRecord) RecordExit(ctx context.Context, id string) (string, error) {
	r.mu.Lock()
	name := r.cfgs[id].Name
	r.mu.Unlock()
	if name == "work" {
		return "", errors.New("delete task: unmount rootfs: device or resource busy")
	}
	return r.Runtime.RecordExit(ctx, id)
}

// A container whose exit cannot be recorded never has its termination message read (92ab780
// reads it only once the exit is recorded), though the message in its terminationMessagePath
// file is complete the moment its process exits: only the log fallback waits for the task's
// delete. The pod reports the exit (Failed, exit code 3) with no message, for good. Before
// 92ab780 the file was read at the first sight of the exit; the kubelet reads it too.
func TestTerminationMessageOfAnExitNotRecorded(t *testing.T) {
	n := &hollowNode{rt: hollow.NewRuntime()}
	n.store = offline.NewMemStore(nil)
	n.ready.Store(true)
	n.staticReady.Store(true)
	var fr *failingRecord
	n.wrap = func(r *hollow.Runtime) runtime.Runtime {
		fr = &failingRecord{Runtime: r, stateDir: n.stateDir, cfgs: map[string]runtime.ContainerConfig{}}
		return fr
	}
	n.start(t, nil)
	pod := jobPod("unrecorded", "sh", "-c", "exit 3")
	pod.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	pod.ObjectMeta.CreationTimestamp = metav1.Now()
	n.mgr.Update(pod)
	st := n.waitStatus(t, pod, "the exit reported", func(st v1.PodStatus) bool {
		return len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].State.Terminated != nil
	})
	time.Sleep(time.Second) // syncs, relists
	st, _ = n.status.Get(pod.UID)
	if got := st.ContainerStatuses[0].State.Terminated; got.Message != "bye" {
		t.Errorf("terminated %d with message %q (phase %s), want the message its file holds, %q", got.ExitCode, got.Message, st.Phase, "bye")
	}
}
