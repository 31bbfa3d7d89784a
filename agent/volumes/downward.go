package volumes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// ResourceFieldValue resolves a resourceFieldRef (env or downward API volume) as kubelet does:
// the named container (ref.ContainerName, else c), its limits defaulted to the node's
// allocatable where unset, divided by the divisor (default 1) and rounded up. c may be nil when
// ref names its container.
func ResourceFieldValue(ref *v1.ResourceFieldSelector, pod *v1.Pod, c *v1.Container, allocatable v1.ResourceList) (string, error) {
	if ref.ContainerName != "" {
		c = findContainer(pod, ref.ContainerName)
		if c == nil {
			return "", fmt.Errorf("container %s not found", ref.ContainerName)
		}
	}
	if c == nil {
		return "", errors.New("resourceFieldRef names no container")
	}
	defaulted := c.DeepCopy()
	if defaulted.Resources.Limits == nil {
		defaulted.Resources.Limits = v1.ResourceList{}
	}
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage} {
		if q, ok := defaulted.Resources.Limits[name]; !ok || q.IsZero() {
			if a, ok := allocatable[name]; ok {
				defaulted.Resources.Limits[name] = a.DeepCopy()
			}
		}
	}
	return podutil.ContainerResourceValue(ref, defaulted)
}

func findContainer(pod *v1.Pod, name string) *v1.Container {
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// downwardPayload computes the files of a downwardAPI volume (or projection): fieldRef values
// as kubelet writes them (labels and annotations as sorted key="value" lines), resourceFieldRef
// values as ResourceFieldValue computes them.
func downwardPayload(items []v1.DownwardAPIVolumeFile, pod *v1.Pod, defaultMode int32, allocatable v1.ResourceList) (map[string]file, error) {
	out := make(map[string]file, len(items))
	var errs []error
	for _, it := range items {
		mode := defaultMode
		if it.Mode != nil {
			mode = *it.Mode
		}
		f := file{mode: os.FileMode(mode)}
		switch {
		case it.FieldRef != nil:
			v, err := podutil.FieldPathValue(pod, it.FieldRef.FieldPath)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			f.data = []byte(v)
		case it.ResourceFieldRef != nil:
			v, err := ResourceFieldValue(it.ResourceFieldRef, pod, nil, allocatable)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			f.data = []byte(v)
		default:
			errs = append(errs, fmt.Errorf("downward API item %q has neither fieldRef nor resourceFieldRef", it.Path))
			continue
		}
		out[filepath.Clean(it.Path)] = f
	}
	return out, errors.Join(errs...)
}

// defaultTmpfsSize is the size of a memory-backed volume without its own sizeLimit, as kubelet
// computes it: the pod's memory limit when every container has one, else the node's
// allocatable memory. 0 means neither is known (the kernel's default then applies).
func defaultTmpfsSize(pod *v1.Pod, allocatable v1.ResourceList) int64 {
	if limit, ok := podMemoryLimit(pod); ok {
		return limit
	}
	if q, ok := allocatable[v1.ResourceMemory]; ok {
		return q.Value()
	}
	return 0
}

// tmpfsSize is sizeLimit capped by the default size, or the default size alone.
func tmpfsSize(pod *v1.Pod, sizeLimit *resource.Quantity, allocatable v1.ResourceList) int64 {
	def := defaultTmpfsSize(pod, allocatable)
	if sizeLimit != nil && sizeLimit.Value() > 0 {
		if def > 0 && def < sizeLimit.Value() {
			return def
		}
		return sizeLimit.Value()
	}
	return def
}

// podMemoryLimit is the sum of the app containers' memory limits, or the largest init
// container limit if that is larger; ok is false when some container has no limit.
func podMemoryLimit(pod *v1.Pod) (int64, bool) {
	if len(pod.Spec.Containers) == 0 {
		return 0, false
	}
	var sum int64
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Limits[v1.ResourceMemory]
		if !ok || q.IsZero() {
			return 0, false
		}
		sum += q.Value()
	}
	for _, c := range pod.Spec.InitContainers {
		q, ok := c.Resources.Limits[v1.ResourceMemory]
		if !ok || q.IsZero() {
			return 0, false
		}
		sum = max(sum, q.Value())
	}
	return sum, true
}
