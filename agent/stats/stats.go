// Package stats measures what the node, its pods and their containers use, in the kubelet's
// Summary API types (k8s.io/kubelet/pkg/apis/stats/v1alpha1): CPU and memory of each
// running container from its cgroups (v1 or v2) or, on the CRI backend, from the runtime's
// container stats; the node's from procfs, its file systems with
// statfs, a pod's network from its network namespace. The node API serves the summary at
// /stats/summary and the resource metrics made from it at /metrics/resource, which is what
// metrics-server scrapes for `kubectl top`.
//
// holdfast keeps no pod cgroup: a pod's CPU and memory are the sums of its containers'.
// Nothing here samples in the background: a summary is measured when asked for, and the CPU
// rate (usageNanoCores) is computed against the previous request's reading.
package stats

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/procfs"
)

// userHZ is the unit of /proc/stat's CPU times (USER_HZ, 100 on every Linux architecture
// holdfast runs on).
const userHZ = 100

// Provider measures summaries. Its fields are set once, before the first Summary.
type Provider struct {
	NodeName string
	// Usage measures each running container (eviction.CgroupUsage: from its cgroups).
	Usage eviction.ContainerUsage
	// Proc is the proc file system; defaults to /proc.
	Proc string
	// Pods are the pods the node runs now.
	Pods func() []*v1.Pod
	// Runtime lists a pod's containers.
	Runtime eviction.ContainerLister
	// Host measures the node's memory and file systems (nodefs: the state directory;
	// imagefs: containerd's).
	Host eviction.HostObserver

	mu   sync.Mutex
	last map[string]cpuReading // by container ID, pod UID or "node": the previous reading
}

type cpuReading struct {
	at    time.Time
	nanos uint64
}

// Summary measures the node and every pod it runs.
func (p *Provider) Summary(ctx context.Context) (*statsapi.Summary, error) {
	now := time.Now()
	proc := p.Proc
	if proc == "" {
		proc = "/proc"
	}
	seen := map[string]cpuReading{}
	node, err := p.node(ctx, proc, now, seen)
	if err != nil {
		return nil, err
	}
	s := &statsapi.Summary{Node: node}
	for _, pod := range p.Pods() {
		ps, ok := p.pod(ctx, proc, pod, now, seen)
		if ok {
			s.Pods = append(s.Pods, ps)
		}
	}
	p.mu.Lock()
	p.last = seen // readings of what is gone are dropped with the previous map
	p.mu.Unlock()
	return s, nil
}

// cpu makes CPU stats from a cumulative reading, with the rate since the previous one.
func (p *Provider) cpu(key string, nanos uint64, now time.Time, seen map[string]cpuReading) *statsapi.CPUStats {
	st := &statsapi.CPUStats{Time: metav1.NewTime(now), UsageCoreNanoSeconds: &nanos}
	p.mu.Lock()
	prev, ok := p.last[key]
	p.mu.Unlock()
	if ok && now.After(prev.at) && nanos >= prev.nanos {
		rate := uint64(float64(nanos-prev.nanos) / now.Sub(prev.at).Seconds())
		st.UsageNanoCores = &rate
	}
	seen[key] = cpuReading{at: now, nanos: nanos}
	return st
}

func (p *Provider) node(ctx context.Context, proc string, now time.Time, seen map[string]cpuReading) (statsapi.NodeStats, error) {
	ns := statsapi.NodeStats{NodeName: p.NodeName}
	cpuNanos, boot, err := readProcStat(filepath.Join(proc, "stat"))
	if err != nil {
		return ns, err
	}
	ns.StartTime = metav1.NewTime(boot)
	ns.CPU = p.cpu("node", cpuNanos, now, seen)
	mem, err := procfs.ReadMeminfo(filepath.Join(proc, "meminfo"))
	if err != nil {
		return ns, err
	}
	// As cAdvisor's root cgroup: usage is what is not free, the working set that less the
	// inactive page cache; available is what the working set leaves of the total.
	usage := uint64(max(mem["MemTotal"]-mem["MemFree"], 0))
	workingSet := uint64(max(int64(usage)-mem["Inactive(file)"], 0))
	available := uint64(max(mem["MemTotal"]-int64(workingSet), 0))
	ns.Memory = &statsapi.MemoryStats{Time: metav1.NewTime(now), UsageBytes: &usage, WorkingSetBytes: &workingSet, AvailableBytes: &available}
	obs, err := p.Host.Observe(ctx)
	if err != nil {
		return ns, err
	}
	ns.Fs = fsStats(obs, eviction.SignalNodeFsAvailable, eviction.SignalNodeFsInodesFree, now)
	if fs := fsStats(obs, eviction.SignalImageFsAvailable, eviction.SignalImageFsInodesFree, now); fs != nil {
		ns.Runtime = &statsapi.RuntimeStats{ImageFs: fs}
	}
	return ns, nil
}

// fsStats turns the eviction observer's file system signals into FsStats; nil when the file
// system was not measured.
func fsStats(obs eviction.Observations, bytes, inodes eviction.Signal, now time.Time) *statsapi.FsStats {
	o, ok := obs[bytes]
	if !ok {
		return nil
	}
	capacity, available := uint64(o.Capacity), uint64(o.Available)
	used := capacity - min(available, capacity)
	fs := &statsapi.FsStats{Time: metav1.NewTime(now), CapacityBytes: &capacity, AvailableBytes: &available, UsedBytes: &used}
	if i, ok := obs[inodes]; ok {
		total, free := uint64(i.Capacity), uint64(i.Available)
		used := total - min(free, total)
		fs.Inodes, fs.InodesFree, fs.InodesUsed = &total, &free, &used
	}
	return fs
}

// pod measures a pod's running containers; ok is false when its containers cannot be listed.
func (p *Provider) pod(ctx context.Context, proc string, pod *v1.Pod, now time.Time, seen map[string]cpuReading) (statsapi.PodStats, bool) {
	ps := statsapi.PodStats{PodRef: statsapi.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)}}
	if pod.Status.StartTime != nil {
		ps.StartTime = *pod.Status.StartTime
	}
	cs, err := p.Runtime.ListPod(ctx, string(pod.UID))
	if err != nil {
		return ps, false
	}
	var cpuNanos uint64
	var mem statsapi.MemoryStats
	var usage, workingSet, rss, faults, majorFaults uint64
	var netPid uint32
	for _, c := range cs {
		if c.State != runtime.StateRunning {
			continue
		}
		u, err := p.Usage.Usage(ctx, c)
		if err != nil {
			continue // exited in between
		}
		if netPid == 0 {
			netPid = c.Pid
		}
		cw, cu, cr, cf, cm := uint64(u.MemoryWorkingSet), uint64(u.MemoryUsage), uint64(u.MemoryRSS), uint64(u.PageFaults), uint64(u.MajorPageFaults)
		ps.Containers = append(ps.Containers, statsapi.ContainerStats{
			Name:      c.Name,
			StartTime: metav1.NewTime(c.StartedAt),
			CPU:       p.cpu(c.ID, u.CPUUsageNanos, now, seen),
			Memory: &statsapi.MemoryStats{Time: metav1.NewTime(now), UsageBytes: &cu, WorkingSetBytes: &cw, RSSBytes: &cr,
				PageFaults: &cf, MajorPageFaults: &cm},
		})
		cpuNanos += u.CPUUsageNanos
		usage, workingSet, rss, faults, majorFaults = usage+cu, workingSet+cw, rss+cr, faults+cf, majorFaults+cm
	}
	if len(ps.Containers) > 0 {
		ps.CPU = p.cpu(string(pod.UID), cpuNanos, now, seen)
		mem = statsapi.MemoryStats{Time: metav1.NewTime(now), UsageBytes: &usage, WorkingSetBytes: &workingSet, RSSBytes: &rss,
			PageFaults: &faults, MajorPageFaults: &majorFaults}
		ps.Memory = &mem
	}
	if netPid != 0 && !pod.Spec.HostNetwork {
		if n, err := readNetDev(filepath.Join(proc, strconv.Itoa(int(netPid)), "net", "dev"), now); err == nil {
			ps.Network = n
		}
	}
	return ps, true
}

// readProcStat returns the CPU time the node has spent busy (all but idle and iowait) and
// the boot time, from /proc/stat.
func readProcStat(path string) (busyNanos uint64, boot time.Time, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, boot, err
	}
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 8 && f[0] == "cpu":
			// user nice system idle iowait irq softirq steal [guest guest_nice: in user]
			var busy uint64
			for i, v := range f[1:] {
				if i == 3 || i == 4 || i >= 8 {
					continue
				}
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, boot, fmt.Errorf("%s: cpu: %w", path, err)
				}
				busy += n
			}
			busyNanos, found = busy*uint64(time.Second/userHZ), true
		case len(f) == 2 && f[0] == "btime":
			if s, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				boot = time.Unix(s, 0)
			}
		}
	}
	if !found {
		return 0, boot, fmt.Errorf("%s has no cpu line", path)
	}
	return busyNanos, boot, nil
}

// readNetDev reads a network namespace's interface counters (/proc/PID/net/dev); the pod's
// default interface is eth0, as CNI names it.
func readNetDev(path string, now time.Time) (*statsapi.NetworkStats, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ns := &statsapi.NetworkStats{Time: metav1.NewTime(now)}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, counters, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue // the two header lines
		}
		name = strings.TrimSpace(name)
		v := strings.Fields(counters)
		if name == "lo" || len(v) < 16 {
			continue
		}
		num := func(i int) *uint64 { n, _ := strconv.ParseUint(v[i], 10, 64); return &n }
		is := statsapi.InterfaceStats{Name: name, RxBytes: num(0), RxErrors: num(2), TxBytes: num(8), TxErrors: num(10)}
		ns.Interfaces = append(ns.Interfaces, is)
		if name == "eth0" {
			ns.InterfaceStats = is
		}
	}
	return ns, sc.Err()
}
