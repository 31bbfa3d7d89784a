package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// CreateNetNS makes a new network namespace with its loopback interface up (what CNI's
// loopback plugin does) and bind-mounts it at path. If path already holds
// a mounted namespace it is kept. The unshare happens on a locked OS thread that is thrown
// away afterwards (never unlocked), so no goroutine ever runs in the new namespace by mistake.
func CreateNetNS(path string) error {
	if isNetNS(path) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create netns file %s: %w", path, err)
	}
	if f != nil {
		f.Close()
	}
	var wg sync.WaitGroup
	var mountErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Not unlocking on purpose: the thread ends with the goroutine, taking the new
		// namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			mountErr = fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		if err := loopbackUp(); err != nil {
			mountErr = err
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			mountErr = fmt.Errorf("bind-mount netns to %s: %w", path, err)
		}
	}()
	wg.Wait()
	if mountErr != nil {
		os.Remove(path)
		return mountErr
	}
	return nil
}

// RemoveNetNS unmounts and deletes the namespace file; a missing one is not an error.
func RemoveNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// isNetNS reports whether path is a mounted network namespace.
func isNetNS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// loopbackUp sets lo up in the calling thread's network namespace; the kernel then gives it
// 127.0.0.1 and ::1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up lo: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: read flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}
