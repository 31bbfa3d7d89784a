package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// CNINetwork is a bridge network configuration private to one test. Nothing exists on the host
// until a CNI ADD creates the bridge; CNI removes the bridge when the test ends.
type CNINetwork struct {
	// Name is the network's name in its configuration.
	Name string
	// ConfDir holds ConfListFile and LoopbackConfListFile, in that (sorted) order, so a
	// consumer that takes the first file of the directory, like containerd's CRI plugin, gets
	// the bridge network.
	ConfDir string
	// BinDir holds the plugins: CNIBinDir.
	BinDir string
	// ConfListFile is the bridge network: bridge (gateway on the bridge, no masquerading) with
	// host-local IPAM over Subnet, then portmap for host ports.
	ConfListFile string
	// LoopbackConfListFile runs the loopback plugin alone. Containers of a pod reach each other
	// on 127.0.0.1 only after it has run in the pod's network namespace.
	LoopbackConfListFile string
	// Bridge is the name of the Linux bridge, at most 15 bytes.
	Bridge string
	// Subnet is the /24 host-local assigns addresses from.
	Subnet *net.IPNet
	// Gateway is the bridge's address in Subnet (.1), the host side of the network.
	Gateway net.IP
}

// CNI writes a CNI configuration for t and removes its bridge when t ends. The bridge name and
// a 10.x.y.0/24 subnet are drawn at random (avoiding subnets already on the host), because
// tests in different packages run at the same time on one machine.
func CNI(t testing.TB) *CNINetwork {
	t.Helper()
	RequireIntegration(t)

	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix) // never fails
	n := &CNINetwork{
		Name:    "holdfast-test-" + hex.EncodeToString(suffix),
		ConfDir: t.TempDir(),
		BinDir:  CNIBinDir,
		Bridge:  "hft" + hex.EncodeToString(suffix), // 11 bytes; IFNAMSIZ allows 15
	}
	subnet, err := freeSubnet()
	if err != nil {
		t.Fatalf("CNI: %v", err)
	}
	n.Subnet = subnet
	n.Gateway = make(net.IP, net.IPv4len)
	copy(n.Gateway, subnet.IP.To4())
	n.Gateway[3] = 1

	t.Cleanup(func() {
		if _, err := net.InterfaceByName(n.Bridge); err != nil {
			return // no CNI ADD ever ran, or the bridge is gone already
		}
		if out, err := exec.Command("ip", "link", "delete", n.Bridge).CombinedOutput(); err != nil {
			t.Errorf("CNI cleanup: delete bridge %s: %v: %s", n.Bridge, err, out)
		}
	})

	conflist := map[string]any{
		"cniVersion": "1.0.0",
		"name":       n.Name,
		"plugins": []map[string]any{
			{
				"type":        "bridge",
				"bridge":      n.Bridge,
				"isGateway":   true,
				"ipMasq":      false, // no internet to reach here, and no host-wide NAT rules to leak
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": subnet.String()}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(n.ConfDir, "ipam"), // not the host's /var/lib/cni
				},
			},
			{
				"type":         "portmap",
				"capabilities": map[string]bool{"portMappings": true},
			},
		},
	}
	loopback := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "loopback",
		"plugins":    []map[string]any{{"type": "loopback"}},
	}
	n.ConfListFile = filepath.Join(n.ConfDir, "10-"+n.Name+".conflist")
	n.LoopbackConfListFile = filepath.Join(n.ConfDir, "99-loopback.conflist")
	for path, conf := range map[string]any{n.ConfListFile: conflist, n.LoopbackConfListFile: loopback} {
		data, err := json.MarshalIndent(conf, "", "  ")
		if err != nil {
			t.Fatalf("CNI: encode %s: %v", path, err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatalf("CNI: %v", err)
		}
	}
	return n
}

// freeSubnet draws 10.x.y.0/24 subnets, x in [100, 228), until one overlaps no address or
// route network on the host. The draw also avoids 10.88.0.0/16, containerd's CRI default.
func freeSubnet() (*net.IPNet, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	var used []*net.IPNet
	for _, a := range addrs {
		if ipnet, ok := a.(*net.IPNet); ok {
			used = append(used, ipnet)
		}
	}
	for range 100 {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		candidate := &net.IPNet{IP: net.IPv4(10, 100+b[0]%128, b[1], 0).To4(), Mask: net.CIDRMask(24, 32)}
		free := true
		for _, u := range used {
			if u.Contains(candidate.IP) || candidate.Contains(u.IP) {
				free = false
				break
			}
		}
		if free {
			return candidate, nil
		}
	}
	return nil, fmt.Errorf("no free 10.x.y.0/24 subnet found in 100 draws")
}
