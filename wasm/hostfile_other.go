//go:build !linux

package wasm

import "os"

// openConfined uses os.Root off Linux (holdfast runs on Linux; this keeps
// the package building on developers' machines). See hostfile_linux.go.
func openConfined(hostDir, confine, rel string, forStat bool) (*os.File, error) {
	return openConfinedRoot(hostDir, confine, rel, os.O_RDONLY)
}
