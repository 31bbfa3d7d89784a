package eviction

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/agent/config"
)

// Signal and Threshold are the configuration's eviction vocabulary (config.EvictionSignal,
// config.EvictionThreshold), parsed there so that reading a configuration needs nothing of
// this package.
type (
	Signal    = config.EvictionSignal
	Threshold = config.EvictionThreshold
)

// The signals holdfast observes.
const (
	SignalMemoryAvailable   = config.SignalMemoryAvailable
	SignalNodeFsAvailable   = config.SignalNodeFsAvailable
	SignalNodeFsInodesFree  = config.SignalNodeFsInodesFree
	SignalImageFsAvailable  = config.SignalImageFsAvailable
	SignalImageFsInodesFree = config.SignalImageFsInodesFree
	SignalPIDAvailable      = config.SignalPIDAvailable
)

// resourceInodes and resourcePIDs name the resources of inode and PID signals, as
// Signal.Resource names them.
const (
	resourceInodes = config.ResourceInodes
	resourcePIDs   = config.ResourcePIDs
)

// signals are the known signals in the order they are dealt with: memory first, as kubelet's
// byEvictionPriority puts it, then disk, then PIDs.
var signals = config.EvictionSignals()

// ParseThresholds is config.ParseEvictionThresholds.
func ParseThresholds(hard, soft, softGracePeriod map[string]string) ([]Threshold, error) {
	return config.ParseEvictionThresholds(hard, soft, softGracePeriod)
}

// thresholdMet says the observation is below the threshold. A signal that was not observed (capacity
// 0) never is.
func thresholdMet(t Threshold, o Observation) bool {
	if o.Capacity <= 0 {
		return false
	}
	return o.Available < t.Value(o.Capacity)
}

// HardReservation is what the hard thresholds keep out of allocatable, as kubelet's
// hardEvictionReservation: memory for memory.available, ephemeral-storage for
// nodefs.available (a percentage taken of the capacity).
func HardReservation(thresholds []Threshold, capacity v1.ResourceList) v1.ResourceList {
	out := v1.ResourceList{}
	for _, t := range thresholds {
		if !t.Hard() {
			continue
		}
		var name v1.ResourceName
		switch t.Signal {
		case SignalMemoryAvailable:
			name = v1.ResourceMemory
		case SignalNodeFsAvailable:
			name = v1.ResourceEphemeralStorage
		default:
			continue
		}
		c, ok := capacity[name]
		if !ok {
			continue
		}
		out[name] = *resource.NewQuantity(t.Value(c.Value()), resource.BinarySI)
	}
	return out
}
