package runtime

import (
	"errors"
	"io"
	"time"
)

// DefaultExecOutputLimit is how much of an exec'd command's output is kept: kubelet's limit
// for a probe's output (10 KiB).
const DefaultExecOutputLimit = 10 << 10

// Errors of Exec, classified with errors.Is.
var (
	// ErrExecTimeout: the command did not finish within its timeout; it was killed.
	ErrExecTimeout = errors.New("exec timed out")
	// ErrContainerNotRunning: the container has no running task to exec in.
	ErrContainerNotRunning = errors.New("container is not running")
	// ErrExecStart: the runtime could not start the command (no such executable, permission
	// denied...). The container itself is unaffected.
	ErrExecStart = errors.New("exec start failed")
)

// ExecOptions tune Exec.
type ExecOptions struct {
	// Timeout bounds the command: when it passes, the process is killed and Exec returns an
	// error wrapping ErrExecTimeout. Defaults to 0: only ctx bounds the command (a ctx
	// deadline counts as the timeout too).
	Timeout time.Duration
	// OutputLimit is how many bytes of stdout and stderr, combined, are kept. The rest is
	// read and dropped, so the command never blocks on a full pipe. Defaults to
	// DefaultExecOutputLimit.
	OutputLimit int
}

// ExecResult is how an exec'd command ended.
type ExecResult struct {
	// ExitCode is the command's exit status.
	ExitCode int
	// Output is the command's stdout and stderr in the order they arrived, at most
	// OutputLimit bytes.
	Output []byte
	// Truncated says the command wrote more than OutputLimit bytes.
	Truncated bool
}

// TerminalSize is a terminal's size in characters.
type TerminalSize struct {
	Width, Height uint16
}

// ExecStreams are the streams of an interactive command (`kubectl exec`). A nil stream is
// not connected.
type ExecStreams struct {
	Stdin  io.Reader
	Stdout io.Writer
	// Stderr is not used with TTY: a terminal has one output.
	Stderr io.Writer
	TTY    bool
	// Resize delivers the client's terminal size changes (TTY only); nil: none.
	Resize <-chan TerminalSize
}

var (
	// ErrStdinClosed: the container's stdin was closed, by its stdinOnce after a first attach.
	ErrStdinClosed = errors.New("the container's stdin is closed (stdinOnce: true, and it was attached to before)")
	// ErrNoStdin: the container was created without stdin: true; nothing reads a stdin.
	ErrNoStdin = errors.New("the container has no stdin (its spec does not set stdin: true)")
)
