package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/offline"
	"github.com/holdfast-dev/holdfast/test/poll"
)

// A mirror pod deleted gracefully (kubectl delete pod, 30 s of grace) is handed to the status
// side, which deletes it for good and makes it again while the static pod runs: nothing runs
// a mirror to report its end, so before it stayed Terminating. A mirror pod is never run, and
// a live mirror's updates are nobody's business.
func TestGracefullyDeletedMirrorIsHandedOver(t *testing.T) {
	var handed []types.UID
	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	s := &APISource{Sink: sink, Log: slog.New(slog.DiscardHandler), OnMirrorDeleted: func(p *v1.Pod) { handed = append(handed, p.UID) }}
	mirror := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-gw", UID: "mirror-1",
		Annotations: map[string]string{manifest.MirrorAnnotation: "hash"}}}
	s.update(mirror)
	if len(handed) != 0 || len(sink.pods) != 0 {
		t.Fatalf("a live mirror: handed %v, delivered %v", handed, sink.pods)
	}
	deleting := mirror.DeepCopy()
	now := metav1.NewTime(time.Unix(1, 0))
	deleting.DeletionTimestamp = &now
	s.update(deleting)
	if len(handed) != 1 || handed[0] != "mirror-1" || len(sink.pods) != 0 {
		t.Fatalf("a mirror being deleted: handed %v, delivered %v; want it handed over, not run", handed, sink.pods)
	}
}

// A mirror pod whose static pod does not run here (its manifest removed while the agent or
// the apiserver was away) is deleted once every source has delivered its pods; before, it
// stayed in the API for good. A mirror whose static pod runs, a pod that is not a mirror, and
// every mirror while a source has not delivered yet are left alone.
func TestOrphanedMirrorsDeleted(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	mirror := func(name string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid"),
			Annotations: map[string]string{manifest.MirrorAnnotation: "hash"}}}
	}
	for _, p := range []*v1.Pod{mirror("running-gw"), mirror("removed-gw"),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "api-pod", UID: "api-uid"}}} {
		if err := indexer.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	ready := false
	var deleted []string
	s := &APISource{Log: slog.New(slog.DiscardHandler), indexer: indexer, Orphans: &OrphanedMirrors{
		AllReady:      func() bool { return ready },
		StaticPodRuns: func(ns, name string) bool { return ns == "default" && name == "running-gw" },
		DeleteOrphan: func(_ context.Context, p *v1.Pod) error {
			deleted = append(deleted, p.Name+"/"+string(p.UID))
			return nil
		},
	}}
	s.deleteOrphanedMirrors(context.Background())
	if len(deleted) != 0 {
		t.Fatalf("deleted %v before every source delivered its pods", deleted)
	}
	ready = true
	s.deleteOrphanedMirrors(context.Background())
	if len(deleted) != 1 || deleted[0] != "removed-gw/removed-gw-uid" {
		t.Fatalf("deleted %v, want removed-gw's mirror alone, by its UID", deleted)
	}
}

// blockingSink holds the first delivery until released.
type blockingSink struct {
	recordingSink
	entered, release chan struct{}
	once             sync.Once
}

func (s *blockingSink) Update(p *v1.Pod) {
	s.once.Do(func() {
		close(s.entered)
		<-s.release
	})
	s.recordingSink.Update(p)
}

// The source is ready once its handler was handed every pod of the first list, not as soon as
// the informer holds the list: until then the pods manager would take the running containers
// of pods not delivered yet for orphans, and kill them. Before, the informer's own HasSynced
// said ready while the handler still held the first pod.
func TestReadyOnlyOnceTheHandlerDelivered(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}, Spec: v1.PodSpec{NodeName: "gw"}}
	sink := &blockingSink{recordingSink: recordingSink{pods: map[types.UID]*v1.Pod{}}, entered: make(chan struct{}), release: make(chan struct{})}
	s := &APISource{Client: kubetest.Wrap(fake.NewSimpleClientset(pod)), NodeName: "gw", Sink: sink, Store: offline.NewMemStore(nil), Log: slog.New(slog.DiscardHandler)}
	inf := s.Start()
	ctx, cancel := context.WithCancel(context.Background())
	inf.Start(ctx.Done())
	release := sync.OnceFunc(func() { close(sink.release) })
	defer func() {
		release() // a failed test must not leave the handler blocked: Shutdown waits for it
		cancel()
		inf.Shutdown()
	}()
	<-sink.entered
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "the informer holds the list", func() error {
		if !inf.HasSynced() {
			return fmt.Errorf("not synced")
		}
		return nil
	})
	if s.Ready() {
		t.Fatal("ready while the handler has not delivered the first pod")
	}
	release()
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "ready once delivered", func() error {
		if !s.Ready() {
			return fmt.Errorf("not ready")
		}
		if len(sink.names()) != 1 {
			return fmt.Errorf("pods %v", sink.names())
		}
		return nil
	})
}

// An API pod whose author wrote kubernetes.io/config.source: file is marked as the API's, as
// the kubelet marks every pod with its source: it must not pass for a static pod (critical,
// never evicted; no status reported). The informer's shared object is left as it is.
func TestAPIPodMarkedWithItsSource(t *testing.T) {
	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	store := offline.NewMemStore(nil)
	s := &APISource{Sink: sink, Store: store, Log: slog.New(slog.DiscardHandler)}
	forged := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1",
		Annotations: map[string]string{manifest.ConfigSourceAnnotation: manifest.SourceFile}}}
	s.update(forged)
	got := sink.pods["u1"]
	if got == nil || manifest.IsStatic(got) || got.Annotations[manifest.ConfigSourceAnnotation] != manifest.SourceAPI {
		t.Fatalf("delivered %+v; want the pod marked as the API's", got)
	}
	if forged.Annotations[manifest.ConfigSourceAnnotation] != manifest.SourceFile {
		t.Error("the informer's object was changed")
	}
	rec, err := store.GetPod("u1")
	if err != nil || manifest.IsStatic(rec.Pod) {
		t.Errorf("cached %+v, %v; want the pod marked as the API's", rec.Pod, err)
	}
}

// A gateway whose state key changed (a new TPM, a replaced key file) boots with pod records
// it cannot read: none is restored (the pods wait for the apiserver) and none is lost or
// quarantined; once the apiserver lists, the pods it still has are recorded again under the
// new key and the records of those it no longer has are deleted instead of staying for good.
func TestRecordsOfAnotherKeyWaitForTheApiserver(t *testing.T) {
	keyA, _ := offline.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	keyB, _ := offline.NewKey([]byte("fedcba9876543210fedcba9876543210"))
	store := offline.NewMemStore(nil)
	store.SetKey(keyA)
	gone := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gone", UID: "u-gone"}, Spec: v1.PodSpec{NodeName: "gw"}}
	kept := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept", UID: "u-kept"}, Spec: v1.PodSpec{NodeName: "gw"}}
	for _, p := range []*v1.Pod{gone, kept} {
		if err := store.PutPod(offline.SourceAPI, p); err != nil {
			t.Fatal(err)
		}
	}
	store.SetKey(keyB) // the reboot with another key

	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	s := &APISource{Client: kubetest.Wrap(fake.NewSimpleClientset(kept)), NodeName: "gw", Sink: sink, Store: store, Log: slog.New(slog.DiscardHandler)}
	if n := s.Restore(); n != 0 || len(sink.names()) != 0 {
		t.Fatalf("restored %d pods (%v) from records sealed with another key", n, sink.names())
	}
	inf := s.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx, inf) }()
	defer func() { cancel(); <-done }()
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "the records reconciled with the apiserver's list", func() error {
		if _, err := store.GetPod("u-gone"); !errors.Is(err, offline.ErrNotFound) {
			return fmt.Errorf("record of the pod the apiserver no longer has: %v", err)
		}
		if rec, err := store.GetPod("u-kept"); err != nil || rec.Pod.Name != "kept" {
			return fmt.Errorf("record of the pod the apiserver has: %+v, %v", rec, err)
		}
		return nil
	})
	if q, _ := store.Quarantined(); len(q) != 0 {
		t.Errorf("records quarantined: %+v", q)
	}
}

// Offline past the compaction window, a pod deleted and created again under its name (a
// StatefulSet's pod) comes back from the relist as an update of the old object into the new
// one. The old UID is gone from the API: it is removed from the sink and the store, as the
// kubelet merges sources by UID. Before, only the new pod was delivered: the old one ran on
// beside it and its record revived it at the next offline reboot.
func TestSameNameNewUIDReplacesThePod(t *testing.T) {
	store := offline.NewMemStore(nil)
	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	s := &APISource{Sink: sink, Store: store, Log: slog.New(slog.DiscardHandler)}
	h := s.handler()
	a := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db-0", UID: "uid-a"}, Spec: v1.PodSpec{NodeName: "gw"}}
	b := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db-0", UID: "uid-b"}, Spec: v1.PodSpec{NodeName: "gw"}}
	h.OnAdd(a, true)
	h.OnUpdate(a, b)
	if got := sink.names(); len(got) != 1 || got["db-0"] != "uid-b" {
		t.Errorf("sink holds %v, want db-0 as uid-b alone", got)
	}
	if len(sink.removed) != 1 || sink.removed[0] != "uid-a" {
		t.Errorf("removed %v, want uid-a", sink.removed)
	}
	if _, err := store.GetPod("uid-a"); !errors.Is(err, offline.ErrNotFound) {
		t.Errorf("record of the replaced pod: %v, want none", err)
	}
	if _, err := store.GetPod("uid-b"); err != nil {
		t.Errorf("record of the new pod: %v", err)
	}
	// An update of the same UID removes nothing.
	b2 := b.DeepCopy()
	b2.Labels = map[string]string{"x": "y"}
	h.OnUpdate(b, b2)
	if len(sink.removed) != 1 {
		t.Errorf("an update of the same pod removed %v", sink.removed[1:])
	}
}

// A pod restored at an offline boot whose record is then lost (quarantined by a read that found
// it corrupt, a disk error) and which is deleted in the API while the node is away: the list
// that comes back proves it deleted. Before, the reconcile walked the store's records only and
// the pod ran on until the next restart (found by TestLifecycleModel).
func TestDeliveredPodWithoutRecordRemovedByTheList(t *testing.T) {
	store := offline.NewMemStore(nil)
	gone := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gone", UID: "u-gone"}, Spec: v1.PodSpec{NodeName: "gw"}}
	kept := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept", UID: "u-kept"}, Spec: v1.PodSpec{NodeName: "gw"}}
	for _, p := range []*v1.Pod{gone, kept} {
		if err := store.PutPod(offline.SourceAPI, p); err != nil {
			t.Fatal(err)
		}
	}
	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	s := &APISource{Client: kubetest.Wrap(fake.NewSimpleClientset(kept)), NodeName: "gw", Sink: sink, Store: store, Log: slog.New(slog.DiscardHandler)}
	if n := s.Restore(); n != 2 {
		t.Fatalf("restored %d pods, want 2", n)
	}
	if err := store.DeletePod("u-gone"); err != nil { // the record lost while the pod runs
		t.Fatal(err)
	}
	inf := s.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx, inf) }()
	defer func() { cancel(); <-done }()
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "the pod the list lacks removed", func() error {
		if !slices.Contains(sink.removedUIDs(), "u-gone") {
			return fmt.Errorf("removed %v", sink.removedUIDs())
		}
		return nil
	})
	if slices.Contains(sink.removedUIDs(), "u-kept") {
		t.Errorf("the pod the apiserver has was removed")
	}
}
