package gc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

type fakeRuntime struct {
	mu sync.Mutex
	cs []runtime.Container
}

func (f *fakeRuntime) List(context.Context) ([]runtime.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]runtime.Container(nil), f.cs...), nil
}

func (f *fakeRuntime) RemoveContainer(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range f.cs {
		if c.ID == id {
			f.cs = append(f.cs[:i], f.cs[i+1:]...)
			break
		}
	}
	return nil
}

func (f *fakeRuntime) ids() string { return ids(f.cs) }

type fakePods struct {
	ready  bool
	known  map[types.UID]bool
	images []string
}

func (p *fakePods) SourcesReady() bool       { return p.ready }
func (p *fakePods) Known(uid types.UID) bool { return p.known[uid] }
func (p *fakePods) Images() []string         { return p.images }

type fakeImages struct {
	imgs       []Image
	containers []string // image names containers reference
	// lateRefs are referenced only when asked right before removal.
	lateRefs map[string]bool
	removed  []string
	lastUsed map[string]time.Time
}

func (f *fakeImages) List(context.Context) ([]Image, error) {
	return append([]Image(nil), f.imgs...), nil
}

func (f *fakeImages) Size(_ context.Context, name string) (int64, error) {
	for _, i := range f.imgs {
		if i.Name == name {
			return i.Size, nil
		}
	}
	return 0, fmt.Errorf("no image %s", name)
}

func (f *fakeImages) ContainerImages(context.Context) ([]string, error) { return f.containers, nil }

func (f *fakeImages) Referenced(_ context.Context, name string) (bool, error) {
	for _, c := range f.containers {
		if c == name {
			return true, nil
		}
	}
	return f.lateRefs[name], nil
}

func (f *fakeImages) Remove(_ context.Context, name string, d digest.Digest) error {
	for i, img := range f.imgs {
		if img.Name == name && img.Digest == d {
			f.imgs = append(f.imgs[:i], f.imgs[i+1:]...)
			f.removed = append(f.removed, name)
			return nil
		}
	}
	return nil
}

func (f *fakeImages) SetLastUsed(_ context.Context, name string, t time.Time) error {
	if f.lastUsed == nil {
		f.lastUsed = map[string]time.Time{}
	}
	f.lastUsed[name] = t
	return nil
}

type fakeFS struct{ capacity, available uint64 }

func (f fakeFS) Usage(context.Context) (uint64, uint64, error) { return f.capacity, f.available, nil }

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestRunOnceContainers(t *testing.T) {
	logRoot := t.TempDir()
	withLog := func(c runtime.Container, ns, pod string) runtime.Container {
		c.PodNamespace, c.PodName = ns, pod
		c.LogPath = filepath.Join(logRoot, ns+"_"+pod+"_"+c.PodUID, c.Name, fmt.Sprintf("%d.log", c.Attempt))
		must(t, os.MkdirAll(filepath.Dir(c.LogPath), 0o755))
		for _, n := range []string{c.LogPath, c.LogPath + ".20261102-100405"} {
			must(t, os.WriteFile(n, []byte("x\n"), 0o640))
		}
		return c
	}
	rt := &fakeRuntime{cs: []runtime.Container{
		withLog(ctr("u1", "app", 0, runtime.StateExited, time.Hour), "default", "web"),
		withLog(ctr("u1", "app", 1, runtime.StateExited, time.Hour), "default", "web"),
		withLog(ctr("u1", "app", 2, runtime.StateRunning, 0), "default", "web"),
		withLog(ctr("u2", "job", 0, runtime.StateExited, time.Hour), "default", "gone"),
	}}
	// A log directory of a pod deleted earlier, whose containers are gone already.
	must(t, os.MkdirAll(filepath.Join(logRoot, "default_old_u3", "app"), 0o755))
	pods := &fakePods{known: map[types.UID]bool{"u1": true}}
	g, err := New(Config{PodLogDir: logRoot}, rt, nil, nil, pods, quietLog())
	if err != nil {
		t.Fatal(err)
	}

	// Sources not complete: only the known pod's surplus attempt goes.
	if err := g.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := rt.ids(); got != "u1-app-1 u1-app-2 u2-job-0" {
		t.Fatalf("containers left %q", got)
	}
	if got := dirNames(t, filepath.Join(logRoot, "default_web_u1", "app")); got != "1.log 1.log.20261102-100405 2.log 2.log.20261102-100405" {
		t.Fatalf("logs of the removed attempt should be gone with it: %s", got)
	}
	if got := dirNames(t, logRoot); got != "default_gone_u2 default_old_u3 default_web_u1" {
		t.Fatalf("pod log dirs %s", got)
	}

	// Complete: the gone pod's container and logs go, and the old pod's log directory.
	pods.ready = true
	if err := g.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := rt.ids(); got != "u1-app-1 u1-app-2" {
		t.Fatalf("containers left %q", got)
	}
	if got := dirNames(t, logRoot); got != "default_web_u1" {
		t.Fatalf("pod log dirs %s", got)
	}
}

func TestRunOnceImages(t *testing.T) {
	clk := now
	old := clk.Add(-24 * time.Hour)
	const mib = 1 << 20
	mk := func(name string, size int64, updated time.Time) Image {
		return Image{Name: name, Digest: dg(name), Size: size, Updated: updated}
	}
	imgs := &fakeImages{
		imgs: []Image{
			mk("docker.io/x/unused-old:1", 10*mib, old.Add(-time.Hour)),
			mk("docker.io/x/unused-newer:1", 10*mib, old),
			mk("docker.io/x/used:1", 10*mib, old.Add(-48*time.Hour)),
			mk("docker.io/x/wanted:1", 10*mib, old.Add(-48*time.Hour)),
			mk("docker.io/x/pinned:1", 10*mib, old.Add(-48*time.Hour)),
			mk("docker.io/x/preloaded:1", 10*mib, old.Add(-48*time.Hour)),
			mk("registry.k8s.io/pause:3.6", 10*mib, old.Add(-48*time.Hour)),
			mk("docker.io/x/raced:1", 10*mib, old.Add(-72*time.Hour)),
		},
		containers: []string{"docker.io/x/used:1"},
		lateRefs:   map[string]bool{"docker.io/x/raced:1": true},
	}
	pods := &fakePods{ready: false, known: map[types.UID]bool{}, images: []string{"x/wanted:1"}}
	fs := &fakeFS{capacity: 1000 * mib, available: 500 * mib}
	g, err := New(Config{
		PinnedImages: []string{"x/pinned:1", "docker.io/x/preloaded:1"},
		Now:          func() time.Time { return clk },
	}, &fakeRuntime{}, imgs, fs, pods, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	run := func() {
		t.Helper()
		if err := g.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	// Full disk, but the sources have not told which images pods want: nothing goes.
	fs.available = 0
	run()
	if len(imgs.removed) != 0 {
		t.Fatalf("removed %v before the sources were complete", imgs.removed)
	}
	pods.ready = true

	// 50% used: below the threshold, nothing goes; the image in use gets its last-used label.
	fs.available = 500 * mib
	run()
	if len(imgs.removed) != 0 {
		t.Fatalf("removed %v below the threshold", imgs.removed)
	}
	if imgs.lastUsed["docker.io/x/used:1"] != clk || len(imgs.lastUsed) != 2 { // used and wanted
		t.Fatalf("last used labels %v", imgs.lastUsed)
	}

	// 85% used: free 50 MiB to reach 80%. "raced" is the least recently used but a container
	// took it since the list; then the two unused ones, oldest first; 20 MiB is all there is.
	fs.available = 150 * mib
	run()
	if got := strings.Join(imgs.removed, " "); got != "docker.io/x/unused-old:1 docker.io/x/unused-newer:1" {
		t.Fatalf("removed %q", got)
	}
	var left []string
	for _, i := range imgs.imgs {
		left = append(left, i.Name)
	}
	sort.Strings(left)
	if got := strings.Join(left, " "); got != "docker.io/x/pinned:1 docker.io/x/preloaded:1 docker.io/x/raced:1 docker.io/x/used:1 docker.io/x/wanted:1 registry.k8s.io/pause:3.6" {
		t.Fatalf("left %q", got)
	}
}

// TestRunOnceImagesLRUSurvivesRestart: the last-used time read back from the image orders a
// new collector's choice.
func TestRunOnceImagesLRUSurvivesRestart(t *testing.T) {
	old := now.Add(-24 * time.Hour)
	imgs := &fakeImages{imgs: []Image{
		{Name: "docker.io/x/a:1", Digest: dg("a"), Size: 10, Updated: old.Add(-10 * time.Hour), LastUsed: now.Add(-time.Hour)},
		{Name: "docker.io/x/b:1", Digest: dg("b"), Size: 10, Updated: old},
	}}
	g, err := New(Config{Now: func() time.Time { return now }}, &fakeRuntime{}, imgs,
		fakeFS{capacity: 100, available: 10}, &fakePods{ready: true}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	// 90% used: free 10 bytes; b was last there a day ago, a used an hour ago.
	if err := g.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(imgs.removed) != "[docker.io/x/b:1]" {
		t.Fatalf("removed %v", imgs.removed)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{MaxDeadPerContainer: -1},
		{ImageHighThresholdPercent: 80, ImageLowThresholdPercent: 85},
		{ImageHighThresholdPercent: 101},
		{ImageHighThresholdPercent: 80, ImageLowThresholdPercent: 80},
		{Period: -time.Second},
	} {
		if _, err := New(c, &fakeRuntime{}, nil, nil, &fakePods{}, quietLog()); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	if _, err := New(Config{ImageHighThresholdPercent: 100}, &fakeRuntime{}, nil, nil, &fakePods{}, quietLog()); err != nil {
		t.Errorf("100%% disables image collection: %v", err)
	}
}

// listCounter is a runtime that reports each List on a channel.
type listCounter struct {
	fakeRuntime
	listed chan struct{}
}

func (l *listCounter) List(ctx context.Context) ([]runtime.Container, error) {
	select {
	case l.listed <- struct{}{}:
	default:
	}
	return l.fakeRuntime.List(ctx)
}

// TestRunCollectsEachPeriodAndStops: Run collects every period and returns once its context
// ends.
func TestRunCollectsEachPeriodAndStops(t *testing.T) {
	rt := &listCounter{listed: make(chan struct{}, 1)}
	g, err := New(Config{Period: 10 * time.Millisecond}, rt, nil, nil, &fakePods{}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	for range 3 {
		select {
		case <-rt.listed:
		case <-time.After(5 * time.Second):
			t.Fatal("no collection within 5s at a 10ms period")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func dirNames(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
