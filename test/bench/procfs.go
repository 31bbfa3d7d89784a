package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/holdfast-dev/holdfast/internal/procfs"
)

// nodeProcs are the processes a node runs on an agent's behalf, found by the containerd
// socket they serve.
type nodeProcs struct {
	containerd int
	shims      []int
	// helpers are per-pod or per-container processes that are not the workload: holdfast's
	// container loggers, the sandbox (pause) processes of the CRI plugin.
	helpers []int
	// workload are the containers' own processes (not counted as overhead).
	workload []int
}

// findNodeProcs finds the containerd daemon listening on address, its shims and their
// children. isHelper tells a helper child from a workload one by its command line.
func findNodeProcs(address string, isHelper func(argv []string) bool) nodeProcs {
	var n nodeProcs
	procs := procfs.AllProcesses()
	shim := map[int]bool{}
	for _, p := range procs {
		if len(p.Argv) == 0 {
			continue
		}
		base := filepath.Base(p.Argv[0])
		switch {
		case base == "containerd":
			for i, a := range p.Argv[:len(p.Argv)-1] {
				if a == "--config" && configHasAddress(p.Argv[i+1], address) {
					n.containerd = p.PID
				}
			}
		case strings.Contains(base, "containerd-shim"):
			for i, a := range p.Argv[:len(p.Argv)-1] {
				if (a == "-address" || a == "--address") && p.Argv[i+1] == address {
					shim[p.PID] = true
					n.shims = append(n.shims, p.PID)
				}
			}
		}
	}
	for _, p := range procs {
		if !shim[p.PPID] {
			continue
		}
		if isHelper(p.Argv) {
			n.helpers = append(n.helpers, p.PID)
		} else {
			n.workload = append(n.workload, p.PID)
		}
	}
	return n
}

// containerdLog returns the log file of the containerd daemon serving address, which
// test/testenv writes next to the daemon's configuration file.
func containerdLog(address string) string {
	for _, p := range procfs.AllProcesses() {
		if len(p.Argv) == 0 || filepath.Base(p.Argv[0]) != "containerd" {
			continue
		}
		for i, a := range p.Argv[:len(p.Argv)-1] {
			if a == "--config" && configHasAddress(p.Argv[i+1], address) {
				return filepath.Join(filepath.Dir(p.Argv[i+1]), "containerd.log")
			}
		}
	}
	return ""
}

func configHasAddress(path, address string) bool {
	b, err := os.ReadFile(path)
	return err == nil && bytes.Contains(b, []byte(strconv.Quote(address)))
}

// overhead lists every pid of n that is not workload.
func (n nodeProcs) overhead() []int {
	var out []int
	if n.containerd != 0 {
		out = append(out, n.containerd)
	}
	out = append(out, n.shims...)
	return append(out, n.helpers...)
}
