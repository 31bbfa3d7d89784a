package logs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnsafePath: a directory below the pod log root or a log file is a symlink, or a log file
// is not a plain file. holdfast never follows it (containerd GHSA-rgh6-rfwx-v388).
var ErrUnsafePath = errors.New("unsafe log path")

// maxNameBytes is the longest file name Linux file systems take (NAME_MAX).
const maxNameBytes = 255

// PodDirName is the name of a pod's log directory below the pod log root: the kubelet's
// NAMESPACE_NAME_UID, with the pod name cut short when the whole would be longer than a file
// name may be. The API allows 253-character names, and a namespace of up to 63 besides: the
// kubelet then fails the pod with "file name too long" (kubernetes/kubernetes#91410); holdfast
// runs it. Namespace and UID are kept whole, so log collectors that parse the name still
// find the pod, and the UID keeps it unique.
func PodDirName(namespace, name, uid string) string {
	if over := len(namespace) + len(name) + len(uid) + 2 - maxNameBytes; over > 0 {
		name = name[:max(len(name)-over, 0)]
	}
	return namespace + "_" + name + "_" + uid
}

// location is a log file split where symlinks stop being followed: root is resolved as usual,
// dirs and name are opened one at a time without following symlinks.
type location struct {
	root string
	dirs []string
	name string
}

func (l location) path() string {
	return filepath.Join(append(append([]string{l.root}, l.dirs...), l.name)...)
}

// locate splits path below root. An empty root means kubelet's layout: the root is three
// levels up from the file (ROOT/NAMESPACE_NAME_UID/CONTAINER/ATTEMPT.log).
func locate(root, path string) (location, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return location{}, fmt.Errorf("log path %q is not a clean absolute path", path)
	}
	if root == "" {
		dir := filepath.Dir(path)
		parts := []string{filepath.Base(filepath.Dir(dir)), filepath.Base(dir)}
		l := location{root: filepath.Dir(filepath.Dir(dir)), dirs: parts, name: filepath.Base(path)}
		if l.path() != path || strings.Count(path, "/") < 4 {
			return location{}, fmt.Errorf("log path %q is not ROOT/NAMESPACE_NAME_UID/CONTAINER/ATTEMPT.log", path)
		}
		return l, nil
	}
	if !filepath.IsAbs(root) {
		return location{}, fmt.Errorf("log root %q is not absolute", root)
	}
	rel, err := filepath.Rel(filepath.Clean(root), path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return location{}, fmt.Errorf("log path %q is not below the log root %q", path, root)
	}
	parts := strings.Split(rel, "/")
	return location{root: filepath.Clean(root), dirs: parts[:len(parts)-1], name: parts[len(parts)-1]}, nil
}

// openDir opens the directory that holds l's file, creating missing directories (0755), the
// root included, when create is set. Below the root every component is opened with O_NOFOLLOW: a symlink is
// refused with ErrUnsafePath.
func openDir(l location, create bool) (*os.File, error) {
	if create {
		// The root is the operator's: made as a path is usually made, symlinks and all.
		if err := os.MkdirAll(l.root, 0o755); err != nil {
			return nil, err
		}
	}
	fd, err := unix.Open(l.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: l.root, Err: err}
	}
	at := l.root
	for _, name := range l.dirs {
		at = filepath.Join(at, name)
		if create {
			if err := unix.Mkdirat(fd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return nil, &os.PathError{Op: "mkdir", Path: at, Err: err}
			}
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%w: %s is a symlink or not a directory; refusing to follow it", ErrUnsafePath, at)
		} else if err != nil {
			return nil, &os.PathError{Op: "open", Path: at, Err: err}
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), filepath.Join(append([]string{l.root}, l.dirs...)...)), nil
}

// openFileAt opens name in dir without following a symlink, and checks that it is a plain
// file with a single link (a hard link to a host file is refused like a symlink).
func openFileAt(dir *os.File, name string, flags int, perm uint32) (*os.File, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, perm)
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("%w: %s is a symlink; refusing to follow it", ErrUnsafePath, path)
	case errors.Is(err, unix.ENXIO): // a FIFO or socket nobody reads
		return nil, fmt.Errorf("%w: %s is not a plain file", ErrUnsafePath, path)
	case err != nil:
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Nlink) > 1 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s is not a plain file with a single link", ErrUnsafePath, path)
	}
	// O_NONBLOCK only kept the open from hanging on a FIFO planted there; plain files ignore
	// it, but the flag is cleared so the file is an ordinary blocking one.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Open opens a container log file for reading, following no symlink below the pod log root
// (three levels up from path, kubelet's layout). Readers of logs (a node API serving
// `kubectl logs`) must open them through it.
func Open(path string) (*os.File, error) {
	l, err := locate("", path)
	if err != nil {
		return nil, err
	}
	dir, err := openDir(l, false)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return openFileAt(dir, l.name, unix.O_RDONLY, 0)
}

// rotatedNames returns the rotated files of name in dir, oldest first.
func rotatedNames(dir *os.File, name string) ([]string, error) {
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir.Name(), Err: err}
	}
	d := os.NewFile(uintptr(fd), dir.Name())
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if isRotated(name, n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// isRotated reports whether n is a rotated file of name: name.YYYYMMDD-HHMMSS[-NNN].
func isRotated(name, n string) bool {
	suffix, ok := strings.CutPrefix(n, name+".")
	if !ok {
		return false
	}
	if len(suffix) != len(rotationFormat) && len(suffix) != len(rotationFormat)+4 {
		return false
	}
	for i, c := range []byte(suffix) {
		switch i {
		case 8, 15:
			if c != '-' {
				return false
			}
		default:
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	return true
}

// RemoveContainerLogs removes a container's log file and its rotated files, following no
// symlink below the pod log root. Nothing to remove is not an error.
func RemoveContainerLogs(path string) error {
	l, err := locate("", path)
	if err != nil {
		return err
	}
	dir, err := openDir(l, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer dir.Close()
	names, err := rotatedNames(dir, l.name)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range append(names, l.name) {
		if err := unix.Unlinkat(int(dir.Fd()), n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, &os.PathError{Op: "remove", Path: filepath.Join(dir.Name(), n), Err: err})
		}
	}
	return errors.Join(errs...)
}
