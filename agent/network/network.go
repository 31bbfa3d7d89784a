package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/libcni"
	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// ErrNetworkNotReady: no usable CNI configuration was found. Pods with their own network
// cannot start until one is installed; host-network pods are unaffected.
var ErrNetworkNotReady = errors.New("network plugin not ready: no CNI configuration")

// PodNetwork is what a pod's network setup produced, kept on disk so an agent restart can
// report podIPs without touching the network again, and what CNI DEL needs, written before
// ADD, so that DEL runs exactly as ADD ran whatever happened since: an agent restart, a
// change of the CNI configuration, a reboot that took the namespace away.
type PodNetwork struct {
	NetNSPath string   `json:"netnsPath"`
	IPs       []string `json:"ips"`
	// Complete is set once ADD succeeded; a record without it is an ADD that did not finish.
	Complete bool `json:"complete,omitempty"`
	// ContainerID, Args and PortMappings are the CNI runtime configuration ADD ran with.
	ContainerID  string              `json:"containerID,omitempty"`
	Args         map[string]string   `json:"args,omitempty"`
	PortMappings []gocni.PortMapping `json:"portMappings,omitempty"`
	// Attachments are the networks ADD attached, in order.
	Attachments []Attachment `json:"attachments,omitempty"`
	// SetAside: the attachment of a boot before a reboot, kept until it is released. Its
	// namespace is gone; whatever is at its path now belongs to the pod's new attachment,
	// which its DEL must never touch.
	SetAside bool `json:"setAside,omitempty"`
}

// Attachment is one network a pod was attached to: its configuration list as ADD read it and
// the interface it got.
type Attachment struct {
	ConfList json.RawMessage `json:"confList"`
	IfName   string          `json:"ifName"`
}

// Manager sets up and tears down pod networks.
type Manager struct {
	confDir  string
	binDirs  []string
	netnsDir string
	stateDir string

	mu         sync.Mutex // protects cni and loadedConf: reloaded when the conf dir changes
	cni        gocni.CNI
	loadedConf string // fingerprint of the conf dir cni was loaded from

	// stale: a previous boot's attachment was set aside by Setup, for Run to release.
	stale chan struct{}
	// staleMu serializes the release of set-aside attachments (Run's and Teardown's).
	staleMu sync.Mutex
	// lastSetup is when a Setup last ran (unix nanoseconds): Run waits for a quiet moment.
	lastSetup atomic.Int64
}

// releaseQuiet is how long no pod network must have been set up before Run releases the
// attachments a reboot left: the CNI DELs wait until the pods of a boot have their networks.
// releaseMaxWait bounds that wait on a node whose pods never stop being set up.
var (
	releaseQuiet   = 5 * time.Second
	releaseMaxWait = time.Minute
)

// NewManager prepares a manager; the CNI configuration is read lazily (and re-read while it
// is missing) so that a gateway whose CNI config arrives after boot still works.
func NewManager(confDir string, binDirs []string, netnsDir, stateDir string) *Manager {
	return &Manager{confDir: confDir, binDirs: binDirs, netnsDir: netnsDir, stateDir: filepath.Join(stateDir, "network"),
		stale: make(chan struct{}, 1)}
}

// load returns the CNI configuration, read again whenever the conf dir changed since it was
// last read (a file added, removed or rewritten), as the kubelet and containerd watch it: a
// gateway whose network configuration is replaced gets new pods on the new network without a
// restart. Pods set up before keep theirs, and are torn down with the configuration they were
// set up with (see PodNetwork).
func (m *Manager) load() (gocni.CNI, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fp := confDirFingerprint(m.confDir)
	if m.cni != nil && fp == m.loadedConf {
		return m.cni, nil
	}
	m.cni, m.loadedConf = nil, ""
	c, err := LoadCNI(m.confDir, m.binDirs)
	if err != nil {
		return nil, err
	}
	m.cni, m.loadedConf = c, fp
	return c, nil
}

// LoadCNI reads the CNI configuration pods get: the first configuration of confDir, with the
// plugins found in binDirs. (The benchmark's network floor loads it the same way.) No loopback
// network: CreateNetNS brings lo up itself, which saves the loopback plugin's exec at every
// ADD and DEL (60 processes for 30 pods after a reboot).
func LoadCNI(confDir string, binDirs []string) (gocni.CNI, error) {
	c, err := gocni.New(gocni.WithPluginConfDir(confDir), gocni.WithPluginDir(binDirs), gocni.WithMinNetworkCount(1))
	if err != nil {
		return nil, fmt.Errorf("init CNI: %w", err)
	}
	if err := c.Load(gocni.WithDefaultConf); err != nil {
		return nil, fmt.Errorf("%w in %s: %v", ErrNetworkNotReady, confDir, err)
	}
	return c, nil
}

// confDirFingerprint names the conf dir's files with their sizes and modification times; it
// changes when a configuration is added, removed or rewritten. Reading a directory of a few
// files costs less than a watch with its goroutine, and load runs only on pod setup and the
// node's readiness check.
func confDirFingerprint(dir string) string {
	entries, err := fsutil.ReadDirNoAtime(dir)
	if err != nil {
		return ""
	}
	var b []byte
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || info.IsDir() {
			continue
		}
		b = fmt.Appendf(b, "%s:%d:%d;", e.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return string(b)
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
	b, err := fsutil.ReadFileNoAtime(m.recordPath(podUID))
	if err != nil {
		return nil
	}
	var pn PodNetwork
	if json.Unmarshal(b, &pn) != nil || !isNetNS(pn.NetNSPath) || !pn.Complete && pn.Attachments != nil {
		return nil
	}
	return &pn
}

// NetNSPath returns the network namespace of a pod whose network is set up, "" otherwise.
func (m *Manager) NetNSPath(podUID string) string {
	if pn := m.Get(podUID); pn != nil {
		return pn.NetNSPath
	}
	return ""
}

// record reads a pod's network record, complete or not; nil without one.
func (m *Manager) record(podUID string) *PodNetwork {
	b, err := fsutil.ReadFileNoAtime(m.recordPath(podUID))
	if err != nil {
		return nil
	}
	var pn PodNetwork
	if json.Unmarshal(b, &pn) != nil {
		return nil
	}
	return &pn
}

// Setup gives a pod with its own network a network namespace with CNI networking, its
// hostPorts mapped, and returns it; a host-network pod needs nothing here (an empty
// PodNetwork). It is idempotent: a pod already set up gets its recorded network back. A
// half-done setup (a namespace without a complete record, after a crash) is torn down and
// redone; so is a setup whose namespace is gone (a reboot).
func (m *Manager) Setup(ctx context.Context, pod *v1.Pod) (*PodNetwork, error) {
	if pod.Spec.HostNetwork {
		return &PodNetwork{}, nil
	}
	return m.setup(ctx, string(pod.UID), pod.Namespace, pod.Name, PortMappings(pod))
}

func (m *Manager) setup(ctx context.Context, podUID, namespace, name string, ports []gocni.PortMapping) (*PodNetwork, error) {
	if pn := m.Get(podUID); pn != nil {
		return pn, nil
	}
	c, err := m.load()
	if err != nil {
		return nil, err
	}
	m.lastSetup.Store(time.Now().UnixNano())
	path := m.netnsPath(podUID)
	containerID := podUID
	old := m.record(podUID)
	switch {
	case old != nil && old.Complete && len(old.Attachments) > 0 && !isNetNS(path) && len(old.PortMappings) == 0 && len(ports) == 0:
		// A boot before a reboot attached the pod: its namespace is gone, IPAM still holds
		// its address. That attachment is set aside, released by Run once the boot's pods
		// have their networks, and the pod is attached again under a new CNI container ID
		// (IPAM gives no second address to the same ID): an offline boot of many pods does
		// not wait for a DEL before each ADD. A pod with host ports gets its DEL first, so
		// that the old attachment's port rules never shadow the new one's.
		if err := m.setAside(old); err != nil {
			return nil, err
		}
		containerID = nextContainerID(podUID, old.ContainerID)
	case old != nil || isNetNS(path):
		// Left by an earlier setup that did not finish (or with host ports, by a boot before
		// a reboot): CNI DEL first so IPAM releases what it allocated to this pod.
		// Best effort, as before a first setup: a DEL that fails must not keep the pod from
		// running.
		_ = m.del(ctx, c, podUID, namespace, name, old)
	}
	if err := CreateNetNS(path); err != nil {
		return nil, err
	}
	pn := &PodNetwork{NetNSPath: path, ContainerID: containerID, Args: podArgs(podUID, namespace, name), PortMappings: ports}
	for _, n := range c.GetConfig().Networks {
		pn.Attachments = append(pn.Attachments, Attachment{ConfList: json.RawMessage(n.Config.Source), IfName: n.IFName})
	}
	// Intent first: should the agent die during ADD, the next setup or teardown knows what to
	// DEL.
	if err := fsutil.WriteJSONAtomic(m.recordPath(podUID), pn); err != nil {
		return nil, err
	}
	opts := []gocni.NamespaceOpts{gocni.WithLabels(pn.Args)}
	if len(ports) > 0 {
		opts = append(opts, gocni.WithCapabilityPortMap(ports))
	}
	res, err := c.Setup(ctx, containerID, path, opts...)
	// What IPAM refused may be held by attachments this boot does not use: the previous
	// boots' (set aside; released now), or, when the pod had no record at all, one no record
	// remembers under this very container ID (the state directory lost or wiped, IPAM's
	// allocations kept: host-local then refuses a "duplicate allocation"). With them
	// released (this attempt's DEL releases the latter), once more. A first ADD pays nothing
	// for it; only one that failed does.
	if err != nil && (m.releaseStale(ctx, "") > 0 || old == nil) {
		if derr := m.del(ctx, c, podUID, namespace, name, pn); derr == nil {
			res, err = c.Setup(ctx, containerID, path, opts...)
		}
	}
	if err != nil {
		if derr := m.del(ctx, c, podUID, namespace, name, pn); derr != nil {
			err = fmt.Errorf("%w (and CNI DEL after it: %v)", err, derr)
		}
		_ = RemoveNetNS(path)
		return nil, fmt.Errorf("CNI setup of pod %s/%s: %w", namespace, name, err)
	}
	for ifname, cfg := range res.Interfaces {
		if ifname == "lo" {
			continue
		}
		for _, ipc := range cfg.IPConfigs {
			pn.IPs = append(pn.IPs, ipc.IP.String())
		}
	}
	pn.Complete = true
	if err := fsutil.WriteJSONAtomic(m.recordPath(podUID), pn); err != nil {
		return nil, err
	}
	return pn, nil
}

// del runs CNI DEL for a pod: from its record when it has one (the configuration, interfaces
// and arguments ADD used), else with the current configuration. A namespace that is gone (a
// reboot) is passed as the empty path, which the CNI spec allows for DEL: IPAM still releases
// the addresses and portmap its rules.
func (m *Manager) del(ctx context.Context, c gocni.CNI, podUID, namespace, name string, rec *PodNetwork) error {
	path := m.netnsPath(podUID)
	if rec != nil && rec.NetNSPath != "" {
		path = rec.NetNSPath
	}
	if !isNetNS(path) || rec != nil && rec.SetAside {
		path = ""
	}
	if rec == nil || len(rec.Attachments) == 0 {
		// A record written before holdfast kept what DEL needs.
		if c == nil {
			var err error
			if c, err = m.load(); err != nil {
				return err
			}
		}
		opts := []gocni.NamespaceOpts{gocni.WithLabels(podArgs(podUID, namespace, name))}
		if rec != nil && len(rec.PortMappings) > 0 {
			opts = append(opts, gocni.WithCapabilityPortMap(rec.PortMappings))
		}
		return c.Remove(ctx, podUID, path, opts...)
	}
	cni := libcni.NewCNIConfig(m.binDirs, nil)
	var errs []error
	for i := len(rec.Attachments) - 1; i >= 0; i-- { // in the reverse order of ADD
		a := rec.Attachments[i]
		list, err := libcni.ConfListFromBytes(a.ConfList)
		if err != nil {
			errs = append(errs, fmt.Errorf("recorded network %d: %w", i, err))
			continue
		}
		rt := &libcni.RuntimeConf{ContainerID: rec.ContainerID, NetNS: path, IfName: a.IfName, CapabilityArgs: map[string]any{}}
		for k, v := range rec.Args {
			rt.Args = append(rt.Args, [2]string{k, v})
		}
		if len(rec.PortMappings) > 0 {
			rt.CapabilityArgs["portMappings"] = rec.PortMappings
		}
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			errs = append(errs, fmt.Errorf("DEL %s on %s: %w", list.Name, a.IfName, err))
		}
	}
	return errors.Join(errs...)
}

// Teardown runs CNI DEL and removes the namespace and the record. Tearing down a pod with
// no network is not an error. DEL runs whenever there is a record, with the namespace or
// without it (after a reboot): otherwise IPAM would keep the pod's addresses for ever. The
// pod's attachments a reboot left, not released yet, are released too.
func (m *Manager) Teardown(ctx context.Context, podUID, namespace, name string) error {
	if m.releaseStale(ctx, podUID) < 0 {
		return fmt.Errorf("CNI teardown of pod %s/%s: an attachment of a previous boot could not be released", namespace, name)
	}
	path := m.netnsPath(podUID)
	if rec := m.record(podUID); rec != nil || isNetNS(path) {
		if err := m.del(ctx, nil, podUID, namespace, name, rec); err != nil {
			return fmt.Errorf("CNI teardown of pod %s/%s: %w", namespace, name, err)
		}
	}
	if err := RemoveNetNS(path); err != nil {
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
	entries, err := fsutil.ReadDirNoAtime(m.stateDir)
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

// staleDir holds the attachments of previous boots that Setup set aside, one record per CNI
// container ID, until Run or Teardown releases them.
func (m *Manager) staleDir() string { return filepath.Join(m.stateDir, "stale") }

// setAside moves a previous boot's complete record of a pod's attachment to the stale
// directory, without its namespace path: its DEL must never reach the new namespace made at
// the same path.
func (m *Manager) setAside(old *PodNetwork) error {
	old.NetNSPath, old.SetAside = "", true
	if err := os.MkdirAll(m.staleDir(), 0o700); err != nil {
		return fmt.Errorf("set aside the network of a previous boot: %w", err)
	}
	if err := fsutil.WriteJSONAtomic(filepath.Join(m.staleDir(), old.ContainerID+".json"), old); err != nil {
		return fmt.Errorf("set aside the network of a previous boot: %w", err)
	}
	select {
	case m.stale <- struct{}{}:
	default:
	}
	return nil
}

// nextContainerID is the CNI container ID of a pod's next attachment after one with prev:
// the pod's UID, then the UID with a generation that grows with each reboot it lives through.
func nextContainerID(podUID, prev string) string {
	gen := 0
	if s, ok := strings.CutPrefix(prev, podUID+"-g"); ok {
		gen, _ = strconv.Atoi(s)
	}
	return podUID + "-g" + strconv.Itoa(gen+1)
}

// releaseStale runs CNI DEL for the set-aside attachments, of one pod (podUID) or of all
// (""), and removes the records of those released. It returns how many were released, or -1
// if one could not be (its record stays, to be tried again).
func (m *Manager) releaseStale(ctx context.Context, podUID string) int {
	m.staleMu.Lock()
	defer m.staleMu.Unlock()
	entries, err := fsutil.ReadDirNoAtime(m.staleDir())
	if err != nil {
		return 0
	}
	released := 0
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || podUID != "" && id != podUID && !strings.HasPrefix(id, podUID+"-g") {
			continue
		}
		file := filepath.Join(m.staleDir(), e.Name())
		var rec PodNetwork
		b, err := fsutil.ReadFileNoAtime(file)
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil {
			_ = os.Remove(file) // unreadable: nothing could DEL from it, now or later
			continue
		}
		rec.NetNSPath, rec.SetAside = "", true
		if err := m.del(ctx, nil, rec.Args["K8S_POD_UID"], rec.Args["K8S_POD_NAMESPACE"], rec.Args["K8S_POD_NAME"], &rec); err != nil {
			return -1
		}
		if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
			return -1
		}
		released++
	}
	return released
}

// Run releases, until ctx ends, the attachments of previous boots that Setup set aside (and
// those an agent stopped before it released them): each once no pod network has been set up
// for releaseQuiet, so that the DELs do not compete with a boot's ADDs. A release that fails
// is tried again a minute later.
func (m *Manager) Run(ctx context.Context) error {
	pending := true // a previous run of the agent may have left some
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		if pending {
			if !m.waitQuiet(ctx) {
				return nil
			}
			pending = m.releaseStale(ctx, "") < 0
			if pending {
				retry.Reset(time.Minute)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.stale:
			pending = true
		case <-retry.C:
		}
	}
}

// waitQuiet waits until no Setup has run for releaseQuiet, at most releaseMaxWait; false if
// ctx ended first.
func (m *Manager) waitQuiet(ctx context.Context) bool {
	deadline := time.Now().Add(releaseMaxWait)
	for {
		wait := time.Until(time.Unix(0, m.lastSetup.Load()).Add(releaseQuiet))
		if wait <= 0 || time.Now().After(deadline) {
			return true
		}
		t := time.NewTimer(min(wait, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// podArgs are the CNI_ARGS of a pod, as containerd's CRI plugin passes them.
func podArgs(uid, namespace, name string) map[string]string {
	return map[string]string{
		"K8S_POD_NAMESPACE":          namespace,
		"K8S_POD_NAME":               name,
		"K8S_POD_INFRA_CONTAINER_ID": uid,
		"K8S_POD_UID":                uid,
		"IgnoreUnknown":              "1",
	}
}

// PortMappings are the hostPorts of a pod with its own network, as the kubelet hands them to
// the runtime (the regular containers' ports, a name used twice in a container counted once)
// and containerd's CRI plugin passes them to CNI's portmap plugin: ports without a hostPort
// left out, protocols in lower case.
func PortMappings(pod *v1.Pod) []gocni.PortMapping {
	var out []gocni.PortMapping
	for _, c := range pod.Spec.Containers {
		names := map[string]bool{}
		for _, p := range c.Ports {
			family := "any"
			if p.HostIP != "" {
				family = "v4"
				if ip := net.ParseIP(p.HostIP); ip != nil && ip.To4() == nil {
					family = "v6"
				}
			}
			name := p.Name
			if name == "" {
				name = fmt.Sprintf("%s-%s-%s:%d:%d", family, p.Protocol, p.HostIP, p.ContainerPort, p.HostPort)
			}
			if names[name] {
				continue
			}
			names[name] = true
			if p.HostPort <= 0 {
				continue
			}
			proto := strings.ToLower(string(p.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			out = append(out, gocni.PortMapping{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: proto, HostIP: p.HostIP})
		}
	}
	return out
}
