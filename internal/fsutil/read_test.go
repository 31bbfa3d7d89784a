package fsutil

import (
	"os"
	"path/filepath"
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
