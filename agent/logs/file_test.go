package logs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// clock is a settable clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func logPath(root string) string { return filepath.Join(root, "default_web_uid-1", "app", "0.log") }

func readDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFileRotatesAndPrunes(t *testing.T) {
	root := t.TempDir()
	path := logPath(root)
	clk := &clock{time.Date(2026, 11, 2, 10, 4, 5, 0, time.UTC)}
	f, err := OpenFile(root, path, FileOptions{MaxSize: 100, MaxFiles: 3, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		clk.t = clk.t.Add(time.Second)
		line := fmt.Sprintf("line %02d %s\n", i, strings.Repeat("x", 21)) // 30 bytes: 3 per file
		if _, err := f.Write([]byte(line)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	names := readDir(t, dir)
	// Rotations happened before lines 4, 7 and 10, at 10:04:09, :12 and :15; the oldest file
	// (lines 1-3) was pruned to keep 3 files.
	want := []string{"0.log", "0.log.20261102-100412", "0.log.20261102-100415"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	for name, lines := range map[string][]int{"0.log": {10}, "0.log.20261102-100412": {4, 5, 6}, "0.log.20261102-100415": {7, 8, 9}} {
		content := readFile(t, filepath.Join(dir, name))
		var got []int
		for _, l := range strings.Split(strings.TrimSuffix(content, "\n"), "\n") {
			var n int
			fmt.Sscanf(l, "line %d", &n)
			got = append(got, n)
		}
		if fmt.Sprint(got) != fmt.Sprint(lines) {
			t.Errorf("%s holds lines %v, want %v", name, got, lines)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("live file mode %v (%v), want 0640", fi.Mode(), err)
	}
}

func TestFileRotationsInOneSecondKeepOrder(t *testing.T) {
	root := t.TempDir()
	path := logPath(root)
	clk := &clock{time.Date(2026, 11, 2, 10, 4, 5, 0, time.UTC)}
	f, err := OpenFile(root, path, FileOptions{MaxSize: 10, MaxFiles: 4, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 5 {
		if _, err := fmt.Fprintf(f, "%d-23456789\n", i); err != nil {
			t.Fatal(err)
		}
	}
	names := readDir(t, filepath.Dir(path))
	want := []string{"0.log", "0.log.20261102-100405-001", "0.log.20261102-100405-002", "0.log.20261102-100405-003"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	// Sorted by name is sorted by age: the newest rotated file holds line 3.
	if got := readFile(t, filepath.Join(filepath.Dir(path), want[3])); got != "3-23456789\n" {
		t.Fatalf("newest rotated file holds %q", got)
	}
}

func TestFileLineLargerThanMaxSize(t *testing.T) {
	root := t.TempDir()
	path := logPath(root)
	f, err := OpenFile(root, path, FileOptions{MaxSize: 8, MaxFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	big := strings.Repeat("b", 20) + "\n"
	for _, l := range []string{"small\n", big} {
		if _, err := f.Write([]byte(l)); err != nil {
			t.Fatal(err)
		}
	}
	if got := readFile(t, path); got != big {
		t.Fatalf("live file %q, want the big line whole", got)
	}
}

func TestFileReopenCountsExistingSize(t *testing.T) {
	root := t.TempDir()
	path := logPath(root)
	for range 2 {
		f, err := OpenFile(root, path, FileOptions{MaxSize: 15, MaxFiles: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("0123456789\n")); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if names := readDir(t, filepath.Dir(path)); len(names) != 2 {
		t.Fatalf("the second open appended past max size without rotating: %v", names)
	}
}

func TestRotatedNames(t *testing.T) {
	for n, want := range map[string]bool{
		"0.log.20261102-100405":      true,
		"0.log.20261102-100405-001":  true,
		"0.log.20261102-100405.gz":   false,
		"0.log.2026110-1004050":      false,
		"0.log":                      false,
		"1.log.20261102-100405":      false,
		"10.log.20261102-100405":     false,
		"0.log.20261102-100405-0001": false,
	} {
		if got := isRotated("0.log", n); got != want {
			t.Errorf("isRotated(0.log, %s) = %v, want %v", n, got, want)
		}
	}
}

// hostDir is a directory that stands for the host's files a container must not reach.
func hostDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "0.log"), []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSymlinksBelowRootAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, root, host string)
	}{
		{"pod dir is a symlink", func(t *testing.T, root, host string) {
			must(t, os.Symlink(host, filepath.Join(root, "default_web_uid-1")))
		}},
		{"container dir is a symlink", func(t *testing.T, root, host string) {
			must(t, os.MkdirAll(filepath.Join(root, "default_web_uid-1"), 0o755))
			must(t, os.Symlink(host, filepath.Join(root, "default_web_uid-1", "app")))
		}},
		{"log file is a symlink", func(t *testing.T, root, host string) {
			must(t, os.MkdirAll(filepath.Join(root, "default_web_uid-1", "app"), 0o755))
			must(t, os.Symlink(filepath.Join(host, "0.log"), logPath(root)))
		}},
		{"log file is a hard link", func(t *testing.T, root, host string) {
			must(t, os.MkdirAll(filepath.Join(root, "default_web_uid-1", "app"), 0o755))
			must(t, os.Link(filepath.Join(host, "0.log"), logPath(root)))
		}},
		{"log file is a fifo", func(t *testing.T, root, host string) {
			must(t, os.MkdirAll(filepath.Join(root, "default_web_uid-1", "app"), 0o755))
			must(t, syscall.Mkfifo(logPath(root), 0o644))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, host := t.TempDir(), hostDir(t)
			tc.plant(t, root, host)
			path := logPath(root)
			if f, err := OpenFile(root, path, FileOptions{}); !errors.Is(err, ErrUnsafePath) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("OpenFile: %v, want ErrUnsafePath", err)
			}
			if f, err := Open(path); !errors.Is(err, ErrUnsafePath) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("Open for reading: %v, want ErrUnsafePath", err)
			}
			if err := RemoveContainerLogs(path); err != nil && !errors.Is(err, ErrUnsafePath) {
				t.Fatalf("RemoveContainerLogs: %v", err)
			}
			if got := readDir(t, host); fmt.Sprint(got) != "[0.log]" {
				t.Errorf("host dir changed: %v", got)
			}
			if got := readFile(t, filepath.Join(host, "0.log")); got != "host secret\n" {
				t.Errorf("host file changed: %q", got)
			}
		})
	}
}

func TestMissingRootIsMade(t *testing.T) {
	root := filepath.Join(t.TempDir(), "var", "log", "pods")
	f, err := OpenFile(root, logPath(root), FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := os.Stat(logPath(root)); err != nil {
		t.Fatal(err)
	}
}

func TestSymlinkedRootIsFollowed(t *testing.T) {
	real := t.TempDir()
	root := filepath.Join(t.TempDir(), "pods")
	must(t, os.Symlink(real, root))
	f, err := OpenFile(root, logPath(root), FileOptions{})
	if err != nil {
		t.Fatalf("a symlinked pod log root is the operator's choice: %v", err)
	}
	f.Close()
	if _, err := os.Stat(logPath(real)); err != nil {
		t.Fatal(err)
	}
}

// TestDirSwappedAfterOpen: replacing the container dir by a symlink while the logger writes
// sends nothing to the symlink's target, rotation included.
func TestDirSwappedAfterOpen(t *testing.T) {
	root, host := t.TempDir(), hostDir(t)
	path := logPath(root)
	f, err := OpenFile(root, path, FileOptions{MaxSize: 10, MaxFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := filepath.Dir(path)
	must(t, os.Rename(dir, dir+".moved"))
	must(t, os.Symlink(host, dir))
	for range 3 {
		if _, err := f.Write([]byte("0123456789\n")); err != nil {
			t.Fatal(err)
		}
	}
	if got := readDir(t, host); fmt.Sprint(got) != "[0.log]" {
		t.Errorf("host dir changed: %v", got)
	}
	if got := readFile(t, filepath.Join(host, "0.log")); got != "host secret\n" {
		t.Errorf("host file changed: %q", got)
	}
	if got := readDir(t, dir+".moved"); len(got) != 2 {
		t.Errorf("the logger should have gone on in its own directory: %v", got)
	}
}

func TestRemoveContainerLogs(t *testing.T) {
	root := t.TempDir()
	path := logPath(root)
	dir := filepath.Dir(path)
	must(t, os.MkdirAll(dir, 0o755))
	for _, n := range []string{"0.log", "0.log.20261102-100405", "0.log.20261102-100406-001", "1.log", "1.log.20261102-100405", "0.log.keep"} {
		must(t, os.WriteFile(filepath.Join(dir, n), nil, 0o640))
	}
	if err := RemoveContainerLogs(path); err != nil {
		t.Fatal(err)
	}
	if got := readDir(t, dir); fmt.Sprint(got) != "[0.log.keep 1.log 1.log.20261102-100405]" {
		t.Fatalf("left %v", got)
	}
	if err := RemoveContainerLogs(filepath.Join(root, "default_gone_uid-2", "app", "0.log")); err != nil {
		t.Fatalf("nothing to remove: %v", err)
	}
}

func TestLocate(t *testing.T) {
	for _, tc := range []struct {
		root, path string
		ok         bool
	}{
		{"", "/var/log/pods/ns_n_u/c/0.log", true},
		{"", "/pods/ns_n_u/c/0.log", true},
		{"", "/ns_n_u/c/0.log", false},
		{"", "relative/ns_n_u/c/0.log", false},
		{"", "/var/log/pods/ns_n_u/../c/0.log", false},
		{"/var/log/pods", "/var/log/pods/ns_n_u/c/0.log", true},
		{"/var/log/pods", "/var/log/other/ns_n_u/c/0.log", false},
		{"/var/log/pods", "/var/log/pods", false},
	} {
		_, err := locate(tc.root, tc.path)
		if (err == nil) != tc.ok {
			t.Errorf("locate(%q, %q): %v, want ok=%v", tc.root, tc.path, err, tc.ok)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRotateAside rotates a log another process writes: the live file renamed to its rotated
// name, the oldest rotated files beyond maxFiles-1 removed, and undo putting it back.
func TestRotateAside(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "0.log")
	at := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	for i := range 3 {
		if err := os.WriteFile(live, []byte(fmt.Sprintf("file %d\n", i)), 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := RotateAside(live, 3, at.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	names := func() []string {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	// Two rotated files kept: with the live one the writer reopens, three.
	if got, want := names(), []string{"0.log.20261204-100001", "0.log.20261204-100002"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("files %v, want %v", got, want)
	}
	if err := os.WriteFile(live, []byte("file 3\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	undo, err := RotateAside(live, 3, at.Add(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(live); err != nil || string(b) != "file 3\n" {
		t.Errorf("after undo: %q, %v", b, err)
	}
	if _, err := RotateAside(filepath.Join(dir, "absent.log"), 3, at); err == nil {
		t.Error("rotating a missing file succeeded")
	}
}
