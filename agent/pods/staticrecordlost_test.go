package pods_test

import (
	"context"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// A static pod's new version waits for its previous version to stop even when the store has
// lost that version's record. The previous version still runs after an agent restart (its
// manifest edited while the agent was down, or an edit or a removal cut short by the stop:
// TestLifecycleModel's seed 156), the apiserver is out of reach, so the API source never
// lists and no source's readiness lets the relist tear down a pod it cannot place. Before,
// only the record told a previous version of a static pod from any other pod of the same
// name: without it, the new version started beside the old one, and both ran until the
// apiserver came back (weeks, on an offline gateway). The container itself now says it is a
// static pod's.
func TestStaticPodWaitsForAPreviousVersionWhoseRecordIsLost(t *testing.T) {
	n := startHollowNode(t)
	n.ready.Store(false) // the apiserver is out of reach: only the file source is ready
	n.rt.SetTermWait(func(g time.Duration) time.Duration { return g / 50 })
	// Both versions ignore SIGTERM: the old one holds its stop for its grace period / 50.
	sh := []string{"sh", "-c", "trap '' TERM; while true; do sleep 1; done"}
	prev := staticPod(t, "sensor", "/etc/holdfast/manifests/sensor.yaml", sh...)
	next := staticPod(t, "sensor", "/etc/holdfast/manifests/sensor.yaml", append(sh, "v2")...)
	if prev.UID == next.UID {
		t.Fatal("the two versions have one UID")
	}
	n.mgr.Update(prev)
	eventually(t, 10*time.Second, "the previous version runs", func() bool { return n.running(t)[prev.UID] })
	eventually(t, 10*time.Second, "the previous version's record is written", func() bool { _, err := n.store.GetPod(prev.UID); return err == nil })
	n.stop()
	if err := n.store.DeletePod(prev.UID); err != nil {
		t.Fatal(err)
	}

	n.start(t, nil) // its manifest edited meanwhile: the file source delivers the new version
	n.mgr.Update(next)
	eventually(t, 10*time.Second, "the new version runs", func() bool {
		run := n.running(t)
		if run[prev.UID] && run[next.UID] {
			t.Fatalf("both versions of the static pod run: %v", run)
		}
		return run[next.UID]
	})
	if cs, err := n.rt.ListPod(context.Background(), string(prev.UID)); err != nil || len(cs) > 0 && cs[0].State == runtime.StateRunning {
		t.Fatalf("the previous version's containers once the new one runs: %v, %v", cs, err)
	}
}
