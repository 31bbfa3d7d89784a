package eviction

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Signal is an eviction signal, named as kubelet names it.
type Signal string

// The signals holdfast observes.
const (
	SignalMemoryAvailable   Signal = "memory.available"
	SignalNodeFsAvailable   Signal = "nodefs.available"
	SignalNodeFsInodesFree  Signal = "nodefs.inodesFree"
	SignalImageFsAvailable  Signal = "imagefs.available"
	SignalImageFsInodesFree Signal = "imagefs.inodesFree"
	SignalPIDAvailable      Signal = "pid.available"
)

// signals lists the known signals in the order they are dealt with: memory first, as kubelet's
// byEvictionPriority puts it, then disk, then PIDs.
var signals = []Signal{
	SignalMemoryAvailable,
	SignalNodeFsAvailable, SignalNodeFsInodesFree,
	SignalImageFsAvailable, SignalImageFsInodesFree,
	SignalPIDAvailable,
}

// DefaultHard are the hard thresholds of a node whose configuration names none: kubelet's
// defaults on Linux, plus pid.available<10%, which kubelet does not set and holdfast does (it
// reported PIDPressure at 90% of pid_max in use before thresholds were configurable). A signal
// the configuration does not name keeps its default; "0" or "0%" disables it.
var DefaultHard = map[string]string{
	string(SignalMemoryAvailable):   "100Mi",
	string(SignalNodeFsAvailable):   "10%",
	string(SignalNodeFsInodesFree):  "5%",
	string(SignalImageFsAvailable):  "15%",
	string(SignalImageFsInodesFree): "5%",
	string(SignalPIDAvailable):      "10%",
}

// resourceInodes and resourcePIDs name the resources of inode and PID signals in messages, as
// kubelet names them.
const (
	resourceInodes v1.ResourceName = "inodes"
	resourcePIDs   v1.ResourceName = "pids"
)

// Resource is what a signal measures, as named in kubelet's eviction messages.
func (s Signal) Resource() v1.ResourceName {
	switch s {
	case SignalMemoryAvailable:
		return v1.ResourceMemory
	case SignalNodeFsAvailable, SignalImageFsAvailable:
		return v1.ResourceEphemeralStorage
	case SignalNodeFsInodesFree, SignalImageFsInodesFree:
		return resourceInodes
	case SignalPIDAvailable:
		return resourcePIDs
	}
	return ""
}

// Condition is the node condition a signal drives.
func (s Signal) Condition() v1.NodeConditionType {
	switch s {
	case SignalMemoryAvailable:
		return v1.NodeMemoryPressure
	case SignalPIDAvailable:
		return v1.NodePIDPressure
	}
	return v1.NodeDiskPressure
}

// disk says the signal is about a file system, where node-level reclaim comes first.
func (s Signal) disk() bool { return s.Condition() == v1.NodeDiskPressure }

// Threshold is one eviction threshold: the signal is under pressure when what is available is
// below Quantity, or below Percentage of the capacity.
type Threshold struct {
	Signal Signal
	// Quantity is the absolute value (bytes, inodes or PIDs); nil when Percentage is used.
	Quantity *resource.Quantity
	// Percentage of the capacity, in (0, 1].
	Percentage float64
	// GracePeriod is how long a soft threshold must be met before pods are evicted; zero for
	// a hard threshold.
	GracePeriod time.Duration
}

// Hard says the threshold evicts as soon as it is met.
func (t Threshold) Hard() bool { return t.GracePeriod == 0 }

// Value is the threshold's value for a signal of the given capacity.
func (t Threshold) Value(capacity int64) int64 {
	if t.Quantity != nil {
		return t.Quantity.Value()
	}
	return int64(math.Ceil(t.Percentage * float64(capacity)))
}

// QuantityFor is the threshold as a quantity (what kubelet prints as "Threshold quantity").
func (t Threshold) QuantityFor(capacity int64) *resource.Quantity {
	if t.Quantity != nil {
		return t.Quantity
	}
	return resource.NewQuantity(t.Value(capacity), format(t.Signal))
}

// Met says the observation is below the threshold. A signal that was not observed (capacity
// 0) never is.
func (t Threshold) Met(o Observation) bool {
	if o.Capacity <= 0 {
		return false
	}
	return o.Available < t.Value(o.Capacity)
}

func (t Threshold) String() string {
	v := strconv.FormatFloat(t.Percentage*100, 'f', -1, 64) + "%"
	if t.Quantity != nil {
		v = t.Quantity.String()
	}
	s := string(t.Signal) + "<" + v
	if !t.Hard() {
		s += " for " + t.GracePeriod.String()
	}
	return s
}

func format(s Signal) resource.Format {
	if s == SignalMemoryAvailable || s == SignalNodeFsAvailable || s == SignalImageFsAvailable {
		return resource.BinarySI
	}
	return resource.DecimalSI
}

// ParseThresholds reads the configuration's thresholds (kubelet's evictionHard, evictionSoft
// and evictionSoftGracePeriod: signal name to "100Mi" or "10%", and to a duration). hard is
// merged over DefaultHard. A soft threshold needs a grace period.
func ParseThresholds(hard, soft, softGracePeriod map[string]string) ([]Threshold, error) {
	merged := maps.Clone(DefaultHard)
	maps.Copy(merged, hard)
	var out []Threshold
	var errs []string
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		t, ok, err := parseThreshold(name, merged[name])
		if err != nil {
			errs = append(errs, "evictionHard: "+err.Error())
		} else if ok {
			out = append(out, t)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(soft)) {
		t, ok, err := parseThreshold(name, soft[name])
		if err != nil {
			errs = append(errs, "evictionSoft: "+err.Error())
			continue
		}
		g, has := softGracePeriod[name]
		if !has {
			errs = append(errs, fmt.Sprintf("evictionSoft: %s has no grace period in evictionSoftGracePeriod", name))
			continue
		}
		d, err := time.ParseDuration(g)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Sprintf("evictionSoftGracePeriod: %s: %q is not a positive duration", name, g))
			continue
		}
		if ok {
			t.GracePeriod = d
			out = append(out, t)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(softGracePeriod)) {
		if _, ok := soft[name]; !ok {
			errs = append(errs, fmt.Sprintf("evictionSoftGracePeriod: %s has no threshold in evictionSoft", name))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return out, nil
}

// parseThreshold reads one "signal: value"; ok is false for a disabled threshold (0 or 0%).
func parseThreshold(name, value string) (Threshold, bool, error) {
	s := Signal(name)
	if !slices.Contains(signals, s) {
		return Threshold{}, false, fmt.Errorf("unknown signal %q (known: %v)", name, signals)
	}
	t := Threshold{Signal: s}
	if p, ok := strings.CutSuffix(strings.TrimSpace(value), "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 100 {
			return t, false, fmt.Errorf("%s: %q is not a percentage in [0%%, 100%%]", name, value)
		}
		t.Percentage = f / 100
		return t, f > 0, nil
	}
	q, err := resource.ParseQuantity(value)
	if err != nil || q.Sign() < 0 {
		return t, false, fmt.Errorf("%s: %q is neither a quantity (100Mi) nor a percentage (10%%)", name, value)
	}
	t.Quantity = &q
	return t, !q.IsZero(), nil
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
