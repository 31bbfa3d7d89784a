package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fakeCgroupfs plays the kernel's part for a tree of plain directories: a cgroup's files go
// with it when it is removed, and one with a process in cgroup.procs cannot be (EBUSY).
func fakeCgroupfs(t *testing.T, mode Mode) Hierarchy {
	t.Helper()
	root := t.TempDir()
	h := Hierarchy{Root: root, Proc: filepath.Join(root, "proc"), Mode: mode}
	if mode == Unified {
		mustWrite(t, filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory hugetlb pids")
		mustWrite(t, filepath.Join(root, "cgroup.subtree_control"), "")
	} else {
		for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "devices"} {
			if err := os.MkdirAll(filepath.Join(root, c), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	old := rmdir
	rmdir = func(dir string) error {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				return syscall.ENOTEMPTY
			}
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); strings.TrimSpace(string(b)) != "" {
			return syscall.EBUSY
		}
		for _, e := range entries {
			os.Remove(filepath.Join(dir, e.Name()))
		}
		return os.Remove(dir)
	}
	t.Cleanup(func() { rmdir = old })
	// A new v2 cgroup offers what its parent enabled for it; the fake's files are written by
	// Ensure, so cgroup.subtree_control is made here for every level Ensure walks through.
	return h
}

func mustWrite(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func ptr[T any](v T) *T { return &v }

func TestEnsureV1(t *testing.T) {
	h := fakeCgroupfs(t, Legacy)
	const pod = "/kubepods/burstable/podu1"
	r := Resources{CPUShares: ptr(uint64(512)), CPUQuota: ptr(int64(50000)), CPUPeriod: ptr(uint64(100000)), Memory: ptr(int64(64 << 20)), PidsLimit: ptr(int64(100))}
	if err := h.Ensure(pod, r); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"cpu" + pod + "/cpu.shares":               "512",
		"cpu" + pod + "/cpu.cfs_quota_us":         "50000",
		"cpu" + pod + "/cpu.cfs_period_us":        "100000",
		"memory" + pod + "/memory.limit_in_bytes": "67108864",
		"pids" + pod + "/pids.max":                "100",
	} {
		if got := read(t, filepath.Join(h.Root, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(h.Root, "cpuacct", pod)); err != nil {
		t.Errorf("no cpuacct cgroup: %v", err)
	}
	if !h.Exists(pod) {
		t.Error("Exists = false after Ensure")
	}
	// Unlimited: the kernel's -1, pids "max"; a nil field is left alone.
	if err := h.Update(pod, Resources{CPUQuota: ptr(int64(-1)), Memory: ptr(int64(-1)), PidsLimit: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"cpu" + pod + "/cpu.shares":               "512",
		"cpu" + pod + "/cpu.cfs_quota_us":         "-1",
		"memory" + pod + "/memory.limit_in_bytes": "-1",
		"pids" + pod + "/pids.max":                "max",
	} {
		if got := read(t, filepath.Join(h.Root, file)); got != want {
			t.Errorf("after Update: %s = %q, want %q", file, got, want)
		}
	}
}

func TestEnsureV2(t *testing.T) {
	h := fakeCgroupfs(t, Unified)
	// The levels above the pod, as the kernel makes them: a cgroup.subtree_control each.
	mustWrite(t, filepath.Join(h.Root, "kubepods/cgroup.subtree_control"), "")
	mustWrite(t, filepath.Join(h.Root, "kubepods/burstable/cgroup.subtree_control"), "cpu")
	const pod = "/kubepods/burstable/podu1"
	r := Resources{CPUShares: ptr(uint64(102)), CPUQuota: ptr(int64(20000)), CPUPeriod: ptr(uint64(100000)), Memory: ptr(int64(128 << 20)), PidsLimit: ptr(int64(-1))}
	if err := h.Ensure(pod, r); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"cgroup.subtree_control":                    "+cpu +memory +pids",
		"kubepods/cgroup.subtree_control":           "+cpu +memory +pids",
		"kubepods/burstable/cgroup.subtree_control": "+memory +pids", // cpu was there
		pod[1:] + "/cpu.weight":                     "4",             // SharesToWeight(102)
		pod[1:] + "/cpu.max":                        "20000 100000",
		pod[1:] + "/memory.max":                     "134217728",
		pod[1:] + "/pids.max":                       "max",
	} {
		if got := read(t, filepath.Join(h.Root, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if err := h.Update(pod, Resources{CPUQuota: ptr(int64(-1)), CPUPeriod: ptr(uint64(100000)), Memory: ptr(int64(-1))}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(h.Root, pod, "cpu.max")); got != "max 100000" {
		t.Errorf("cpu.max = %q, want no quota", got)
	}
	if got := read(t, filepath.Join(h.Root, pod, "memory.max")); got != "max" {
		t.Errorf("memory.max = %q, want max", got)
	}
}

// TestRemove: a pod cgroup goes from every hierarchy, the containers' leftovers below it
// first; one that holds a process stays, with an error, and nothing else of it is lost.
func TestRemove(t *testing.T) {
	for _, mode := range []Mode{Legacy, Unified} {
		t.Run(mode.String(), func(t *testing.T) {
			h := fakeCgroupfs(t, mode)
			const pod = "/kubepods/besteffort/podu1"
			if mode == Unified {
				mustWrite(t, filepath.Join(h.Root, "kubepods/cgroup.subtree_control"), "")
				mustWrite(t, filepath.Join(h.Root, "kubepods/besteffort/cgroup.subtree_control"), "")
			}
			if err := h.Ensure(pod, Resources{CPUShares: ptr(uint64(2))}); err != nil {
				t.Fatal(err)
			}
			// What the runtime leaves: a container's cgroup in every hierarchy, e.g. freezer.
			busy := filepath.Join(h.Dir(pod, "memory"), "ctr")
			mustWrite(t, filepath.Join(busy, "cgroup.procs"), "4242\n")
			if mode == Legacy {
				mustWrite(t, filepath.Join(h.Root, "freezer", pod, "ctr", "cgroup.procs"), "")
			}
			err := h.Remove(pod)
			if !errors.Is(err, syscall.EBUSY) {
				t.Fatalf("Remove with a process inside = %v, want EBUSY", err)
			}
			if _, err := os.Stat(busy); err != nil {
				t.Fatalf("the busy cgroup was removed: %v", err)
			}
			mustWrite(t, filepath.Join(busy, "cgroup.procs"), "")
			if err := h.Remove(pod); err != nil {
				t.Fatal(err)
			}
			for _, top := range h.hierarchyRoots() {
				if _, err := os.Stat(filepath.Join(top, pod)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s still there (%v)", filepath.Join(top, pod), err)
				}
			}
			if _, err := os.Stat(h.Dir("/kubepods/besteffort", "cpu")); err != nil {
				t.Errorf("the QoS level went with the pod: %v", err)
			}
			if err := h.Remove(pod); err != nil {
				t.Errorf("Remove of a removed cgroup = %v, want nil", err)
			}
		})
	}
}

// TestSettingsAtReadsBackWhatUpdateWrote: a pod cgroup's settings, written by Ensure and then
// Update (a pod-level resize), read back by path on v1 and v2 in a container's units (shares,
// quota and period, memory bytes), v2's weight as the least shares of that weight.
func TestSettingsAtReadsBackWhatUpdateWrote(t *testing.T) {
	for _, mode := range []Mode{Legacy, Unified} {
		t.Run(mode.String(), func(t *testing.T) {
			h := fakeCgroupfs(t, mode)
			const pod = "/kubepods/burstable/podu1"
			if mode == Unified {
				mustWrite(t, filepath.Join(h.Root, "kubepods/cgroup.subtree_control"), "")
				mustWrite(t, filepath.Join(h.Root, "kubepods/burstable/cgroup.subtree_control"), "")
			}
			if err := h.Ensure(pod, Resources{CPUShares: ptr(uint64(102)), CPUQuota: ptr(int64(20000)), CPUPeriod: ptr(uint64(100000)), Memory: ptr(int64(64 << 20))}); err != nil {
				t.Fatal(err)
			}
			if err := h.Update(pod, Resources{CPUShares: ptr(uint64(204)), CPUQuota: ptr(int64(40000)), CPUPeriod: ptr(uint64(100000)), Memory: ptr(int64(96 << 20))}); err != nil {
				t.Fatal(err)
			}
			got, err := h.SettingsAt(pod)
			if err != nil {
				t.Fatal(err)
			}
			want := Settings{CPUShares: 204, CPUQuota: 40000, CPUPeriod: 100000, MemoryLimit: 96 << 20}
			if mode == Unified {
				want.CPUShares = WeightToShares(SharesToWeight(204))
			}
			if got != want {
				t.Errorf("SettingsAt = %+v, want %+v", got, want)
			}
		})
	}
}
