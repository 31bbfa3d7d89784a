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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
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
	n.wrap = func(r *hollow.Runtime) runtime.Runtime {
		return &failingRecord{Runtime: r, stateDir: n.stateDir, cfgs: map[string]runtime.ContainerConfig{}}
	}
	startReady(t, n, nil)
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
