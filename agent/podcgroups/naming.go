package podcgroups

import (
	"fmt"
	"path"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// The cgroup drivers, by the kubelet's names (KubeletConfiguration cgroupDriver).
const (
	DriverCgroupfs = "cgroupfs"
	DriverSystemd  = "systemd"
)

// Layout names the hierarchy's cgroups as the kubelet's cgroup manager does: each is a list
// of components (cgroupRoot's, then "kubepods", the QoS class, "pod<uid>"), which the
// cgroupfs driver joins into a path (/kubepods/burstable/pod<uid>) and the systemd driver
// into nested slices (/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
// with - as _>.slice, the kubelet's CgroupName.ToSystemd). Either way the result is the
// cgroup's path in the hierarchy, which is what the runtime is given as the pod's cgroup
// parent and what reads go to: only making, updating and removing differ by driver.
type Layout struct {
	// Root is the kubelet's cgroupRoot, in cgroupfs form ("/" or "/edge").
	Root string
	// Systemd names the cgroups as slices (cgroupDriver: systemd).
	Systemd bool
}

// NewLayout returns the layout of driver (DriverCgroupfs or DriverSystemd) below root.
func NewLayout(driver, root string) (Layout, error) {
	l := Layout{Root: root, Systemd: driver == DriverSystemd}
	if driver != DriverCgroupfs && driver != DriverSystemd {
		return l, fmt.Errorf("cgroupDriver %q: want %q or %q", driver, DriverCgroupfs, DriverSystemd)
	}
	for _, c := range l.rootComponents() {
		// The kubelet forbids "_" in a component (NewCgroupName): the systemd name writes "-"
		// as "_", and would not read back.
		if l.Systemd && strings.Contains(c, "_") {
			return l, fmt.Errorf("cgroupRoot %q: the systemd driver takes no \"_\" in it (the kubelet's rule: %q stands for \"-\" in a slice name)", root, "_")
		}
	}
	return l, nil
}

func (l Layout) rootComponents() []string {
	var out []string
	for _, c := range strings.Split(l.Root, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// path is the cgroup of the kubelet's name components below the root.
func (l Layout) path(components ...string) string {
	name := append(l.rootComponents(), components...)
	if !l.Systemd {
		return "/" + path.Join(name...)
	}
	return SystemdPath(name)
}

// Kubepods is the cgroup all pods are under: /kubepods, or /kubepods.slice.
func (l Layout) Kubepods() string { return l.path(Kubepods) }

// QOSDir is a QoS class's cgroup: Guaranteed pods sit in kubepods itself, the other two
// classes in a level of their own.
func (l Layout) QOSDir(qos v1.PodQOSClass) string {
	if qos == v1.PodQOSGuaranteed {
		return l.Kubepods()
	}
	return l.path(Kubepods, strings.ToLower(string(qos)))
}

// PodDir is a pod's cgroup: its QoS class's, then pod<uid> (the kubelet's
// GetPodCgroupNameSuffix).
func (l Layout) PodDir(pod *v1.Pod) string { return l.podDir(podutil.ComputePodQOS(pod), pod.UID) }

func (l Layout) podDir(qos v1.PodQOSClass, uid types.UID) string {
	if qos == v1.PodQOSGuaranteed {
		return l.path(Kubepods, podDirName(uid))
	}
	return l.path(Kubepods, strings.ToLower(string(qos)), podDirName(uid))
}

// PodUID is the pod whose cgroup a child of a QoS cgroup (a directory name, as Children
// lists it) is: false for anything else (the QoS levels below kubepods, a container's).
func (l Layout) PodUID(child string) (types.UID, bool) {
	last := child
	if l.Systemd {
		base, ok := strings.CutSuffix(child, sliceSuffix)
		if !ok {
			return "", false
		}
		parts := strings.Split(base, "-")
		last = unescapeSystemd(parts[len(parts)-1])
	}
	uid, ok := strings.CutPrefix(last, "pod")
	if !ok || uid == "" {
		return "", false
	}
	return types.UID(uid), true
}

const sliceSuffix = ".slice"

// escapeSystemd is the kubelet's escapeSystemdCgroupName: "-" nests slices in systemd's
// names, so a component's own "-" (a pod UID has four) is written "_".
func escapeSystemd(component string) string   { return strings.ReplaceAll(component, "-", "_") }
func unescapeSystemd(component string) string { return strings.ReplaceAll(component, "_", "-") }

// SystemdPath is the kubelet's CgroupName.ToSystemd: the name components joined with "-"
// into one slice name, expanded into the path of its nested slices:
// {kubepods, burstable, pod12-ab} is
// /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice.
func SystemdPath(components []string) string {
	if len(components) == 0 {
		return "/"
	}
	escaped := make([]string, len(components))
	for i, c := range components {
		escaped[i] = escapeSystemd(c)
	}
	p, err := ExpandSlice(strings.Join(escaped, "-") + sliceSuffix)
	if err != nil {
		// Only an empty component gets here; Layout's components are never empty.
		panic(fmt.Sprintf("cgroup name %q as a systemd slice: %v", components, err))
	}
	return p
}

// ExpandSlice is runc's (opencontainers/cgroups/systemd): a slice's path in the hierarchy
// from its name, a-b-c.slice being /a.slice/a-b.slice/a-b-c.slice; "-.slice", the root
// slice, is "/".
func ExpandSlice(slice string) (string, error) {
	name, ok := strings.CutSuffix(slice, sliceSuffix)
	if !ok || name == "" || strings.Contains(slice, "/") {
		return "", fmt.Errorf("invalid slice name %q", slice)
	}
	if name == "-" {
		return "/", nil
	}
	var p, prefix string
	for _, c := range strings.Split(name, "-") {
		if c == "" {
			return "", fmt.Errorf("invalid slice name %q", slice)
		}
		p += "/" + prefix + c + sliceSuffix
		prefix += c + "-"
	}
	return p, nil
}

// IsSlicePath says a cgroup path is a systemd slice's (its last element ends in .slice): the
// parent the runtime must then name with the systemd cgroup driver ("slice:prefix:name"),
// as containerd's CRI plugin tells it (getCgroupsPath).
func IsSlicePath(p string) bool { return strings.HasSuffix(path.Base(p), sliceSuffix) }
