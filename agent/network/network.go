package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	gocni "github.com/containerd/go-cni"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// ErrNetworkNotReady: no usable CNI configuration was found. Pods with their own network
// cannot start until one is installed; host-network pods are unaffected.
var ErrNetworkNotReady = errors.New("network plugin not ready: no CNI configuration")

// PodNetwork is what a pod's network setup produced, kept on disk so an agent restart can
// report podIPs without touching the network again.
type PodNetwork struct {
	NetNSPath string   `json:"netnsPath"`
	IPs       []string `json:"ips"`
}

// Manager sets up and tears down pod networks.
type Manager struct {
	confDir  string
	binDirs  []string
	netnsDir string
	stateDir string

	mu  sync.Mutex // protects cni: reloaded when the conf dir changes
	cni gocni.CNI
}

// NewManager prepares a manager; the CNI configuration is read lazily (and re-read while it
// is missing) so that a gateway whose CNI config arrives after boot still works.
func NewManager(confDir string, binDirs []string, netnsDir, stateDir string) *Manager {
	return &Manager{confDir: confDir, binDirs: binDirs, netnsDir: netnsDir, stateDir: filepath.Join(stateDir, "network")}
}

func (m *Manager) load() (gocni.CNI, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cni != nil {
		return m.cni, nil
	}
	c, err := gocni.New(gocni.WithPluginConfDir(m.confDir), gocni.WithPluginDir(m.binDirs), gocni.WithMinNetworkCount(2))
	if err != nil {
		return nil, fmt.Errorf("init CNI: %w", err)
	}
	if err := c.Load(gocni.WithLoNetwork, gocni.WithDefaultConf); err != nil {
		return nil, fmt.Errorf("%w in %s: %v", ErrNetworkNotReady, m.confDir, err)
	}
	m.cni = c
	return c, nil
}

// Ready reports whether a CNI configuration is loaded (for the node's Ready condition).
func (m *Manager) Ready() error {
	_, err := m.load()
	return err
}

func (m *Manager) netnsPath(podUID string) string {
	return filepath.Join(m.netnsDir, "holdfast-"+podUID)
}

func (m *Manager) recordPath(podUID string) string {
	return filepath.Join(m.stateDir, podUID+".json")
}

// Get returns the recorded network of a pod, or nil if it has none.
func (m *Manager) Get(podUID string) *PodNetwork {
	b, err := os.ReadFile(m.recordPath(podUID))
	if err != nil {
		return nil
	}
	var pn PodNetwork
	if json.Unmarshal(b, &pn) != nil || !isNetNS(pn.NetNSPath) {
		return nil
	}
	return &pn
}

// Setup gives the pod a network namespace with CNI networking and returns it. It is
// idempotent: a pod already set up gets its recorded network back. A half-done setup (a
// namespace without a record, after a crash) is torn down and redone.
func (m *Manager) Setup(ctx context.Context, podUID, namespace, name string) (*PodNetwork, error) {
	if pn := m.Get(podUID); pn != nil {
		return pn, nil
	}
	c, err := m.load()
	if err != nil {
		return nil, err
	}
	path := m.netnsPath(podUID)
	if _, err := os.Stat(m.recordPath(podUID)); err == nil || isNetNS(path) {
		// Left by an earlier setup that did not finish, or by a boot before a reboot (the
		// namespace is gone, IPAM still remembers): CNI DEL first so IPAM releases what it
		// allocated to this pod.
		_ = c.Remove(ctx, podUID, path, podLabels(podUID, namespace, name))
	}
	if err := createNetNS(path); err != nil {
		return nil, err
	}
	res, err := c.Setup(ctx, podUID, path, podLabels(podUID, namespace, name))
	if err != nil {
		_ = c.Remove(ctx, podUID, path, podLabels(podUID, namespace, name))
		_ = removeNetNS(path)
		return nil, fmt.Errorf("CNI setup of pod %s/%s: %w", namespace, name, err)
	}
	pn := &PodNetwork{NetNSPath: path}
	for ifname, cfg := range res.Interfaces {
		if ifname == "lo" {
			continue
		}
		for _, ipc := range cfg.IPConfigs {
			pn.IPs = append(pn.IPs, ipc.IP.String())
		}
	}
	if err := fsutil.WriteJSONAtomic(m.recordPath(podUID), pn); err != nil {
		return nil, err
	}
	return pn, nil
}

// Teardown runs CNI DEL and removes the namespace and the record. Tearing down a pod with
// no network is not an error.
func (m *Manager) Teardown(ctx context.Context, podUID, namespace, name string) error {
	path := m.netnsPath(podUID)
	if isNetNS(path) {
		c, err := m.load()
		if err != nil {
			return fmt.Errorf("tear down network of pod %s/%s: %w", namespace, name, err)
		}
		if err := c.Remove(ctx, podUID, path, podLabels(podUID, namespace, name)); err != nil {
			return fmt.Errorf("CNI teardown of pod %s/%s: %w", namespace, name, err)
		}
	}
	if err := removeNetNS(path); err != nil {
		return err
	}
	if err := os.Remove(m.recordPath(podUID)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove network record: %w", err)
	}
	return nil
}

// Known lists the pod UIDs that have a network record, for cleaning up after pods that were
// deleted while the agent was down.
func (m *Manager) Known() []string {
	entries, err := os.ReadDir(m.stateDir)
	if err != nil {
		return nil
	}
	var uids []string
	for _, e := range entries {
		if n := e.Name(); filepath.Ext(n) == ".json" {
			uids = append(uids, n[:len(n)-len(".json")])
		}
	}
	return uids
}

func podLabels(uid, namespace, name string) gocni.NamespaceOpts {
	return gocni.WithLabels(map[string]string{
		"K8S_POD_NAMESPACE":          namespace,
		"K8S_POD_NAME":               name,
		"K8S_POD_INFRA_CONTAINER_ID": uid,
		"K8S_POD_UID":                uid,
		"IgnoreUnknown":              "1",
	})
}
