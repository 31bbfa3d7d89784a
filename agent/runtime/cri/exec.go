package cri

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// execSlack is how long past an exec's own timeout the call may take: the runtime kills the
// command at the timeout, then answers.
const execSlack = 10 * time.Second

// Exec runs cmd in the running container id (ExecSync), its stdout then its stderr kept up
// to OutputLimit. The runtime kills it at the timeout, which is reported as
// runtime.ErrExecTimeout. A non-zero exit is not an error: ExecResult.ExitCode says so.
func (r *Runtime) Exec(ctx context.Context, id string, cmd []string, opts runtime.ExecOptions) (runtime.ExecResult, error) {
	if len(cmd) == 0 {
		return runtime.ExecResult{}, errors.New("exec: empty command")
	}
	if opts.OutputLimit <= 0 {
		opts.OutputLimit = runtime.DefaultExecOutputLimit
	}
	timeout := opts.Timeout
	if d, ok := ctx.Deadline(); ok && (timeout <= 0 || time.Until(d) < timeout) {
		timeout = time.Until(d)
	}
	req := &criapi.ExecSyncRequest{ContainerId: id, Cmd: cmd}
	callCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		// Whole seconds, as the CRI counts them, never 0 (no timeout).
		req.Timeout = max(int64((timeout+time.Second-1)/time.Second), 1)
		// The runtime kills the command at the timeout and answers: ctx's deadline is left to
		// it (so that a timeout is told from a failure), its cancellation is not (a pod deleted,
		// a grace period shortened: the call ends, and the runtime kills the command).
		callCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), timeout+execSlack)
		stop := context.AfterFunc(ctx, func() {
			if errors.Is(ctx.Err(), context.Canceled) {
				cancel()
			}
		})
		defer stop()
	}
	defer cancel()
	began := time.Now()
	resp, err := r.rs.ExecSync(callCtx, req)
	switch {
	case err == nil:
	case errors.Is(ctx.Err(), context.Canceled):
		return runtime.ExecResult{}, fmt.Errorf("exec %q: %w", strings.Join(cmd, " "), ctx.Err())
	case timeout > 0 && time.Since(began) >= timeout:
		return runtime.ExecResult{}, fmt.Errorf("%w: command %q timed out after %s", runtime.ErrExecTimeout, strings.Join(cmd, " "), timeout)
	case status.Code(err) == codes.NotFound || status.Code(err) == codes.FailedPrecondition:
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: %w: %v", id, runtime.ErrContainerNotRunning, err)
	default:
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: %w: %v", id, runtime.ErrExecStart, err)
	}
	out := append(resp.Stdout, resp.Stderr...)
	res := runtime.ExecResult{ExitCode: int(resp.ExitCode), Output: out}
	if len(out) > opts.OutputLimit {
		res.Output, res.Truncated = out[:opts.OutputLimit], true
	}
	return res, nil
}

// ExecStream runs cmd in the running container id connected to s, through the runtime's
// streaming server (the URL its Exec answers), and returns the command's exit code.
func (r *Runtime) ExecStream(ctx context.Context, id string, cmd []string, s runtime.ExecStreams) (int, error) {
	if len(cmd) == 0 {
		return 0, errors.New("exec: empty command")
	}
	resp, err := r.rs.Exec(ctx, &criapi.ExecRequest{ContainerId: id, Cmd: cmd, Tty: s.TTY,
		Stdin: s.Stdin != nil, Stdout: s.Stdout != nil, Stderr: s.Stderr != nil && !s.TTY})
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w: %v", id, runtime.ErrContainerNotRunning, err)
	}
	err = r.stream(ctx, resp.Url, s)
	var exit utilexec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitStatus(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", id, err)
	}
	return 0, nil
}

// Attach connects s to the main process of the running container id through the runtime's
// streaming server.
func (r *Runtime) Attach(ctx context.Context, id string, s runtime.ExecStreams) error {
	if s.Stdin != nil {
		cs, err := r.status(ctx, id, criapi.ContainerState_CONTAINER_UNKNOWN)
		if err != nil {
			return fmt.Errorf("attach to %s: %w: %v", id, runtime.ErrContainerNotRunning, err)
		}
		stdin := cs.st.Annotations[annotationStdin]
		r.mu.Lock()
		used := r.stdinUsed[id]
		if stdin == "once" {
			r.stdinUsed[id] = true
		}
		r.mu.Unlock()
		switch {
		case stdin == "":
			return fmt.Errorf("attach to %s: %w", id, runtime.ErrNoStdin)
		case used:
			return fmt.Errorf("attach to %s: %w", id, runtime.ErrStdinClosed)
		}
	}
	resp, err := r.rs.Attach(ctx, &criapi.AttachRequest{ContainerId: id, Tty: s.TTY,
		Stdin: s.Stdin != nil, Stdout: s.Stdout != nil, Stderr: s.Stderr != nil && !s.TTY})
	if err != nil {
		return fmt.Errorf("attach to %s: %w: %v", id, runtime.ErrContainerNotRunning, err)
	}
	if err := r.stream(ctx, resp.Url, s); err != nil {
		return fmt.Errorf("attach to %s: %w", id, err)
	}
	return nil
}

// stream connects s to a session of the runtime's streaming server, as the kubelet's
// redirect-less proxy does.
func (r *Runtime) stream(ctx context.Context, rawURL string, s runtime.ExecStreams) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("streaming URL %q: %w", rawURL, err)
	}
	ex, err := remotecommand.NewSPDYExecutor(&restclient.Config{}, "POST", u)
	if err != nil {
		return err
	}
	opts := remotecommand.StreamOptions{Stdin: s.Stdin, Stdout: s.Stdout, Tty: s.TTY}
	if !s.TTY {
		opts.Stderr = s.Stderr
	}
	if s.TTY && s.Resize != nil {
		opts.TerminalSizeQueue = sizeQueue(s.Resize)
	}
	return ex.StreamWithContext(ctx, opts)
}

// sizeQueue hands the client's terminal sizes to the streaming session.
type sizeQueue <-chan runtime.TerminalSize

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	size, ok := <-q
	if !ok {
		return nil
	}
	return &remotecommand.TerminalSize{Width: size.Width, Height: size.Height}
}
