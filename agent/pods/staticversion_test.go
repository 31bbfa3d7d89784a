package pods

import (
	"context"
	"log/slog"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// beforeListRuntime runs beforeList at the next List, once, then lists: the test puts the
// relist's adoption of an orphan exactly between what previousStaticVersion reads of the
// workers and what it reads of the runtime.
type beforeListRuntime struct {
	runtime.Runtime
	beforeList func()
}

func (r *beforeListRuntime) List(ctx context.Context) ([]runtime.Container, error) {
	if f := r.beforeList; f != nil {
		r.beforeList = nil // the relist it runs lists too
		f()
	}
	return r.Runtime.List(ctx)
}

// A static pod's new version waits for its previous version whatever the moment the relist
// hands that version's containers to an orphan worker. The agent starts with the previous
// version still running (its manifest edited while the agent was down, or an edit cut short
// by a kill): the new version's first sync and the start's first relist run at once. Before,
// previousStaticVersion looked at the workers (no orphan yet), then at the running containers
// of pods no worker has (the orphan had one by then): adopted in between, the previous version
// counted in neither pass, and the new version started while the orphan worker still waited
// out the old one's stop (TestLifecycleModel, "2 versions of the static pod run at once", in
// full-package runs).
func TestStaticPodWaitsForAPreviousVersionAdoptedWhileItLooks(t *testing.T) {
	for _, c := range []struct {
		name string
		// source is what the store's record of the running pod (v1) says it came from; want
		// what previousStaticVersion answers.
		source offline.Source
		want   types.UID
	}{
		{"a previous version of the static pod", offline.SourceFile, "v1"},
		// An API pod of the same namespace and name is not a version of the static pod: it
		// does not hold the static pod up, adopted or not.
		{"an API pod of the same name", offline.SourceAPI, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			hollowRT := hollow.NewRuntime()
			prev := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "v1", Name: "sensor-gw", Namespace: "default"},
				Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "registry.example/sensor:1"}}}}
			if c.source == offline.SourceFile {
				prev.Annotations = map[string]string{manifest.ConfigSourceAnnotation: manifest.SourceFile}
			}
			if _, err := hollowRT.EnsureImage(ctx, "registry.example/sensor:1", v1.PullIfNotPresent, nil); err != nil {
				t.Fatal(err)
			}
			id, err := hollowRT.CreateContainer(ctx, runtime.ContainerConfig{PodUID: "v1", PodName: "sensor-gw", PodNamespace: "default",
				Name: "main", Image: "registry.example/sensor:1", Command: []string{"sleep", "inf"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := hollowRT.StartContainer(ctx, id); err != nil {
				t.Fatal(err)
			}
			store := offline.NewMemStore(nil)
			if err := store.PutPod(c.source, prev); err != nil {
				t.Fatal(err)
			}

			rt := &beforeListRuntime{Runtime: hollowRT}
			m := NewManager(Config{}, rt, hollow.NewNetwork("gw"), nil, nil, slog.New(slog.DiscardHandler))
			m.SetAdmission(nil, store)
			m.SetStaticSourceReady(func() bool { return true }) // the file source has read its directory
			if c.source == offline.SourceAPI {
				// An API pod's orphan waits for every source: they are ready here.
				m.SetSourcesReady(func() bool { return true })
				m.cfg.Volumes = volumes.NewManager(t.TempDir(), nil, nil, slog.New(slog.DiscardHandler), volumes.Options{PlainDirs: true})
			}
			next := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "v2", Name: "sensor-gw", Namespace: "default",
				Annotations: map[string]string{manifest.ConfigSourceAnnotation: manifest.SourceFile}}}
			w := newWorker(m, next)
			m.workers[next.UID] = w // Run does not run: no worker starts, the test calls the worker itself

			rt.beforeList = func() {
				if _, _, ok := m.relist(ctx, nil); !ok {
					t.Error("the relist failed")
				}
			}
			got := w.previousStaticVersion(ctx, next, nil)
			if rt.beforeList != nil || !m.Known("v1") {
				t.Fatal("the relist did not adopt the running pod between the two passes: the test no longer drives the interleaving")
			}
			if got != c.want {
				t.Errorf("%s running, adopted while the new version looked: previousStaticVersion = %q, want %q", c.name, got, c.want)
			}
		})
	}
}
