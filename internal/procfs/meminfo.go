// Package procfs reads the kernel's views under /proc that more than one part of the agent
// needs (the node's capacity in agent/node, its eviction signals in agent/eviction) and the
// per-process figures the benchmarks and the fleet harness measure.
package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ReadMeminfo parses a meminfo file (/proc/meminfo) into bytes per field ("MemTotal",
// "MemAvailable", ...); fields without a kB unit are counts, kept as they are.
func ReadMeminfo(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		if len(f) == 3 && f[2] == "kB" {
			v *= 1024
		}
		out[strings.TrimSuffix(f[0], ":")] = v
	}
	if out["MemTotal"] == 0 {
		return nil, fmt.Errorf("%s has no MemTotal", path)
	}
	return out, nil
}
