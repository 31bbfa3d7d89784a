package network

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func dnsPod(policy v1.DNSPolicy, hostNetwork bool, cfg *v1.PodDNSConfig) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "u1"},
		Spec:       v1.PodSpec{DNSPolicy: policy, HostNetwork: hostNetwork, DNSConfig: cfg},
	}
}

// TestPodDNS: each dnsPolicy composes resolv.conf as the kubelet's dns configurer does.
func TestPodDNS(t *testing.T) {
	host := ResolvConf{Servers: []string{"192.0.2.53", "192.0.2.54"}, Searches: []string{"plant.example"}, Options: []string{"edns0"}}
	cluster := DNSSettings{ClusterDNS: []string{"10.96.0.10"}, ClusterDomain: "cluster.local"}
	clusterSearch := []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "plant.example"}
	missing := []DNSEvent{
		{OnNode: true, Reason: "MissingClusterDNS", Message: `kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy.`},
		{Reason: "MissingClusterDNS", Message: `pod: "web_shop(u1)". kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy.`},
	}
	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		settings DNSSettings
		want     ResolvConf
		events   []DNSEvent
	}{
		{"ClusterFirst", dnsPod(v1.DNSClusterFirst, false, nil), cluster,
			ResolvConf{Servers: []string{"10.96.0.10"}, Searches: clusterSearch, Options: []string{"ndots:5"}}, nil},
		{"ClusterFirst on the host network is Default", dnsPod(v1.DNSClusterFirst, true, nil), cluster, host, nil},
		{"ClusterFirstWithHostNet", dnsPod(v1.DNSClusterFirstWithHostNet, true, nil), cluster,
			ResolvConf{Servers: []string{"10.96.0.10"}, Searches: clusterSearch, Options: []string{"ndots:5"}}, nil},
		{"Default", dnsPod(v1.DNSDefault, false, nil), cluster, host, nil},
		{"ClusterFirst without clusterDNS falls back to Default", dnsPod(v1.DNSClusterFirst, false, nil),
			DNSSettings{ClusterDomain: "cluster.local"}, host, missing},
		{"None with dnsConfig", dnsPod(v1.DNSNone, false, &v1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1"}, Searches: []string{"a.example"},
			Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("2")}, {Name: "edns0"}},
		}), cluster, ResolvConf{Servers: []string{"1.1.1.1"}, Searches: []string{"a.example"}, Options: []string{"ndots:2", "edns0"}}, nil},
		{"ClusterFirst with dnsConfig appended, duplicates dropped, options replaced", dnsPod(v1.DNSClusterFirst, false, &v1.PodDNSConfig{
			Nameservers: []string{"10.96.0.10", "1.1.1.1"}, Searches: []string{"svc.cluster.local", "b.example"},
			Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("1")}, {Name: "single-request"}},
		}), cluster, ResolvConf{Servers: []string{"10.96.0.10", "1.1.1.1"}, Searches: append(clusterSearch, "b.example"),
			Options: []string{"ndots:1", "single-request"}}, nil},
		{"more than 3 nameservers", dnsPod(v1.DNSDefault, false, &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "8.8.8.8"}}), cluster,
			ResolvConf{Servers: []string{"192.0.2.53", "192.0.2.54", "1.1.1.1"}, Searches: host.Searches, Options: host.Options},
			[]DNSEvent{{Reason: "DNSConfigForming", Message: "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 192.0.2.53 192.0.2.54 1.1.1.1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, events := PodDNS(tc.pod, tc.settings, host)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("resolv.conf:\n got %+v\nwant %+v", got, tc.want)
			}
			if !reflect.DeepEqual(events, tc.events) {
				t.Errorf("events:\n got %+v\nwant %+v", events, tc.events)
			}
		})
	}
}

// TestPodDNSSearchLimits: more than 32 search domains keep the first 32; a line longer than
// 2048 characters loses domains from its end; each with the kubelet's DNSConfigForming event.
func TestPodDNSSearchLimits(t *testing.T) {
	var many []string
	for i := range 40 {
		many = append(many, fmt.Sprintf("d%d.example", i))
	}
	got, events := PodDNS(dnsPod(v1.DNSNone, false, &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: many}), DNSSettings{}, ResolvConf{})
	if len(got.Searches) != 32 || got.Searches[31] != "d31.example" {
		t.Errorf("searches = %v, want the first 32", got.Searches)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0].Message, "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: d0.example d1.example") {
		t.Errorf("events = %+v", events)
	}
	long := []string{strings.Repeat("a", 250) + ".example"}
	for range 9 {
		long = append(long, strings.Repeat("b", 240)+fmt.Sprintf("%d.example", len(long)))
	}
	got, events = PodDNS(dnsPod(v1.DNSNone, false, &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: long}), DNSSettings{}, ResolvConf{})
	if l := len(strings.Join(got.Searches, " ")); l > 2048 || len(got.Searches) != 8 || len(events) != 1 {
		t.Errorf("search line of %d characters, %d domains, events %+v: want at most 2048, the first 8 kept, one event", l, len(got.Searches), events)
	}
}

func TestResolvConfBytes(t *testing.T) {
	rc := ResolvConf{Servers: []string{"10.96.0.10", "1.1.1.1"}, Searches: []string{"a", "b"}, Options: []string{"ndots:5"}}
	want := "search a b\nnameserver 10.96.0.10\nnameserver 1.1.1.1\noptions ndots:5\n"
	if got := string(rc.Bytes()); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := ParseResolvConf(want); !reflect.DeepEqual(got, rc) {
		t.Errorf("parsed back: %+v", got)
	}
}

// TestReadHostResolvConf: a host resolv.conf naming only systemd-resolved's stub is replaced by
// the upstream servers systemd-resolved keeps, when that file exists; otherwise it is kept.
func TestReadHostResolvConf(t *testing.T) {
	dir := t.TempDir()
	stub := filepath.Join(dir, "resolv.conf")
	upstream := filepath.Join(dir, "systemd-resolv.conf")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(stub, "# stub\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan.\n")
	got, err := ReadHostResolvConf(stub, upstream)
	if err != nil || !reflect.DeepEqual(got.Servers, []string{"127.0.0.53"}) || !reflect.DeepEqual(got.Searches, []string{"lan"}) {
		t.Errorf("without the systemd file: %+v, %v; want the stub as it is", got, err)
	}
	write(upstream, "nameserver 192.0.2.1\nnameserver 192.0.2.2\nsearch lan\n")
	got, err = ReadHostResolvConf(stub, upstream)
	if err != nil || !reflect.DeepEqual(got.Servers, []string{"192.0.2.1", "192.0.2.2"}) {
		t.Errorf("with the systemd file: %+v, %v; want its upstream servers", got, err)
	}
	write(stub, "nameserver 127.0.0.53\nnameserver 192.0.2.9\n")
	if got, _ = ReadHostResolvConf(stub, upstream); !reflect.DeepEqual(got.Servers, []string{"127.0.0.53", "192.0.2.9"}) {
		t.Errorf("a host file with a non-loopback server is kept: %+v", got)
	}
	if got, err = ReadHostResolvConf(filepath.Join(dir, "none"), upstream); err != nil || len(got.Servers) != 0 {
		t.Errorf("missing host file: %+v, %v; want empty", got, err)
	}
}

func TestPodHostnameAndHostsFile(t *testing.T) {
	fqdn := true
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop"},
		Spec: v1.PodSpec{Hostname: "web", Subdomain: "backend", SetHostnameAsFQDN: &fqdn,
			HostAliases: []v1.HostAlias{{IP: "192.0.2.7", Hostnames: []string{"plc", "plc.lan"}}}}}
	h, d, err := PodHostnameAndDomain(pod, "cluster.local")
	if err != nil || h != "web" || d != "backend.shop.svc.cluster.local" {
		t.Fatalf("got %q %q %v", h, d, err)
	}
	if k, err := KernelHostname(pod, h, d); err != nil || k != "web.backend.shop.svc.cluster.local" {
		t.Errorf("kernel hostname %q %v", k, err)
	}
	want := "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n" +
		"10.1.2.3\tweb.backend.shop.svc.cluster.local\tweb\n\n# Entries added by HostAliases.\n192.0.2.7\tplc\tplc.lan\n"
	if got := string(HostsFile([]string{"10.1.2.3"}, h, d, pod.Spec.HostAliases)); got != want {
		t.Errorf("hosts file:\n%s\nwant:\n%s", got, want)
	}
	node := "127.0.0.1 localhost\n192.0.2.1 gw\n"
	want = "# Kubernetes-managed hosts file (host network).\n" + node + "\n# Entries added by HostAliases.\n192.0.2.7\tplc\tplc.lan\n"
	if got := string(NodeHostsFile([]byte(node), pod.Spec.HostAliases)); got != want {
		t.Errorf("host-network hosts file:\n%s\nwant:\n%s", got, want)
	}
	long := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("a", 62) + "-b"}}
	if h, _, _ := PodHostnameAndDomain(long, "cluster.local"); h != strings.Repeat("a", 62) {
		t.Errorf("truncated hostname %q", h)
	}
	pod.Spec.Hostname = strings.Repeat("h", 40)
	h, d, _ = PodHostnameAndDomain(pod, "cluster.local")
	if _, err := KernelHostname(pod, h, d); err == nil || !strings.Contains(err.Error(), "is too long (64 characters is the max") {
		t.Errorf("FQDN too long: %v", err)
	}
}
