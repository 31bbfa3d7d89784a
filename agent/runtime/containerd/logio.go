package containerd

import (
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/holdfast-dev/holdfast/agent/logs"
)

// TaskIO returns the IO of a task whose output goes to the log file at logPath, through the
// logger the agent installed (logs.Install; logs.PrepareLog makes the file), with stdio. The
// shim runs the logger, so logs survive an agent restart.
func TaskIO(logPath string, stdio Stdio) (cio.Creator, error) {
	l, err := logs.PrepareLog(logPath)
	if err != nil {
		return nil, err
	}
	if l.Binary == "" {
		return withStdio(cio.LogFile(l.Path), stdio), nil
	}
	return withStdio(cio.BinaryIO(l.Binary, l.Args), stdio), nil
}

// Stdio is what a task's process gets besides its output going to the log: a stdin and a
// terminal, for containers with stdin: true and tty: true (kubectl attach, kubectl run -it).
type Stdio struct {
	// Stdin is a FIFO (it must exist) that the shim feeds the process's stdin from; empty:
	// none, the process reads /dev/null. The shim holds it open for writing too, until the
	// task's stdin is closed (CloseIO), so the stdin does not end with its first writer.
	Stdin string
	// Terminal gives the process a terminal; its stderr then goes to the terminal too, and
	// the log has one stream. The container's OCI spec must ask for one (process.terminal).
	Terminal bool
}

// withStdio adds stdio to the IO create makes.
func withStdio(create cio.Creator, stdio Stdio) cio.Creator {
	if stdio.Stdin == "" && !stdio.Terminal {
		return create
	}
	return func(id string) (cio.IO, error) {
		io, err := create(id)
		if err != nil {
			return nil, err
		}
		cfg := io.Config()
		cfg.Stdin, cfg.Terminal = stdio.Stdin, stdio.Terminal
		return stdioIO{IO: io, cfg: cfg}, nil
	}
}

// stdioIO is an IO whose configuration, what the shim is asked to set up, has a stdin and a
// terminal besides the log.
type stdioIO struct {
	cio.IO
	cfg cio.Config
}

func (s stdioIO) Config() cio.Config { return s.cfg }
