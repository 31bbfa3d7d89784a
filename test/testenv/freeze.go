package testenv

import (
	"syscall"
)

// Freeze stops the containerd daemon with SIGSTOP, as a hung runtime: its socket still
// accepts connections and calls already made stay open, but nothing answers. The shims and
// the containers they run go on. Thaw resumes it; so does the end of the test, before the
// daemon is cleaned up.
func (c *Containerd) Freeze() {
	c.t.Helper()
	pid := c.proc.Pid()
	if pid == 0 {
		c.t.Fatal("freeze containerd: the daemon is not running")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		c.t.Fatalf("freeze containerd: %v", err)
	}
	c.t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
}

// Thaw resumes a daemon stopped by Freeze with SIGCONT.
func (c *Containerd) Thaw() {
	c.t.Helper()
	pid := c.proc.Pid()
	if pid == 0 {
		c.t.Fatal("thaw containerd: the daemon is not running")
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		c.t.Fatalf("thaw containerd: %v", err)
	}
}
