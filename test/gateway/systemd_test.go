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

	testpoll "github.com/holdfast-dev/holdfast/test/poll"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Scenario 10 (issue 29): the kubelet's systemd cgroup driver on the gateway's cgroup v2 with
// systemd as init. kubepods, the QoS levels and each pod's cgroup are transient slice units
// with the kubelet's names (kubepods-burstable-pod<uid with - as _>.slice), their limits set
// through systemd and found in the slices' files; each container runs in a scope runc makes
// below its pod's slice; a pods/resize changes the slice's limits in place; a deleted pod's
// slice goes.
//
// The guest is read in few ssh sessions (guestState), each tried again at a slow pace: under
// software emulation on a loaded machine one session can take longer than ssh waits, and a
// burst of them fills sshd's queue of unauthenticated connections (its first runs here failed
// on "Connection timed out during banner exchange" at a host load of 20 to 27).
func TestScenario10SystemdCgroupDriver(t *testing.T) {
	g := startGatewayWith(t, gatewayOptions{setConfig: map[string]string{"cgroupDriver": "systemd"}})
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
			out, _ := g.vm.SSH("systemctl list-units --all --no-pager --plain 'kubepods*' 'holdfast-*'; journalctl -u holdfast --no-pager | grep -i -E 'cgroup|slice|systemd|error' | tail -60")
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
		"/sys/fs/cgroup/kubepods.slice/memory.max",
		"/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/cpu.weight",
		"/sys/fs/cgroup" + resizableDir + "/memory.max", "/sys/fs/cgroup" + resizableDir + "/cpu.max",
		"/sys/fs/cgroup" + burstableDir + "/memory.max", "/sys/fs/cgroup" + burstableDir + "/cpu.max",
	}
	st := g.guestState(t, sh, units, files)
	if fs := st.files["stat -fc %T /sys/fs/cgroup"]; fs != "cgroup2fs" {
		t.Fatalf("the guest's /sys/fs/cgroup is %q, want cgroup2fs", fs)
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
		if got := st.files["/sys/fs/cgroup/kubepods.slice/memory.max"]; got == "max" || got == "" {
			t.Errorf("kubepods.slice/memory.max = %q, want the node allocatable", got)
		}
		if got := st.units["kubepods.slice"]["MemoryMax"]; got == "infinity" || got == "" {
			t.Errorf("kubepods.slice's MemoryMax %q: want the node allocatable, set through systemd", got)
		}
		if got := st.files["/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/cpu.weight"]; got != "1" {
			t.Errorf("kubepods-besteffort.slice/cpu.weight = %q, want 1 (2 shares)", got)
		}
	})

	t.Run("pods are slices, containers scopes below them", func(t *testing.T) {
		for _, tt := range []struct {
			pod, unit, dir string
			cpuMax         string
		}{
			{"resizable", resizableUnit, resizableDir, "20000 100000"},
			{"burstable", burstableUnit, burstableDir, "max 100000"},
		} {
			u := st.units[tt.unit]
			if u["ActiveState"] != "active" || u["ControlGroup"] != tt.dir {
				t.Errorf("%s's slice %s: %v, want active in %s", tt.pod, tt.unit, u, tt.dir)
			}
			if u["MemoryMax"] != strconv.Itoa(64<<20) {
				t.Errorf("%s MemoryMax = %s, want %d (64Mi)", tt.unit, u["MemoryMax"], 64<<20)
			}
			if got := st.files["/sys/fs/cgroup"+tt.dir+"/memory.max"]; got != strconv.Itoa(64<<20) {
				t.Errorf("%s/memory.max = %s, want %d (64Mi)", tt.dir, got, 64<<20)
			}
			if got := st.files["/sys/fs/cgroup"+tt.dir+"/cpu.max"]; got != tt.cpuMax {
				t.Errorf("%s/cpu.max = %q, want %q", tt.dir, got, tt.cpuMax)
			}
			c := st.cgroup[tt.pod+"/main"]
			if path.Dir(c) != tt.dir || !strings.HasPrefix(path.Base(c), "holdfast-") || !strings.HasSuffix(c, ".scope") {
				t.Errorf("%s/main's cgroup is %q, want a holdfast-<id>.scope below %s", tt.pod, c, tt.dir)
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
		container := "/sys/fs/cgroup" + st.cgroup["resizable/main"]
		after := g.guestState(t, sh, []string{resizableUnit}, []string{
			"/sys/fs/cgroup" + resizableDir + "/cpu.max", "/sys/fs/cgroup" + resizableDir + "/memory.max",
			container + "/cpu.max", container + "/memory.max",
		})
		if a := after.containers["resizable/main"]; a.ID != before.ID || a.PID != before.PID {
			t.Errorf("container %s pid %d before the resize, %s pid %d after: want the same process", before.ID, before.PID, a.ID, a.PID)
		}
		u := after.units[resizableUnit]
		if u["MemoryMax"] != strconv.Itoa(96<<20) || u["CPUQuotaPerSecUSec"] != "400ms" {
			t.Errorf("%s after the resize: %v, want MemoryMax %d and CPUQuotaPerSecUSec 400ms", resizableUnit, u, 96<<20)
		}
		for _, d := range []string{"/sys/fs/cgroup" + resizableDir, container} {
			if got := after.files[d+"/cpu.max"]; got != "40000 100000" {
				t.Errorf("%s/cpu.max = %q, want \"40000 100000\" (400m)", d, got)
			}
			if got := after.files[d+"/memory.max"]; got != strconv.Itoa(96<<20) {
				t.Errorf("%s/memory.max = %s, want %d (96Mi)", d, got, 96<<20)
			}
		}
	})

	t.Run("a deleted pod's slice goes", func(t *testing.T) {
		g.deletePod("burstable")
		g.waitPodGone(podTimeout, "burstable")
		testpoll.Until(t, podTimeout, 20*time.Second, burstableUnit+" gone", func() error {
			// A stopped transient slice may stay loaded (inactive) until systemd collects it: run 4
			// (docs/runs) saw "loaded" with its cgroup gone.
			out, err := g.vm.SSH("systemctl show " + burstableUnit + " -p ActiveState --value; test -d /sys/fs/cgroup" + burstableDir + " && echo dir-there || echo dir-gone; systemctl show kubepods-burstable.slice -p ActiveState --value")
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
	cgroup     map[string]string            // each running container's cgroup v2 path
}

// guestState reads, in two ssh sessions, the running containers and their cgroups, the units'
// properties (systemctl show, with LoadState, ActiveState, ControlGroup, MemoryMax,
// CPUQuotaPerSecUSec) and the files.
func (g *gateway) guestState(t *testing.T, sh func(*testing.T, string) string, units, files []string) guestSnapshot {
	t.Helper()
	s := guestSnapshot{units: map[string]map[string]string{}, files: map[string]string{}, containers: map[string]Container{}, cgroup: map[string]string{}}
	var cs []Container
	if err := json.Unmarshal([]byte(sh(t, "/run/holdfast-payload/tools/guestprobe")), &cs); err != nil {
		t.Fatalf("the guest's containers: %v", err)
	}
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
		fmt.Fprintf(&script, "echo '@unit %s'; systemctl show %s -p LoadState,ActiveState,ControlGroup,MemoryMax,CPUQuotaPerSecUSec; ", u, u)
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
			s.cgroup[key] = strings.TrimPrefix(text, "0::")
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
