// Command holdfast-logger is the container logger of holdfast: containerd's shim runs one per
// container, through the link the agent keeps in its state directory, and it writes the
// container's stdout and stderr to the container's log file in the CRI format (see agent/logs).
//
// The holdfast binary can play this part too, but one logger runs per container, and this
// binary links only the logger: about 1 MiB of private memory per container instead of 6.
// Install it beside holdfast (the agent looks for it there).
package main

import (
	"os"

	"github.com/holdfast-dev/holdfast/agent/logs"
)

func main() {
	os.Exit(logs.Main(os.Args[1:], os.Stderr))
}
