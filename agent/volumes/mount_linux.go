package volumes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// ensureTmpfs mounts a tmpfs of sizeBytes (0: the kernel's default, half the RAM) on dir unless
// one is already there (an agent restart finds its mounts in place). Whatever else is mounted
// there is an error: secrets must never land on a disk because a mount went missing.
func ensureTmpfs(dir string, sizeBytes int64, mode os.FileMode) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	state := probeTmpfs(real)
	if state == tmpfsMountRoot {
		return nil
	}
	mounts, err := readMountTable(exactly(real))
	if err != nil {
		return fmt.Errorf("read mount table: %w", err)
	}
	if len(mounts) > 0 {
		if fsType := mounts[len(mounts)-1].FSType; fsType != "tmpfs" {
			return fmt.Errorf("%s is a %s mount, not the tmpfs holdfast mounts there", dir, fsType)
		}
		if state == notTmpfs {
			// The table lists a tmpfs at dir that a mount over a directory above it
			// hides: what is written at dir now lands on whatever that mount is.
			return fmt.Errorf("the tmpfs mounted on %s is hidden by a mount above it: the directory is not on a tmpfs now", dir)
		}
		return nil
	}
	opts := "mode=" + strconv.FormatUint(uint64(unixMode(mode)), 8)
	if sizeBytes > 0 {
		opts += ",size=" + strconv.FormatInt(sizeBytes, 10)
	}
	if err := unix.Mount("tmpfs", real, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return nil
}

// isTmpfs reports whether a tmpfs is mounted exactly on dir, and is what dir shows.
func isTmpfs(dir string) bool {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	switch probeTmpfs(real) {
	case tmpfsMountRoot:
		return true
	case notTmpfs:
		return false
	}
	mounts, err := readMountTable(exactly(real))
	return err == nil && len(mounts) > 0 && mounts[len(mounts)-1].FSType == "tmpfs"
}

// readMountTable is mountinfo.GetMounts; tests count its calls.
var readMountTable = mountinfo.GetMounts

// tmpfsState is what probeTmpfs finds at a directory.
type tmpfsState int

const (
	// notTmpfs: the filesystem dir shows is not a tmpfs (whatever the mount table lists).
	notTmpfs tmpfsState = iota
	// tmpfsMountRoot: dir is the root of a tmpfs mount, the top one there.
	tmpfsMountRoot
	// inTmpfs: dir shows a tmpfs but has its parent's device: a directory inside a tmpfs, or
	// a bind mount of one. Only the mount table tells.
	inTmpfs
)

// probeTmpfs tells from a statfs(2) and two stat(2)s what dir (symlinks resolved) shows:
// statfs names the filesystem on top at dir, and a mount's root has a device number of its
// own, unlike its parent directory (every tmpfs gets its own). devtmpfs reports a tmpfs's
// magic: its device is told apart. Every pod sync checks its secret, token and downward API
// volumes, and the mount table grows with the pods: reading it each time was a third of the
// agent's CPU in the steady state with 30 pods (the profile of 2026-12-07, issue 31).
func probeTmpfs(dir string) tmpfsState {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return notTmpfs
	}
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil {
		return notTmpfs
	}
	if dev, ok := devtmpfsDevice(); ok && st.Dev == dev {
		return notTmpfs
	}
	if st.Dev != parent.Dev {
		return tmpfsMountRoot
	}
	return inTmpfs
}

// devtmpfsDevice is the device number of the kernel's devtmpfs (one instance, however often
// it is mounted), read from the mount table once; false if none was mounted then.
var devtmpfsDevice = sync.OnceValues(func() (uint64, bool) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("devtmpfs"))
	if err != nil || len(mounts) == 0 {
		return 0, false
	}
	return unix.Mkdev(uint32(mounts[0].Major), uint32(mounts[0].Minor)), true
})

// unmountUnder unmounts every mount at or below dir, deepest first, repeating until none is
// left (mounts may be stacked). A busy mount is detached lazily: its users are containers that
// are already gone or about to be.
func unmountUnder(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for range 16 {
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(real))
		if err != nil {
			return fmt.Errorf("read mount table: %w", err)
		}
		if len(mounts) == 0 {
			return nil
		}
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
		for _, m := range mounts {
			err := unix.Unmount(m.Mountpoint, 0)
			if errors.Is(err, unix.EBUSY) {
				err = unix.Unmount(m.Mountpoint, unix.MNT_DETACH)
			}
			if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", m.Mountpoint, err)
			}
		}
	}
	return fmt.Errorf("mounts under %s keep coming back", dir)
}

// removeAllOneFS removes path and everything below it, never through a mount: if something is
// still mounted below (a hostPath bind-mounted for a subPath, say), removing through it would
// delete the host's files, so that is an error instead. The mount table is checked first (a
// bind mount from the same file system has the same device number); the device check while
// walking is a second line of defence.
func removeAllOneFS(path string) error {
	var root unix.Stat_t
	if err := unix.Lstat(path, &root); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", path, err)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(real))
	if err != nil {
		return fmt.Errorf("read mount table: %w", err)
	}
	if len(mounts) > 0 {
		return fmt.Errorf("refusing to remove %s: %s is still mounted", path, mounts[0].Mountpoint)
	}
	return removeOneFS(path, root.Dev)
}

func removeOneFS(path string, dev uint64) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if st.Dev != dev {
		return fmt.Errorf("refusing to remove %s: another file system is mounted there", path)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		entries, err := os.ReadDir(path)
		if err != nil {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		for _, e := range entries {
			if err := removeOneFS(filepath.Join(path, e.Name()), dev); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// exactly selects every mount on mountpoint (several when stacked; the last one is on top).
func exactly(mountpoint string) mountinfo.FilterFunc {
	return func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != mountpoint, false }
}

func sameDevice(a, b fs.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && sa.Dev == sb.Dev
}

// allocatedBytes is the space a file occupies on its file system (its blocks, not its length).
func allocatedBytes(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}
