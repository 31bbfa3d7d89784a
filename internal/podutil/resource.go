package podutil

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ContainerResourceValue returns the value of a downward API resource field of the container
// (limits.cpu, requests.memory, limits.hugepages-2Mi, ...) in units of the selector's divisor
// (1 when unset), rounded up.
func ContainerResourceValue(fs *v1.ResourceFieldSelector, container *v1.Container) (string, error) {
	divisor := resource.Quantity{}
	if divisor.Cmp(fs.Divisor) == 0 {
		divisor = resource.MustParse("1")
	} else {
		divisor = fs.Divisor
	}
	switch fs.Resource {
	case "limits.cpu":
		return cpuString(container.Resources.Limits.Cpu(), divisor), nil
	case "limits.memory":
		return valueString(container.Resources.Limits.Memory(), divisor), nil
	case "limits.ephemeral-storage":
		return valueString(container.Resources.Limits.StorageEphemeral(), divisor), nil
	case "requests.cpu":
		return cpuString(container.Resources.Requests.Cpu(), divisor), nil
	case "requests.memory":
		return valueString(container.Resources.Requests.Memory(), divisor), nil
	case "requests.ephemeral-storage":
		return valueString(container.Resources.Requests.StorageEphemeral(), divisor), nil
	}
	// hugepages-<size>, whose names are not fixed
	if name, ok := strings.CutPrefix(fs.Resource, "requests."); ok && isHugePages(v1.ResourceName(name)) {
		return valueString(container.Resources.Requests.Name(v1.ResourceName(name), resource.BinarySI), divisor), nil
	}
	if name, ok := strings.CutPrefix(fs.Resource, "limits."); ok && isHugePages(v1.ResourceName(name)) {
		return valueString(container.Resources.Limits.Name(v1.ResourceName(name), resource.BinarySI), divisor), nil
	}
	return "", fmt.Errorf("unsupported container resource: %v", fs.Resource)
}

// cpuString is cpu in units of divisor, rounded up, compared in millicores.
func cpuString(cpu *resource.Quantity, divisor resource.Quantity) string {
	return strconv.FormatInt(int64(math.Ceil(float64(cpu.MilliValue())/float64(divisor.MilliValue()))), 10)
}

// valueString is q in units of divisor, rounded up.
func valueString(q *resource.Quantity, divisor resource.Quantity) string {
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10)
}

func isHugePages(name v1.ResourceName) bool {
	return strings.HasPrefix(string(name), v1.ResourceHugePagesPrefix)
}
