package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestPodDNSPolicies: a pod's /etc/resolv.conf, hostname and /etc/hosts as the kubelet makes
// them: ClusterFirst gets clusterDNS, the cluster search path before the host's and ndots:5;
// dnsPolicy None gets exactly its dnsConfig (refused before holdfast implemented it); hostname,
// subdomain and setHostnameAsFQDN give the FQDN as hostname and in /etc/hosts with the
// hostAliases.
func TestPodDNSPolicies(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) { c.ClusterDNS = []string{"10.96.0.10"} })
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	script := "cat /etc/resolv.conf; echo HOSTNAME=$(hostname); cat /etc/hosts; echo END; exec sleep 3600"
	fqdn := true
	clusterFirst := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dns-cluster"}, Spec: v1.PodSpec{
		NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		Hostname: "web", Subdomain: "backend", SetHostnameAsFQDN: &fqdn,
		HostAliases: []v1.HostAlias{{IP: "192.0.2.7", Hostnames: []string{"plc", "plc.lan"}}},
		Containers:  []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", script}}},
	}}
	ndots := "2"
	none := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dns-none"}, Spec: v1.PodSpec{
		NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		DNSPolicy: v1.DNSNone, DNSConfig: &v1.PodDNSConfig{Nameservers: []string{"192.0.2.53"}, Searches: []string{"plant.example"},
			Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: &ndots}}},
		HostAliases: []v1.HostAlias{{IP: "192.0.2.8", Hostnames: []string{"historian"}}},
		Containers:  []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", script}}},
	}}
	for _, p := range []*v1.Pod{clusterFirst, none} {
		created, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		*p = *created
	}

	host, err := network.ReadHostResolvConf(network.HostResolvConf, network.SystemdResolvConf)
	if err != nil {
		t.Fatal(err)
	}
	search := append([]string{"default.svc.cluster.local", "svc.cluster.local", "cluster.local"}, host.Searches...)
	out := waitOutput(t, e, clusterFirst, "c", "END")
	for _, want := range []string{
		"search " + strings.Join(search, " ") + "\nnameserver 10.96.0.10\noptions ndots:5\n",
		"HOSTNAME=web.backend.default.svc.cluster.local\n",
		"\tweb.backend.default.svc.cluster.local\tweb\n",
		"# Entries added by HostAliases.\n192.0.2.7\tplc\tplc.lan\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ClusterFirst pod printed:\n%s\nwant it to contain %q", out, want)
		}
	}
	out = waitOutput(t, e, none, "c", "END")
	if want := "search plant.example\nnameserver 192.0.2.53\noptions ndots:2\nHOSTNAME="; !strings.HasPrefix(out, want) {
		t.Errorf("dnsPolicy None pod printed:\n%s\nwant it to start with %q", out, want)
	}
	// A host-network pod's /etc/hosts is the node's, with its hostAliases after it.
	hosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Kubernetes-managed hosts file (host network).\n" + string(hosts) + "\n# Entries added by HostAliases.\n192.0.2.8\thistorian\nEND\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("host-network pod printed:\n%s\nwant it to end with:\n%s", out, want)
	}
}

// TestPodDNSWithoutClusterDNS: with no clusterDNS configured a ClusterFirst pod falls back to the
// host's resolver configuration, with the kubelet's MissingClusterDNS event on the pod.
func TestPodDNSWithoutClusterDNS(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dns-fallback"}, Spec: v1.PodSpec{
		NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
			Command: []string{"sh", "-c", "cat /etc/resolv.conf; echo END; exec sleep 3600"}}},
	}}
	created, err := e.cp.Admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	host, err := network.ReadHostResolvConf(network.HostResolvConf, network.SystemdResolvConf)
	if err != nil {
		t.Fatal(err)
	}
	if out := waitOutput(t, e, created, "c", "END"); out != string(host.Bytes())+"END\n" {
		t.Errorf("resolv.conf:\n%s\nwant the host's:\n%s", out, host.Bytes())
	}
	testenv.Eventually(t, 30*time.Second, "a MissingClusterDNS event on the pod", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=dns-fallback,reason=MissingClusterDNS"})
		if err != nil {
			return err
		}
		if len(evs.Items) == 0 {
			return fmt.Errorf("none yet")
		}
		if want := `pod: "dns-fallback_default(` + string(created.UID) + `)". kubelet does not have ClusterDNS IP configured`; !strings.HasPrefix(evs.Items[0].Message, want) {
			return fmt.Errorf("message %q, want it to start with %q", evs.Items[0].Message, want)
		}
		return nil
	})
}
