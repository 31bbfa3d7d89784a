package volumes

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/holdfast-dev/holdfast/test/prereq"
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

// TestFSGroupDoesNotFollowSwappedLinks: a root container owns its emptyDir's entries and can
// swap any of them for a symlink to a host file while the agent gives the volume to the pod's
// fsGroup; it can also make the agent walk again at every sync (a chmod of the volume's root
// did, on 2df39b2). The walk must never change a file outside the volume: here a "host" file
// of mode 0600 that every entry is, in turn and over and over, swapped for a symlink to. On
// 2df39b2 its mode became 0660 within a few walks (a path-based chmod followed the link).
func TestFSGroupDoesNotFollowSwappedLinks(t *testing.T) {
	prereq.Root(t, "chown to the pod's fsGroup")
	base := t.TempDir()
	host := filepath.Join(base, "shadow")
	if err := os.WriteFile(host, []byte("root:secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "volume")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o777); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range 64 {
		name := filepath.Join(dir, "sub", fmt.Sprintf("f%d", i))
		if i%2 == 0 {
			name = filepath.Join(dir, fmt.Sprintf("f%d", i))
		}
		if err := os.WriteFile(name, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	// The container: each entry in turn becomes a symlink to the host file and back, by
	// renames, as fast as it can.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := names[i%len(names)]
			link := name + ".link"
			_ = os.Symlink(host, link)
			_ = os.Rename(name, name+".saved")
			_ = os.Rename(link, name)
			_ = os.Rename(name+".saved", name)
		}
	})
	const gid = 4242
	for range 300 {
		// The container's chmod of its volume's root, to have the walk done again.
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		_ = applyFSGroup(dir, gid, false) // an entry vanishing under the walk may fail it
	}
	close(stop)
	wg.Wait()
	fi, err := os.Stat(host)
	if err != nil {
		t.Fatal(err)
	}
	if g := fi.Sys().(*syscall.Stat_t).Gid; fi.Mode().Perm() != 0o600 || g != 0 {
		t.Fatalf("the host file is now mode %v, group %d: the walk followed a swapped symlink", fi.Mode().Perm(), g)
	}
	// And it did its work where nothing raced it.
	if g, mode := groupAndMode(t, filepath.Join(dir, "sub")); g != gid || mode&os.ModeSetgid == 0 {
		t.Errorf("sub: group %d, mode %v; want %d and setgid", g, mode, gid)
	}
}

// TestFSGroupEmptyDirOnce: an emptyDir is given to the fsGroup when it is made and not walked
// again at later syncs, whatever its containers do to it (a chmod of its root made the agent
// walk it at every sync on 2df39b2); a root made anew (a tmpfs after a reboot) or another
// fsGroup is walked again.
func TestFSGroupEmptyDirOnce(t *testing.T) {
	prereq.Root(t, "chown to the pod's fsGroup")
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	const gid = 4242
	if err := applyFSGroupOnce(dir, gid, false); err != nil {
		t.Fatal(err)
	}
	if g, mode := groupAndMode(t, dir); g != gid || mode&os.ModeSetgid == 0 {
		t.Fatalf("the new volume: group %d, mode %v", g, mode)
	}
	// The container: a file of its own group, the root's setgid taken away.
	own := filepath.Join(dir, "own")
	if err := os.WriteFile(own, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, -1, 7); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := applyFSGroupOnce(dir, gid, false); err != nil {
		t.Fatal(err)
	}
	if g, _ := groupAndMode(t, own); g != 7 {
		t.Errorf("a later sync walked the volume again: the container's file has group %d", g)
	}
	// Another fsGroup: walked.
	if err := applyFSGroupOnce(dir, gid+1, false); err != nil {
		t.Fatal(err)
	}
	if g, _ := groupAndMode(t, own); g != gid+1 {
		t.Errorf("another fsGroup: the file has group %d, want %d", g, gid+1)
	}
	// The root made anew, as a tmpfs is after a reboot: walked.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := applyFSGroupOnce(dir, gid+1, false); err != nil {
		t.Fatal(err)
	}
	if g, mode := groupAndMode(t, dir); g != gid+1 || mode&os.ModeSetgid == 0 {
		t.Errorf("the volume made anew: group %d, mode %v", g, mode)
	}
}

// TestFSGroupDeepTree: a container that nests directories deeper than the walk goes does not
// fail its pod's syncs (the review of 2df39b2's walk found it did): the walk stops descending,
// and what it reached is done.
func TestFSGroupDeepTree(t *testing.T) {
	prereq.Root(t, "chown to the pod's fsGroup")
	dir := filepath.Join(t.TempDir(), "data")
	deep := dir
	for range maxFSGroupDepth + 44 {
		deep = filepath.Join(deep, "d")
	}
	if err := os.MkdirAll(deep, 0o777); err != nil {
		t.Fatal(err)
	}
	const gid = 4242
	if err := applyFSGroup(dir, gid, false); err != nil {
		t.Fatalf("a tree %d directories deep: %v", maxFSGroupDepth+44, err)
	}
	if g, mode := groupAndMode(t, filepath.Join(dir, "d", "d")); g != gid || mode&os.ModeSetgid == 0 {
		t.Errorf("a directory within reach: group %d, mode %v", g, mode)
	}
}
