package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// execCleanupTimeout bounds killing, waiting for and deleting an exec process once its own
// deadline has passed, so a hung shim cannot hold the caller forever. A variable for the tests.
var execCleanupTimeout = 10 * time.Second

// execDrainTimeout bounds how long output is still read after the command exited: a child it
// left in the background may hold stdout open for ever.
const execDrainTimeout = time.Second

// Exec runs cmd inside the running container id, the way `crictl exec` does: a new process in
// the container's namespaces and cgroup, with the process spec of the container (user, env,
// working directory, capabilities, rlimits) and cmd as its arguments, without a terminal or
// stdin. Its stdout and stderr are captured up to OutputLimit.
//
// A command that runs and exits non-zero is not an error: ExitResult.ExitCode says so. The
// exec process is always deleted before Exec returns, also on timeout (killed first) and on
// ctx cancellation. Processes the command left in the background keep running, as with
// kubelet.
func (r *Runtime) Exec(ctx context.Context, id string, cmd []string, opts runtime.ExecOptions) (runtime.ExecResult, error) {
	if len(cmd) == 0 {
		return runtime.ExecResult{}, errors.New("exec: empty command")
	}
	if opts.OutputLimit <= 0 {
		opts.OutputLimit = runtime.DefaultExecOutputLimit
	}
	ctx = r.ctx(ctx)
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if opts.Timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, opts.Timeout)
	}
	defer cancel()

	c, err := r.client.LoadContainer(runCtx, id)
	if errdefs.IsNotFound(err) {
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: %w", id, runtime.ErrContainerNotRunning)
	} else if err != nil {
		return runtime.ExecResult{}, r.execErr(runCtx, ctx, cmd, opts, fmt.Errorf("exec in %s: load container: %w", id, err))
	}
	task, err := c.Task(runCtx, nil)
	if errdefs.IsNotFound(err) {
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: %w", id, runtime.ErrContainerNotRunning)
	} else if err != nil {
		return runtime.ExecResult{}, r.execErr(runCtx, ctx, cmd, opts, fmt.Errorf("exec in %s: load task: %w", id, err))
	}
	spec, err := c.Spec(runCtx)
	if err != nil {
		return runtime.ExecResult{}, r.execErr(runCtx, ctx, cmd, opts, fmt.Errorf("exec in %s: read spec: %w", id, err))
	}
	if spec.Process == nil {
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: the container's spec has no process", id)
	}
	pspec := *spec.Process
	pspec.Args = append([]string(nil), cmd...)
	pspec.Terminal = false
	pspec.ConsoleSize = nil

	out := &limitedBuffer{limit: opts.OutputLimit}
	execID, err := newExecID()
	if err != nil {
		return runtime.ExecResult{}, err
	}
	proc, err := task.Exec(runCtx, execID, &pspec, cio.NewCreator(r.execIO(cio.WithStreams(nil, out, out))...))
	if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) {
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: %w: %v", id, runtime.ErrContainerNotRunning, err)
	} else if err != nil {
		return runtime.ExecResult{}, r.execErr(runCtx, ctx, cmd, opts, fmt.Errorf("exec in %s: create process: %w", id, err))
	}
	// From here on the exec process exists in the shim: it is deleted whatever happens, with
	// a context of its own since runCtx may be the very reason we stop.
	defer r.deleteExec(ctx, proc, id)

	// Wait before Start, so that a command that exits at once is not missed. The channel's
	// goroutine (the client's) ends when waitCtx does. No deadline of its own: the command
	// may run as long as runCtx lets it (a bounded context here ended every command after
	// execCleanupTimeout with "context deadline exceeded").
	waitCtx, waitCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer waitCancel()
	exitCh, err := proc.Wait(waitCtx)
	if err != nil {
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: wait: %w", id, err)
	}
	if err := proc.Start(runCtx); err != nil {
		if runCtx.Err() != nil {
			return runtime.ExecResult{}, r.execErr(runCtx, ctx, cmd, opts, err)
		}
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: %w: %v", id, runtime.ErrExecStart, err)
	}

	var st client.ExitStatus
	select {
	case st = <-exitCh:
	case <-runCtx.Done():
		r.killExec(ctx, proc, exitCh, id, execID)
		return runtime.ExecResult{Output: out.Bytes(), Truncated: out.Truncated()}, r.execErr(runCtx, ctx, cmd, opts, runCtx.Err())
	}
	if err := st.Error(); err != nil {
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: wait: %w", id, err)
	}
	drainExecIO(proc)
	return runtime.ExecResult{ExitCode: int(st.ExitCode()), Output: out.Bytes(), Truncated: out.Truncated()}, nil
}

// cleanupContext bounds the clean-up of an exec process by execCleanupTimeout from now, whatever
// became of ctx (its end may be the very reason for the clean-up).
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), execCleanupTimeout)
}

// killExec kills an exec process whose caller gave up and waits, for at most
// execCleanupTimeout, for its exit.
func (r *Runtime) killExec(ctx context.Context, proc client.Process, exitCh <-chan client.ExitStatus, id, execID string) {
	cleanupCtx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := proc.Kill(cleanupCtx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("kill exec process", "container", id, "exec", execID, "err", err)
	}
	select {
	case <-exitCh:
	case <-cleanupCtx.Done():
	}
}

// drainExecIO waits for the output an exited exec process left in its pipes, for at most
// execDrainTimeout: a child it left in the background may hold them open.
func drainExecIO(proc client.Process) {
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		proc.IO().Wait()
	}()
	drainTimer := time.NewTimer(execDrainTimeout)
	defer drainTimer.Stop()
	select {
	case <-drained:
	case <-drainTimer.C:
		proc.IO().Cancel() // closes our ends of the pipes: the copy stops, Wait returns
		<-drained
	}
}

// deleteExec removes the exec process from the shim, killing it first if it still runs
// (the caller gave up on it), and releases its pipes, within execCleanupTimeout from now.
func (r *Runtime) deleteExec(ctx context.Context, proc client.Process, id string) {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	_, err := proc.Delete(ctx)
	if errdefs.IsFailedPrecondition(err) {
		exitCh, werr := proc.Wait(ctx)
		if kerr := proc.Kill(ctx, syscall.SIGKILL); kerr != nil && !errdefs.IsNotFound(kerr) {
			r.log.Warn("kill exec process", "container", id, "exec", proc.ID(), "err", kerr)
		}
		if werr == nil {
			select {
			case <-exitCh:
			case <-ctx.Done():
			}
		}
		_, err = proc.Delete(ctx)
	}
	if err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("delete exec process", "container", id, "exec", proc.ID(), "err", err)
		if io := proc.IO(); io != nil {
			io.Cancel()
			io.Wait()
			_ = io.Close()
		}
	}
}

// execErr turns an error into ErrExecTimeout when a deadline (the timeout's or ctx's) passed,
// and keeps the caller's cancellation as such, so that callers tell a slow command from an
// agent shutting down.
func (r *Runtime) execErr(runCtx, parent context.Context, cmd []string, opts runtime.ExecOptions, err error) error {
	if errors.Is(parent.Err(), context.Canceled) {
		return fmt.Errorf("exec %q: %w", strings.Join(cmd, " "), parent.Err())
	}
	if errors.Is(runCtx.Err(), context.DeadlineExceeded) {
		if opts.Timeout > 0 {
			return fmt.Errorf("%w: command %q timed out after %s", runtime.ErrExecTimeout, strings.Join(cmd, " "), opts.Timeout)
		}
		return fmt.Errorf("%w: command %q timed out", runtime.ErrExecTimeout, strings.Join(cmd, " "))
	}
	return err
}

func newExecID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("exec id: %w", err)
	}
	return "holdfast-exec-" + hex.EncodeToString(b[:]), nil
}

// limitedBuffer keeps the first limit bytes written to it and drops the rest. Stdout and
// stderr are copied into it by two goroutines.
type limitedBuffer struct {
	mu        sync.Mutex // protects buf, truncated
	buf       []byte
	limit     int
	truncated bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := b.limit - len(b.buf)
	if room < len(p) {
		b.truncated = true
		if room > 0 {
			b.buf = append(b.buf, p[:room]...)
		}
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

func (b *limitedBuffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.truncated
}

// execIO is the IO options of an exec: its streams, its FIFOs where WithExecFIFODir says.
func (r *Runtime) execIO(opts ...cio.Opt) []cio.Opt {
	if r.execFIFODir != "" {
		opts = append(opts, cio.WithFIFODir(r.execFIFODir))
	}
	return opts
}
