package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/apparmor"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Capability bits in the masks of /proc/PID/status.
const (
	capChown          = 0
	capNetBindService = 10
	capNetRaw         = 13
)

// capMask returns the mask of a Cap* line ("CapEff", "CapBnd", "CapPrm") of a /proc/PID/status.
func capMask(t *testing.T, status, field string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + field + `:\s*([0-9a-f]+)$`).FindStringSubmatch(status)
	if m == nil {
		t.Fatalf("no %s in %q", field, status)
	}
	v, err := strconv.ParseUint(m[1], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// statusLine returns the value of a line of a /proc/PID/status ("Gid", "Seccomp").
func statusLine(status, field string) string {
	m := regexp.MustCompile(`(?m)^` + field + `:\s*(.*)$`).FindStringSubmatch(status)
	if m == nil {
		return ""
	}
	return strings.TrimSpace(m[1])
}

// denyMkdir is a seccomp profile that lets everything through but mkdir, which fails with EPERM.
const denyMkdir = `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}`

// TestSecurityContextAndNamespaces: capabilities follow the CRI plugin's rule (drop ALL clears
// the set, then add) for a root container, exactly; runAsGroup alone sets the group; a
// host-network pod shares the host's hostname and UTS namespace, hostPID and hostIPC the host's
// PID and IPC namespaces; sysctls of the safe set and of allowedUnsafeSysctls are set inside
// the pod and not on the host, others are refused with kubelet's SysctlForbidden (net.* ones
// for host-network pods too: the API refuses those already, admission's unit test covers them);
// a Localhost seccomp profile is loaded from seccompProfileRoot and
// a missing one fails the container, naming the file; AppArmor profiles are refused where the
// host does not enforce them. Pods are written as users write them: service account token
// mounted, API defaults.
func TestSecurityContextAndNamespaces(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.AllowedUnsafeSysctls = []string{"net.core.somaxconn"}
		// The default seccompProfileRoot: <stateDir>/seccomp.
		dir := filepath.Join(c.StateDir, "seccomp", "profiles")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "deny-mkdir.json"), []byte(denyMkdir), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	publishRootCA(t, e, "default")
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	root := int64(0)
	hostShmRmid, err := os.ReadFile("/proc/sys/kernel/shm_rmid_forced")
	if err != nil {
		t.Fatal(err)
	}

	newPod := func(name string, hostNetwork bool, sc *v1.SecurityContext) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
			NodeName: node, HostNetwork: hostNetwork, TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []v1.Container{{Name: "main", Image: testenv.BusyboxImage, Command: []string{"sleep", "3600"}, SecurityContext: sc}},
		}}
	}
	exact := newPod("caps-exact", true, &v1.SecurityContext{RunAsUser: &root,
		Capabilities: &v1.Capabilities{Drop: []v1.Capability{"ALL"}, Add: []v1.Capability{"NET_BIND_SERVICE", "CHOWN"}}})
	noRaw := newPod("caps-no-raw", true, &v1.SecurityContext{RunAsUser: &root, Capabilities: &v1.Capabilities{Drop: []v1.Capability{"NET_RAW"}}})
	plain := newPod("plain", false, nil)
	groupOnly := newPod("group-only", true, &v1.SecurityContext{RunAsGroup: ptr.To[int64](3456)})
	hostNS := newPod("host-ns", true, nil)
	hostNS.Spec.HostPID, hostNS.Spec.HostIPC = true, true
	sysctls := newPod("sysctls", false, nil)
	sysctls.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{
		{Name: "kernel.shm_rmid_forced", Value: "1"},
		{Name: "net.ipv4.ip_local_port_range", Value: "40000 50000"},
		{Name: "net.core.somaxconn", Value: "2048"},
	}}
	unsafe := newPod("sysctl-unsafe", true, nil)
	unsafe.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "kernel.msgmax", Value: "65536"}}}
	seccompLocal := newPod("seccomp-local", true, &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{
		Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("profiles/deny-mkdir.json")}})
	seccompMissing := newPod("seccomp-missing", true, &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{
		Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("profiles/absent.json")}})
	appArmor := newPod("apparmor", true, &v1.SecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}})
	// fsGroup: a non-root user reaches its volumes through the group, as with kubelet.
	fsGroup := newPod("fsgroup", true, nil)
	fsGroup.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), FSGroup: ptr.To[int64](2000),
		FSGroupChangePolicy: ptr.To(v1.FSGroupChangeOnRootMismatch)}
	fsGroup.Spec.Volumes = []v1.Volume{
		{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "mem", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
		{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds", DefaultMode: ptr.To[int32](0o400)}}},
	}
	fsGroup.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}, {Name: "mem", MountPath: "/mem"}, {Name: "creds", MountPath: "/creds"}}
	if _, err := e.cp.Admin.CoreV1().Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Two pods with networks of their own, one after the other: under -race go-cni's locks are
	// go-deadlock's, which report concurrent network setups as recursive locking and exit.
	for _, p := range []*v1.Pod{plain, exact, noRaw, groupOnly, hostNS, unsafe, seccompLocal, seccompMissing, appArmor, fsGroup} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitAPIRunning(t, "plain")
	if _, err := pods.Create(ctx, sysctls, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names := []string{"caps-exact", "caps-no-raw", "plain", "group-only", "host-ns", "sysctls", "seccomp-local", "fsgroup"}
	if apparmor.HostSupports() {
		names = append(names, "apparmor")
	}
	running := e.waitAPIRunning(t, names...)
	status := map[string]string{}
	for _, n := range names {
		out, err := e.exec(strings.TrimPrefix(containerIDOf(running[n]), "containerd://"), "cat", "/proc/1/status")
		if err != nil {
			t.Fatalf("%s: read /proc/1/status: %v", n, err)
		}
		status[n] = out
	}
	run := func(pod string, cmd ...string) string {
		t.Helper()
		out, err := e.exec(strings.TrimPrefix(containerIDOf(running[pod]), "containerd://"), cmd...)
		if err != nil {
			t.Fatalf("%s: %v: %v (%s)", pod, cmd, err, out)
		}
		return strings.TrimSpace(out)
	}

	// Capabilities of root containers: exactly the added ones after drop ALL, in every set.
	want := uint64(1<<capNetBindService | 1<<capChown)
	for _, set := range []string{"CapEff", "CapBnd", "CapPrm"} {
		if got := capMask(t, status["caps-exact"], set); got != want {
			t.Errorf("drop ALL, add NET_BIND_SERVICE, CHOWN: %s %016x, want %016x", set, got, want)
		}
	}
	def := capMask(t, status["plain"], "CapEff")
	if def&(1<<capNetRaw) == 0 {
		t.Fatalf("the runtime's default set %016x lacks NET_RAW", def)
	}
	for _, set := range []string{"CapEff", "CapBnd", "CapPrm"} {
		if got := capMask(t, status["caps-no-raw"], set); got != def&^(1<<capNetRaw) {
			t.Errorf("drop NET_RAW: %s %016x, want the default set %016x without NET_RAW", set, got, def)
		}
	}

	// runAsGroup alone: the image's user (root) with that group, real to saved.
	if u, g := run("group-only", "id", "-u"), run("group-only", "id", "-g"); u != "0" || g != "3456" {
		t.Errorf("runAsGroup 3456 alone: id -u %s, id -g %s; want 0 and 3456", u, g)
	}
	if gid := strings.Fields(statusLine(status["group-only"], "Gid")); len(gid) != 4 || strings.Join(gid, " ") != "3456 3456 3456 3456" {
		t.Errorf("runAsGroup 3456 alone: Gid %v, want 3456 four times", gid)
	}

	// Namespaces: the host's for host-ns (UTS with the network), the pod's own for plain.
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if got := run("host-ns", "hostname"); got != hostname {
		t.Errorf("host-network pod hostname %q, want the host's %q", got, hostname)
	}
	if got := run("plain", "hostname"); got != "plain" {
		t.Errorf("pod-network pod hostname %q, want the pod's name", got)
	}
	for _, ns := range []string{"uts", "pid", "ipc", "net"} {
		host, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		if got := run("host-ns", "readlink", "/proc/self/ns/"+ns); got != host {
			t.Errorf("host-ns pod %s namespace %s, want the host's %s", ns, got, host)
		}
		if got := run("plain", "readlink", "/proc/self/ns/"+ns); got == host {
			t.Errorf("plain pod shares the host's %s namespace %s", ns, got)
		}
	}

	// Sysctls: set in the pod's namespaces, the host's untouched.
	for file, want := range map[string]string{
		"kernel/shm_rmid_forced":       "1",
		"net/ipv4/ip_local_port_range": "40000\t50000",
		"net/core/somaxconn":           "2048",
	} {
		if got := run("sysctls", "cat", "/proc/sys/"+file); got != want {
			t.Errorf("sysctl %s = %q in the pod, want %q", file, got, want)
		}
	}
	if now, _ := os.ReadFile("/proc/sys/kernel/shm_rmid_forced"); string(now) != string(hostShmRmid) {
		t.Errorf("the host's kernel.shm_rmid_forced changed from %q to %q", hostShmRmid, now)
	}

	// The Localhost seccomp profile filters; mkdir is denied.
	if mode := statusLine(status["seccomp-local"], "Seccomp"); mode != "2" {
		t.Errorf("seccomp-local: Seccomp mode %q, want 2 (filtered)", mode)
	}
	if out, err := e.exec(strings.TrimPrefix(containerIDOf(running["seccomp-local"]), "containerd://"), "mkdir", "/tmp/x"); err == nil || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("mkdir under the deny-mkdir profile: %v %q, want EPERM", err, out)
	}

	// fsGroup: a supplementary group; the volumes' group, setgid directories (what the user
	// creates joins the group), secrets and the token readable through the group.
	if groups := strings.Fields(run("fsgroup", "id", "-G")); !slices.Contains(groups, "2000") {
		t.Errorf("fsGroup 2000: groups %v", groups)
	}
	for path, want := range map[string]string{
		"/scratch":        "2000 2777",
		"/mem":            "2000 3777", // a tmpfs root's sticky bit kept, as kubelet mounts it
		"/creds/password": "2000 440",
		"/var/run/secrets/kubernetes.io/serviceaccount/token": "2000 640",
	} {
		if got := run("fsgroup", "stat", "-L", "-c", "%g %a", path); got != want {
			t.Errorf("fsGroup 2000: %s group and mode %q, want %q", path, got, want)
		}
	}
	if got := run("fsgroup", "cat", "/creds/password"); got != "hunter2" {
		t.Errorf("user 1000 reads the secret %q through fsGroup, want hunter2", got)
	}
	if got := run("fsgroup", "sh", "-c", "touch /scratch/new && stat -c %g /scratch/new"); got != "2000" {
		t.Errorf("a file user 1000 creates in the emptyDir has group %s, want the fsGroup", got)
	}

	if apparmor.HostSupports() {
		if got := run("apparmor", "cat", "/proc/1/attr/current"); !strings.HasPrefix(got, "cri-containerd.apparmor.d") {
			t.Errorf("apparmor RuntimeDefault: profile %q, want the runtime's default", got)
		}
	}

	// Rejected at admission, as kubelet rejects them.
	rejected := map[string][2]string{
		"sysctl-unsafe": {"SysctlForbidden", `forbidden sysctl: "kernel.msgmax" not allowlisted`},
	}
	if !apparmor.HostSupports() {
		rejected["apparmor"] = [2]string{"AppArmor", "Cannot enforce AppArmor: AppArmor is not enabled on the host"}
	}
	for name, want := range rejected {
		testenv.Eventually(t, 60*time.Second, name+" rejected", func() error {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != v1.PodFailed || p.Status.Reason != want[0] || !strings.Contains(p.Status.Message, want[1]) {
				return fmt.Errorf("phase %s reason %q message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
			}
			return nil
		})
	}

	// A missing Localhost profile: the container is not created, and the error names the file.
	testenv.Eventually(t, 60*time.Second, "seccomp-missing waits with CreateContainerError", func() error {
		p, err := pods.Get(ctx, "seccomp-missing", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		if w == nil || w.Reason != "CreateContainerError" || !strings.Contains(w.Message, filepath.Join("seccomp", "profiles", "absent.json")) {
			return fmt.Errorf("state %+v", p.Status.ContainerStatuses[0].State)
		}
		return nil
	})
}
