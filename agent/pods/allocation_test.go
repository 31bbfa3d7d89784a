package pods_test

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
	"github.com/holdfast-dev/holdfast/offline"
)

// heldAllocation is the store as the manager sees it, with the first read of one pod's
// allocation held until release is closed: entered is closed when that read begins. A slow
// flash or a busy bbolt stretches that read; holding it makes the moment it spans one a test
// can look at.
type heldAllocation struct {
	pods.Records
	uid              types.UID
	entered, release chan struct{}
	once             sync.Once
}

func (h *heldAllocation) GetAllocation(uid types.UID) (offline.Allocation, error) {
	if uid == h.uid {
		held := false
		h.once.Do(func() { held = true })
		if held {
			close(h.entered)
			<-h.release
		}
	}
	return h.Records.GetAllocation(uid)
}

// waitAdmission waits for the manager's admission decision on uid.
func (n *hollowNode) waitAdmission(t *testing.T, uid types.UID) admission.Result {
	t.Helper()
	var r admission.Result
	eventually(t, 10*time.Second, "the admission decision of "+string(uid), func() bool {
		var ok bool
		r, ok = n.mgr.Admission(uid)
		return ok
	})
	return r
}

// A pod restored after an agent restart, its decision and allocation (400m) in the store and a
// deferred resize (600m) in its spec, is counted with its allocation by the admission of a pod
// that arrives while the restored pod's allocation is being read: its decision is published
// with its allocation, never before it. Before, the decision was published first (and
// admission's lock released), the allocation read after; a pod judged in between counted the
// restored pod's spec, 600m, and was rejected (OutOfcpu) on a node it fits.
func TestRestoredDecisionPublishedWithItsAllocation(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testRestoredDecisionPublishedWithItsAllocation(t, offline.NewMemStore(nil)) })
	t.Run("bbolt", func(t *testing.T) {
		store, _, err := offline.Open(filepath.Join(t.TempDir(), "state.db"), offline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := store.Close(); err != nil {
				t.Error(err)
			}
		})
		testRestoredDecisionPublishedWithItsAllocation(t, store)
	})
}

func testRestoredDecisionPublishedWithItsAllocation(t *testing.T, store pods.Records) {
	allocated := resizablePod("b", 400, 64<<20)
	b := resized(allocated, 600, 64<<20)
	if err := store.PutPod(offline.SourceAPI, b); err != nil {
		t.Fatal(err)
	}
	if err := store.SetAdmission(b.UID, offline.Admission{Accepted: true, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	kept := offline.Allocation{Containers: map[string]v1.ResourceRequirements{"app": allocated.Spec.Containers[0].Resources}}
	if err := store.SetAllocation(b.UID, kept); err != nil {
		t.Fatal(err)
	}
	held := &heldAllocation{Records: store, uid: b.UID, entered: make(chan struct{}), release: make(chan struct{})}
	// The statuses go to a store of their own: what is looked at is the manager's records.
	n := &hollowNode{rt: hollow.NewRuntime(), store: offline.NewMemStore(nil), records: held}
	n.ready.Store(false) // a restart: the sources have not delivered everything yet
	n.staticReady.Store(false)
	n.start(t, nodeOf{cpu: 1000, mem: 1 << 30})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(held.release) }) }
	t.Cleanup(release) // before the manager's stop, which waits for b's worker

	n.mgr.Update(b) // restored from the store
	select {
	case <-held.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("b's allocation never read")
	}
	_, published := n.mgr.Admission(b.UID)
	if published {
		t.Error("b's admission decision is published while its allocation is still being read")
	}
	c := resizablePod("c", 500, 64<<20) // 400m + 500m fit the node, 600m + 500m do not
	n.mgr.Update(c)
	var rc admission.Result
	if published {
		// Admission is open and b counts: c is judged now, whatever b's allocation turns out.
		rc = n.waitAdmission(t, c.UID)
		release()
	} else {
		release()
		rc = n.waitAdmission(t, c.UID)
	}
	if !rc.Admitted {
		t.Fatalf("c rejected beside b's allocation of 400m: %s: %s", rc.Reason, rc.Message)
	}
	n.ready.Store(true)
	st := n.waitStatus(t, b, "b running with its allocation, its resize deferred", func(st v1.PodStatus) bool {
		p := condition(st, v1.PodResizePending)
		return p != nil && p.Reason == v1.PodReasonDeferred && len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].State.Running != nil
	})
	if got := st.ContainerStatuses[0].AllocatedResources.Cpu().MilliValue(); got != 400 {
		t.Errorf("b runs with %dm allocated, want its allocation, 400m", got)
	}
}
