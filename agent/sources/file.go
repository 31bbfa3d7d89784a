package sources

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/holdfast-dev/holdfast/agent/manifest"
)

// FileSource runs the static pods of a manifest directory: one Pod per file, YAML or JSON.
//
// A file is read once it has been quiet for QuietPeriod, so a manifest being copied in is not
// read half-written. Hidden files and editor leftovers are ignored. A file that does not parse
// or validate is reported (log line with its path and the reason) and the pod it described
// before, if any, keeps running: only removing the file stops a static pod.
type FileSource struct {
	Dir      string
	NodeName string
	Sink     Sink
	Log      *slog.Logger
	// Recorder, if set, gets a Warning event on the Node for every invalid manifest.
	Recorder    record.EventRecorder
	QuietPeriod time.Duration // defaults to 300ms
	Rescan      time.Duration // defaults to 20s: the safety net for missed notifications

	ready atomic.Bool
	pods  map[string]*v1.Pod // by file path; owned by Run's goroutine
	bad   map[string]string  // file path -> last error reported, to log each problem once
}

// Ready reports whether the initial scan is done: the source has delivered all its pods.
func (s *FileSource) Ready() bool { return s.ready.Load() }

// Run scans the directory, then follows it until ctx ends.
func (s *FileSource) Run(ctx context.Context) error {
	if s.QuietPeriod == 0 {
		s.QuietPeriod = 300 * time.Millisecond
	}
	if s.Rescan == 0 {
		s.Rescan = 20 * time.Second
	}
	s.pods, s.bad = map[string]*v1.Pod{}, map[string]string{}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("static manifest dir: %w", err)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.Dir, err)
	}
	defer watcher.Close()
	if err := watcher.Add(s.Dir); err != nil {
		return fmt.Errorf("watch %s: %w", s.Dir, err)
	}
	s.scan()
	s.ready.Store(true)

	pending := map[string]time.Time{} // path -> last event
	tick := time.NewTicker(s.QuietPeriod / 3)
	defer tick.Stop()
	rescan := time.NewTicker(s.Rescan)
	defer rescan.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return fmt.Errorf("watcher of %s closed", s.Dir)
			}
			pending[ev.Name] = time.Now()
		case err, ok := <-watcher.Errors:
			if !ok {
				return fmt.Errorf("watcher of %s closed", s.Dir)
			}
			s.Log.Warn("static manifest watch error; rescanning", "dir", s.Dir, "err", err)
			s.scan()
		case <-tick.C:
			for p, at := range pending {
				if time.Since(at) >= s.QuietPeriod {
					delete(pending, p)
					s.syncFile(p)
				}
			}
		case <-rescan.C:
			s.scan()
		}
	}
}

// scan reads every manifest and removes pods whose file is gone.
func (s *FileSource) scan() {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		// Unreadable is not empty: keep every pod running.
		s.Log.Error("read static manifest dir; keeping current static pods", "dir", s.Dir, "err", err)
		return
	}
	seen := map[string]bool{}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(s.Dir, n)
		seen[p] = true
		s.syncFile(p)
	}
	for p := range s.pods {
		if !seen[p] {
			s.syncFile(p)
		}
	}
}

// ignored says whether a file name is not a manifest: hidden files, editor swap and backup
// files, partial downloads, and anything not .yaml, .yml or .json.
func ignored(name string) bool {
	base := filepath.Base(name)
	if strings.HasPrefix(base, ".") || strings.HasSuffix(base, "~") {
		return true
	}
	switch strings.ToLower(filepath.Ext(base)) {
	case ".yaml", ".yml", ".json":
		return false
	}
	return true
}

func (s *FileSource) syncFile(path string) {
	old := s.pods[path]
	st, err := os.Stat(path)
	if os.IsNotExist(err) {
		delete(s.bad, path)
		if old != nil {
			delete(s.pods, path)
			s.Log.Info("static manifest removed; stopping its pod", "path", path, "pod", old.Name)
			s.Sink.Remove(old.UID, "static manifest "+path+" was removed")
		}
		return
	}
	if ignored(path) || (err == nil && st.IsDir()) {
		return
	}
	pod, err := s.read(path)
	if err != nil {
		msg := err.Error()
		if s.bad[path] != msg {
			s.bad[path] = msg
			if old != nil {
				s.Log.Error("invalid static manifest; the pod it described before keeps running", "path", path, "pod", old.Name, "err", err)
			} else {
				s.Log.Error("invalid static manifest; skipped", "path", path, "err", err)
			}
			if s.Recorder != nil {
				ref := &v1.ObjectReference{Kind: "Node", Name: s.NodeName, UID: types.UID(s.NodeName)}
				s.Recorder.Eventf(ref, v1.EventTypeWarning, "InvalidStaticManifest", "static manifest %s skipped: %v", path, err)
			}
		}
		return
	}
	delete(s.bad, path)
	if old != nil && old.UID == pod.UID {
		return
	}
	s.pods[path] = pod
	if old != nil {
		s.Log.Info("static manifest changed; replacing its pod", "path", path, "pod", pod.Name)
		s.Sink.Remove(old.UID, "static manifest "+path+" changed")
	} else {
		s.Log.Info("static pod found", "path", path, "pod", pod.Name)
	}
	s.Sink.Update(pod)
}

func (s *FileSource) read(path string) (*v1.Pod, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, manifest.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	pod, err := manifest.Decode(data)
	if err != nil {
		return nil, err
	}
	if err := manifest.MakeStatic(pod, s.NodeName, path); err != nil {
		return nil, fmt.Errorf("invalid pod: %w", err)
	}
	return pod, nil
}
