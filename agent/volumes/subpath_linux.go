package volumes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// validateSubPath refuses subPaths that name something outside the volume by their spelling:
// absolute paths and "..". Symlinks are dealt with by bindSubPath.
func validateSubPath(sub string) error {
	if filepath.IsAbs(sub) {
		return fmt.Errorf("subPath %q must be a relative path", sub)
	}
	for _, item := range strings.Split(sub, "/") {
		if item == ".." {
			return fmt.Errorf("subPath %q must not contain '..'", sub)
		}
	}
	return nil
}

// bindSubPath bind-mounts volRoot/sub onto target, a path outside the volume that only the
// agent writes to, and returns nothing else: target is then the container mount's source.
//
// A container that can write to the volume could otherwise swap a component of sub for a
// symlink to / between our check and the runtime's mount, and be handed the host. So, as
// kubelet does: resolve sub (symlinks inside the volume are allowed), refuse a result outside
// the volume, create missing directories component by component without following symlinks,
// open the result the same way, and bind-mount the opened file descriptor (/proc/PID/fd/N), not
// the path. Whatever happens to the volume afterwards, target is what was checked.
func bindSubPath(volRoot, sub, target string) error {
	if err := validateSubPath(sub); err != nil {
		return err
	}
	root, err := filepath.EvalSymlinks(volRoot)
	if err != nil {
		return fmt.Errorf("resolve volume path: %w", err)
	}
	if err := safeMkdirAll(root, sub); err != nil {
		return err
	}
	resolved, err := filepath.EvalSymlinks(filepath.Join(root, sub))
	if err != nil {
		return fmt.Errorf("resolve subPath %q: %w", sub, err)
	}
	if !within(root, resolved) {
		return fmt.Errorf("subpath %q not within volume path %q", resolved, root)
	}
	rel, err := filepath.Rel(root, resolved)
	if err != nil {
		return err
	}
	fd, err := openBeneath(root, rel)
	if err != nil {
		return fmt.Errorf("open subPath %q: %w", sub, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat subPath %q: %w", sub, err)
	}

	if err := unmountUnder(target); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() != isDir {
		// A previous attempt bound a directory where a file is now wanted, or the reverse.
		if err := os.Remove(target); err != nil {
			return err
		}
	}
	if isDir {
		if err := os.MkdirAll(target, 0o750); err != nil {
			return err
		}
	} else {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o640)
		if err != nil {
			return err
		}
		f.Close()
	}
	src := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind subPath %q: %w", sub, err)
	}
	// Keep it out of any shared peer group, so it neither shows up elsewhere nor is taken
	// away from a container by an unmount here.
	if err := unix.Mount("", target, "", unix.MS_PRIVATE, ""); err != nil {
		unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("make subPath mount private: %w", err)
	}
	return nil
}

func within(root, p string) bool {
	return p == root || strings.HasPrefix(p, root+string(os.PathSeparator))
}

// openBeneath opens root/rel component by component with O_NOFOLLOW, so that no symlink (put
// there after rel was resolved) is followed. The result is an O_PATH descriptor.
func openBeneath(root, rel string) (int, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return fd, nil
	}
	parts := strings.Split(rel, string(os.PathSeparator))
	for i, part := range parts {
		flags := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i < len(parts)-1 {
			flags |= unix.O_DIRECTORY
		}
		next, err := unix.Openat(fd, part, flags, 0)
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("%s: %w", filepath.Join(parts[:i+1]...), err)
		}
		fd = next
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(fd)
		return -1, fmt.Errorf("%s became a symlink", rel)
	}
	return fd, nil
}

// safeMkdirAll creates the missing directories of root/sub, as kubelet does for a subPath that
// does not exist yet. Existing components may be symlinks that stay inside root (they are
// resolved and checked); new directories are made with mkdirat under a descriptor opened
// without following symlinks, with the mode of root (special bits included, past the umask:
// kubelet's SafeMakeDir), so a volume given to an fsGroup gives its new directories too.
func safeMkdirAll(root, sub string) error {
	full := filepath.Join(root, sub)
	if _, err := os.Stat(full); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	rootInfo, err := os.Stat(root)
	if err != nil {
		return err
	}
	mode := unixMode(rootInfo.Mode())
	// Find the deepest existing ancestor and check where it really is.
	existing := full
	var missing []string
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		missing = append([]string{filepath.Base(existing)}, missing...)
		existing = filepath.Dir(existing)
		if !within(root, existing) {
			return fmt.Errorf("subpath %q not within volume path %q", full, root)
		}
	}
	resolved, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", existing, err)
	}
	if !within(root, resolved) {
		return fmt.Errorf("subpath %q not within volume path %q", resolved, root)
	}
	rel, err := filepath.Rel(root, resolved)
	if err != nil {
		return err
	}
	fd, err := openBeneath(root, rel)
	if err != nil {
		return err
	}
	for _, name := range missing {
		if err := unix.Mkdirat(fd, name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return fmt.Errorf("create subPath directory %s: %w", name, err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("open new subPath directory %s: %w", name, err)
		}
		fd = next
		if err := unix.Fchmod(fd, mode); err != nil {
			unix.Close(fd)
			return fmt.Errorf("set the mode of new subPath directory %s: %w", name, err)
		}
	}
	unix.Close(fd)
	return nil
}

// unixMode is m's permission and special bits as chmod(2) takes them.
func unixMode(m fs.FileMode) uint32 {
	mode := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		mode |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		mode |= unix.S_ISVTX
	}
	return mode
}
