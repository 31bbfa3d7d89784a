//go:build linux || darwin || freebsd

package offline

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// fileLock is an exclusive flock(2) on "<db>.lock", held for the store's
// lifetime. It exists besides bbolt's own flock on the database file because
// recovery renames that file: with the lock on a file that never moves, a
// second agent can never recover (rename) a database the first one has just
// recreated. The kernel drops it when the process dies, so a killed agent
// leaves no stale lock. The file holds the holder's PID for error messages.
type fileLock struct {
	f *os.File
}

// lockPollInterval is how often a blocked acquireLock retries; flock has no
// timed wait.
const lockPollInterval = 20 * time.Millisecond

func acquireLock(path string, timeout time.Duration) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
					holder = "process " + strconv.Itoa(pid)
				}
			}
			f.Close()
			return nil, fmt.Errorf("%w: held by %s (waited %s for %s): another holdfast may be running with this state directory; stop it or use another state directory",
				ErrLocked, holder, timeout, path)
		}
		time.Sleep(lockPollInterval)
	}
	// Record the holder; informational, so no fsync.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &fileLock{f: f}, nil
}

// release drops the lock. The file stays: removing it would race with a
// process that has opened it and is waiting for the lock.
func (l *fileLock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}
