package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// SWTPM is a software TPM 2.0 (swtpm, Debian's package, installed by hack/deps.sh) serving
// the TPM's command channel on a unix socket, as /dev/tpmrm0 serves a gateway's chip, or
// serving a qemu virtual machine's TPM (SWTPMOptions.ForQEMU). Its state (the owner
// hierarchy's seed among it) lives in a directory of its own: two SWTPMs on two directories
// are two different chips, and one directory is the same chip across restarts.
type SWTPM struct {
	// Socket is the command channel, for the TPM clients of the code under test. Empty with
	// ForQEMU: qemu passes swtpm its own command channel over Ctrl.
	Socket string
	// Ctrl is the control channel: out-of-band commands (initialize, reset), and the one a
	// qemu tpm-emulator backend connects to (-chardev socket,path=Ctrl).
	Ctrl string
	proc *Process
}

// SWTPMOptions configures StartSWTPMWith.
type SWTPMOptions struct {
	// StateDir holds the TPM's state, made if missing and never removed: the same directory
	// is the same chip, across Start after Stop and across SWTPMs. Empty: a new directory,
	// removed when the test ends.
	StateDir string
	// ForQEMU serves the control channel only, the way qemu's tpm-emulator backend drives a
	// TPM: qemu hands swtpm the command channel over it and initializes the TPM at every
	// reset of the machine, and the guest's firmware and kernel start it, as on a board. So
	// swtpm neither starts the TPM itself nor outlives qemu: it ends when qemu's connection
	// closes, and must be started again (Start) before qemu is.
	ForQEMU bool
}

// StartSWTPM starts a new software TPM with a command channel, stopped when the test ends.
func StartSWTPM(t testing.TB) *SWTPM {
	t.Helper()
	return StartSWTPMWith(t, SWTPMOptions{})
}

// StartSWTPMWith starts a software TPM as opts says, stopped when the test ends.
func StartSWTPMWith(t testing.TB, opts SWTPMOptions) *SWTPM {
	t.Helper()
	bin, err := exec.LookPath("swtpm")
	if err != nil {
		t.Fatalf("swtpm not found (Debian package swtpm, installed by hack/deps.sh): %v", err)
	}
	// A short directory for the sockets: a unix socket's path is at most 107 bytes, and
	// t.TempDir's are long.
	dir, err := os.MkdirTemp("", "swtpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state := opts.StateDir
	if state == "" {
		state = filepath.Join(dir, "state")
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatalf("swtpm state: %v", err)
	}
	s := &SWTPM{Ctrl: filepath.Join(dir, "ctrl.sock")}
	argv := []string{bin, "socket", "--tpm2", "--tpmstate", "dir=" + state,
		"--ctrl", "type=unixio,path=" + s.Ctrl}
	if !opts.ForQEMU {
		s.Socket = filepath.Join(dir, "tpm.sock")
		argv = append(argv, "--server", "type=unixio,path="+s.Socket,
			"--flags", "not-need-init,startup-clear")
	}
	s.proc = NewProcess("swtpm", filepath.Join(dir, "swtpm.log"), argv...)
	t.Cleanup(func() { _ = s.Stop() })
	logTailOnFailure(t, s.proc)
	s.Start(t)
	return s
}

// Start starts the TPM again after Stop, or after it ended with qemu's connection (ForQEMU),
// on the same state, and waits until it listens. It is an error to start a running TPM.
func (s *SWTPM) Start(t testing.TB) {
	t.Helper()
	// The sockets of a previous run: waiting for them would not wait for this one.
	for _, sock := range []string{s.Socket, s.Ctrl} {
		if sock != "" {
			_ = os.Remove(sock)
		}
	}
	if err := s.proc.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := poll(ctx, s.proc, func(context.Context) error {
		for _, sock := range []string{s.Socket, s.Ctrl} {
			if fi, err := os.Stat(sock); sock != "" && (err != nil || fi.Mode()&os.ModeSocket == 0) {
				return fmt.Errorf("no socket at %s yet", sock)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("swtpm not ready: %v", err)
	}
}

// Stop stops the TPM (SIGTERM: swtpm writes its state out), as a machine's power cut cuts its
// TPM's; a no-op if it is not running.
func (s *SWTPM) Stop() error { return s.proc.Stop(syscall.SIGTERM, 5*time.Second) }

// Running reports whether the TPM runs: with ForQEMU, it ends with qemu's connection.
func (s *SWTPM) Running() bool { return s.proc.Running() }
