package sources

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/test/poll"
)

// recordingSink remembers what a source delivered.
type recordingSink struct {
	mu      sync.Mutex
	pods    map[types.UID]*v1.Pod
	removed []types.UID
}

func (s *recordingSink) Update(p *v1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[p.UID] = p
}

func (s *recordingSink) Remove(uid types.UID, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pods, uid)
	s.removed = append(s.removed, uid)
}

func (s *recordingSink) removedUIDs() []types.UID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.removed)
}

func (s *recordingSink) names() map[string]types.UID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]types.UID{}
	for uid, p := range s.pods {
		out[p.Name] = uid
	}
	return out
}

// runSource runs src until the test ends, and fails the test if Run did not end cleanly.
func runSource(t *testing.T, src *FileSource) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

const podManifest = "apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec: {containers: [{name: c, image: busybox:1, command: [%q]}]}\n"

func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", fmt.Sprintf(podManifest, "a", "v1"))
	write(".hidden.yaml", fmt.Sprintf(podManifest, "hidden", "v1"))
	write("b.yaml~", fmt.Sprintf(podManifest, "backup", "v1"))
	write("notes.txt", "not a manifest")
	write("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec: {containers: []}\n")

	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	src := &FileSource{Dir: dir, NodeName: "n1", Sink: sink, Log: slog.New(slog.DiscardHandler), QuietPeriod: 50 * time.Millisecond, Rescan: time.Hour}
	runSource(t, src)

	poll.Until(t, 10*time.Second, 20*time.Millisecond, "initial scan", func() error {
		if !src.Ready() {
			return fmt.Errorf("not ready")
		}
		if n := sink.names(); len(n) != 1 || n["a-n1"] == "" {
			return fmt.Errorf("pods %v, want only a-n1", n)
		}
		return nil
	})
	first := sink.names()["a-n1"]

	// An invalid edit keeps the running pod.
	write("a.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n")
	time.Sleep(200 * time.Millisecond) // past the quiet period: the bad version was read
	if n := sink.names(); n["a-n1"] != first {
		t.Fatalf("an invalid edit replaced or removed the pod: %v", n)
	}
	// A valid edit replaces it.
	write("a.yaml", fmt.Sprintf(podManifest, "a", "v2"))
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "edited pod replaces the old one", func() error {
		if uid := sink.names()["a-n1"]; uid == "" || uid == first {
			return fmt.Errorf("uid %q (first %q)", uid, first)
		}
		return nil
	})
	// Removing the file removes the pod.
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "removed file stops its pod", func() error {
		if n := sink.names(); len(n) != 0 {
			return fmt.Errorf("pods %v", n)
		}
		return nil
	})
}

func TestIgnored(t *testing.T) {
	for name, want := range map[string]bool{
		"pod.yaml": false, "pod.yml": false, "pod.JSON": false,
		".pod.yaml.swp": true, "pod.yaml~": true, ".#pod.yaml": true, "pod.yaml.part": true, "README": true,
	} {
		if got := ignored(name); got != want {
			t.Errorf("ignored(%q) = %v, want %v", name, got, want)
		}
	}
}

// The manifest directory cannot be read at boot (an I/O error of a failing card, a directory
// being replaced): the source is not ready, so that the pods manager takes no running
// container of a static pod for an orphan and kills it; it becomes ready, with the pods, once
// a read succeeds. Before, the failed first read marked the source ready with no pods.
func TestUnreadableManifestDirAtBootIsNotReady(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(fmt.Sprintf(podManifest, "a", "v1")), 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	failing := true
	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	src := &FileSource{Dir: dir, NodeName: "n1", Sink: sink, Log: slog.New(slog.DiscardHandler), QuietPeriod: 50 * time.Millisecond, Rescan: time.Hour,
		readDir: func(d string) ([]os.DirEntry, error) {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return nil, &os.PathError{Op: "readdirent", Path: d, Err: syscall.EIO}
			}
			return os.ReadDir(d)
		}}
	runSource(t, src)
	time.Sleep(300 * time.Millisecond) // several retries
	if src.Ready() {
		t.Fatal("the source is ready although its directory was never read")
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "ready with the pod once the directory reads", func() error {
		if !src.Ready() {
			return fmt.Errorf("not ready")
		}
		if n := sink.names(); n["a-n1"] == "" {
			return fmt.Errorf("pods %v", n)
		}
		return nil
	})
}

// Two manifests that name the same pod (a copy left beside the original, web.yaml and
// web.yaml.new renamed to web2.yaml): the first file by name runs it and the other is
// refused with a reason, as the kubelet refuses a duplicate name in a source. Before, both
// ran, and each one's mirror pod replaced the other's in a loop. Once the first file is gone
// the other runs, at once; a new file that comes first by name takes the name, as the next
// boot would give it to that file.
func TestDuplicateStaticPodNameRefused(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []struct{ name, version string }{{"a.yaml", "v1"}, {"b.yaml", "v2"}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(fmt.Sprintf(podManifest, "web", f.version)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logs strings.Builder
	var logMu sync.Mutex
	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	src := &FileSource{Dir: dir, NodeName: "n1", Sink: sink, Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil)),
		QuietPeriod: 50 * time.Millisecond, Rescan: 200 * time.Millisecond}
	runSource(t, src)
	command := func() string {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.pods) != 1 {
			return fmt.Sprintf("%d pods", len(sink.pods))
		}
		for _, p := range sink.pods {
			return p.Spec.Containers[0].Command[0]
		}
		return ""
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "a.yaml's pod alone", func() error {
		if c := command(); c != "v1" {
			return fmt.Errorf("running %q, want a.yaml's v1 alone", c)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // rescans: b.yaml still refused
	if c := command(); c != "v1" {
		t.Fatalf("after rescans: %q", c)
	}
	logMu.Lock()
	logged := logs.String()
	logMu.Unlock()
	if !strings.Contains(logged, "already defined by "+filepath.Join(dir, "a.yaml")) {
		t.Errorf("no reason logged for b.yaml: %s", logged)
	}
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "b.yaml's pod once a.yaml is gone", func() error {
		if c := command(); c != "v2" {
			return fmt.Errorf("running %q", c)
		}
		return nil
	})
	// A file that comes first by name takes the name, as the next boot would give it.
	if err := os.WriteFile(filepath.Join(dir, "0.yaml"), []byte(fmt.Sprintf(podManifest, "web", "v3")), 0o644); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "0.yaml's pod in b.yaml's place", func() error {
		if c := command(); c != "v3" {
			return fmt.Errorf("running %q", c)
		}
		return nil
	})
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
