package gateway

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	testpoll "github.com/holdfast-dev/holdfast/test/poll"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Scenario 10 (issue 29): the kubelet's systemd cgroup driver on the gateway's cgroup v2 with
// systemd as init, holdfast on its containerd backend. kubepods, the QoS levels and each pod's
// cgroup are transient slice units with the kubelet's names (kubepods-burstable-pod<uid with -
// as _>.slice), their limits set through systemd and found in the slices' files; each container
// runs in a scope runc makes below its pod's slice; a pods/resize changes the slice's limits in
// place; a deleted pod's slice goes.
//
// The guest is read in few ssh sessions (guestState), each tried again at a slow pace: under
// software emulation on a loaded machine one session can take longer than ssh waits, and a
// burst of them fills sshd's queue of unauthenticated connections (its first runs here failed
// on "Connection timed out during banner exchange" at a host load of 20 to 27).
func TestScenario10SystemdCgroupDriver(t *testing.T) {
	g := startGatewayWith(t, gatewayOptions{setConfig: map[string]string{"cgroupDriver": "systemd"}})
	systemdCgroupDriver(t, g, "holdfast-", unified)
}

// Scenario 11 (issue 29): scenario 10 on holdfast's CRI backend (runtime: cri), the guest's
// containerd CRI plugin with runc's systemd cgroup driver (SystemdCgroup = true), as the
// kubelet runs there: holdfast makes the pod's slice and gives it to the runtime as the
// sandbox's cgroup parent; runc makes each container a cri-containerd-<id>.scope below it; a
// resize goes through UpdateContainerResources to the container's scope and holdfast's own
// update of the pod's slice.
func TestScenario11CRISystemdCgroupDriver(t *testing.T) {
	g := startGatewayWith(t, gatewayOptions{setConfig: map[string]string{"cgroupDriver": "systemd"}, cri: true})
	systemdCgroupDriver(t, g, "cri-containerd-", unified)
}

// Scenario 12 (issue 29): scenario 10 on cgroup v1, systemd's legacy hierarchy
// (systemd.unified_cgroup_hierarchy=0: a tree per controller), as older gateway images boot:
// the slices get their limits through systemd's cgroup v1 properties (MemoryLimit, CPUShares)
// and the limits are found in the memory and cpu controllers' trees.
func TestScenario12SystemdCgroupDriverOnCgroupV1(t *testing.T) {
	g := startGatewayWith(t, gatewayOptions{
		setConfig:  map[string]string{"cgroupDriver": "systemd"},
		kernelArgs: []string{"systemd.unified_cgroup_hierarchy=0"},
	})
	systemdCgroupDriver(t, g, "holdfast-", legacy)
}

// hierarchy is the guest's cgroup hierarchy: where a cgroup's limits are and how they read.
type hierarchy struct{ v1 bool }

var (
	unified = hierarchy{}         // cgroup v2
	legacy  = hierarchy{v1: true} // cgroup v1, a tree per controller
)

// fsType is what stat -fc %T says /sys/fs/cgroup is.
func (h hierarchy) fsType() string {
	if h.v1 {
		return "tmpfs"
	}
	return "cgroup2fs"
}

// memoryMax and cpuQuota are the files of cgroup dir's memory limit and CFS quota; cpuWeight
// the file of its CPU share.
func (h hierarchy) memoryMax(dir string) string {
	if h.v1 {
		return "/sys/fs/cgroup/memory" + dir + "/memory.limit_in_bytes"
	}
	return "/sys/fs/cgroup" + dir + "/memory.max"
}

func (h hierarchy) cpuQuota(dir string) string {
	if h.v1 {
		return "/sys/fs/cgroup/cpu,cpuacct" + dir + "/cpu.cfs_quota_us"
	}
	return "/sys/fs/cgroup" + dir + "/cpu.max"
}

func (h hierarchy) cpuWeight(dir string) string {
	if h.v1 {
		return "/sys/fs/cgroup/cpu,cpuacct" + dir + "/cpu.shares"
	}
	return "/sys/fs/cgroup" + dir + "/cpu.weight"
}

// quota is cpuQuota's content for a limit of millicores (0: none) at the 100 ms period.
func (h hierarchy) quota(millicores int) string {
	switch {
	case h.v1 && millicores == 0:
		return "-1"
	case h.v1:
		return strconv.Itoa(millicores * 100)
	case millicores == 0:
		return "max 100000"
	default:
		return fmt.Sprintf("%d 100000", millicores*100)
	}
}

// leastWeight is cpuWeight's content for the kubelet's least share (2, BestEffort's).
func (h hierarchy) leastWeight() string {
	if h.v1 {
		return "2"
	}
	return "1"
}

// unlimitedMemory says whether memoryMax's content is no limit.
func (h hierarchy) unlimitedMemory(v string) bool {
	if h.v1 {
		return v == "9223372036854771712" // PAGE_COUNTER_MAX pages of 4 KiB
	}
	return v == "max"
}

// memoryProperty is the slice unit's memory limit as systemd takes it on this hierarchy.
func (h hierarchy) memoryProperty() string {
	if h.v1 {
		return "MemoryLimit"
	}
	return "MemoryMax"
}

// systemdCgroupDriver checks a gateway running with cgroupDriver: systemd on hierarchy h whose
// runtime names each container's scope scopePrefix<id>.scope.
func systemdCgroupDriver(t *testing.T, g *gateway, scopePrefix string, h hierarchy) {
	sh := func(t *testing.T, command string) string {
		t.Helper()
		var out string
		testpoll.Until(t, 6*time.Minute, 20*time.Second, "ssh "+command, func() (err error) {
			out, err = g.vm.SSH(command)
			return err
		})
		return out
	}
	// On failure, what systemd and the agent said (before the VM goes: cleanups run last first).
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := g.vm.SSH("systemctl list-units --all --no-pager --plain 'kubepods*' '" + scopePrefix + "*'; journalctl -u holdfast -u containerd --no-pager | grep -i -E 'cgroup|slice|systemd|error' | tail -60")
			t.Logf("the guest's slices and the agent's cgroup log:\n%s", out)
		}
	})
	g.create(resizablePod("resizable"))
	g.create(burstablePod("burstable"))
	g.create(sleeperPod("steady"))
	g.waitAPIRunning(podTimeout, "resizable", "burstable", "steady")

	podSlice := func(t *testing.T, name, qos string) (unitName, dir string) {
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
	resizableUnit, resizableDir := podSlice(t, "resizable", "")
	burstableUnit, burstableDir := podSlice(t, "burstable", "burstable")
	_, steadyDir := podSlice(t, "steady", "besteffort")
	units := []string{"kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice", resizableUnit, burstableUnit}
	files := []string{
		h.memoryMax("/kubepods.slice"),
		h.cpuWeight("/kubepods.slice/kubepods-besteffort.slice"),
		h.memoryMax(resizableDir), h.cpuQuota(resizableDir),
		h.memoryMax(burstableDir), h.cpuQuota(burstableDir),
	}
	st := g.guestState(t, sh, units, files)
	if fs := st.files["stat -fc %T /sys/fs/cgroup"]; fs != h.fsType() {
		t.Fatalf("the guest's /sys/fs/cgroup is %q, want %s", fs, h.fsType())
	}

	t.Run("kubepods and the QoS levels are slices", func(t *testing.T) {
		for name, cgroup := range map[string]string{
			"kubepods.slice":            "/kubepods.slice",
			"kubepods-burstable.slice":  "/kubepods.slice/kubepods-burstable.slice",
			"kubepods-besteffort.slice": "/kubepods.slice/kubepods-besteffort.slice",
		} {
			u := st.units[name]
			if u["LoadState"] != "loaded" || u["ActiveState"] != "active" || u["ControlGroup"] != cgroup {
				t.Errorf("%s: %v, want loaded, active, in %s", name, u, cgroup)
			}
		}
		if f := h.memoryMax("/kubepods.slice"); h.unlimitedMemory(st.files[f]) || st.files[f] == "" {
			t.Errorf("%s = %q, want the node allocatable", f, st.files[f])
		}
		if p := h.memoryProperty(); st.units["kubepods.slice"][p] == "infinity" || st.units["kubepods.slice"][p] == "" {
			t.Errorf("kubepods.slice's %s %q: want the node allocatable, set through systemd", p, st.units["kubepods.slice"][p])
		}
		if f := h.cpuWeight("/kubepods.slice/kubepods-besteffort.slice"); st.files[f] != h.leastWeight() {
			t.Errorf("%s = %q, want %s (2 shares)", f, st.files[f], h.leastWeight())
		}
	})

	t.Run("pods are slices, containers scopes below them", func(t *testing.T) {
		for _, tt := range []struct {
			pod, unit, dir string
			cpuMax         string
		}{
			{"resizable", resizableUnit, resizableDir, h.quota(200)},
			{"burstable", burstableUnit, burstableDir, h.quota(0)},
		} {
			u := st.units[tt.unit]
			if u["ActiveState"] != "active" || u["ControlGroup"] != tt.dir {
				t.Errorf("%s's slice %s: %v, want active in %s", tt.pod, tt.unit, u, tt.dir)
			}
			if p := h.memoryProperty(); u[p] != strconv.Itoa(64<<20) {
				t.Errorf("%s %s = %s, want %d (64Mi)", tt.unit, p, u[p], 64<<20)
			}
			if f := h.memoryMax(tt.dir); st.files[f] != strconv.Itoa(64<<20) {
				t.Errorf("%s = %s, want %d (64Mi)", f, st.files[f], 64<<20)
			}
			if f := h.cpuQuota(tt.dir); st.files[f] != tt.cpuMax {
				t.Errorf("%s = %q, want %q", f, st.files[f], tt.cpuMax)
			}
			c := st.cgroup[tt.pod+"/main"]
			if path.Dir(c) != tt.dir || !strings.HasPrefix(path.Base(c), scopePrefix) || !strings.HasSuffix(c, ".scope") {
				t.Errorf("%s/main's cgroup is %q, want a %s<id>.scope below %s", tt.pod, c, scopePrefix, tt.dir)
			}
		}
		if c := st.cgroup["steady/main"]; path.Dir(c) != steadyDir {
			t.Errorf("steady/main's cgroup is %q, want one below %s", c, steadyDir)
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
		before := st.containers["resizable/main"]
		g.resize("resizable", `{"limits":{"cpu":"400m","memory":"96Mi"},"requests":{"cpu":"400m","memory":"96Mi"}}`)
		testenv.Eventually(t, podTimeout, "the resize reported done", func() error {
			_, err := g.resized("resizable", "400m", "96Mi")
			return err
		})
		container := st.cgroup["resizable/main"]
		after := g.guestState(t, sh, []string{resizableUnit}, []string{
			h.cpuQuota(resizableDir), h.memoryMax(resizableDir), h.cpuQuota(container), h.memoryMax(container),
		})
		if a := after.containers["resizable/main"]; a.ID != before.ID || a.PID != before.PID {
			t.Errorf("container %s pid %d before the resize, %s pid %d after: want the same process", before.ID, before.PID, a.ID, a.PID)
		}
		u := after.units[resizableUnit]
		if p := h.memoryProperty(); u[p] != strconv.Itoa(96<<20) || u["CPUQuotaPerSecUSec"] != "400ms" {
			t.Errorf("%s after the resize: %v, want %s %d and CPUQuotaPerSecUSec 400ms", resizableUnit, u, p, 96<<20)
		}
		for _, d := range []string{resizableDir, container} {
			if f := h.cpuQuota(d); after.files[f] != h.quota(400) {
				t.Errorf("%s = %q, want %q (400m)", f, after.files[f], h.quota(400))
			}
			if f := h.memoryMax(d); after.files[f] != strconv.Itoa(96<<20) {
				t.Errorf("%s = %s, want %d (96Mi)", f, after.files[f], 96<<20)
			}
		}
	})

	t.Run("a deleted pod's slice goes", func(t *testing.T) {
		g.deletePod("burstable")
		g.waitPodGone(podTimeout, "burstable")
		testpoll.Until(t, podTimeout, 20*time.Second, burstableUnit+" gone", func() error {
			// A stopped transient slice may stay loaded (inactive) until systemd collects it: run 4
			// (docs/runs) saw "loaded" with its cgroup gone.
			out, err := g.vm.SSH("systemctl show " + burstableUnit + " -p ActiveState --value; test -d " + path.Dir(h.memoryMax(burstableDir)) + " && echo dir-there || echo dir-gone; systemctl show kubepods-burstable.slice -p ActiveState --value")
			if err != nil {
				return err
			}
			if f := strings.Fields(out); len(f) != 3 || f[0] != "inactive" || f[1] != "dir-gone" || f[2] != "active" {
				return fmt.Errorf("pod slice's ActiveState, its cgroup, the burstable level's ActiveState: %q", out)
			}
			return nil
		})
	})
}

// guestSnapshot is what guestState read in the guest.
type guestSnapshot struct {
	units      map[string]map[string]string // systemctl show, by unit
	files      map[string]string            // contents, trimmed, by path (and the cgroup fs type)
	containers map[string]Container         // running, by "pod/container"
	cgroup     map[string]string            // each running container's cgroup (procCgroupPath)
}

// guestState reads, in two ssh sessions, the running containers and their cgroups, the units'
// properties (systemctl show, with LoadState, ActiveState, ControlGroup, MemoryMax, MemoryLimit,
// CPUQuotaPerSecUSec) and the files.
func (g *gateway) guestState(t *testing.T, sh func(*testing.T, string) string, units, files []string) guestSnapshot {
	t.Helper()
	s := guestSnapshot{units: map[string]map[string]string{}, files: map[string]string{}, containers: map[string]Container{}, cgroup: map[string]string{}}
	var cs []Container
	if err := json.Unmarshal([]byte(sh(t, g.probeCommand())), &cs); err != nil {
		t.Fatalf("the guest's containers: %v", err)
	}
	cs = withoutSandboxes(cs)
	var script strings.Builder
	script.WriteString("echo '@file stat -fc %T /sys/fs/cgroup'; stat -fc %T /sys/fs/cgroup; ")
	for _, c := range cs {
		if c.Task == "running" {
			key := c.pod() + "/" + c.container()
			s.containers[key] = c
			fmt.Fprintf(&script, "echo '@cgroup %s'; cat /proc/%d/cgroup; ", key, c.PID)
		}
	}
	for _, u := range units {
		fmt.Fprintf(&script, "echo '@unit %s'; systemctl show %s -p LoadState,ActiveState,ControlGroup,MemoryMax,MemoryLimit,CPUQuotaPerSecUSec; ", u, u)
	}
	for _, f := range files {
		fmt.Fprintf(&script, "echo '@file %s'; cat %s; ", f, f)
	}
	var kind, key string
	var body []string
	flush := func() {
		text := strings.TrimSpace(strings.Join(body, "\n"))
		switch kind {
		case "file":
			s.files[key] = text
		case "cgroup":
			s.cgroup[key] = procCgroupPath(text)
		case "unit":
			props := map[string]string{}
			for _, line := range body {
				if k, v, ok := strings.Cut(line, "="); ok {
					props[k] = v
				}
			}
			s.units[key] = props
		}
		body = nil
	}
	for _, line := range strings.Split(sh(t, script.String()+"true"), "\n") {
		if rest, ok := strings.CutPrefix(line, "@"); ok {
			flush()
			kind, key, _ = strings.Cut(rest, " ")
			continue
		}
		body = append(body, line)
	}
	flush()
	t.Logf("guest state: units %v files %v cgroups %v", s.units, s.files, s.cgroup)
	return s
}

// procCgroupPath is a process's cgroup in the hierarchy, from its /proc/PID/cgroup: the
// memory controller's on cgroup v1 (with systemd's hybrid layout the file has a "0::" line
// too, systemd's own tree), the one "0::" line's on v2.
func procCgroupPath(procCgroup string) string {
	var unified string
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			return parts[2]
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
		}
	}
	return unified
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
