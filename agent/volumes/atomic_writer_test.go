package volumes

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func readVisible(t *testing.T, dir, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, p))
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(b)
}

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	payload := map[string]file{
		"greeting":          {data: []byte("hello"), mode: 0o644},
		"secret":            {data: []byte("s3cret"), mode: 0o400},
		"nested/deep/value": {data: []byte("42"), mode: 0o644},
	}
	_, changed, err := writeAtomic(dir, payload)
	if err != nil || !changed {
		t.Fatalf("first write: changed %v, err %v", changed, err)
	}
	for p, f := range payload {
		if got := readVisible(t, dir, p); got != string(f.data) {
			t.Errorf("%s = %q, want %q", p, got, f.data)
		}
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil || fi.Mode().Perm() != f.mode {
			t.Errorf("%s mode %v (err %v), want %v", p, fi.Mode().Perm(), err, f.mode)
		}
	}
	for _, top := range []string{"greeting", "secret", "nested"} {
		target, err := os.Readlink(filepath.Join(dir, top))
		if err != nil || target != filepath.Join(dataDirName, top) {
			t.Errorf("visible %s -> %q (err %v), want a link into ..data", top, target, err)
		}
	}
	first, err := os.Readlink(filepath.Join(dir, dataDirName))
	if err != nil || !strings.HasPrefix(first, "..") {
		t.Fatalf("..data -> %q, %v", first, err)
	}

	// The same payload again: nothing written, ..data unchanged.
	_, changed, err = writeAtomic(dir, payload)
	if err != nil || changed {
		t.Fatalf("identical write: changed %v, err %v", changed, err)
	}
	if again, _ := os.Readlink(filepath.Join(dir, dataDirName)); again != first {
		t.Errorf("identical write moved ..data from %s to %s", first, again)
	}

	// Change one value, drop the nested tree, add a key: one swap, old directory gone.
	payload2 := map[string]file{
		"greeting": {data: []byte("bonjour"), mode: 0o644},
		"secret":   {data: []byte("s3cret"), mode: 0o400},
		"new":      {data: []byte("n"), mode: 0o600},
	}
	_, changed, err = writeAtomic(dir, payload2)
	if err != nil || !changed {
		t.Fatalf("update: changed %v, err %v", changed, err)
	}
	if got := readVisible(t, dir, "greeting"); got != "bonjour" {
		t.Errorf("greeting = %q after update", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nested")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("nested still visible after its removal from the payload (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, first)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("old data directory %s left behind (%v)", first, err)
	}

	// A mode change alone is a change.
	payload2["new"] = file{data: []byte("n"), mode: 0o644}
	if _, changed, err := writeAtomic(dir, payload2); err != nil || !changed {
		t.Fatalf("mode change: changed %v, err %v", changed, err)
	}

	// Leftovers of a crash mid-write are cleaned on the next write.
	if err := os.Mkdir(filepath.Join(dir, "..2001_01_01_00_00_00.123"), 0o755); err != nil {
		t.Fatal(err)
	}
	payload2["greeting"] = file{data: []byte("hej"), mode: 0o644}
	if _, _, err := writeAtomic(dir, payload2); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var hidden []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") {
			hidden = append(hidden, e.Name())
		}
	}
	if len(hidden) != 2 { // ..data and its one directory
		t.Errorf("hidden entries %v, want ..data and one data directory", hidden)
	}

	// An empty payload (optional object missing) is a valid, empty volume.
	if _, _, err := writeAtomic(dir, map[string]file{}); err != nil {
		t.Fatal(err)
	}
	entries, _ = os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			t.Errorf("visible %s left in an emptied volume", e.Name())
		}
	}
}

func TestWriteAtomicRefusesBadPaths(t *testing.T) {
	for _, p := range []string{"", "/etc/passwd", "../escape", "a/../../b", "..data", "..hidden", strings.Repeat("x", 256)} {
		if _, _, err := writeAtomic(t.TempDir(), map[string]file{p: {data: []byte("x"), mode: 0o644}}); err == nil {
			t.Errorf("path %q accepted", p)
		}
	}
	if _, _, err := writeAtomic(t.TempDir(), map[string]file{"a/..b/c": {data: []byte("x"), mode: 0o644}}); err != nil {
		t.Errorf("path a/..b/c refused: %v", err)
	}
}

// TestWriteAtomicReadersSeeOneVersion: a reader that resolves ..data once and reads two files
// through it never sees one file from a version and the other from another, while versions
// are swapped under it as fast as the writer can.
func TestWriteAtomicReadersSeeOneVersion(t *testing.T) {
	dir := t.TempDir()
	write := func(v int) {
		s := []byte(fmt.Sprint(v))
		if _, _, err := writeAtomic(dir, map[string]file{"a": {data: s, mode: 0o644}, "b": {data: s, mode: 0o644}}); err != nil {
			t.Error(err)
		}
	}
	write(0)
	var stop atomic.Bool
	var reads, mixes atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				ts, err := os.Readlink(filepath.Join(dir, dataDirName))
				if err != nil {
					continue
				}
				a, errA := os.ReadFile(filepath.Join(dir, ts, "a"))
				b, errB := os.ReadFile(filepath.Join(dir, ts, "b"))
				if errA != nil || errB != nil {
					continue // that version was already removed: read again
				}
				reads.Add(1)
				if !bytes.Equal(a, b) {
					mixes.Add(1)
				}
			}
		}()
	}
	for v := 1; v <= 60; v++ {
		write(v)
	}
	stop.Store(true)
	wg.Wait()
	if mixes.Load() > 0 {
		t.Errorf("%d of %d reads saw two versions at once", mixes.Load(), reads.Load())
	}
	if got := readVisible(t, dir, "a"); got != "60" {
		t.Errorf("a = %q after the last write", got)
	}
}
