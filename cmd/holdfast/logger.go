package main

import (
	"io"
	"path/filepath"
	"runtime/debug"

	"github.com/holdfast-dev/holdfast/agent/logs"
)

// loggerMemoryLimit caps the heap of a container logger: one runs per container, and it needs
// two line buffers.
const loggerMemoryLimit = 8 << 20

// calledAsLogger reports whether holdfast was run as a container logger: containerd's shim
// runs it through the holdfast-logger symlink the agent makes (see agent/logs).
func calledAsLogger(argv0 string) bool { return filepath.Base(argv0) == logs.LoggerName }

// loggerMain is main for a container logger. Its arguments are the log URI's query as key
// value pairs in no particular order, so it bypasses the command line parser.
func loggerMain(args []string, stderr io.Writer) int {
	debug.SetMemoryLimit(loggerMemoryLimit)
	return logs.Main(args, stderr)
}
