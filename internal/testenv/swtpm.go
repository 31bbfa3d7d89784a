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
// the TPM's command channel on a unix socket, as /dev/tpmrm0 serves a gateway's chip. Its
// state (the owner hierarchy's seed among it) lives in a directory of its own: two SWTPMs are
// two different chips.
type SWTPM struct {
	// Socket is the command channel, for the TPM clients of the code under test.
	Socket string
	proc   *Process
}

// StartSWTPM starts a new software TPM, stopped when the test ends.
func StartSWTPM(t testing.TB) *SWTPM {
	t.Helper()
	bin, err := exec.LookPath("swtpm")
	if err != nil {
		t.Fatalf("swtpm not found (Debian package swtpm, installed by hack/deps.sh): %v", err)
	}
	// A short directory: a unix socket's path is at most 107 bytes, and t.TempDir's are long.
	dir, err := os.MkdirTemp("", "swtpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	s := &SWTPM{Socket: filepath.Join(dir, "tpm.sock")}
	s.proc = NewProcess("swtpm", filepath.Join(dir, "swtpm.log"), bin, "socket", "--tpm2",
		"--tpmstate", "dir="+state,
		"--server", "type=unixio,path="+s.Socket,
		"--ctrl", "type=unixio,path="+filepath.Join(dir, "ctrl.sock"),
		"--flags", "not-need-init,startup-clear")
	t.Cleanup(func() { _ = s.proc.Stop(syscall.SIGTERM, 5*time.Second) })
	logTailOnFailure(t, s.proc)
	if err := s.proc.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := poll(ctx, s.proc, func(context.Context) error {
		if fi, err := os.Stat(s.Socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("no socket at %s yet", s.Socket)
		}
		return nil
	}); err != nil {
		t.Fatalf("swtpm not ready: %v", err)
	}
	return s
}
