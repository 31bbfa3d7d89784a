package sources

import (
	"log/slog"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
