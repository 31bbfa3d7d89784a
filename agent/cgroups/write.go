package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Resources are the limits a cgroup the agent makes is given, in the kubelet's units
// (pkg/kubelet/cm ResourceConfig): a nil field is left as the kernel or the last write set it.
type Resources struct {
	// CPUShares is the relative CPU weight in cgroup v1 shares [2, 262144]; on cgroup v2 it is
	// written as cpu.weight through SharesToWeight, as runc and the kubelet convert it.
	CPUShares *uint64
	// CPUQuota (microseconds per CPUPeriod; -1: none) is the CFS bandwidth limit.
	CPUQuota  *int64
	CPUPeriod *uint64
	// Memory is the memory limit in bytes; -1: none.
	Memory *int64
	// PidsLimit is the most tasks; -1 or 0: none (the kubelet writes "max").
	PidsLimit *int64
}

// limitControllers are the cgroup v1 hierarchies (and the v2 controllers) that hold the
// limits of Resources: the ones the agent makes its cgroups in. The runtime makes the
// container's cgroups in the other v1 hierarchies (devices, freezer, cpuset...) itself, down
// the same path; cpuset in particular is left to runc, which copies cpuset.cpus and
// cpuset.mems into each level it makes, where an empty directory made here would refuse tasks.
var limitControllers = []string{"cpu", "cpuacct", "memory", "pids"}

// v2Controllers are those a parent enables for its children in cgroup.subtree_control.
var v2Controllers = []string{"cpu", "memory", "pids"}

// Dir is where the cgroup at path (absolute in the hierarchy: "/kubepods/burstable") lies for
// controller: <root>/<controller>/<path> on cgroup v1, <root>/<path> on cgroup v2.
func (h Hierarchy) Dir(path, controller string) string {
	if h.Mode == Unified {
		return filepath.Join(h.Root, path)
	}
	return filepath.Join(h.Root, controller, path)
}

// Exists says the cgroup at path is there: in every limit controller's hierarchy on cgroup
// v1, as the kubelet's cgroupfs manager checks it.
func (h Hierarchy) Exists(path string) bool {
	for _, c := range h.controllers() {
		if _, err := os.Stat(h.Dir(path, c)); err != nil {
			return false
		}
	}
	return true
}

// Ensure makes the cgroup at path (and its parents) where it is missing and writes r into it:
// what the kubelet's cgroup manager does with Create, then Update on an existing one.
func (h Hierarchy) Ensure(path string, r Resources) error {
	if err := h.mkdir(path); err != nil {
		return err
	}
	return h.Update(path, r)
}

func (h Hierarchy) mkdir(path string) error {
	if h.Mode == Unified {
		// Each level enables the limit controllers for the level below, from the root down:
		// a controller is usable in a cgroup only when its parent's subtree_control names it.
		parts := strings.Split(strings.Trim(filepath.Clean("/"+path), "/"), "/")
		dir := h.Root
		for _, p := range parts {
			if err := enableControllers(dir); err != nil {
				return err
			}
			dir = filepath.Join(dir, p)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("make cgroup %s: %w", dir, err)
			}
		}
		return nil
	}
	for _, c := range limitControllers {
		if _, err := os.Stat(filepath.Join(h.Root, c)); err != nil {
			if c == "pids" || c == "cpuacct" {
				continue // an old kernel without it, or cpuacct co-mounted with cpu
			}
			return fmt.Errorf("cgroup v1 controller %s: %w", c, err)
		}
		if err := os.MkdirAll(h.Dir(path, c), 0o755); err != nil {
			return fmt.Errorf("make cgroup %s: %w", h.Dir(path, c), err)
		}
	}
	return nil
}

// enableControllers adds the limit controllers to dir's cgroup.subtree_control, those it
// already has left as they are; one the kernel does not offer (cgroup.controllers) is skipped.
func enableControllers(dir string) error {
	have, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cgroup v2 subtree_control of %s: %w", dir, err)
	}
	offered, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	var add []string
	for _, c := range v2Controllers {
		if slices.Contains(strings.Fields(string(have)), c) {
			continue
		}
		if offered != nil && !slices.Contains(strings.Fields(string(offered)), c) {
			continue
		}
		add = append(add, "+"+c)
	}
	if len(add) == 0 {
		return nil
	}
	if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " ")); err != nil {
		return fmt.Errorf("enable controllers %v in %s: %w", add, dir, err)
	}
	return nil
}

// Update writes r into the existing cgroup at path.
func (h Hierarchy) Update(path string, r Resources) error {
	var errs []error
	write := func(controller, file, value string) {
		if err := writeFile(filepath.Join(h.Dir(path, controller), file), value); err != nil {
			errs = append(errs, err)
		}
	}
	if h.Mode == Unified {
		if r.CPUShares != nil {
			write("cpu", "cpu.weight", strconv.FormatUint(SharesToWeight(*r.CPUShares), 10))
		}
		if r.CPUQuota != nil || r.CPUPeriod != nil {
			quota, period := "max", uint64(100000)
			if r.CPUQuota != nil && *r.CPUQuota > 0 {
				quota = strconv.FormatInt(*r.CPUQuota, 10)
			}
			if r.CPUPeriod != nil && *r.CPUPeriod > 0 {
				period = *r.CPUPeriod
			}
			write("cpu", "cpu.max", quota+" "+strconv.FormatUint(period, 10))
		}
		if r.Memory != nil {
			write("memory", "memory.max", limitOrMax(*r.Memory))
		}
		if r.PidsLimit != nil {
			write("pids", "pids.max", limitOrMax(*r.PidsLimit))
		}
		return errors.Join(errs...)
	}
	if r.CPUShares != nil {
		write("cpu", "cpu.shares", strconv.FormatUint(*r.CPUShares, 10))
	}
	// The period first: a quota is checked against the period in place.
	if r.CPUPeriod != nil {
		write("cpu", "cpu.cfs_period_us", strconv.FormatUint(*r.CPUPeriod, 10))
	}
	if r.CPUQuota != nil {
		q := *r.CPUQuota
		if q <= 0 {
			q = -1
		}
		write("cpu", "cpu.cfs_quota_us", strconv.FormatInt(q, 10))
	}
	if r.Memory != nil {
		m := *r.Memory
		if m <= 0 {
			m = -1
		}
		write("memory", "memory.limit_in_bytes", strconv.FormatInt(m, 10))
	}
	if r.PidsLimit != nil {
		if _, err := os.Stat(h.Dir(path, "pids")); err == nil {
			write("pids", "pids.max", limitOrMax(*r.PidsLimit))
		}
	}
	return errors.Join(errs...)
}

// limitOrMax is a v2 limit (and v1 pids.max): the number, or "max" for none.
func limitOrMax(v int64) string {
	if v <= 0 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

// Remove removes the cgroup at path, its children first, from every hierarchy the host
// mounts (the runtime made the container's in each): only empty cgroups can be removed, so a
// cgroup with a process in it stays and Remove says which. It never kills anything. A cgroup
// already gone is not an error.
func (h Hierarchy) Remove(path string) error {
	var errs []error
	for _, top := range h.hierarchyRoots() {
		errs = append(errs, removeTree(filepath.Join(top, path)))
	}
	return errors.Join(errs...)
}

// hierarchyRoots are the directories each hierarchy is mounted at: the root on cgroup v2;
// every directory under the root on cgroup v1 (symbolic links such as cpu,cpuacct -> cpu are
// the same hierarchy under another name, skipped).
func (h Hierarchy) hierarchyRoots() []string {
	if h.Mode == Unified {
		return []string{h.Root}
	}
	entries, err := os.ReadDir(h.Root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join(h.Root, e.Name()))
		}
	}
	return out
}

// Children lists the names of the cgroups directly below path in the cpu (v1) or unified
// (v2) hierarchy.
func (h Hierarchy) Children(path string) ([]string, error) {
	entries, err := os.ReadDir(h.Dir(path, "cpu"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// removeTree removes dir's child cgroups, deepest first, then dir. A cgroup directory is
// removed with rmdir alone (its files are the kernel's); the kernel refuses one that holds
// a process (EBUSY), and that error is returned.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeTree(filepath.Join(dir, e.Name())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := rmdir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// rmdir removes one cgroup; a variable so that the tests' fake tree, of plain directories,
// can play the kernel (which removes a cgroup's files with it, and refuses one in use).
var rmdir = unix.Rmdir

func (h Hierarchy) controllers() []string {
	if h.Mode == Unified {
		return []string{""}
	}
	return []string{"cpu", "memory"}
}

// writeFile writes a cgroup file as the kernel wants it: one write, no truncation of a file
// that is not a regular one.
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write cgroup file %s: %w", path, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

// Populated says a process is in the cgroup at path or below it: cgroup.events' "populated"
// on cgroup v2; on v1, any cgroup.procs in its tree of the cpu and memory hierarchies. A
// cgroup that is not there holds nothing.
func (h Hierarchy) Populated(path string) (bool, error) {
	if h.Mode == Unified {
		b, err := os.ReadFile(filepath.Join(h.Dir(path, ""), "cgroup.events"))
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read cgroup.events of %s: %w", path, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "populated "); ok {
				return strings.TrimSpace(v) != "0", nil
			}
		}
		return false, fmt.Errorf("cgroup.events of %s has no populated line", path)
	}
	for _, c := range h.controllers() {
		populated := false
		err := filepath.WalkDir(h.Dir(path, c), func(p string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil || !d.IsDir() {
				return err
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if strings.TrimSpace(string(b)) != "" {
				populated = true
				return filepath.SkipAll
			}
			return nil
		})
		if err != nil {
			return false, fmt.Errorf("processes of cgroup %s: %w", path, err)
		}
		if populated {
			return true, nil
		}
	}
	return false, nil
}
