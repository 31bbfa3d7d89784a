package prober

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Execer runs a command in a running container; *runtime.Runtime is one.
type Execer interface {
	Exec(ctx context.Context, containerID string, cmd []string, opts runtime.ExecOptions) (runtime.ExecResult, error)
}

// ExecHandler runs exec probes: the command in the container, success on exit status 0. Its
// output (stdout and stderr, at most 10 KiB as kubelet keeps) is the failure's message.
type ExecHandler struct {
	Runtime Execer
}

// Probe runs t's exec command.
func (h *ExecHandler) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	if h.Runtime == nil {
		return 0, "", fmt.Errorf("%w: exec (no container runtime)", ErrNoHandler)
	}
	cmd := expandStatic(t.Probe.Exec.Command, t.Container.Env)
	if len(cmd) == 0 {
		return 0, "", errors.New("exec probe has an empty command")
	}
	res, err := h.Runtime.Exec(ctx, t.ContainerID, cmd, runtime.ExecOptions{Timeout: t.Timeout, OutputLimit: runtime.DefaultExecOutputLimit})
	switch {
	case errors.Is(err, runtime.ErrExecTimeout):
		// kubelet: a timed-out exec probe fails (ExecProbeTimeout, GA since 1.20).
		return Failure, fmt.Sprintf("command %q timed out after %s", strings.Join(cmd, " "), t.Timeout), nil
	case err != nil:
		return 0, "", err
	}
	out := string(res.Output)
	if res.ExitCode != 0 {
		if strings.TrimSpace(out) == "" {
			// kubelet's event would end with an empty message; say at least how it ended.
			out = fmt.Sprintf("command %q exited with %d", strings.Join(cmd, " "), res.ExitCode)
		}
		return Failure, out, nil
	}
	return Success, out, nil
}
