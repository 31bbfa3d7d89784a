package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ExecStream runs cmd in the running container id as Exec does (the container's process spec
// with cmd as its arguments), connected to the given streams, optionally on a terminal, until
// the command exits or ctx ends (the command is then killed). It returns the command's exit
// code. The exec process is always deleted before ExecStream returns; processes the command
// left in the background keep running, as with kubelet.
func (r *Runtime) ExecStream(ctx context.Context, id string, cmd []string, s runtime.ExecStreams) (int, error) {
	if len(cmd) == 0 {
		return 0, errors.New("exec: empty command")
	}
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return 0, fmt.Errorf("exec in %s: %w", id, runtime.ErrContainerNotRunning)
	} else if err != nil {
		return 0, fmt.Errorf("exec in %s: load container: %w", id, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return 0, fmt.Errorf("exec in %s: %w", id, runtime.ErrContainerNotRunning)
	} else if err != nil {
		return 0, fmt.Errorf("exec in %s: load task: %w", id, err)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		return 0, fmt.Errorf("exec in %s: read spec: %w", id, err)
	}
	if spec.Process == nil {
		return 0, fmt.Errorf("exec in %s: the container's spec has no process", id)
	}
	pspec := *spec.Process
	pspec.Args = append([]string(nil), cmd...)
	pspec.Terminal = s.TTY
	pspec.ConsoleSize = nil
	if s.TTY {
		// The process starts on a terminal of the client's size, not 0x0 resized a moment
		// later: what runs first (a typed `stty size`, a full-screen program drawing its first
		// screen) saw no size and failed or drew for the wrong one.
		if size, ok := firstTerminalSize(ctx, &s); ok {
			pspec.ConsoleSize = &specs.Box{Width: uint(size.Width), Height: uint(size.Height)}
		}
	}

	// The client's stdin ends (EOF) when it closes it: the process's stdin is closed then, so
	// that `echo x | kubectl exec -i -- cat` ends.
	var stdin io.Reader
	stdinDone := make(chan struct{})
	if s.Stdin != nil {
		stdin = &eofSignal{r: s.Stdin, done: stdinDone}
	}
	stderr := s.Stderr
	opts := []cio.Opt{cio.WithStreams(stdin, s.Stdout, stderr)}
	if s.TTY {
		opts = append(opts, cio.WithTerminal)
	}
	execID, err := newExecID()
	if err != nil {
		return 0, err
	}
	proc, err := task.Exec(ctx, execID, &pspec, cio.NewCreator(r.execIO(opts...)...))
	if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) {
		return 0, fmt.Errorf("exec in %s: %w: %v", id, runtime.ErrContainerNotRunning, err)
	} else if err != nil {
		return 0, fmt.Errorf("exec in %s: create process: %w", id, err)
	}
	defer r.deleteExec(ctx, proc, id)

	// As long as the session lasts: an interactive shell outlives any fixed bound.
	waitCtx, waitCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer waitCancel()
	exitCh, err := proc.Wait(waitCtx)
	if err != nil {
		return 0, fmt.Errorf("exec in %s: wait: %w", id, err)
	}
	if err := proc.Start(ctx); err != nil {
		return 0, fmt.Errorf("exec in %s: %w: %v", id, runtime.ErrExecStart, err)
	}

	var st client.ExitStatus
	stdinCh := (<-chan struct{})(stdinDone)
	if s.Stdin == nil {
		stdinCh = nil
	}
wait:
	for {
		select {
		case st = <-exitCh:
			break wait
		case size, ok := <-s.Resize:
			if !ok {
				s.Resize = nil
				continue
			}
			if err := proc.Resize(ctx, uint32(size.Width), uint32(size.Height)); err != nil && !errdefs.IsNotFound(err) {
				r.log.Debug("resize exec terminal", "container", id, "exec", execID, "err", err)
			}
		case <-stdinCh:
			stdinCh = nil
			if err := proc.CloseIO(ctx, client.WithStdinCloser); err != nil && !errdefs.IsNotFound(err) {
				r.log.Debug("close exec stdin", "container", id, "exec", execID, "err", err)
			}
		case <-ctx.Done():
			r.killExec(ctx, proc, exitCh, id, execID)
			return 0, fmt.Errorf("exec in %s: %w", id, ctx.Err())
		}
	}
	if err := st.Error(); err != nil {
		return 0, fmt.Errorf("exec in %s: wait: %w", id, err)
	}
	drainExecIO(proc)
	return int(st.ExitCode()), nil
}

// firstSizeWait bounds the wait for the client's terminal size before a TTY command starts.
// kubectl sends it as soon as the streams are up; a client that sends none starts 0x0 after it.
var firstSizeWait = time.Second

// firstTerminalSize takes the first size the client sends on s.Resize, waiting at most
// firstSizeWait. s.Resize is set to nil if the client closed it.
func firstTerminalSize(ctx context.Context, s *runtime.ExecStreams) (runtime.TerminalSize, bool) {
	if s.Resize == nil {
		return runtime.TerminalSize{}, false
	}
	timer := time.NewTimer(firstSizeWait)
	defer timer.Stop()
	select {
	case size, ok := <-s.Resize:
		if !ok {
			s.Resize = nil
		}
		return size, ok && size.Width > 0 && size.Height > 0
	case <-timer.C:
	case <-ctx.Done():
	}
	return runtime.TerminalSize{}, false
}

// eofSignal closes done once r returned an error (EOF: the client closed stdin).
type eofSignal struct {
	r    io.Reader
	done chan struct{}
	shut bool
}

func (e *eofSignal) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !e.shut {
		e.shut = true
		close(e.done)
	}
	return n, err
}
