package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Terminal is a command running on a pseudo-terminal, as an operator's interactive session:
// the test types into it and reads its screen. `kubectl exec -it` and `kubectl attach -it`
// check that their stdin is a terminal and put it in raw mode, so only a real one tests them.
type Terminal struct {
	Cmd    *exec.Cmd
	master *os.File
	done   chan struct{} // closed when the screen reader ends (the command and its pty closed)

	mu     sync.Mutex
	screen bytes.Buffer
}

// StartTerminal starts cmd on a new pseudo-terminal of rows x cols and stops it (SIGKILL) when
// t ends, if it still runs.
func StartTerminal(t testing.TB, cmd *exec.Cmd, rows, cols uint16) *Terminal {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	fail := func(what string, err error) {
		master.Close()
		t.Fatalf("pseudo-terminal: %s: %v", what, err)
	}
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		fail("unlock", err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		fail("number", err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		fail("open its slave", err)
	}
	defer slave.Close()
	if err := unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		fail("set its size", err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// Its own session, with the terminal as its controlling terminal (fd 0 in the child).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		fail("start "+cmd.Path, err)
	}
	term := &Terminal{Cmd: cmd, master: master, done: make(chan struct{})}
	go func() { // ends when the slave's last holder, the command, exits (EIO)
		defer close(term.done)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			term.mu.Lock()
			term.screen.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		<-term.done
		master.Close()
	})
	return term
}

// Type writes s to the terminal, as keys pressed.
func (term *Terminal) Type(t testing.TB, s string) {
	t.Helper()
	if _, err := term.master.Write([]byte(s)); err != nil {
		t.Fatalf("type %q: %v", s, err)
	}
}

// Screen returns everything the command wrote to the terminal so far.
func (term *Terminal) Screen() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.screen.String()
}

// WaitFor waits until the screen shows want after the first from bytes of it, failing t
// after timeout with what it shows. It returns the screen's length just past want, for the
// next wait to start from.
func (term *Terminal) WaitFor(t testing.TB, from int, want string, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		screen := term.Screen()
		if i := strings.Index(screen[min(from, len(screen)):], want); i >= 0 {
			return from + i + len(want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminal: %q not shown within %v; the screen:\n%s", want, timeout, screen)
		}
		select {
		case <-term.done:
			if !strings.Contains(term.Screen()[min(from, len(term.Screen())):], want) {
				t.Fatalf("terminal: the command ended without showing %q; the screen:\n%s", want, term.Screen())
			}
		case <-time.After(50 * time.Millisecond):
		}
	}
}
