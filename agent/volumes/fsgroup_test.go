package volumes

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func groupAndMode(t *testing.T, p string) (int, os.FileMode) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Gid), fi.Mode()
}

// TestFSGroupContentVolume: a content volume written with fsGroup gets the group and kubelet's
// modes, including files of a later update, and an unchanged payload is not rewritten.
func TestFSGroupContentVolume(t *testing.T) {
	dir := t.TempDir()
	gid := int64(os.Getgid()) // a group this test may give files to without root
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(payload map[string]file) bool {
		t.Helper()
		for p, f := range payload {
			f.mode |= fsGroupRO
			payload[p] = f
		}
		_, changed, err := writeAtomic(dir, payload)
		if err != nil {
			t.Fatal(err)
		}
		if err := applyFSGroup(dir, gid, true); err != nil {
			t.Fatal(err)
		}
		return changed
	}
	write(map[string]file{"token": {data: []byte("t1"), mode: 0o600}, "ca/ca.crt": {data: []byte("c"), mode: 0o644}})
	check := func() {
		t.Helper()
		for p, want := range map[string]os.FileMode{"token": 0o640, "ca/ca.crt": 0o644, "ca": os.ModeDir | os.ModeSetgid | 0o755, ".": os.ModeDir | os.ModeSetgid | 0o755} {
			g, mode := groupAndMode(t, filepath.Join(dir, p))
			if g != int(gid) || mode != want {
				t.Errorf("%s: group %d mode %v, want %d and %v", p, g, mode, gid, want)
			}
		}
	}
	check()
	if write(map[string]file{"token": {data: []byte("t1"), mode: 0o600}, "ca/ca.crt": {data: []byte("c"), mode: 0o644}}) {
		t.Error("an unchanged payload was rewritten")
	}
	if !write(map[string]file{"token": {data: []byte("t2"), mode: 0o600}, "ca/ca.crt": {data: []byte("c"), mode: 0o644}}) {
		t.Fatal("a changed payload was not written")
	}
	check()
}

func TestFSGroupEmptyDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	gid := int64(os.Getgid())
	if !fsGroupChangeNeeded(dir, gid, false) {
		t.Fatal("a directory without setgid needs no change")
	}
	if err := applyFSGroup(dir, gid, false); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{".": os.ModeDir | os.ModeSetgid | 0o777, "sub/f": 0o660} {
		if _, mode := groupAndMode(t, filepath.Join(dir, p)); mode&^0o007 != want&^0o007 {
			t.Errorf("%s: mode %v, want %v", p, mode, want)
		}
	}
	if fsGroupChangeNeeded(dir, gid, false) {
		t.Error("a volume just given to the group needs a change")
	}
}
