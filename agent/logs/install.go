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
// runtime backend, which reaches it through PrepareLog: one agent per process.
var current atomic.Pointer[installed]

// Install makes cfg.Binary (by default the dedicated logger beside the running executable, or
// the running executable) the logger of the containers started
// from now on: it links StateDir/bin/holdfast-logger to it (atomically replacing an older link, so loggers of
// containers that run on keep their binary and new ones get this one) and records cfg for
// PrepareLog. The agent calls it at start, before any container starts.
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

// Logger is how a runtime's shim writes a container's output to its log file: it runs Binary
// with Args (the logger Install linked, which writes the CRI log format and rotates), or, with
// Binary empty, it writes the raw output to Path.
type Logger struct {
	Path   string
	Binary string
	Args   map[string]string
}

// PrepareLog returns the logger of the container whose log file is logPath. Before returning it
// makes the log's directories and file (following no symlink below the pod log root), so that a
// path the logger would refuse fails the start here, with its reason, rather than in a process
// whose errors nobody reads.
//
// Without Install (a tool or a test that drives the runtime alone), the output is written raw
// to the file, as containerd's file:// log URI does.
func PrepareLog(logPath string) (Logger, error) {
	inst := current.Load()
	if inst == nil {
		warnRaw.Do(func() {
			slog.Warn("container logger not installed: container output is written raw, not in the CRI log format (the agent calls logs.Install at start)")
		})
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
			return Logger{}, fmt.Errorf("log dir: %w", err)
		}
		return Logger{Path: logPath}, nil
	}
	loc, err := locate("", logPath)
	if err != nil {
		return Logger{}, err
	}
	dir, err := openDir(loc, true)
	if err != nil {
		return Logger{}, err
	}
	defer dir.Close()
	f, err := openFileAt(dir, loc.name, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o640)
	if err != nil {
		return Logger{}, err
	}
	f.Close()
	opts := Options{Path: logPath, Root: loc.root, MaxSize: inst.cfg.MaxSize, MaxFiles: inst.cfg.MaxFiles, MaxLine: inst.cfg.MaxLine}
	return Logger{Path: logPath, Binary: inst.binary, Args: opts.Args()}, nil
}

// defaultBinary is the logger to use when none is configured, given the running executable:
// the dedicated logger installed beside it if there is one, otherwise the executable itself.
func defaultBinary(self string) string {
	sibling := filepath.Join(filepath.Dir(self), LoggerName)
	if fi, err := os.Stat(sibling); err == nil && fi.Mode().IsRegular() && unix.Access(sibling, unix.X_OK) == nil {
		return sibling
	}
	return self
}
