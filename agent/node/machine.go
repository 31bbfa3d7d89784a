package node

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
	"github.com/holdfast-dev/holdfast/internal/procfs"
)

// machineInfo is what the node reports about the machine it runs on.
type machineInfo struct {
	cpus         int
	memoryBytes  int64
	storageBytes int64
	kernel       string
	osImage      string
	machineID    string
	bootID       string
	systemUUID   string
}

// readMachine measures the machine; storageDir is the filesystem reported as
// ephemeral-storage (the one holding the agent's state and the containers' writable layers).
func readMachine(storageDir string) (machineInfo, error) {
	mi := machineInfo{cpus: goruntime.NumCPU()}
	mem, err := procfs.ReadMeminfo("/proc/meminfo")
	if err != nil {
		return mi, err
	}
	mi.memoryBytes = mem["MemTotal"]
	var fs unix.Statfs_t
	if err := unix.Statfs(storageDir, &fs); err != nil {
		return mi, fmt.Errorf("statfs %s: %w", storageDir, err)
	}
	mi.storageBytes = int64(fs.Blocks) * int64(fs.Bsize)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		mi.kernel = unix.ByteSliceToString(uts.Release[:])
	}
	mi.osImage = osImage()
	mi.machineID = readTrim("/etc/machine-id")
	mi.bootID = readTrim("/proc/sys/kernel/random/boot_id")
	mi.systemUUID = readTrim("/sys/class/dmi/id/product_uuid")
	return mi, nil
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
// holding the default route, or the first global unicast address found. It remembers nothing;
// the agent uses an AddressKeeper, which keeps the last address of the default route.
func HostIPs(configured string) []string {
	return []string{chooseHostIP(configured, defaultRouteIP(), "", firstGlobalIPv4)}
}

// chooseHostIP picks the node's address: the configured one; else the address of the default
// route's interface; else the last address the default route had (last), so that the node's
// and its pods' hostIP do not jump to another interface exactly when the uplink drops (its
// default route goes with it); else the first global unicast address; else loopback.
func chooseHostIP(configured, defaultRoute, last string, anyGlobal func() string) string {
	switch {
	case configured != "":
		return configured
	case defaultRoute != "":
		return defaultRoute
	case last != "":
		return last
	}
	if ip := anyGlobal(); ip != "" {
		return ip
	}
	return "127.0.0.1"
}

// AddressKeeper reports the node's address (HostIPs) and keeps the last address the default
// route had, in memory and in a file of the state directory, so that neither an uplink that
// drops nor an agent restarted while it is down changes the address the node reports.
type AddressKeeper struct {
	configured string
	path       string
	route      func() string // the default route's address; "" when there is none
	now        func() time.Time

	mu      sync.Mutex // protects last, routeIP, routeAt
	last    string
	routeIP string    // what route returned at routeAt
	routeAt time.Time // zero: route never asked
}

// routeTTL is how long the default route's address is reused before route is asked again:
// asking dumps every interface and address of the node over netlink (longer with each pod's
// veth), and every sync of a pod and every node status wants the address.
const routeTTL = 10 * time.Second

// NewAddressKeeper reads the last known address from stateDir.
func NewAddressKeeper(configured, stateDir string) *AddressKeeper {
	k := &AddressKeeper{configured: configured, path: filepath.Join(stateDir, "node-address"), route: defaultRouteIP, now: time.Now}
	if b, err := os.ReadFile(k.path); err == nil && net.ParseIP(strings.TrimSpace(string(b))) != nil {
		k.last = strings.TrimSpace(string(b))
	}
	return k
}

// IPs returns the node's addresses (one, IPv4) and remembers the default route's.
func (k *AddressKeeper) IPs() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	route := ""
	if k.configured == "" {
		route = k.routeLocked()
	}
	if route != "" && route != k.last {
		// Written only when it changes: flash wears out.
		if err := fsutil.WriteFileAtomic(k.path, []byte(route+"\n"), 0o644); err == nil {
			k.last = route
		}
	}
	return []string{chooseHostIP(k.configured, route, k.last, firstGlobalIPv4)}
}

// routeLocked returns the default route's address, asked of route at most once per routeTTL.
func (k *AddressKeeper) routeLocked() string {
	if now := k.now(); k.routeAt.IsZero() || now.Sub(k.routeAt) >= routeTTL {
		k.routeIP, k.routeAt = k.route(), now
	}
	return k.routeIP
}

func firstGlobalIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.IsGlobalUnicast() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	return ""
}

// defaultRouteIP returns the first IPv4 address of the interface holding the IPv4 default
// route, "" when there is no default route.
func defaultRouteIP() string {
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return ""
	}
	name := defaultRouteInterface(string(b))
	if name == "" {
		return ""
	}
	iface, err := net.InterfaceByName(name)
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
	return ""
}

// defaultRouteInterface finds the interface of the default route in /proc/net/route's table
// (destination 00000000, mask 00000000, the route up).
func defaultRouteInterface(table string) string {
	lines := strings.Split(table, "\n")
	if len(lines) < 2 {
		return ""
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		if flags, err := strconv.ParseUint(f[3], 16, 32); err == nil && flags&unix.RTF_UP != 0 {
			return f[0]
		}
	}
	return ""
}
