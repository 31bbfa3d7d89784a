package wasm

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// openat2Missing is set once openat2 turns out to be unavailable (a kernel
// before 5.6, or a seccomp profile that refuses it).
var openat2Missing atomic.Bool

// openConfined opens rel inside hostDir/confine as if that directory were
// the root: with openat2's RESOLVE_IN_ROOT, ".." stops at it and an absolute
// symlink planted by the workload ("/etc/shadow") is read relative to it, as
// the container itself would see it, never on the host. Magic links
// (/proc/self/root and the like) are refused. The confining directory is
// itself resolved in the mount's root, so a symlinked /var/run works.
//
// forStat opens with O_PATH (any file type, no read); otherwise the file is
// opened read-only and non-blocking, so a FIFO planted in place of a file
// cannot hang the agent.
func openConfined(hostDir, confine, rel string, forStat bool) (*os.File, error) {
	if openat2Missing.Load() {
		return openConfinedRoot(hostDir, confine, rel, fallbackFlags())
	}
	mountFD, err := unix.Open(hostDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: hostDir, Err: err}
	}
	defer unix.Close(mountFD)
	const resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	dirFD := mountFD
	if confine != "." {
		fd, err := unix.Openat2(mountFD, confine, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve})
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			openat2Missing.Store(true)
			return openConfinedRoot(hostDir, confine, rel, fallbackFlags())
		}
		if err != nil {
			return nil, &os.PathError{Op: "openat2", Path: confine, Err: err}
		}
		defer unix.Close(fd)
		dirFD = fd
	}
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if forStat {
		flags = unix.O_PATH | unix.O_CLOEXEC
	}
	fd, err := unix.Openat2(dirFD, rel, &unix.OpenHow{Flags: uint64(flags), Resolve: resolve})
	if errors.Is(err, unix.ENOSYS) || (errors.Is(err, unix.EPERM) && confine == ".") {
		openat2Missing.Store(true)
		return openConfinedRoot(hostDir, confine, rel, fallbackFlags())
	}
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	// The name is for messages only: reopening it would resolve on the host.
	return os.NewFile(uintptr(fd), filepath.Join(confine, rel)), nil
}

func fallbackFlags() int {
	return os.O_RDONLY | unix.O_NONBLOCK
}
