package containerd

import "time"

// SetExecCleanupTimeout sets execCleanupTimeout for a test and returns what restores it.
func SetExecCleanupTimeout(d time.Duration) (restore func()) {
	old := execCleanupTimeout
	execCleanupTimeout = d
	return func() { execCleanupTimeout = old }
}
