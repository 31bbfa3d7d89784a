package hollow

import (
	"context"
	"hash/fnv"
	"net/netip"
	"path"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/network"
)

// Network gives pods addresses without namespaces or interfaces: each hollow node hands out
// the addresses of a /24 of 10.128.0.0/9 chosen by its name, so that pods report IPs as on a
// real node. Two nodes may draw the same /24: nothing routes to these addresses.
type Network struct {
	mu     sync.Mutex // protects pods, next
	subnet netip.Prefix
	pods   map[string]*network.PodNetwork
	next   uint8 // the last host part handed out
}

// NewNetwork returns the network of the hollow node named nodeName.
func NewNetwork(nodeName string) *Network {
	h := fnv.New32a()
	h.Write([]byte(nodeName))
	n := h.Sum32()
	subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128 | byte(n>>8&0x7f), byte(n), 0}), 24)
	return &Network{subnet: subnet, pods: map[string]*network.PodNetwork{}, next: 1}
}

// Ready: the network is always configured.
func (n *Network) Ready() error { return nil }

// Run has nothing to release: a hollow node's addresses go back at Teardown. It returns when
// ctx ends, as the CNI manager's does.
func (n *Network) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Setup gives a pod with its own network the next free address; a pod set up already keeps
// its own. A host-network pod gets nothing.
func (n *Network) Setup(_ context.Context, pod *v1.Pod) (*network.PodNetwork, error) {
	if pod.Spec.HostNetwork {
		return &network.PodNetwork{}, nil
	}
	podUID, ports := string(pod.UID), network.PortMappings(pod)
	n.mu.Lock()
	defer n.mu.Unlock()
	if pn, ok := n.pods[podUID]; ok {
		return clonePodNetwork(pn), nil
	}
	ip := n.freeLocked()
	pn := &network.PodNetwork{NetNSPath: path.Join("/run/hollow/netns", podUID), IPs: []string{ip}, Complete: true, PortMappings: ports}
	n.pods[podUID] = pn
	return clonePodNetwork(pn), nil
}

// freeLocked returns an address no pod of the node holds, after the last one handed out
// (.2 to .254, the gateway .1 left out); with all 253 taken it hands one out again.
func (n *Network) freeLocked() string {
	taken := map[string]bool{}
	for _, pn := range n.pods {
		taken[pn.IPs[0]] = true
	}
	base := n.subnet.Addr().As4()
	for range 253 {
		n.next++
		if n.next < 2 || n.next > 254 {
			n.next = 2
		}
		base[3] = n.next
		if ip := netip.AddrFrom4(base).String(); !taken[ip] {
			return ip
		}
	}
	return netip.AddrFrom4(base).String()
}

// Teardown releases the pod's address.
func (n *Network) Teardown(_ context.Context, podUID, _, _ string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.pods, podUID)
	return nil
}

// Get returns the pod's network, nil when it has none.
func (n *Network) Get(podUID string) *network.PodNetwork {
	n.mu.Lock()
	defer n.mu.Unlock()
	if pn, ok := n.pods[podUID]; ok {
		return clonePodNetwork(pn)
	}
	return nil
}

// NetNSPath returns the made-up namespace path of a pod set up, "" otherwise.
func (n *Network) NetNSPath(podUID string) string {
	if pn := n.Get(podUID); pn != nil {
		return pn.NetNSPath
	}
	return ""
}

// Known returns the pods with an address.
func (n *Network) Known() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.pods))
	for uid := range n.pods {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out
}

func clonePodNetwork(pn *network.PodNetwork) *network.PodNetwork {
	c := *pn
	c.IPs = slices.Clone(pn.IPs)
	c.PortMappings = slices.Clone(pn.PortMappings)
	return &c
}
