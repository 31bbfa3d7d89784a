package sources

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
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

	// readDir lists the directory (fsutil.ReadDirNoAtime; a test's failing disk).
	readDir func(string) ([]os.DirEntry, error)

	ready atomic.Bool
	pods  map[string]*v1.Pod // by file path; owned by Run's goroutine
	bad   map[string]string  // file path -> last error reported, to log each problem once
}

// Ready reports whether a scan of the whole directory succeeded: the source has delivered all
// its pods. Until then the pods manager takes no container for an orphan.
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
	if s.readDir == nil {
		s.readDir = fsutil.ReadDirNoAtime
	}
	// A directory that cannot be read is not an empty one: ready only once a scan read it,
	// tried again at every tick until then (a failing card, a directory being replaced).
	s.ready.Store(s.scan() == nil)

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
			if s.scan() == nil {
				s.ready.Store(true)
			}
		case <-tick.C:
			if !s.ready.Load() && s.scan() == nil {
				s.ready.Store(true)
			}
			for p, at := range pending {
				if time.Since(at) >= s.QuietPeriod {
					delete(pending, p)
					s.syncFile(p)
				}
			}
		case <-rescan.C:
			if s.scan() == nil {
				s.ready.Store(true)
			}
		}
	}
}

// scan reads every manifest and removes pods whose file is gone. A directory it cannot list
// changes nothing (unreadable is not empty: every pod keeps running) and is its error.
func (s *FileSource) scan() error {
	entries, err := s.readDir(s.Dir)
	if err != nil {
		if msg := err.Error(); s.bad[s.Dir] != msg { // once per distinct error, not every tick
			s.bad[s.Dir] = msg
			s.Log.Error("read static manifest dir; keeping current static pods", "dir", s.Dir, "err", err)
		}
		return err
	}
	delete(s.bad, s.Dir)
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
	return nil
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
			s.Sink.Remove(old.UID, "static manifest "+displayPath(path)+" was removed")
			s.resyncRefused()
		}
		return
	}
	if ignored(path) || (err == nil && st.IsDir()) {
		return
	}
	pod, err := s.read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return // gone since the stat (or a dangling symlink): its removal event follows
	}
	if err == nil {
		if other := s.definedBy(pod, path); other != "" && other < path {
			// As the kubelet refuses a duplicate pod name within a source: two static pods of
			// one name would share one mirror pod, each replacing the other's in a loop. The
			// first file by name has it, as at every boot, whatever came first.
			err = fmt.Errorf("pod %s/%s is already defined by %s: static pod names must be unique", pod.Namespace, pod.Name, displayPath(other))
		} else if other != "" {
			// This file comes first by name: it takes the name from the other, which is
			// reported as the duplicate from now on (as the next boot would have it).
			displaced := s.pods[other]
			delete(s.pods, other)
			msg := fmt.Sprintf("pod %s/%s is already defined by %s: static pod names must be unique", pod.Namespace, pod.Name, displayPath(path))
			s.bad[other] = msg
			s.Log.Error("invalid static manifest; its pod stops", "path", other, "pod", displaced.Name, "err", msg)
			s.Sink.Remove(displaced.UID, "static manifest "+displayPath(path)+" defines the same pod and comes first by name")
		}
	}
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
				s.Recorder.Eventf(ref, v1.EventTypeWarning, "InvalidStaticManifest", "static manifest %s skipped: %v", displayPath(path), err)
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
		s.Sink.Remove(old.UID, "static manifest "+displayPath(path)+" changed")
	} else {
		s.Log.Info("static pod found", "path", path, "pod", pod.Name)
	}
	s.Sink.Update(pod)
}

// resyncRefused reads again, at once, the files refused so far, so that a duplicate of a pod
// that is gone runs it without waiting for a rescan (a rename of the file that had the name
// is a removal and a creation, in either order). A file still refused for the same reason is
// not reported again.
func (s *FileSource) resyncRefused() {
	var paths []string
	for p := range s.bad {
		if p != s.Dir {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		s.syncFile(p)
	}
}

// definedBy returns the file of another static pod with pod's namespace and name, "" if none.
func (s *FileSource) definedBy(pod *v1.Pod, path string) string {
	for p, other := range s.pods {
		if p != path && other.Namespace == pod.Namespace && other.Name == pod.Name {
			return p
		}
	}
	return ""
}

// displayPath is path as events and messages show it: as it is, or quoted when it holds a
// newline, another control character or invalid UTF-8 (log lines quote it themselves).
func displayPath(path string) string {
	if !utf8.ValidString(path) || strings.ContainsFunc(path, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(path)
	}
	return path
}

// open opens a manifest for reading: a regular file of the directory, or a symlink to one
// inside it. The agent runs as root, so a symlink leading outside the directory is not followed:
// a link to /etc/shadow must not have its content echoed in a parse error. A FIFO is opened
// without blocking and refused (opening it for reading would wait for a writer, and the
// source with it), as is a device.
func (s *FileSource) open(path string) (*os.File, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(s.Dir)
	if err != nil {
		return nil, err
	}
	if rel, err := filepath.Rel(dir, resolved); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("a symlink to %s, outside the manifest directory: not followed", resolved)
	}
	// O_NOFOLLOW: resolved has no symlink left, unless one was put there since.
	f, err := os.OpenFile(resolved, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("not a regular file (%s): not read", st.Mode().Type())
	}
	return f, nil
}

func (s *FileSource) read(path string) (*v1.Pod, error) {
	f, err := s.open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, manifest.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(data) > manifest.MaxSize {
		size := "more"
		if st, err := f.Stat(); err == nil {
			size = strconv.FormatInt(st.Size(), 10) + " bytes,"
		}
		return nil, fmt.Errorf("manifest is %s more than the %d bytes allowed", size, manifest.MaxSize)
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
