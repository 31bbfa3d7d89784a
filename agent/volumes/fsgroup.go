package volumes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// The bits kubelet's SetVolumeOwnership adds for fsGroup (pkg/volume/volume_linux.go): group
// read and write (read only for read-only volumes), and search plus setgid on directories, so
// that what a container creates there belongs to the group too.
const (
	fsGroupRW   = os.FileMode(0o660)
	fsGroupRO   = os.FileMode(0o440)
	fsGroupExec = os.FileMode(0o110)
)

// fsGroupOf is the pod's fsGroup, nil when it sets none.
func fsGroupOf(pod *v1.Pod) *int64 {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	return pod.Spec.SecurityContext.FSGroup
}

// applyFSGroup gives the volume at dir to group gid as kubelet does for emptyDir, configMap,
// secret, downwardAPI and projected volumes: every file and directory gets the group (symlinks
// too, without touching their targets) and the group bits above.
//
// Each directory is done after what it holds and the root last, so a root (and, for a content
// volume, the directory its ..data names, new at every update) that is already right means the
// walk completed: it is skipped then. holdfast creates these volumes itself, empty or with
// content it wrote, so the result is the one fsGroupChangePolicy Always and OnRootMismatch both
// give.
//
// A root container owns what its emptyDir holds and can swap any entry for a symlink to a host
// file while this runs: no path inside the volume is ever resolved. Each entry is opened once,
// relative to its directory's descriptor, without following a symlink (O_PATH|O_NOFOLLOW), and
// everything after is done to that descriptor: what was a file when it was opened is the file
// changed, whatever the name means by then.
func applyFSGroup(dir string, gid int64, readOnly bool) error {
	data := filepath.Join(dir, dataDirName)
	_, err := os.Lstat(data)
	hasData := err == nil
	if !fsGroupChangeNeeded(dir, gid, readOnly) && (!hasData || !fsGroupChangeNeeded(data, gid, readOnly)) {
		return nil
	}
	mask := uint32(fsGroupRW)
	if readOnly {
		mask = uint32(fsGroupRO)
	}
	root, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("apply fsGroup %d to %s: %w", gid, dir, err)
	}
	defer unix.Close(root)
	if err := setGroupTree(root, ".", int(gid), mask, 0); err != nil {
		return fmt.Errorf("apply fsGroup %d to %s: %w", gid, dir, err)
	}
	return nil
}

// applyFSGroupOnce gives an emptyDir to gid when it is made, and again only when the pod's
// fsGroup or the volume's root directory (a tmpfs mounted anew after a reboot) is not the one
// recorded beside the volume (not in it: its containers write there). A container could
// otherwise have the agent walk the volume at every sync (a chmod of its root, which the root
// check takes for a volume not done), over as many files as it cares to make. made says the
// caller has just made the volume (a directory, a tmpfs mounted): it is walked whatever the
// record says.
func applyFSGroupOnce(dir string, gid int64, made bool) error {
	// The root by inode and birth time: a directory made anew may get the inode number of the
	// one removed, never its birth time (where the file system keeps none, a zero; the caller's
	// made covers a volume it just made). Not the device: its number may change across boots.
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_BTIME, &st); err != nil {
		return fmt.Errorf("apply fsGroup %d to %s: %w", gid, dir, err)
	}
	marker := filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".fsgroup")
	want := fmt.Sprintf("gid %d root %d born %d.%09d\n", gid, st.Ino, st.Btime.Sec, st.Btime.Nsec)
	if b, err := fsutil.ReadFileNoAtime(marker); err == nil && string(b) == want && !made {
		return nil
	}
	if err := applyFSGroup(dir, gid, false); err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(marker, []byte(want), 0o600); err != nil {
		return fmt.Errorf("record fsGroup %d of %s: %w", gid, dir, err)
	}
	return nil
}

// maxFSGroupDepth bounds the directories the walk descends through (one descriptor each):
// deeper than any volume holdfast writes, and than a container would make but to exhaust the
// agent's descriptors. What is deeper is left as it is (the directory itself is done).
const maxFSGroupDepth = 256

// setGroupTree gives the file fd refers to (an O_PATH descriptor opened without following a
// symlink; rel names it in errors) and, for a directory, everything under it, first, to gid
// with the group bits of mask.
func setGroupTree(fd int, rel string, gid int, mask uint32, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		// The link itself; a chmod would reach its target.
		if err := unix.Fchownat(fd, "", -1, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	case unix.S_IFDIR:
		// Past maxFSGroupDepth (only a container makes a volume that deep) what a directory
		// holds keeps the group its setgid parents gave it, and the pod's sync goes on.
		if depth < maxFSGroupDepth {
			if err := setGroupEntries(fd, rel, gid, mask, depth); err != nil {
				return err
			}
		}
		mask |= unix.S_ISGID | uint32(fsGroupExec)
	}
	if err := unix.Fchownat(fd, "", -1, gid, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	// chmod has no form for an O_PATH descriptor but its /proc/self/fd link, which names the
	// opened file itself.
	if err := unix.Chmod(procFD(fd), st.Mode&(0o777|unix.S_ISGID|unix.S_ISVTX)|mask); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// setGroupEntries does setGroupTree for each entry of the directory dirfd refers to.
func setGroupEntries(dirfd int, rel string, gid int, mask uint32, depth int) error {
	// The directory's own entries, through the descriptor: /proc/self/fd/N is the directory
	// that was opened, not a path resolved again.
	entries, err := fsutil.ReadDirNoAtime(procFD(dirfd))
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	for _, e := range entries {
		child, err := unix.Openat(dirfd, e.Name(), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue // removed since the listing: nothing to give
		}
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(rel, e.Name()), err)
		}
		err = setGroupTree(child, filepath.Join(rel, e.Name()), gid, mask, depth+1)
		unix.Close(child)
		if err != nil {
			return err
		}
	}
	return nil
}

func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// fsGroupChangeNeeded is kubelet's root check: the group, the group bits and setgid.
func fsGroupChangeNeeded(dir string, gid int64, readOnly bool) bool {
	fi, err := os.Stat(dir)
	if err != nil {
		return true
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int64(st.Gid) != gid || !fi.IsDir() {
		return true
	}
	want := fsGroupRW | fsGroupExec
	if readOnly {
		want = fsGroupRO | fsGroupExec
	}
	return fi.Mode().Perm()&want != want || fi.Mode()&os.ModeSetgid == 0
}
