package network

import (
	"fmt"
	"net"
	"os"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The limits the apiserver enforces on a pod's dnsConfig, applied by the kubelet to the
// composed configuration as well (k8s.io/kubernetes/pkg/apis/core/validation).
const (
	maxDNSNameservers     = 3
	maxDNSSearchPaths     = 32
	maxDNSSearchListChars = 2048
)

// Host resolver files: /etc/resolv.conf, and the file systemd-resolved keeps with the real
// upstream servers when /etc/resolv.conf points at its loopback stub (127.0.0.53).
const (
	HostResolvConf    = "/etc/resolv.conf"
	SystemdResolvConf = "/run/systemd/resolve/resolv.conf"
)

// DNSSettings is the node's DNS configuration: the kubelet's clusterDNS, clusterDomain and
// resolvConf.
type DNSSettings struct {
	// ClusterDNS are the cluster DNS servers of ClusterFirst pods; empty: ClusterFirst falls
	// back to Default, with a MissingClusterDNS event, as with the kubelet.
	ClusterDNS []string
	// ClusterDomain is the cluster's DNS domain (cluster.local).
	ClusterDomain string
}

// ResolvConf is the content of a resolv.conf: nameservers, search domains and options.
type ResolvConf struct {
	Servers  []string
	Searches []string
	Options  []string
}

// Bytes renders the file as containerd's CRI plugin writes a sandbox's resolv.conf from the
// kubelet's DNSConfig.
func (r ResolvConf) Bytes() []byte {
	var b strings.Builder
	if len(r.Searches) > 0 {
		b.WriteString("search " + strings.Join(r.Searches, " ") + "\n")
	}
	if len(r.Servers) > 0 {
		b.WriteString("nameserver " + strings.Join(r.Servers, "\nnameserver ") + "\n")
	}
	if len(r.Options) > 0 {
		b.WriteString("options " + strings.Join(r.Options, " ") + "\n")
	}
	return []byte(b.String())
}

// DNSEvent is a Warning event the DNS configuration of a pod gives rise to, worded as the
// kubelet's; OnNode events go to the Node, the others to the pod.
type DNSEvent struct {
	OnNode  bool
	Reason  string
	Message string
}

// ReadHostResolvConf reads the host's resolver configuration, the base of Default pods and the
// source of the search path ClusterFirst pods inherit. When path names only loopback servers
// (systemd-resolved's stub 127.0.0.53, or a local dnsmasq) and systemdPath exists, systemdPath is
// read instead: a loopback server is unreachable from a pod's own network namespace, so the
// kubelet is pointed at /run/systemd/resolve/resolv.conf on systemd hosts. A missing file is an
// empty configuration: a gateway without DNS still runs its pods.
func ReadHostResolvConf(path, systemdPath string) (ResolvConf, error) {
	rc, err := readResolvConfFile(path)
	if err != nil {
		return ResolvConf{}, err
	}
	if len(rc.Servers) > 0 && allLoopback(rc.Servers) && systemdPath != "" {
		if _, err := os.Stat(systemdPath); err == nil {
			return readResolvConfFile(systemdPath)
		}
	}
	return rc, nil
}

func readResolvConfFile(path string) (ResolvConf, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return ResolvConf{}, nil
	}
	if err != nil {
		return ResolvConf{}, fmt.Errorf("read resolver configuration: %w", err)
	}
	return ParseResolvConf(string(b)), nil
}

func allLoopback(servers []string) bool {
	for _, s := range servers {
		if ip := net.ParseIP(s); ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// ParseResolvConf parses a resolv.conf as the kubelet does: nameserver lines accumulate, the
// last search line wins (trailing dots dropped, "." ignored), options accumulate with a later
// option replacing an earlier one of the same name.
func ParseResolvConf(content string) ResolvConf {
	var rc ResolvConf
	for _, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) >= 2 {
				rc.Servers = append(rc.Servers, f[1])
			}
		case "search":
			rc.Searches = []string{}
			for _, s := range f[1:] {
				if s != "." {
					rc.Searches = append(rc.Searches, strings.TrimSuffix(s, "."))
				}
			}
		case "options":
			rc.Options = mergeOptions(rc.Options, f[1:]...)
		}
	}
	return rc
}

// PodDNS composes a pod's resolv.conf from its dnsPolicy and dnsConfig, the node's settings and
// the host's resolver configuration, as the kubelet's dns.Configurer.GetPodDNS does (which
// containerd then writes): ClusterFirst gets the cluster servers, the search path
// NAMESPACE.svc.DOMAIN svc.DOMAIN DOMAIN followed by the host's, and ndots:5; Default (and
// ClusterFirst on the host network) the host's; None nothing; dnsConfig is appended; the
// result is cut to 3 nameservers and 32 search domains of at most 2048 characters in all.
// The events are the kubelet's MissingClusterDNS and DNSConfigForming.
func PodDNS(pod *v1.Pod, s DNSSettings, host ResolvConf) (ResolvConf, []DNSEvent) {
	var events []DNSEvent
	rc := ResolvConf{
		Servers:  append([]string(nil), host.Servers...),
		Searches: append([]string(nil), host.Searches...),
		Options:  append([]string(nil), host.Options...),
	}
	cluster := false
	switch pod.Spec.DNSPolicy {
	case v1.DNSNone:
		rc = ResolvConf{}
	case v1.DNSClusterFirstWithHostNet:
		cluster = true
	case v1.DNSDefault:
	default: // ClusterFirst, and what the apiserver defaults an empty policy to
		cluster = !pod.Spec.HostNetwork
	}
	if cluster && len(s.ClusterDNS) == 0 {
		msg := fmt.Sprintf("kubelet does not have ClusterDNS IP configured and cannot create Pod using %q policy. Falling back to %q policy.", v1.DNSClusterFirst, v1.DNSDefault)
		events = append(events,
			DNSEvent{OnNode: true, Reason: "MissingClusterDNS", Message: msg},
			DNSEvent{Reason: "MissingClusterDNS", Message: fmt.Sprintf("pod: %q. %s", formatPod(pod), msg)})
		cluster = false
	}
	if cluster {
		rc.Servers = append([]string(nil), s.ClusterDNS...)
		if s.ClusterDomain != "" {
			rc.Searches = omitDuplicates(append([]string{
				pod.Namespace + ".svc." + s.ClusterDomain, "svc." + s.ClusterDomain, s.ClusterDomain,
			}, rc.Searches...))
		}
		rc.Options = []string{"ndots:5"}
	}
	if dc := pod.Spec.DNSConfig; dc != nil {
		rc.Servers = omitDuplicates(append(rc.Servers, dc.Nameservers...))
		rc.Searches = omitDuplicates(append(rc.Searches, dc.Searches...))
		for _, o := range dc.Options {
			opt := o.Name
			if o.Value != nil && *o.Value != "" {
				opt += ":" + *o.Value
			}
			rc.Options = mergeOptions(rc.Options, opt)
		}
	}
	if len(rc.Servers) > maxDNSNameservers {
		rc.Servers = rc.Servers[:maxDNSNameservers]
		events = append(events, DNSEvent{Reason: "DNSConfigForming", Message: "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: " + strings.Join(rc.Servers, " ")})
	}
	var cut bool
	if rc.Searches, cut = searchesWithinLimits(rc.Searches); cut {
		events = append(events, DNSEvent{Reason: "DNSConfigForming", Message: "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: " + strings.Join(rc.Searches, " ")})
	}
	return rc, events
}

// searchesWithinLimits keeps the first 32 search domains, drops any longer than a DNS name
// may be (glibc aborts on them), and cuts from the end until the line fits 2048 characters.
func searchesWithinLimits(searches []string) ([]string, bool) {
	cut := false
	if len(searches) > maxDNSSearchPaths {
		searches, cut = searches[:maxDNSSearchPaths], true
	}
	kept := searches[:0:0]
	for _, s := range searches {
		if len(s) > validation.DNS1123SubdomainMaxLength {
			cut = true
			continue
		}
		kept = append(kept, s)
	}
	for len(kept) > 0 && len(strings.Join(kept, " ")) > maxDNSSearchListChars {
		kept, cut = kept[:len(kept)-1], true
	}
	return kept, cut
}

// mergeOptions adds options, a later one replacing an earlier one of the same name in place
// (ndots:2 replaces ndots:5). The kubelet merges through a map, in random order; holdfast keeps
// the order of first appearance so that the file does not change from one sync to the next.
func mergeOptions(options []string, more ...string) []string {
	out := append([]string(nil), options...)
	for _, o := range more {
		name, _, _ := strings.Cut(o, ":")
		replaced := false
		for i, e := range out {
			if en, _, _ := strings.Cut(e, ":"); en == name {
				out[i], replaced = o, true
				break
			}
		}
		if !replaced {
			out = append(out, o)
		}
	}
	return out
}

func omitDuplicates(s []string) []string {
	seen := map[string]bool{}
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// formatPod is the kubelet's format.Pod: NAME_NAMESPACE(UID).
func formatPod(pod *v1.Pod) string {
	return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
}
