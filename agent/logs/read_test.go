package logs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var readT0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// writeCRI writes lines "STREAM TAG MESSAGE" at readT0 + i seconds, in the CRI format.
func writeCRI(t *testing.T, f *os.File, first int, lines ...string) {
	t.Helper()
	var b []byte
	for i, l := range lines {
		parts := strings.SplitN(l, " ", 3)
		b = AppendLine(b, readT0.Add(time.Duration(first+i)*time.Second), Stream(parts[0]), parts[1] == TagPartial, []byte(parts[2]))
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func newLogFile(t *testing.T) (string, *os.File) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "default_web_uid1", "app")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "0.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return path, f
}

// TestRead: kubelet's /containerLogs options applied to a CRI log file.
func TestRead(t *testing.T) {
	path, f := newLogFile(t)
	writeCRI(t, f, 0,
		"stdout F one",
		"stderr F two",
		"stdout P thr",
		"stdout F ee",
		"stdout F four",
	)
	if _, err := f.WriteString("garbage that is not a CRI line\n"); err != nil {
		t.Fatal(err)
	}
	writeCRI(t, f, 5, "stdout F five")
	for _, tc := range []struct {
		name string
		opts ReadOptions
		want string
	}{
		{"all", ReadOptions{TailLines: -1}, "one\ntwo\nthree\nfour\nfive\n"},
		{"tail 2", ReadOptions{TailLines: 2}, "five\n"}, // the garbage line counts as a line, as in kubelet
		{"tail 3", ReadOptions{TailLines: 3}, "four\nfive\n"},
		{"tail 0", ReadOptions{TailLines: 0}, ""},
		{"tail more than the file", ReadOptions{TailLines: 100}, "one\ntwo\nthree\nfour\nfive\n"},
		{"since", ReadOptions{TailLines: -1, Since: readT0.Add(3 * time.Second)}, "ee\nfour\nfive\n"},
		{"limitBytes", ReadOptions{TailLines: -1, LimitBytes: 6}, "one\ntw"},
		{"limitBytes on a line end", ReadOptions{TailLines: -1, LimitBytes: 4}, "one\n"},
		{"timestamps", ReadOptions{TailLines: 1, Timestamps: true}, "2026-12-03T10:00:05Z five\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Read(context.Background(), path, tc.opts, &out); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("got %q, want %q", out.String(), tc.want)
			}
		})
	}
}

// TestReadRefusesSymlink: a log file replaced by a symlink (to a host file) is not read.
func TestReadRefusesSymlink(t *testing.T) {
	path, f := newLogFile(t)
	f.Close()
	secret := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(secret, []byte("2026-12-03T10:00:00Z stdout F root:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, path); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := Read(context.Background(), path, ReadOptions{TailLines: -1}, &out)
	if err == nil || out.Len() > 0 {
		t.Fatalf("read through a symlink: err %v, output %q", err, out.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestReadFollow: a follow sees lines written after it started, goes on across a rotation,
// and ends once the container stopped and its last lines were read.
func TestReadFollow(t *testing.T) {
	path, f := newLogFile(t)
	writeCRI(t, f, 0, "stdout F before")
	var running atomic.Bool
	running.Store(true)
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- Read(context.Background(), path, ReadOptions{TailLines: -1, Follow: true, Running: running.Load, PollInterval: time.Millisecond}, out)
	}()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for out.String() != want {
			if time.Now().After(deadline) {
				t.Fatalf("output %q, want %q", out.String(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("before\n")
	writeCRI(t, f, 1, "stdout F after")
	waitFor("before\nafter\n")
	// Rotate as the logger does: rename, then a new file at the path.
	writeCRI(t, f, 2, "stdout F last of the old file")
	if err := os.Rename(path, path+".20261203-100000"); err != nil {
		t.Fatal(err)
	}
	f2, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	writeCRI(t, f2, 3, "stdout F new file")
	waitFor("before\nafter\nlast of the old file\nnew file\n")
	writeCRI(t, f2, 4, "stdout F exit")
	running.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end after the container stopped")
	}
	if got, want := out.String(), "before\nafter\nlast of the old file\nnew file\nexit\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestReadFollowEndsWithContext: an endless follow ends when its request does.
func TestReadFollowEndsWithContext(t *testing.T) {
	path, f := newLogFile(t)
	writeCRI(t, f, 0, "stdout F x")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Read(ctx, path, ReadOptions{TailLines: -1, Follow: true, Running: func() bool { return true }, PollInterval: time.Millisecond}, &syncBuffer{})
	}()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end with its context")
	}
}

func TestParseLine(t *testing.T) {
	p, err := ParseLine([]byte("2026-12-03T10:00:00.123456789Z stderr P a b c\n"))
	if err != nil || p.Stream != Stderr || !p.Partial || string(p.Message) != "a b c" || p.Time.Nanosecond() != 123456789 {
		t.Errorf("got %+v, %v", p, err)
	}
	for _, bad := range []string{"", "x stdout F m", "2026-12-03T10:00:00Z stdin F m", "2026-12-03T10:00:00Z stdout X m"} {
		if _, err := ParseLine([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
