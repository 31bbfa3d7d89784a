package node

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// machineInfo is what the node reports about the machine it runs on.
type machineInfo struct {
	cpus             int
	memoryBytes      int64
	memAvailable     int64
	storageBytes     int64
	storageAvailable int64
	kernel           string
	osImage          string
	machineID        string
	bootID           string
	systemUUID       string
	pids, pidMax     int64
}

// readMachine measures the machine; storageDir is the filesystem reported as
// ephemeral-storage (the one holding the agent's state and the containers' writable layers).
func readMachine(storageDir string) (machineInfo, error) {
	mi := machineInfo{cpus: goruntime.NumCPU()}
	mem, err := readMeminfo()
	if err != nil {
		return mi, err
	}
	mi.memoryBytes, mi.memAvailable = mem["MemTotal"], mem["MemAvailable"]
	var fs unix.Statfs_t
	if err := unix.Statfs(storageDir, &fs); err != nil {
		return mi, fmt.Errorf("statfs %s: %w", storageDir, err)
	}
	mi.storageBytes = int64(fs.Blocks) * int64(fs.Bsize)
	mi.storageAvailable = int64(fs.Bavail) * int64(fs.Bsize)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		mi.kernel = unix.ByteSliceToString(uts.Release[:])
	}
	mi.osImage = osImage()
	mi.machineID = readTrim("/etc/machine-id")
	mi.bootID = readTrim("/proc/sys/kernel/random/boot_id")
	mi.systemUUID = readTrim("/sys/class/dmi/id/product_uuid")
	mi.pidMax, _ = strconv.ParseInt(readTrim("/proc/sys/kernel/pid_max"), 10, 64)
	if entries, err := os.ReadDir("/proc"); err == nil {
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				mi.pids++
			}
		}
	}
	return mi, nil
}

func readMeminfo() (map[string]int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, fmt.Errorf("read /proc/meminfo: %w", err)
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
		return nil, fmt.Errorf("/proc/meminfo has no MemTotal")
	}
	return out, nil
}

func osImage() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "Unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "Unknown"
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// HostIPs returns the node's addresses: the configured one, or the address of the interface
// holding the default route, or the first global unicast address found.
func HostIPs(configured string) []string {
	if configured != "" {
		return []string{configured}
	}
	if ip := defaultRouteIP(); ip != "" {
		return []string{ip}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.IsGlobalUnicast() && ipn.IP.To4() != nil {
			return []string{ipn.IP.String()}
		}
	}
	return []string{"127.0.0.1"}
}

// defaultRouteIP finds the source address the kernel would use towards the default route,
// without sending anything (a UDP "connect" only selects a route).
func defaultRouteIP() string {
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 2 && f[1] == "00000000" {
			iface, err := net.InterfaceByName(f[0])
			if err != nil {
				return ""
			}
			addrs, err := iface.Addrs()
			if err != nil {
				return ""
			}
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
					return ipn.IP.String()
				}
			}
		}
	}
	return ""
}
