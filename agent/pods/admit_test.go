package pods

import (
	"context"
	"log/slog"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/offline"
)

// slowRecordStore holds every admission record until the test releases it, as a slow flash
// holds an fsync.
type slowRecordStore struct {
	offline.Store
	entered chan types.UID
	release chan struct{}
}

func (s *slowRecordStore) SetAdmission(uid types.UID, a offline.Admission) error {
	s.entered <- uid
	<-s.release
	return s.Store.SetAdmission(uid, a)
}

// A pod's admission decision is taken while the previous pod's decision is still being
// written to the store: decisions are taken in order, their records are written together.
// (With the record inside the decision's lock, a burst of 30 pods queued 30 commits, one
// after the other, before the last pod could start.) Each pod's decision is recorded before
// admit returns, so before anything of it runs.
func TestAdmissionRecordsDoNotQueueDecisions(t *testing.T) {
	store := &slowRecordStore{Store: offline.NewMemStore(time.Now), entered: make(chan types.UID, 2), release: make(chan struct{})}
	m := NewManager(Config{}, nil, nil, nil, nil, slog.Default())
	m.SetAdmission(nil, store)
	pod := func(name string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")}}
	}
	returned := make(chan types.UID, 2)
	decided := make(chan types.UID, 2)
	admit := func(p *v1.Pod) {
		m.admit(context.Background(), p, nil, func(admission.Result) { decided <- p.UID })
		returned <- p.UID
	}
	go admit(pod("a"))
	if uid := <-store.entered; uid != "a-uid" {
		t.Fatalf("first record for %s", uid)
	}
	go admit(pod("b"))
	select {
	case uid := <-decided:
		if uid != "a-uid" {
			t.Fatalf("decided %s first", uid)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a's decision not published")
	}
	select {
	case uid := <-decided:
		if uid != "b-uid" {
			t.Fatalf("decided %s", uid)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("b's decision waited for a's record to be written")
	}
	select {
	case uid := <-returned:
		t.Fatalf("admit of %s returned before its decision was recorded", uid)
	default:
	}
	close(store.release)
	for range 2 {
		<-returned
	}
	for _, uid := range []types.UID{"a-uid", "b-uid"} {
		if rec, err := store.GetPod(uid); err != nil || !rec.Admission.Accepted {
			t.Errorf("%s: record %+v, %v; want its admission recorded", uid, rec.Admission, err)
		}
	}
}
