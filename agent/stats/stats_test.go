package stats

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

type fakeLister map[string][]runtime.Container

func (f fakeLister) ListPod(_ context.Context, uid string) ([]runtime.Container, error) {
	return f[uid], nil
}

// fakeNode lays out a proc file system and a cgroup v2 hierarchy with one running container
// (pid 42) whose cgroup's CPU time is cpuUsec.
func fakeNode(t *testing.T, cpuUsec string) (proc, cgroupRoot string) {
	t.Helper()
	dir := t.TempDir()
	proc, cgroupRoot = filepath.Join(dir, "proc"), filepath.Join(dir, "cgroup")
	files := map[string]string{
		proc + "/stat":                              "cpu  1000 0 500 90000 100 0 0 0 0 0\ncpu0 1000 0 500 90000 100 0 0 0 0 0\nbtime 1700000000\n",
		proc + "/meminfo":                           "MemTotal:       4000000 kB\nMemFree:        1000000 kB\nMemAvailable:   2500000 kB\nInactive(file):  500000 kB\n",
		proc + "/42/cgroup":                         "0::/holdfast/web\n",
		proc + "/42/net/dev":                        "Inter-|   Receive\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  eth0: 1500 10 1 0 0 0 0 0 700 5 2 0 0 0 0 0\n",
		cgroupRoot + "/holdfast/web/memory.current": "300000000\n",
		cgroupRoot + "/holdfast/web/memory.stat":    "anon 200000000\ninactive_file 80000000\npgfault 10\npgmajfault 1\n",
		cgroupRoot + "/holdfast/web/cpu.stat":       "usage_usec " + cpuUsec + "\n",
	}
	for p, content := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return proc, cgroupRoot
}

func testProvider(t *testing.T, proc, cgroupRoot string) *Provider {
	started := metav1.NewTime(time.Unix(1700000100, 0))
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "uid-1"}, Status: v1.PodStatus{StartTime: &started}}
	return &Provider{
		NodeName: "gw",
		Usage:    eviction.CgroupUsage{Cgroups: cgroups.Hierarchy{Root: cgroupRoot, Proc: proc, Mode: cgroups.Unified}},
		Proc:     proc,
		Pods:     func() []*v1.Pod { return []*v1.Pod{pod} },
		Runtime: fakeLister{"uid-1": {
			{ID: "c1", Name: "app", State: runtime.StateRunning, Pid: 42, StartedAt: time.Unix(1700000200, 0)},
			{ID: "c0", Name: "app", State: runtime.StateExited, Attempt: 0},
		}},
		Host: eviction.HostObserver{NodeFS: t.TempDir(), Proc: proc},
	}
}

func TestSummary(t *testing.T) {
	proc, cg := fakeNode(t, "2500000")
	p := testProvider(t, proc, cg)
	s, err := p.Summary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := s.Node
	if n.NodeName != "gw" || n.StartTime.Unix() != 1700000000 || *n.CPU.UsageCoreNanoSeconds != 15*uint64(time.Second) || n.CPU.UsageNanoCores != nil {
		t.Errorf("node: name %s start %v cpu %d nanocores %v; want gw, btime, (1000+500)/100 s, no rate yet",
			n.NodeName, n.StartTime, *n.CPU.UsageCoreNanoSeconds, n.CPU.UsageNanoCores)
	}
	// usage = total - free = 3000000 kB; working set = usage - inactive(file) = 2500000 kB.
	if *n.Memory.UsageBytes != 3000000*1024 || *n.Memory.WorkingSetBytes != 2500000*1024 || *n.Memory.AvailableBytes != 1500000*1024 {
		t.Errorf("node memory %d %d %d", *n.Memory.UsageBytes, *n.Memory.WorkingSetBytes, *n.Memory.AvailableBytes)
	}
	if n.Fs == nil || *n.Fs.CapacityBytes == 0 {
		t.Errorf("node fs %+v", n.Fs)
	}
	if len(s.Pods) != 1 || len(s.Pods[0].Containers) != 1 {
		t.Fatalf("pods %+v: want one pod with its one running container", s.Pods)
	}
	pod, c := s.Pods[0], s.Pods[0].Containers[0]
	if pod.PodRef != (statsapi.PodReference{Name: "web", Namespace: "shop", UID: "uid-1"}) || pod.StartTime.Unix() != 1700000100 {
		t.Errorf("pod ref %+v start %v", pod.PodRef, pod.StartTime)
	}
	if c.Name != "app" || c.StartTime.Unix() != 1700000200 || *c.CPU.UsageCoreNanoSeconds != 2500000000 ||
		*c.Memory.WorkingSetBytes != 220000000 || *c.Memory.RSSBytes != 200000000 || *c.Memory.PageFaults != 10 {
		t.Errorf("container %+v cpu %d memory %+v", c, *c.CPU.UsageCoreNanoSeconds, c.Memory)
	}
	if *pod.Memory.WorkingSetBytes != 220000000 || *pod.CPU.UsageCoreNanoSeconds != 2500000000 {
		t.Errorf("pod sums: memory %d cpu %d", *pod.Memory.WorkingSetBytes, *pod.CPU.UsageCoreNanoSeconds)
	}
	if pod.Network == nil || pod.Network.Name != "eth0" || *pod.Network.RxBytes != 1500 || *pod.Network.TxBytes != 700 || len(pod.Network.Interfaces) != 1 {
		t.Errorf("network %+v", pod.Network)
	}

	// A second reading gives the rate since the first.
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(cg, "holdfast/web/cpu.stat"), []byte("usage_usec 2600000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err = p.Summary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c = s.Pods[0].Containers[0]
	if c.CPU.UsageNanoCores == nil || *c.CPU.UsageNanoCores == 0 {
		t.Errorf("no CPU rate from two readings: %+v", c.CPU)
	}
}

func TestResourceMetrics(t *testing.T) {
	proc, cg := fakeNode(t, "2500000")
	h := ResourceMetricsHandler(testProvider(t, proc, cg), slog.New(slog.NewTextHandler(io.Discard, nil)))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics/resource", nil))
	body := rec.Body.String()
	for _, want := range []string{
		"# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds",
		`container_cpu_usage_seconds_total{container="app",namespace="shop",pod="web"} 2.5 `,
		`container_memory_working_set_bytes{container="app",namespace="shop",pod="web"} 2.2e+08 `,
		`container_start_time_seconds{container="app",namespace="shop",pod="web"} 1.7000002e+09`,
		`pod_memory_working_set_bytes{namespace="shop",pod="web"} 2.2e+08 `,
		"node_cpu_usage_seconds_total 15 ",
		"resource_scrape_error 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}
