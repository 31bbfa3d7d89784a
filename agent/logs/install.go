package logs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/v2/pkg/cio"
	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// Defaults of the container log settings, kubelet's containerLogMaxSize and
// containerLogMaxFiles.
const (
	DefaultMaxSize  = 10 << 20
	DefaultMaxFiles = 5
)

// Config is how the agent's containers log.
type Config struct {
	// StateDir is the agent's state directory; the logger symlink is StateDir/bin/holdfast-logger.
	StateDir string
	// MaxSize is the size in bytes past which a container's log file is rotated. Defaults to
	// DefaultMaxSize; negative never rotates.
	MaxSize int64
	// MaxFiles is how many files of one container attempt are kept, the live one included.
	// Defaults to DefaultMaxFiles; at least 2.
	MaxFiles int
	// MaxLine is the longest message of one line. Defaults to DefaultMaxLineBytes.
	MaxLine int
	// Binary is the logger executable the symlink points to. Defaults to the holdfast-logger
	// binary beside the running executable (cmd/holdfast-logger, which `make build` builds and
	// a gateway image installs next to holdfast), or, if there is none, the running executable
	// itself, whose main runs Main when called by the link's name. One logger runs per
	// container: the dedicated binary costs about 1 MiB of private memory each, holdfast
	// itself about 6 MiB (the package initialisation of everything the agent links).
	Binary string
}

// installed is the logger containers started from now on use.
type installed struct {
	binary string
	cfg    Config
}

// current is set by Install. A process-wide setting because containers are started by the
// runtime package, which reaches it through TaskIO: one agent per process.
var current atomic.Pointer[installed]

// Install makes cfg.Binary (by default the dedicated logger beside the running executable, or
// the running executable) the logger of the containers started
// from now on: it links StateDir/bin/holdfast-logger to it (atomically replacing an older link, so loggers of
// containers that run on keep their binary and new ones get this one) and records cfg for
// TaskIO. The agent calls it at start, before any container starts.
func Install(cfg Config) (string, error) {
	if cfg.StateDir == "" {
		return "", errors.New("install container logger: no state directory")
	}
	switch {
	case cfg.MaxSize == 0:
		cfg.MaxSize = DefaultMaxSize
	case cfg.MaxSize < 0:
		cfg.MaxSize = 0
	}
	if cfg.MaxFiles == 0 {
		cfg.MaxFiles = DefaultMaxFiles
	}
	if cfg.MaxFiles < 2 {
		return "", fmt.Errorf("install container logger: max files %d is below 2", cfg.MaxFiles)
	}
	if cfg.MaxLine != 0 && cfg.MaxLine < minMaxLineBytes {
		return "", fmt.Errorf("install container logger: max line %d is below %d", cfg.MaxLine, minMaxLineBytes)
	}
	exe := cfg.Binary
	if exe == "" {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("install container logger: find own executable: %w", err)
		}
		// Replaced in place by an upgrade, /proc/self/exe reads "PATH (deleted)": PATH is the
		// binary to run now.
		exe = defaultBinary(strings.TrimSuffix(self, " (deleted)"))
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	if !filepath.IsAbs(exe) {
		return "", fmt.Errorf("install container logger: binary %q is not an absolute path", exe)
	}
	binDir, err := filepath.Abs(filepath.Join(cfg.StateDir, "bin"))
	if err != nil {
		return "", fmt.Errorf("install container logger: %w", err)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", fmt.Errorf("install container logger: %w", err)
	}
	link := filepath.Join(binDir, LoggerName)
	if target, err := os.Readlink(link); err != nil || target != exe {
		tmp := link + ".new"
		if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("install container logger: %w", err)
		}
		if err := os.Symlink(exe, tmp); err != nil {
			return "", fmt.Errorf("install container logger: %w", err)
		}
		if err := os.Rename(tmp, link); err != nil {
			return "", fmt.Errorf("install container logger: %w", err)
		}
		if err := fsutil.SyncDir(binDir); err != nil {
			return "", fmt.Errorf("install container logger: %w", err)
		}
	}
	if err := unix.Access(link, unix.X_OK); err != nil {
		return "", fmt.Errorf("install container logger: %s is not executable: %w", link, err)
	}
	current.Store(&installed{binary: link, cfg: cfg})
	return link, nil
}

var warnRaw sync.Once

// TaskIO returns the IO of a task whose output goes to the log file at logPath: the shim runs
// the installed logger. Before returning it makes the log's directories and file (following
// no symlink below the pod log root), so that a path the logger would refuse fails the start
// here, with its reason, rather than in a process whose errors nobody reads.
//
// Without Install (a tool or a test that drives the runtime alone), the shim writes the raw
// output to the file, as containerd's file:// log URI does.
func TaskIO(logPath string, stdio Stdio) (cio.Creator, error) {
	inst := current.Load()
	if inst == nil {
		warnRaw.Do(func() {
			slog.Warn("container logger not installed: container output is written raw, not in the CRI log format (the agent calls logs.Install at start)")
		})
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
			return nil, fmt.Errorf("log dir: %w", err)
		}
		return withStdio(cio.LogFile(logPath), stdio), nil
	}
	loc, err := locate("", logPath)
	if err != nil {
		return nil, err
	}
	dir, err := openDir(loc, true)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	f, err := openFileAt(dir, loc.name, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	f.Close()
	opts := Options{Path: logPath, Root: loc.root, MaxSize: inst.cfg.MaxSize, MaxFiles: inst.cfg.MaxFiles, MaxLine: inst.cfg.MaxLine}
	return withStdio(cio.BinaryIO(inst.binary, opts.Args()), stdio), nil
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

// defaultBinary is the logger to use when none is configured, given the running executable:
// the dedicated logger installed beside it if there is one, otherwise the executable itself.
func defaultBinary(self string) string {
	sibling := filepath.Join(filepath.Dir(self), LoggerName)
	if fi, err := os.Stat(sibling); err == nil && fi.Mode().IsRegular() && unix.Access(sibling, unix.X_OK) == nil {
		return sibling
	}
	return self
}
