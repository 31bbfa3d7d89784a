package gateway

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Scenario 10 (issue 29): the kubelet's systemd cgroup driver on the gateway's cgroup v2 with
// systemd as init. kubepods, the QoS levels and each pod's cgroup are transient slice units
// with the kubelet's names (kubepods-burstable-pod<uid with - as _>.slice), their limits set
// through systemd and found in the slices' files; each container runs in a scope runc makes
// below its pod's slice; a pods/resize changes the slice's limits in place; a deleted pod's
// slice goes.
func TestScenario10SystemdCgroupDriver(t *testing.T) {
	g := startGatewayWith(t, gatewayOptions{setConfig: map[string]string{"cgroupDriver": "systemd"}})
	// On failure, what systemd and the agent said (before the VM goes: cleanups run last first).
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := g.vm.SSH("systemctl list-units --all --no-pager 'kubepods*' 'holdfast-*'; journalctl -u holdfast --no-pager | grep -i -E 'cgroup|slice|systemd|error' | tail -60")
			t.Logf("the guest's slices and the agent's cgroup log:\n%s", out)
		}
	})
	g.create(resizablePod("resizable"))
	g.create(burstablePod("burstable"))
	g.create(sleeperPod("steady"))
	g.waitAPIRunning(podTimeout, "resizable", "burstable", "steady")

	// sh runs a command in the guest, failing the test or subtest t (not the VM's): tried again
	// for a while, since an ssh session can time out on a loaded machine under emulation.
	sh := func(t *testing.T, command string) string {
		t.Helper()
		var out string
		testenv.Eventually(t, 3*time.Minute, "ssh "+command, func() (err error) {
			out, err = g.vm.SSH(command)
			return err
		})
		return out
	}
	// unit reads systemd's view of a unit: `systemctl show` as key=value.
	unit := func(t *testing.T, name string, props ...string) map[string]string {
		t.Helper()
		props = append(props, "LoadState", "ActiveState", "ControlGroup")
		out := sh(t, "systemctl show "+name+" -p "+strings.Join(props, ","))
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				got[k] = v
			}
		}
		t.Logf("systemctl show %s: %v", name, got)
		return got
	}
	podSlice := func(name, qos string) (unitName, dir string) {
		t.Helper()
		p, err := g.apiPod(name)
		if err != nil {
			t.Fatal(err)
		}
		uid := strings.ReplaceAll(string(p.UID), "-", "_")
		if qos == "" {
			unitName = "kubepods-pod" + uid + ".slice"
			return unitName, "/kubepods.slice/" + unitName
		}
		unitName = "kubepods-" + qos + "-pod" + uid + ".slice"
		return unitName, "/kubepods.slice/kubepods-" + qos + ".slice/" + unitName
	}
	cat := func(t *testing.T, file string) string { t.Helper(); return strings.TrimSpace(sh(t, "cat "+file)) }
	if fs := strings.TrimSpace(sh(t, "stat -fc %T /sys/fs/cgroup")); fs != "cgroup2fs" {
		t.Fatalf("the guest's /sys/fs/cgroup is %s, want cgroup2fs", fs)
	}

	t.Run("kubepods and the QoS levels are slices", func(t *testing.T) {
		for name, cgroup := range map[string]string{
			"kubepods.slice":            "/kubepods.slice",
			"kubepods-burstable.slice":  "/kubepods.slice/kubepods-burstable.slice",
			"kubepods-besteffort.slice": "/kubepods.slice/kubepods-besteffort.slice",
		} {
			u := unit(t, name, "MemoryMax")
			if u["LoadState"] != "loaded" || u["ActiveState"] != "active" || u["ControlGroup"] != cgroup {
				t.Errorf("%s: %v, want loaded, active, in %s", name, u, cgroup)
			}
		}
		if got := cat(t, "/sys/fs/cgroup/kubepods.slice/memory.max"); got == "max" {
			t.Errorf("kubepods.slice/memory.max = max, want the node allocatable")
		}
		if u := unit(t, "kubepods.slice", "MemoryMax"); u["MemoryMax"] == "infinity" || u["MemoryMax"] == "" {
			t.Errorf("kubepods.slice's MemoryMax %q: want the node allocatable, set through systemd", u["MemoryMax"])
		}
		if got := cat(t, "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/cpu.weight"); got != "1" {
			t.Errorf("kubepods-besteffort.slice/cpu.weight = %s, want 1 (2 shares)", got)
		}
	})

	t.Run("pods are slices, containers scopes below them", func(t *testing.T) {
		for _, tt := range []struct {
			pod, qos string
			cpuMax   string
		}{
			{"resizable", "", "20000 100000"},
			{"burstable", "burstable", "max 100000"},
		} {
			name, dir := podSlice(tt.pod, tt.qos)
			u := unit(t, name, "MemoryMax")
			if u["ActiveState"] != "active" || u["ControlGroup"] != dir {
				t.Errorf("%s's slice %s: %v, want active in %s", tt.pod, name, u, dir)
			}
			if u["MemoryMax"] != strconv.Itoa(64<<20) {
				t.Errorf("%s MemoryMax = %s, want %d (64Mi)", name, u["MemoryMax"], 64<<20)
			}
			if got := cat(t, "/sys/fs/cgroup"+dir+"/memory.max"); got != strconv.Itoa(64<<20) {
				t.Errorf("%s/memory.max = %s, want %d (64Mi)", dir, got, 64<<20)
			}
			if got := cat(t, "/sys/fs/cgroup"+dir+"/cpu.max"); got != tt.cpuMax {
				t.Errorf("%s/cpu.max = %q, want %q", dir, got, tt.cpuMax)
			}
			c := g.cgroupDir(tt.pod + "/main")
			if path.Dir(c) != "/sys/fs/cgroup"+dir || !strings.HasPrefix(path.Base(c), "holdfast-") || !strings.HasSuffix(c, ".scope") {
				t.Errorf("%s/main's cgroup is %s, want a holdfast-<id>.scope below %s", tt.pod, c, dir)
			}
		}
		_, dir := podSlice("steady", "besteffort")
		if c := g.cgroupDir("steady/main"); path.Dir(c) != "/sys/fs/cgroup"+dir {
			t.Errorf("steady/main's cgroup is %s, want one below %s", c, dir)
		}
	})

	t.Run("stats read on the slices", func(t *testing.T) {
		raw := sh(t, "/run/holdfast-payload/tools/guestprobe -stats")
		var sum statsapi.Summary
		if err := json.Unmarshal([]byte(raw), &sum); err != nil {
			t.Fatalf("stats summary: %v\n%s", err, raw)
		}
		found := false
		for _, p := range sum.Pods {
			for _, c := range p.Containers {
				if p.PodRef.Name == "burstable" && c.Name == "main" {
					found = c.CPU != nil && c.CPU.UsageCoreNanoSeconds != nil && *c.CPU.UsageCoreNanoSeconds > 0 &&
						c.Memory != nil && c.Memory.WorkingSetBytes != nil && *c.Memory.WorkingSetBytes > 0
				}
			}
		}
		if !found {
			t.Errorf("burstable/main has no CPU or memory usage in the summary: %s", raw)
		}
	})

	t.Run("resize applied to the slice in place", func(t *testing.T) {
		before := g.running()["resizable/main"]
		g.resize("resizable", `{"limits":{"cpu":"400m","memory":"96Mi"},"requests":{"cpu":"400m","memory":"96Mi"}}`)
		testenv.Eventually(t, podTimeout, "the resize reported done", func() error {
			p, err := g.apiPod("resizable")
			if err != nil {
				return err
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.Resources == nil || cs.Resources.Limits.Cpu().String() != "400m" || cs.Resources.Limits.Memory().String() != "96Mi" {
				return fmt.Errorf("status resources %+v", cs.Resources)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == v1.PodResizePending || c.Type == v1.PodResizeInProgress {
					return fmt.Errorf("condition %s %s: %s", c.Type, c.Reason, c.Message)
				}
			}
			return nil
		})
		after := g.running()["resizable/main"]
		if after.ID != before.ID || after.PID != before.PID {
			t.Errorf("container %s pid %d before the resize, %s pid %d after: want the same process", before.ID, before.PID, after.ID, after.PID)
		}
		name, dir := podSlice("resizable", "")
		u := unit(t, name, "MemoryMax", "CPUQuotaPerSecUSec")
		if u["MemoryMax"] != strconv.Itoa(96<<20) || u["CPUQuotaPerSecUSec"] != "400ms" {
			t.Errorf("%s after the resize: %v, want MemoryMax %d and CPUQuotaPerSecUSec 400ms", name, u, 96<<20)
		}
		for _, d := range []string{"/sys/fs/cgroup" + dir, g.cgroupDir("resizable/main")} {
			if got := cat(t, d+"/cpu.max"); got != "40000 100000" {
				t.Errorf("%s/cpu.max = %q, want \"40000 100000\" (400m)", d, got)
			}
			if got := cat(t, d+"/memory.max"); got != strconv.Itoa(96<<20) {
				t.Errorf("%s/memory.max = %s, want %d (96Mi)", d, got, 96<<20)
			}
		}
	})

	t.Run("a deleted pod's slice goes", func(t *testing.T) {
		name, dir := podSlice("burstable", "burstable")
		g.deletePod("burstable")
		g.waitPodGone(podTimeout, "burstable")
		testenv.Eventually(t, podTimeout, name+" gone", func() error {
			out, err := g.vm.SSH("systemctl show " + name + " -p LoadState --value; test -d /sys/fs/cgroup" + dir + " && echo dir-there || echo dir-gone")
			if err != nil {
				return err
			}
			if f := strings.Fields(out); len(f) != 2 || f[0] != "not-found" || f[1] != "dir-gone" {
				return fmt.Errorf("unit and cgroup: %q", out)
			}
			return nil
		})
		if u := unit(t, "kubepods-burstable.slice"); u["ActiveState"] != "active" {
			t.Errorf("kubepods-burstable.slice after its last pod went: %v, want active", u)
		}
	})
}

// burstablePod requests 100m and 32Mi and is limited to 64Mi of memory: Burstable, with a
// memory limit on its pod cgroup and no CPU quota.
func burstablePod(name string) *v1.Pod {
	pod := sleeperPod(name)
	pod.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	return pod
}
