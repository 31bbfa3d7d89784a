package sources

import (
	"context"
	"log/slog"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/holdfast-dev/holdfast/agent/manifest"
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
