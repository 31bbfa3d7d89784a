package volumes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// countMountTableReads counts the reads of the mount table until the test ends.
func countMountTableReads(t *testing.T) *int {
	t.Helper()
	n := new(int)
	orig := readMountTable
	readMountTable = func(f mountinfo.FilterFunc) ([]*mountinfo.Info, error) {
		*n++
		return orig(f)
	}
	t.Cleanup(func() { readMountTable = orig })
	return n
}

func mustMount(t *testing.T, source, target, fstype string, flags uintptr) {
	t.Helper()
	if err := unix.Mount(source, target, fstype, flags, ""); err != nil {
		t.Fatalf("mount %s on %s: %v", fstype, target, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
}

// Every pod sync checks that its secret, token and downward API volumes are still tmpfs
// mounts. With 30 pods that check read and parsed the whole mount table (which grows with the
// pods) each time: a third of the agent's steady-state CPU. Once a volume's tmpfs is there,
// the check must not read the mount table; and its answers stay those of the mount table.
func TestTmpfsCheckReadsNoMountTableOnceMounted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mounts need root: run the unit tests as root (make test does)")
	}
	base := t.TempDir()
	vol := filepath.Join(base, "secret")
	if err := ensureTmpfs(vol, 1<<20, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(vol, unix.MNT_DETACH) })
	reads := countMountTableReads(t)
	for range 10 {
		if err := ensureTmpfs(vol, 1<<20, 0o755); err != nil {
			t.Fatal(err)
		}
		if !isTmpfs(vol) {
			t.Fatal("isTmpfs: false on the tmpfs ensureTmpfs mounted")
		}
	}
	if *reads != 0 {
		t.Errorf("the mount table was read %d times for 20 checks of a mounted tmpfs", *reads)
	}
	if m, err := mountinfo.GetMounts(exactly(vol)); err != nil || len(m) != 1 {
		t.Errorf("mounts on %s: %d, %v; want the one tmpfs (a check mounted another)", vol, len(m), err)
	}

	// A directory inside a tmpfs is not a tmpfs's root: it gets a tmpfs of its own.
	outer := filepath.Join(base, "outer")
	if err := os.Mkdir(outer, 0o755); err != nil {
		t.Fatal(err)
	}
	mustMount(t, "tmpfs", outer, "tmpfs", 0)
	inner := filepath.Join(outer, "vol")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	if isTmpfs(inner) {
		t.Error("a directory inside a tmpfs counted as a tmpfs mount")
	}
	if err := ensureTmpfs(inner, 1<<20, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(inner, unix.MNT_DETACH) })
	if m, err := mountinfo.GetMounts(exactly(inner)); err != nil || len(m) != 1 || m[0].FSType != "tmpfs" {
		t.Errorf("mounts on %s after ensureTmpfs: %v, %v", inner, m, err)
	}

	// A bind mount of a disk's directory over a volume keeps the disk's device: still an
	// error, as the mount table says, never a tmpfs mounted over it or a yes.
	plain := filepath.Join(base, "plain")
	bound := filepath.Join(base, "bound")
	for _, d := range []string{plain, bound} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustMount(t, plain, bound, "", unix.MS_BIND)
	if isTmpfs(bound) {
		t.Error("a bind mount of a disk's directory counted as a tmpfs")
	}
	if err := ensureTmpfs(bound, 1<<20, 0o755); err == nil || !strings.Contains(err.Error(), "not the tmpfs") {
		t.Errorf("ensureTmpfs over a bind mount: %v, want the mount named as not a tmpfs", err)
	}
}

// A tmpfs holdfast mounted on a volume, then a disk's directory mounted over the volume's
// parent: the mount table still lists the tmpfs at the volume's path, but what the path shows
// is the disk, and a secret written there would land on it. Neither check may take the
// table's word for it.
func TestTmpfsHiddenByAMountAboveIsNoTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mounts need root: run the unit tests as root (make test does)")
	}
	base := t.TempDir()
	parent := filepath.Join(base, "volumes")
	vol := filepath.Join(parent, "secret")
	if err := ensureTmpfs(vol, 1<<20, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(vol, unix.MNT_DETACH) })
	disk := filepath.Join(base, "disk")
	if err := os.MkdirAll(filepath.Join(disk, "secret"), 0o755); err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(disk, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		t.Fatalf("the test's disk directory %s is on a tmpfs (%v): it must be on a disk", disk, err)
	}
	mustMount(t, disk, parent, "", unix.MS_BIND)
	if m, err := mountinfo.GetMounts(exactly(vol)); err != nil || len(m) == 0 || m[len(m)-1].FSType != "tmpfs" {
		t.Fatalf("the mount table at %s: %v, %v; the test needs it to list the hidden tmpfs", vol, m, err)
	}
	if isTmpfs(vol) {
		t.Error("isTmpfs: true on a path that shows a disk")
	}
	if err := ensureTmpfs(vol, 1<<20, 0o755); err == nil || !strings.Contains(err.Error(), "hidden") {
		t.Errorf("ensureTmpfs on a hidden tmpfs: %v, want an error saying it is hidden", err)
	}
}

// devtmpfs reports a tmpfs's magic number to statfs: mounted on a volume it is still not the
// tmpfs holdfast mounts there.
func TestDevtmpfsOnAVolumeIsNoTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mounts need root: run the unit tests as root (make test does)")
	}
	vol := filepath.Join(t.TempDir(), "secret")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	mustMount(t, "none", vol, "devtmpfs", 0)
	if isTmpfs(vol) {
		t.Error("isTmpfs: true on devtmpfs")
	}
	if err := ensureTmpfs(vol, 1<<20, 0o755); err == nil || !strings.Contains(err.Error(), "devtmpfs") {
		t.Errorf("ensureTmpfs on devtmpfs: %v, want an error naming it", err)
	}
}
