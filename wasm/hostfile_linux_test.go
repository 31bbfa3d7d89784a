package wasm_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/wasm"
)

// TestFileReadHoldsDeadline: read_file on a file whose open the kernel does
// not complete (as on a hung NFS server or FUSE daemon; here a fanotify
// listener that never answers the open's permission event) answers
// "timeout" at the call's deadline instead of holding the call; while
// earlier reads are still blocked, further ones are answered at once; once
// the file system answers again, reads work.
func TestFileReadHoldsDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("needs root and fanotify: an integration test")
	}
	if os.Geteuid() != 0 {
		t.Fatal("fanotify permission events need root: run the tests as root (make test does)")
	}
	rootfs := t.TempDir()
	file := filepath.Join(rootfs, "run/app/heartbeat")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("alive"), 0o644); err != nil {
		t.Fatal(err)
	}
	fan, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC, unix.O_RDONLY)
	if err != nil {
		t.Fatalf("fanotify_init: %v", err)
	}
	// Closing the listener allows every pending open: the blocked reads end.
	release := func() {
		if fan >= 0 {
			unix.Close(fan)
			fan = -1
		}
	}
	t.Cleanup(release)
	if err := unix.FanotifyMark(fan, unix.FAN_MARK_ADD, unix.FAN_OPEN_PERM, unix.AT_FDCWD, file); err != nil {
		t.Fatalf("fanotify_mark: %v", err)
	}

	const deadline = 300 * time.Millisecond
	e := newEngine(t, wasm.Limits{CallTimeout: deadline, MaxInstances: 2})
	m := hostcall(t, e)
	files := wasm.WithFiles([]string{"/run/app"}, wasm.FileMount{GuestPath: "/", HostPath: rootfs})
	read := func() (map[string]any, time.Duration) {
		t.Helper()
		start := time.Now()
		out, err := m.Call(context.Background(), "read", []byte(`{"path":"/run/app/heartbeat"}`), files)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("read: %v after %s", err, took)
		}
		return decode(t, out), took
	}
	for i := range 2 {
		got, took := read()
		t.Logf("read %d while the open is blocked: %v after %s", i+1, got, took.Round(time.Millisecond))
		if got["code"] != "timeout" || took > deadline+time.Second {
			t.Fatalf("read %d: %v after %s, want a timeout answer at the deadline of %s", i+1, got, took, deadline)
		}
	}
	// Both slots are held by blocked opens: answered at once.
	got, took := read()
	if got["code"] != "timeout" || !strings.Contains(got["error"].(string), "still blocked") || took > deadline/2 {
		t.Fatalf("a third read while two are blocked: %v after %s, want an immediate timeout answer", got, took)
	}

	release()
	var last map[string]any
	for start := time.Now(); time.Since(start) < 10*time.Second; {
		if last, _ = read(); last["data"] == "alive" {
			return
		}
	}
	t.Fatalf("reads did not recover once the file system answered: %v", last)
}
