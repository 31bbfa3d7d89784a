package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// attachPollInterval is how often an attach looks for new output at the end of the log: an
// operator typing at a terminal sees the echo within it.
const attachPollInterval = 50 * time.Millisecond

// stdio is the stdin and terminal a container's task gets, from the labels CreateContainer
// recorded: a terminal for tty: true, and for stdin: true a FIFO in the IO directory that the
// shim feeds the process's stdin from and an attach writes to.
//
// containerd's runc shim connects a stdin to a process whose output goes to a logging binary
// only through a terminal (without one it gives the process no stdin at all), so stdin without
// tty cannot be had here while logs stay in the shim's hands; admission refuses it.
func (r *Runtime) stdio(id string, labels map[string]string) (Stdio, error) {
	s := Stdio{Terminal: labels[LabelTTY] == "true"}
	mode := labels[LabelStdin]
	if mode == "" {
		return s, nil
	}
	if !s.Terminal {
		return s, errors.New("stdin: true without tty: true is not supported: containerd's shim gives a process logged by a logging binary no stdin without a terminal")
	}
	path, err := r.stdinPath(id)
	if err != nil {
		return s, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return s, fmt.Errorf("stdin FIFO directory: %w", err)
	}
	// The FIFO of an earlier start of this container (a task created again after the agent
	// stopped half-way) is made again: a stale one may have lost its holder.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("remove old stdin FIFO: %w", err)
	}
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return s, fmt.Errorf("make stdin FIFO %s: %w", path, err)
	}
	s.Stdin = path
	return s, nil
}

func (r *Runtime) stdinPath(id string) (string, error) {
	if r.ioDir == "" {
		return "", errors.New("stdin: true needs the runtime's IO directory (runtime.WithIODir)")
	}
	return filepath.Join(r.ioDir, id+".stdin"), nil
}

// removeStdin removes the container's stdin FIFO, if it has one.
func (r *Runtime) removeStdin(id string) {
	path, err := r.stdinPath(id)
	if err != nil {
		return
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Warn("remove stdin FIFO", "container", id, "path", path, "err", err)
	}
}

// Attach connects s to the main process of the running container id, as `kubectl attach`
// does: its output from now on, stdin into its stdin, terminal size changes to its terminal.
// It returns when ctx ends or the container stops.
//
// The output is read from the container's log as the logger writes it (the shim hands the
// process's output to the logger alone): line by line, so a prompt without a newline shows
// once its line ends. Stdin goes to the container's stdin FIFO, which the shim keeps open
// between attaches; with stdinOnce the container's stdin is closed when the first attach's
// stdin ends, as the kubelet does. A container created without stdin: true gets ErrNoStdin.
func (r *Runtime) Attach(ctx context.Context, id string, s runtime.ExecStreams) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("attach to %s: %w", id, runtime.ErrContainerNotRunning)
	} else if err != nil {
		return fmt.Errorf("attach to %s: load container: %w", id, err)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return fmt.Errorf("attach to %s: labels: %w", id, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("attach to %s: %w", id, runtime.ErrContainerNotRunning)
	} else if err != nil {
		return fmt.Errorf("attach to %s: load task: %w", id, err)
	}
	logPath := labels[LabelLogPath]
	if logPath == "" {
		return fmt.Errorf("attach to %s: the container has no log to read its output from", id)
	}

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	// The output from now on: what the process writes once its stdin is connected, the answer
	// to the client's first line included, even when the log is opened after that answer
	// (it was lost when the read started at the end of the file as it was then).
	since := time.Now()
	if s.Stdin != nil {
		if labels[LabelStdin] == "" {
			return fmt.Errorf("attach to %s: %w", id, runtime.ErrNoStdin)
		}
		path, err := r.stdinPath(id)
		if err != nil {
			return fmt.Errorf("attach to %s: %w", id, err)
		}
		// Non-blocking: with no reader left (stdinOnce, after its first attach) the open
		// fails with ENXIO instead of waiting for one forever.
		fifo, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if errors.Is(err, syscall.ENXIO) {
			return fmt.Errorf("attach to %s: %w", id, runtime.ErrStdinClosed)
		} else if err != nil {
			return fmt.Errorf("attach to %s: open stdin: %w", id, err)
		}
		// Closing both ends unblocks the copy when the attach ends first: the FIFO for a
		// write, the client's stream (every stream of the node API is a Closer) for a read.
		stop := context.AfterFunc(ctx, func() {
			fifo.Close()
			if rc, ok := s.Stdin.(io.Closer); ok {
				rc.Close()
			}
		})
		defer stop()
		once := labels[LabelStdin] == "once"
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := io.Copy(fifo, s.Stdin); err != nil && ctx.Err() == nil {
				r.log.Debug("attach: copy stdin", "container", id, "err", err)
			}
			fifo.Close()
			if once {
				// The shim's own writer goes: the process reads the end of its input.
				closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if err := task.CloseIO(closeCtx, client.WithStdinCloser); err != nil && !errdefs.IsNotFound(err) {
					r.log.Warn("attach: close the stdin of a stdinOnce container", "container", id, "err", err)
				}
			}
		}()
	}

	if s.Resize != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case size, ok := <-s.Resize:
					if !ok {
						return
					}
					if err := task.Resize(ctx, uint32(size.Width), uint32(size.Height)); err != nil && !errdefs.IsNotFound(err) {
						r.log.Debug("attach: resize terminal", "container", id, "err", err)
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}

	stdout, stderr := s.Stdout, s.Stderr
	if stdout == nil {
		stdout = io.Discard
	} else if labels[LabelTTY] == "true" {
		// The logger keeps lines without the "\r" of a terminal's "\r\n" (as containerd's
		// CRI logger does); the client's terminal is in raw mode and needs it back.
		stdout = &crlfWriter{w: stdout}
	}
	if stderr == nil {
		stderr = io.Discard
	}
	running := func() bool {
		st, err := task.Status(ctx)
		return err == nil && st.Status != client.Stopped
	}
	err = logs.Read(ctx, logPath, logs.ReadOptions{Follow: true, Running: running, Stderr: stderr, PollInterval: attachPollInterval,
		Since: since, TailLines: attachBacklogLines}, stdout)
	if err != nil {
		return fmt.Errorf("attach to %s: read output: %w", id, err)
	}
	return nil
}

// attachBacklogLines bounds how far back from the end of the log an attach looks for the lines
// written since it began (Since drops the older ones).
const attachBacklogLines = 1000

// crlfWriter writes what it is given with every "\n" made "\r\n", as a terminal's line
// discipline (ONLCR) had written it before the log took the "\r" away.
type crlfWriter struct {
	w   io.Writer
	buf []byte
}

func (c *crlfWriter) Write(p []byte) (int, error) {
	c.buf = c.buf[:0]
	for _, b := range p {
		if b == '\n' {
			c.buf = append(c.buf, '\r')
		}
		c.buf = append(c.buf, b)
	}
	if _, err := c.w.Write(c.buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush passes a flush on: the node API flushes each batch of lines to the client.
func (c *crlfWriter) Flush() {
	if f, ok := c.w.(interface{ Flush() }); ok {
		f.Flush()
	}
}
