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

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// cgroupFile reads a file of a running container's cgroup for a controller ("devices/devices.list").
func (e *env) cgroupFile(t *testing.T, containerID, file string) string {
	t.Helper()
	controller, name, _ := strings.Cut(file, "/")
	return readCgroupFile(t, e.containerCgroupDir(t, containerID, controller), name)
}

// containerCgroupDir is the directory of the container's cgroup for controller, from its
// task's /proc/<pid>/cgroup.
func (e *env) containerCgroupDir(t *testing.T, containerID, controller string) string {
	t.Helper()
	dir, err := cgroups.Host().ProcessDir(e.taskPid(t, containerID), controller)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func readCgroupFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestResourcesAndSecurityContext: limits become cgroup settings the container sees, an OOM
// kill is reported as OOMKilled, the QoS class is the API's, and the securityContext fields
// take effect, runAsNonRoot refusing an image that runs as root with a clear reason.
func TestResourcesAndSecurityContext(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")

	limited := sleeperPod("limited", true)
	limited.Spec.Containers[0] = step("main", "id -u; id -g; touch /probe-write 2>/dev/null && echo rootfs-writable || echo rootfs-readonly; grep Cap /proc/self/status; exec sleep 3600")
	limited.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m"), v1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	uid, gid, ro, no := int64(1234), int64(2345), true, false
	limited.Spec.Containers[0].SecurityContext = &v1.SecurityContext{
		RunAsUser: &uid, RunAsGroup: &gid, ReadOnlyRootFilesystem: &ro, AllowPrivilegeEscalation: &no,
		Capabilities:   &v1.Capabilities{Drop: []v1.Capability{"ALL"}},
		SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault},
	}

	hog := sleeperPod("hog", true)
	hog.Spec.RestartPolicy = v1.RestartPolicyNever
	hog.Spec.Containers[0] = step("main", "head -c 200m /dev/zero | tail")
	hog.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("24Mi")}

	rootless := sleeperPod("rootless", true)
	yes := true
	rootless.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: &yes}

	// privileged gets every capability the runtime has, the host's devices, a writable /sys and
	// no seccomp filter, even though it asks to drop every capability and for the default
	// seccomp profile (as with containerd's CRI plugin); plain, the same container without
	// privileged, gets its default profile and none of the rest.
	privileged := sleeperPod("privileged", true)
	runtimeDefault := &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}
	privileged.Spec.Containers[0].SecurityContext = &v1.SecurityContext{
		Privileged:     &yes,
		Capabilities:   &v1.Capabilities{Drop: []v1.Capability{"ALL"}},
		SeccompProfile: runtimeDefault,
	}
	plain := sleeperPod("plain", true)
	plain.Spec.Containers[0].SecurityContext = &v1.SecurityContext{SeccompProfile: runtimeDefault}

	for _, p := range []*v1.Pod{limited, hog, rootless, privileged, plain} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := e.waitAPIRunning(t, "limited")["limited"]
	if running.Status.QOSClass != v1.PodQOSBurstable {
		t.Errorf("qosClass %s, want Burstable", running.Status.QOSClass)
	}
	testenv.Eventually(t, 30*time.Second, "limits and identity seen inside the container", func() error {
		out := e.podLog(t, running, "main")
		// A non-root process has no effective capabilities whatever it may keep: the bounding
		// set is what shows that drop ALL dropped them all.
		for _, want := range []string{"1234", "2345", "rootfs-readonly", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("output %q lacks %q", out, want)
			}
		}
		return nil
	})

	// The cgroup the runtime put the container in carries the limits, on either hierarchy.
	id := strings.TrimPrefix(running.Status.ContainerStatuses[0].ContainerID, "containerd://")
	h := cgroups.Host()
	limits, err := h.Limits(e.taskPid(t, id))
	if err != nil {
		t.Fatal(err)
	}
	want := cgroups.Limits{CPUQuota: 50000, CPUPeriod: 100000, CPUShares: 256, MemoryMax: 64 << 20}
	if h.Mode == cgroups.Unified {
		// runc writes the weight of the shares; runc 1.1 (Debian 12) converts linearly, later
		// releases with a quadratic fit (35 for 256 shares).
		want.CPUShares, want.CPUWeight = 0, cgroups.SharesToWeight(256)
		if limits.CPUWeight == 35 {
			want.CPUWeight = 35
		}
	}
	if limits != want {
		t.Errorf("cgroup %s limits %+v, want %+v", h.Mode, limits, want)
	}

	testenv.Eventually(t, 60*time.Second, "memory hog OOMKilled", func() error {
		p, err := pods.Get(ctx, "hog", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.Reason != "OOMKilled" || p.Status.Phase != v1.PodFailed {
			return fmt.Errorf("phase %s terminated %+v", p.Status.Phase, term)
		}
		return nil
	})

	e.checkPrivileged(t)

	testenv.Eventually(t, 60*time.Second, "runAsNonRoot refuses the root image", func() error {
		p, err := pods.Get(ctx, "rootless", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		if w == nil || w.Reason != "CreateContainerConfigError" || !strings.Contains(w.Message, "runAsNonRoot and image will run as root") {
			return fmt.Errorf("waiting %+v", w)
		}
		return nil
	})
}

// capSysAdmin is CAP_SYS_ADMIN's bit in the CapEff mask of /proc/PID/status.
const capSysAdmin = 21

// capEff returns the CapEff mask of a /proc/PID/status.
func capEff(t *testing.T, status string) uint64 {
	t.Helper()
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("CapEff %q: %v", v, err)
			}
			return mask
		}
	}
	t.Fatalf("no CapEff in %q", status)
	return 0
}

// checkPrivileged compares the pods "privileged" (securityContext.privileged) and "plain" (the
// same container without it), seen from inside: the privileged one has every capability the
// agent has (CapEff of its PID 1), the host's device nodes in /dev and access to every device
// in its devices cgroup; the plain one has the runtime's default capabilities (not
// CAP_SYS_ADMIN), a minimal /dev and a device allow-list.
func (e *env) checkPrivileged(t *testing.T) {
	t.Helper()
	ids := map[string]string{}
	for name, p := range e.waitAPIRunning(t, "privileged", "plain") {
		ids[name] = strings.TrimPrefix(containerIDOf(p), "containerd://")
	}
	// The agent runs as root with the test's capabilities; the privileged container gets them all.
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	host := capEff(t, string(self))
	caps, devs := map[string]uint64{}, map[string][]string{}
	seccompMode, sysMount := map[string]string{}, map[string]string{}
	for name, id := range ids {
		status, err := e.exec(id, "cat", "/proc/1/status")
		if err != nil {
			t.Fatalf("%s: read /proc/1/status: %v", name, err)
		}
		caps[name] = capEff(t, status)
		if m := regexp.MustCompile(`(?m)^Seccomp:\s*(\d)`).FindStringSubmatch(status); m != nil {
			seccompMode[name] = m[1]
		}
		mounts, err := e.exec(id, "cat", "/proc/mounts")
		if err != nil {
			t.Fatalf("%s: read /proc/mounts: %v", name, err)
		}
		for _, line := range strings.Split(mounts, "\n") {
			if f := strings.Fields(line); len(f) >= 4 && f[1] == "/sys" {
				sysMount[name] = strings.Split(f[3], ",")[0]
			}
		}
		ls, err := e.exec(id, "ls", "-1", "/dev")
		if err != nil {
			t.Fatalf("%s: ls /dev: %v", name, err)
		}
		devs[name] = strings.Fields(ls)
	}
	if caps["privileged"] != host {
		t.Errorf("privileged container CapEff %016x, want the agent's %016x", caps["privileged"], host)
	}
	// Seccomp: 0 is no filter, 2 a filter (the runtime's default profile).
	if seccompMode["privileged"] != "0" || seccompMode["plain"] != "2" {
		t.Errorf("seccomp mode of PID 1: privileged %q, plain %q; want 0 (unconfined) and 2 (filtered)", seccompMode["privileged"], seccompMode["plain"])
	}
	if sysMount["privileged"] != "rw" || sysMount["plain"] != "ro" {
		t.Errorf("/sys mounted privileged %q, plain %q; want rw and ro", sysMount["privileged"], sysMount["plain"])
	}
	if caps["plain"]&(1<<capSysAdmin) != 0 || caps["plain"] == host {
		t.Errorf("plain container CapEff %016x: must be the runtime's default set, without CAP_SYS_ADMIN (host %016x)", caps["plain"], host)
	}

	// Every device node at the top of the host's /dev is in the privileged container's
	// (/dev/console is the runtime's own); some of them are not in the plain container's.
	entries, err := os.ReadDir("/dev")
	if err != nil {
		t.Fatal(err)
	}
	var hostDevs, privilegedLacks, plainLacks []string
	for _, de := range entries {
		if de.Type()&os.ModeDevice == 0 || de.Name() == "console" {
			continue
		}
		hostDevs = append(hostDevs, de.Name())
		if !slices.Contains(devs["privileged"], de.Name()) {
			privilegedLacks = append(privilegedLacks, de.Name())
		}
		if !slices.Contains(devs["plain"], de.Name()) {
			plainLacks = append(plainLacks, de.Name())
		}
	}
	if len(privilegedLacks) > 0 {
		t.Errorf("host devices %v missing in the privileged container's /dev %v", privilegedLacks, devs["privileged"])
	}
	t.Logf("CapEff privileged %016x, plain %016x; the plain container lacks %d of the host's %d devices (%v...)",
		caps["privileged"], caps["plain"], len(plainLacks), len(hostDevs), plainLacks[:min(3, len(plainLacks))])
	if len(plainLacks) == 0 {
		t.Errorf("the plain container has every host device %v: %v", hostDevs, devs["plain"])
	}
	if cgroups.Host().Mode == cgroups.Unified {
		// cgroup v2 has no devices.list: runc enforces the allow-list with an eBPF program.
		return
	}
	if got := e.cgroupFile(t, ids["privileged"], "devices/devices.list"); got != "a *:* rwm" {
		t.Errorf("privileged devices cgroup %q, want every device allowed", got)
	}
	if got := e.cgroupFile(t, ids["plain"], "devices/devices.list"); strings.Contains(got, "a *:* rwm") {
		t.Errorf("plain devices cgroup allows every device: %q", got)
	}
}
