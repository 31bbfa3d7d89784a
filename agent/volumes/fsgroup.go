package volumes

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

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
// too, without touching their targets' modes) and the group bits above.
//
// Each directory is done after what it holds and the root last, so a root (and, for a content
// volume, the directory its ..data names, new at every update) that is already right means the
// walk completed: it is skipped then. holdfast creates these volumes itself, empty or with
// content it wrote, so the result is the one fsGroupChangePolicy Always and OnRootMismatch both
// give, without walking a large emptyDir again at every sync.
func applyFSGroup(dir string, gid int64, readOnly bool) error {
	data := filepath.Join(dir, dataDirName)
	_, err := os.Lstat(data)
	hasData := err == nil
	if !fsGroupChangeNeeded(dir, gid, readOnly) && (!hasData || !fsGroupChangeNeeded(data, gid, readOnly)) {
		return nil
	}
	mask := fsGroupRW
	if readOnly {
		mask = fsGroupRO
	}
	var paths []string
	var entries []fs.DirEntry
	err = fsutil.WalkDirNoAtime(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths, entries = append(paths, p), append(entries, d)
		return nil
	})
	if err != nil {
		return fmt.Errorf("apply fsGroup %d to %s: %w", gid, dir, err)
	}
	// Reversed pre-order: whatever a directory holds comes before it, the root last.
	for i := len(paths) - 1; i >= 0; i-- {
		if err := setGroup(paths[i], entries[i], gid, mask); err != nil {
			return fmt.Errorf("apply fsGroup %d to %s: %w", gid, paths[i], err)
		}
	}
	return nil
}

func setGroup(p string, d fs.DirEntry, gid int64, mask os.FileMode) error {
	if err := os.Lchown(p, -1, int(gid)); err != nil {
		return err
	}
	if d.Type()&fs.ModeSymlink != 0 {
		return nil // a chmod would reach the target
	}
	info, err := d.Info()
	if err != nil {
		return err
	}
	if info.IsDir() {
		mask |= os.ModeSetgid | fsGroupExec
	}
	return os.Chmod(p, info.Mode()&(fs.ModePerm|os.ModeSetgid|os.ModeSticky)|mask)
}

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
