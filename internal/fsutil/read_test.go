package fsutil

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ReadFileNoAtime returns the content and leaves the access time as it was, where a plain
// read would move it (the access time set before the modification time: relatime updates).
func TestReadFileNoAtime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "record.json")
	if err := os.WriteFile(path, []byte(`{"a":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, time.Now()); err != nil {
		t.Fatal(err)
	}
	atime := func() unix.Timespec {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return st.Atim
	}
	before := atime()
	b, err := ReadFileNoAtime(path)
	if err != nil || string(b) != `{"a":1}` {
		t.Fatalf("read %q, %v", b, err)
	}
	if after := atime(); after != before {
		t.Errorf("access time moved from %v to %v", before, after)
	}
	if _, err := ReadFileNoAtime(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}

// WalkDirNoAtime (and ReadDirNoAtime under it) visits what filepath.WalkDir visits, in the
// same order, with fs.SkipDir honoured, and leaves the directories' access times as they were,
// where filepath.WalkDir moves them.
func TestWalkDirNoAtime(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a/b", "a/c", "z"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a/b/f1", "a/c/f2", "top"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/", filepath.Join(root, "a/outside")); err != nil {
		t.Fatal(err)
	}
	dirs := []string{root, filepath.Join(root, "a"), filepath.Join(root, "a/b"), filepath.Join(root, "a/c"), filepath.Join(root, "z")}
	old := time.Now().Add(-48 * time.Hour)
	for _, d := range dirs {
		if err := os.Chtimes(d, old, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	atimes := func() []unix.Timespec {
		var out []unix.Timespec
		for _, d := range dirs {
			var st unix.Stat_t
			if err := unix.Stat(d, &st); err != nil {
				t.Fatal(err)
			}
			out = append(out, st.Atim)
		}
		return out
	}
	walk := func(w func(string, fs.WalkDirFunc) error, skip string) []string {
		var seen []string
		err := w(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			seen = append(seen, rel+" "+d.Type().String())
			if rel == skip {
				return fs.SkipDir
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return seen
	}

	before := atimes()
	got := walk(WalkDirNoAtime, "")
	gotSkip := walk(WalkDirNoAtime, "a")
	if after := atimes(); !slices.Equal(after, before) {
		t.Errorf("access times moved: %v -> %v", before, after)
	}
	entries, err := ReadDirNoAtime(filepath.Join(root, "a"))
	if err != nil || len(entries) != 3 || entries[0].Name() != "b" || entries[2].Name() != "outside" {
		t.Errorf("ReadDirNoAtime(a): %v, %v", entries, err)
	}
	if after := atimes(); !slices.Equal(after, before) {
		t.Errorf("access times moved by ReadDirNoAtime: %v -> %v", before, after)
	}

	want := walk(filepath.WalkDir, "")
	wantSkip := walk(filepath.WalkDir, "a")
	if !slices.Equal(got, want) || !slices.Equal(gotSkip, wantSkip) {
		t.Errorf("visited %q (skipping a: %q), filepath.WalkDir %q (%q)", got, gotSkip, want, wantSkip)
	}
	if slices.Equal(atimes(), before) {
		t.Logf("filepath.WalkDir did not move the access times either: this file system does not keep them")
	}
	if err := WalkDirNoAtime(filepath.Join(root, "missing"), func(_ string, _ fs.DirEntry, err error) error { return err }); !os.IsNotExist(err) {
		t.Errorf("missing root: %v", err)
	}
}
