package cgroups

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeHost lays out a /proc/PID/cgroup and cgroup files under a temporary root.
func fakeHost(t *testing.T, mode Mode, procCgroup string, files map[string]string) Hierarchy {
	t.Helper()
	dir := t.TempDir()
	h := Hierarchy{Root: filepath.Join(dir, "cgroup"), Proc: filepath.Join(dir, "proc"), Mode: mode}
	files["../proc/42/cgroup"] = procCgroup
	for name, content := range files {
		p := filepath.Join(h.Root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func TestLimitsUnified(t *testing.T) {
	const ctr = "/holdfast/abc"
	h := fakeHost(t, Unified, "0::"+ctr+"\n", map[string]string{
		ctr + "/cpu.max":    "50000 100000\n",
		ctr + "/cpu.weight": "10\n",
		ctr + "/memory.max": "67108864\n",
	})
	dir, err := h.ProcessDir(42, "memory")
	if err != nil || dir != filepath.Join(h.Root, ctr) {
		t.Fatalf("ProcessDir = %q, %v; want the unified directory", dir, err)
	}
	l, err := h.Limits(42)
	if err != nil {
		t.Fatal(err)
	}
	want := Limits{CPUQuota: 50000, CPUPeriod: 100000, CPUWeight: 10, MemoryMax: 64 << 20}
	if l != want {
		t.Errorf("Limits = %+v, want %+v", l, want)
	}

	// No limits: "max".
	h = fakeHost(t, Unified, "0::"+ctr+"\n", map[string]string{
		ctr + "/cpu.max":    "max 100000\n",
		ctr + "/cpu.weight": "100\n",
		ctr + "/memory.max": "max\n",
	})
	if l, err = h.Limits(42); err != nil || l.CPUQuota != Unlimited || l.MemoryMax != Unlimited {
		t.Errorf("Limits = %+v, %v; want quota and memory Unlimited", l, err)
	}
}

func TestLimitsV1(t *testing.T) {
	// As on a hybrid host: v1 controllers (cpu and cpuacct co-mounted here), systemd's empty v2
	// tree on line 0, which holds no limits.
	h := fakeHost(t, Hybrid, "9:name=systemd:/\n5:cpu,cpuacct:/holdfast/abc\n4:memory:/holdfast/abc\n0::/\n", map[string]string{
		"cpu/holdfast/abc/cpu.cfs_quota_us":         "-1\n",
		"cpu/holdfast/abc/cpu.cfs_period_us":        "100000\n",
		"cpu/holdfast/abc/cpu.shares":               "256\n",
		"memory/holdfast/abc/memory.limit_in_bytes": "67108864\n",
	})
	l, err := h.Limits(42)
	if err != nil {
		t.Fatal(err)
	}
	want := Limits{CPUQuota: Unlimited, CPUPeriod: 100000, CPUShares: 256, MemoryMax: 64 << 20}
	if l != want {
		t.Errorf("Limits = %+v, want %+v", l, want)
	}
	if _, err := h.ProcessDir(42, "devices"); err == nil {
		t.Error("ProcessDir found a devices cgroup the process is not in")
	}
}

func TestSharesToWeight(t *testing.T) {
	for shares, weight := range map[uint64]uint64{2: 1, 1024: 39, 256: 10, 262144: 10000, 0: 0} {
		if got := SharesToWeight(shares); got != weight {
			t.Errorf("SharesToWeight(%d) = %d, want %d", shares, got, weight)
		}
	}
}

func TestDetectMode(t *testing.T) {
	if m := DetectMode(t.TempDir()); m != Legacy {
		t.Errorf("a plain directory detected as %s", m)
	}
	t.Logf("this host: %s", Host().Mode)
}

// The working set is the usage less the inactive file cache, on both hierarchies.
func TestUsage(t *testing.T) {
	const ctr = "/holdfast/abc"
	h := fakeHost(t, Unified, "0::"+ctr+"\n", map[string]string{
		ctr + "/memory.current": "300000000\n",
		ctr + "/memory.stat":    "anon 200000000\nfile 100000000\ninactive_file 80000000\nactive_file 20000000\npgfault 1234\npgmajfault 5\n",
		ctr + "/pids.current":   "7\n",
		ctr + "/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
	})
	u, err := h.Usage(42)
	want := Usage{MemoryWorkingSet: 220000000, PIDs: 7, MemoryUsage: 300000000, MemoryRSS: 200000000,
		PageFaults: 1234, MajorPageFaults: 5, CPUUsageNanos: 2500000000}
	if err != nil || u != want {
		t.Errorf("v2 Usage = %+v, %v; want %+v", u, err, want)
	}
	h = fakeHost(t, Legacy, "5:cpu,cpuacct:/holdfast/abc\n4:memory:/holdfast/abc\n3:pids:/holdfast/abc\n", map[string]string{
		"memory/holdfast/abc/memory.usage_in_bytes": "300000000\n",
		"memory/holdfast/abc/memory.stat":           "cache 100000000\nrss 1\ninactive_file 5\ntotal_rss 200000000\ntotal_inactive_file 80000000\ntotal_pgfault 1234\ntotal_pgmajfault 5\n",
		"pids/holdfast/abc/pids.current":            "3\n",
		"cpuacct/holdfast/abc/cpuacct.usage":        "2500000000\n",
	})
	u, err = h.Usage(42)
	want.PIDs = 3
	if err != nil || u != want {
		t.Errorf("v1 Usage = %+v, %v; want %+v", u, err, want)
	}
}

// memory.swap.max can be set where the agent's own v2 cgroup has it; not on v1, not from the
// root cgroup.
func TestSwapController(t *testing.T) {
	h := fakeHost(t, Unified, "0::/system.slice/holdfast.service\n", map[string]string{
		"system.slice/holdfast.service/memory.swap.max": "max\n",
	})
	if !h.swapController(42) {
		t.Error("v2 with memory.swap.max: want the swap controller")
	}
	h = fakeHost(t, Unified, "0::/system.slice/holdfast.service\n", map[string]string{
		"system.slice/holdfast.service/memory.max": "max\n",
	})
	if h.swapController(42) {
		t.Error("v2 without memory.swap.max (no swap accounting): want none")
	}
	if h = fakeHost(t, Unified, "0::/\n", map[string]string{}); h.swapController(42) {
		t.Error("an agent in the root cgroup cannot tell: want none")
	}
	if h = fakeHost(t, Legacy, "4:memory:/holdfast\n", map[string]string{"memory/holdfast/memory.limit_in_bytes": "1\n"}); h.swapController(42) {
		t.Error("v1: want none")
	}
}

// A container's shares read back from a v2 cgroup stand for the same weight runc wrote for
// them: for every shares value, weight(WeightToShares(weight(s))) == weight(s), and no smaller
// shares value has that weight.
func TestWeightToSharesRoundTrips(t *testing.T) {
	for s := uint64(2); s <= 262144; s++ {
		w := SharesToWeight(s)
		back := WeightToShares(w)
		if SharesToWeight(back) != w || back > s || (back > 2 && SharesToWeight(back-1) == w) {
			t.Fatalf("shares %d: weight %d, read back as %d (weight %d)", s, w, back, SharesToWeight(back))
		}
	}
}

// MountOptions reads the options of the file system mounted at the root, its superblock's
// (what a container's mount of the same cgroup2 would reset), not the mount's own: a tmpfs the
// test mounts with a size shows it (a superblock option; relatime is the mount's). A directory
// nothing is mounted on has none.
func TestMountOptions(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RELATIME, "size=1m"); err != nil {
		t.Fatalf("mount a tmpfs for the test (needs root, as make test runs it): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, 0) })
	opts, err := Hierarchy{Root: dir}.MountOptions()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(opts, "size=1024k") || slices.Contains(opts, "relatime") {
		t.Errorf("options of a tmpfs mounted with size=1m: %v, want its superblock's (size=1024k), not the mount's (relatime)", opts)
	}
	none, err := Hierarchy{Root: t.TempDir()}.MountOptions()
	if err != nil || none != nil {
		t.Errorf("options of a directory nothing is mounted on: %v, %v", none, err)
	}
}
