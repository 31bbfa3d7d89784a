package podcgroups

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
)

// fakeV1 is a cgroup v1 tree of plain directories: the writes land in files, and a cgroup
// with files in it cannot be removed (as one in use cannot), an empty directory can.
func fakeV1(t *testing.T) cgroups.Hierarchy {
	t.Helper()
	root := t.TempDir()
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids"} {
		if err := os.MkdirAll(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return cgroups.Hierarchy{Root: root, Mode: cgroups.Legacy}
}

func readFile(t *testing.T, h cgroups.Hierarchy, p, controller, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.Dir(p, controller), file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestManager: Start caps kubepods and makes the QoS levels; each pod's cgroup is made in its
// QoS level with its limits, after the burstable level counts its requests; Cleanup removes
// an orphan and never a pod whose cgroup was made since the agent started, whatever active
// answers.
func TestManager(t *testing.T) {
	h := fakeV1(t)
	m := NewManager(Config{Hierarchy: h, Root: "/edge", EnforceCPULimits: true, PodPidsLimit: 512,
		Kubepods: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("300Mi")}})
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, h, "/edge/kubepods", "memory", "memory.limit_in_bytes"); got != "314572800" {
		t.Errorf("kubepods memory limit %s, want 300Mi", got)
	}
	if got := readFile(t, h, "/edge/kubepods", "cpu", "cpu.shares"); got != "2048" {
		t.Errorf("kubepods shares %s, want 2048", got)
	}
	for _, qos := range []string{"burstable", "besteffort"} {
		if got := readFile(t, h, "/edge/kubepods/"+qos, "cpu", "cpu.shares"); got != "2" {
			t.Errorf("%s shares %s at start, want 2", qos, got)
		}
	}

	pod := podWith(nil, requirements(resourceList("500m", "64Mi"), resourceList("1", "")))
	pod.UID = "b1"
	dir, err := m.EnsurePod(pod)
	if err != nil {
		t.Fatal(err)
	}
	if dir != "/edge/kubepods/burstable/podb1" {
		t.Fatalf("EnsurePod = %s", dir)
	}
	for file, want := range map[[2]string]string{
		{"cpu", "cpu.shares"}: "512", {"cpu", "cpu.cfs_quota_us"}: "100000", {"pids", "pids.max"}: "512",
	} {
		if got := readFile(t, h, dir, file[0], file[1]); got != want {
			t.Errorf("pod %s = %s, want %s", file[1], got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(h.Dir(dir, "memory"), "memory.limit_in_bytes")); err == nil {
		t.Error("a memory limit on a pod whose container has none")
	}
	if got := readFile(t, h, "/edge/kubepods/burstable", "cpu", "cpu.shares"); got != "512" {
		t.Errorf("burstable level %s shares with the pod, want 512", got)
	}

	// A pod cgroup left by an earlier run (an empty directory: nothing in it) is removed; the
	// pod ensured now is kept even when active says it is not known, so that a pod being
	// started cannot lose its cgroup to a cleanup running at the same time.
	orphan := "/edge/kubepods/besteffort/podorphan"
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids"} {
		if err := os.MkdirAll(h.Dir(orphan, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removed := m.Cleanup(func(types.UID) bool { return false })
	if !slices.Equal(removed, []types.UID{"orphan"}) {
		t.Errorf("Cleanup removed %v, want the orphan alone", removed)
	}
	if h.Exists(orphan) || !h.Exists(dir) {
		t.Errorf("after Cleanup: orphan there %v, ensured pod there %v", h.Exists(orphan), h.Exists(dir))
	}
	if got := readFile(t, h, "/edge/kubepods/burstable", "cpu", "cpu.shares"); got != "512" {
		t.Errorf("after Cleanup the burstable level has %s shares, want 512: the ensured pod was taken for an orphan", got)
	}

	// RemovePod takes the pod out of its level's count.
	_ = m.RemovePod(pod.UID) // the fake's files keep the directory; the count is what is checked
	if got := readFile(t, h, "/edge/kubepods/burstable", "cpu", "cpu.shares"); got != "2" {
		t.Errorf("after RemovePod the burstable level has %s shares, want 2", got)
	}
}
