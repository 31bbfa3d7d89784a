package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is one child daemon (etcd, kube-apiserver, containerd, an agent) that can be
// started and stopped repeatedly with the same arguments. Its output is appended to one log
// file.
type Process struct {
	name    string
	argv    []string
	logPath string
	env     []string // added to the test binary's environment; set before Start

	mu      sync.Mutex // protects the fields below
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the waiter goroutine of cmd has returned
	waitErr error         // cmd.Wait's result, valid once exited is closed
}

// NewProcess describes a process; Start starts it.
func NewProcess(name, logPath string, argv ...string) *Process {
	return &Process{name: name, argv: argv, logPath: logPath}
}

// SetEnv adds kv ("NAME=value") to the environment the process gets from the test binary; call
// it before Start.
func (p *Process) SetEnv(kv ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.env = append(p.env, kv...)
}

// Start starts the process in a new session (so in its own process group). It is an error to
// start a running process.
//
// The child gets SIGKILL if the test binary dies (Pdeathsig), so a test killed by -timeout
// leaves no daemons behind. Pdeathsig fires when the thread that forked the child exits, not
// the process, so the waiter goroutine forks from a thread it keeps locked until the child has
// been reaped: that thread outlives the child.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return fmt.Errorf("start %s: already running (pid %d)", p.name, p.cmd.Process.Pid)
		}
	}
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: open log: %w", p.name, err)
	}
	fmt.Fprintf(logFile, "==== %s: starting %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.argv, " "))

	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		defer close(exited)
		defer logFile.Close()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
	}()
	if err := <-started; err != nil {
		<-exited
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.exited, p.waitErr = cmd, exited, nil
	return nil
}

// exitedChan returns a channel closed when the current run has exited (nil if never started).
func (p *Process) exitedChan() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Pid returns the pid of the running process, 0 if it is not running.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	select {
	case <-p.exited:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// LogPath is the file the process's output goes to.
func (p *Process) LogPath() string { return p.logPath }

// Running reports whether the process was started and has not exited.
func (p *Process) Running() bool {
	ch := p.exitedChan()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// ExitError describes how the process ended, for messages about a daemon that died early.
func (p *Process) ExitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waitErr == nil {
		return fmt.Errorf("%s exited with status 0", p.name)
	}
	return fmt.Errorf("%s exited: %w", p.name, p.waitErr)
}

// Stop sends sig to the process group, waits up to grace for the process to exit, then kills
// the group and waits for it. Stopping a process that is not running is a no-op.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	pgid := cmd.Process.Pid // Setsid made the child the leader of its own group
	select {
	case <-exited:
		// The leader is gone; anything it left in its group still goes.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return nil
	default:
	}
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: signal %v: %w", p.name, sig, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-exited:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return nil
	case <-timer.C:
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: kill: %w", p.name, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("stop %s: pid %d still not reaped 30s after SIGKILL", p.name, pgid)
	}
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.logPath, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// logTailOnFailure registers a cleanup that prints the tail of p's log if the test failed.
// Register it after the cleanup that stops p, so that it runs first: the log is complete
// enough by then and the message appears before teardown noise.
func logTailOnFailure(t testing.TB, p *Process) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- last lines of %s (%s) ----\n%s", p.name, p.logPath, p.LogTail(60))
		}
	})
}
