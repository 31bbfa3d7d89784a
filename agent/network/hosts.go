package network

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// hostnameMaxLen is the kernel's limit on a hostname: 64 bytes with the terminating NUL.
const hostnameMaxLen = 63

// PodHostnameAndDomain returns the pod's hostname and its DNS domain, as the kubelet's
// GeneratePodHostNameAndDomain: hostnameOverride, else spec.hostname, else the pod name, cut to
// 63 characters (without a trailing '-' or '.'); the domain is SUBDOMAIN.NAMESPACE.svc.DOMAIN
// when spec.subdomain is set, empty otherwise.
func PodHostnameAndDomain(pod *v1.Pod, clusterDomain string) (hostname, domain string, err error) {
	if o := pod.Spec.HostnameOverride; o != nil {
		if msgs := validation.IsDNS1123Subdomain(*o); len(msgs) != 0 {
			return "", "", fmt.Errorf("pod HostnameOverride %q is not a valid DNS subdomain: %s", *o, strings.Join(msgs, ";"))
		}
		h, err := truncateHostname(pod.Name, *o)
		return h, "", err
	}
	hostname = pod.Name
	if h := pod.Spec.Hostname; h != "" {
		if msgs := validation.IsDNS1123Label(h); len(msgs) != 0 {
			return "", "", fmt.Errorf("pod Hostname %q is not a valid DNS label: %s", h, strings.Join(msgs, ";"))
		}
		hostname = h
	}
	if hostname, err = truncateHostname(pod.Name, hostname); err != nil {
		return "", "", err
	}
	if sd := pod.Spec.Subdomain; sd != "" {
		if msgs := validation.IsDNS1123Label(sd); len(msgs) != 0 {
			return "", "", fmt.Errorf("pod Subdomain %q is not a valid DNS label: %s", sd, strings.Join(msgs, ";"))
		}
		domain = fmt.Sprintf("%s.%s.svc.%s", sd, pod.Namespace, clusterDomain)
	}
	return hostname, domain, nil
}

func truncateHostname(podName, hostname string) (string, error) {
	if len(hostname) <= hostnameMaxLen {
		return hostname, nil
	}
	truncated := strings.TrimRight(hostname[:hostnameMaxLen], "-.")
	if truncated == "" {
		return "", fmt.Errorf("hostname for pod %q was invalid: %q", podName, hostname)
	}
	return truncated, nil
}

// KernelHostname is the hostname the pod's UTS namespace gets: the FQDN HOSTNAME.DOMAIN when
// setHostnameAsFQDN asks for it and there is a domain, the short name otherwise (the kubelet's
// GetNodenameForKernel, with its message when the FQDN does not fit).
func KernelHostname(pod *v1.Pod, hostname, domain string) (string, error) {
	if domain == "" || pod.Spec.SetHostnameAsFQDN == nil || !*pod.Spec.SetHostnameAsFQDN {
		return hostname, nil
	}
	fqdn := hostname + "." + domain
	if len(fqdn) > hostnameMaxLen+1 {
		return "", fmt.Errorf("failed to construct FQDN from pod hostname and cluster domain, FQDN %s is too long (%d characters is the max, %d characters requested)", fqdn, hostnameMaxLen+1, len(fqdn))
	}
	return fqdn, nil
}

// HostsFile is the pod's managed /etc/hosts, byte for byte the kubelet's: localhost entries,
// each pod IP with the pod's FQDN (when it has a domain) and hostname, then the hostAliases.
func HostsFile(podIPs []string, hostname, domain string, aliases []v1.HostAlias) []byte {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file.\n")
	b.WriteString("127.0.0.1\tlocalhost\n")
	b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	b.WriteString("fe00::0\tip6-localnet\n")
	b.WriteString("fe00::0\tip6-mcastprefix\n")
	b.WriteString("fe00::1\tip6-allnodes\n")
	b.WriteString("fe00::2\tip6-allrouters\n")
	for _, ip := range podIPs {
		if domain != "" {
			fmt.Fprintf(&b, "%s\t%s.%s\t%s\n", ip, hostname, domain, hostname)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
		}
	}
	writeHostAliases(&b, aliases)
	return []byte(b.String())
}

// NodeHostsFile is a host-network pod's /etc/hosts, as the kubelet writes it: the node's own
// hosts file under a header, then the pod's hostAliases.
func NodeHostsFile(node []byte, aliases []v1.HostAlias) []byte {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file (host network).\n")
	b.Write(node)
	writeHostAliases(&b, aliases)
	return []byte(b.String())
}

func writeHostAliases(b *strings.Builder, aliases []v1.HostAlias) {
	if len(aliases) == 0 {
		return
	}
	b.WriteString("\n# Entries added by HostAliases.\n")
	for _, a := range aliases {
		fmt.Fprintf(b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
}
