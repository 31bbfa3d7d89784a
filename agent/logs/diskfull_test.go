package logs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/test/prereq"
)

// smallFS mounts a tmpfs of size bytes at a new directory (root only) and returns it.
func smallFS(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	prereq.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)), "mount a small tmpfs (root)")
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fill writes a file until the file system is full and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{'f'}, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	// The last page may have been taken in part: take single bytes until nothing goes in.
	for {
		if _, err := f.Write([]byte{'f'}); err != nil {
			return path
		}
	}
}

// syncWriter is a diagnostics sink safe for Serve's goroutines.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestServeOnFullFileSystem: on a full log file system the logger keeps draining the
// container's output (a container never blocks on its stdout for want of disk), drops the
// lines it cannot write, says so once rather than once per line, keeps the file to whole
// lines, and writes again as soon as there is room.
func TestServeOnFullFileSystem(t *testing.T) {
	root := smallFS(t, 256<<10)
	path := logPath(root)
	p := newPipes(t)
	diag := &syncWriter{}
	done := make(chan error, 1)
	go func() {
		done <- Serve(context.Background(), Options{Path: path, Root: root}, p.outR, p.errR, func() error { return nil }, diag)
	}()
	fmt.Fprintf(p.outW, "before the disk filled\n")
	deadline := time.Now().Add(10 * time.Second)
	for b, _ := os.ReadFile(path); !bytes.Contains(b, []byte("before")); b, _ = os.ReadFile(path) {
		if time.Now().After(deadline) {
			t.Fatal("the first line never reached the file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	filler := fill(t, root)

	// Far more than the pipe holds (64 KiB): a logger that stopped reading would block this.
	line := strings.Repeat("x", 200) + "\n"
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for range 5000 {
			fmt.Fprint(p.outW, line)
		}
	}()
	select {
	case <-wrote:
	case <-time.After(30 * time.Second):
		t.Fatal("the container's writes blocked: the logger stopped draining on a full disk")
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(p.outW, "after the room came back\n")
	p.outW.Close()
	p.errW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}

	content := readFile(t, path)
	for _, l := range strings.Split(strings.TrimSuffix(content, "\n"), "\n") {
		if _, err := ParseLine([]byte(l)); err != nil || strings.Count(l, " stdout ") != 1 {
			t.Errorf("torn line in the file: %.120q (%v)", l, err)
		}
	}
	if !strings.Contains(content, "after the room came back") {
		t.Errorf("nothing written once there was room again; file ends %q", content[max(0, len(content)-200):])
	}
	d := diag.String()
	if strings.Count(d, "\n") > 4 || !strings.Contains(d, "no space left on device") || !strings.Contains(d, "lines were dropped") {
		t.Errorf("diagnostics: want the failure once and the count of dropped lines, got:\n%.2000s", d)
	}
}
