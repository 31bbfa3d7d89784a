package main

import (
	"path/filepath"

	"github.com/holdfast-dev/holdfast/agent/logs"
)

// calledAsLogger reports whether holdfast was run as a container logger: containerd's shim
// runs it through the holdfast-logger link the agent makes when no dedicated holdfast-logger
// binary is installed beside it (see agent/logs).
func calledAsLogger(argv0 string) bool { return filepath.Base(argv0) == logs.LoggerName }
