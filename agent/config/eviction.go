package config

// The eviction thresholds' vocabulary: the configuration's evictionHard, evictionSoft and
// evictionSoftGracePeriod read into thresholds of the signals agent/eviction observes. It
// lives here so that reading and checking a configuration needs nothing of the agent.

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

// EvictionSignal is an eviction signal, named as kubelet names it.
type EvictionSignal string

// The signals holdfast observes.
const (
	SignalMemoryAvailable   EvictionSignal = "memory.available"
	SignalNodeFsAvailable   EvictionSignal = "nodefs.available"
	SignalNodeFsInodesFree  EvictionSignal = "nodefs.inodesFree"
	SignalImageFsAvailable  EvictionSignal = "imagefs.available"
	SignalImageFsInodesFree EvictionSignal = "imagefs.inodesFree"
	SignalPIDAvailable      EvictionSignal = "pid.available"
)

// evictionSignals lists the known signals in the order they are dealt with: memory first, as kubelet's
// byEvictionPriority puts it, then disk, then PIDs.
var evictionSignals = []EvictionSignal{
	SignalMemoryAvailable,
	SignalNodeFsAvailable, SignalNodeFsInodesFree,
	SignalImageFsAvailable, SignalImageFsInodesFree,
	SignalPIDAvailable,
}

// EvictionSignals are the known signals, memory first, then disk, then PIDs.
func EvictionSignals() []EvictionSignal { return slices.Clone(evictionSignals) }

// DefaultEvictionHard are the hard thresholds of a node whose configuration names none: kubelet's
// defaults on Linux, plus pid.available<10%, which kubelet does not set and holdfast does (it
// reported PIDPressure at 90% of pid_max in use before thresholds were configurable). A signal
// the configuration does not name keeps its default; "0" or "0%" disables it.
var DefaultEvictionHard = map[string]string{
	string(SignalMemoryAvailable):   "100Mi",
	string(SignalNodeFsAvailable):   "10%",
	string(SignalNodeFsInodesFree):  "5%",
	string(SignalImageFsAvailable):  "15%",
	string(SignalImageFsInodesFree): "5%",
	string(SignalPIDAvailable):      "10%",
}

// ResourceInodes and ResourcePIDs name the resources of inode and PID signals in messages, as
// kubelet names them.
const (
	ResourceInodes v1.ResourceName = "inodes"
	ResourcePIDs   v1.ResourceName = "pids"
)

// Resource is what a signal measures, as named in kubelet's eviction messages.
func (s EvictionSignal) Resource() v1.ResourceName {
	switch s {
	case SignalMemoryAvailable:
		return v1.ResourceMemory
	case SignalNodeFsAvailable, SignalImageFsAvailable:
		return v1.ResourceEphemeralStorage
	case SignalNodeFsInodesFree, SignalImageFsInodesFree:
		return ResourceInodes
	case SignalPIDAvailable:
		return ResourcePIDs
	}
	return ""
}

// Condition is the node condition a signal drives.
func (s EvictionSignal) Condition() v1.NodeConditionType {
	switch s {
	case SignalMemoryAvailable:
		return v1.NodeMemoryPressure
	case SignalPIDAvailable:
		return v1.NodePIDPressure
	}
	return v1.NodeDiskPressure
}

// Disk says the signal is about a file system, where node-level reclaim comes first.
func (s EvictionSignal) Disk() bool { return s.Condition() == v1.NodeDiskPressure }

// EvictionThreshold is one eviction threshold: the signal is under pressure when what is available is
// below Quantity, or below Percentage of the capacity.
type EvictionThreshold struct {
	Signal EvictionSignal
	// Quantity is the absolute value (bytes, inodes or PIDs); nil when Percentage is used.
	Quantity *resource.Quantity
	// Percentage of the capacity, in (0, 1].
	Percentage float64
	// GracePeriod is how long a soft threshold must be met before pods are evicted; zero for
	// a hard threshold.
	GracePeriod time.Duration
}

// Hard says the threshold evicts as soon as it is met.
func (t EvictionThreshold) Hard() bool { return t.GracePeriod == 0 }

// Value is the threshold's value for a signal of the given capacity.
func (t EvictionThreshold) Value(capacity int64) int64 {
	if t.Quantity != nil {
		return t.Quantity.Value()
	}
	return int64(math.Ceil(t.Percentage * float64(capacity)))
}

// QuantityFor is the threshold as a quantity (what kubelet prints as "Threshold quantity").
func (t EvictionThreshold) QuantityFor(capacity int64) *resource.Quantity {
	if t.Quantity != nil {
		return t.Quantity
	}
	return resource.NewQuantity(t.Value(capacity), t.Signal.Format())
}

func (t EvictionThreshold) String() string {
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

// Format is how quantities of the signal are written: bytes in binary SI, counts in decimal.
func (s EvictionSignal) Format() resource.Format {
	if s == SignalMemoryAvailable || s == SignalNodeFsAvailable || s == SignalImageFsAvailable {
		return resource.BinarySI
	}
	return resource.DecimalSI
}

// ParseEvictionThresholds reads the configuration's thresholds (kubelet's evictionHard, evictionSoft
// and evictionSoftGracePeriod: signal name to "100Mi" or "10%", and to a duration). hard is
// merged over DefaultEvictionHard. A soft threshold needs a grace period.
func ParseEvictionThresholds(hard, soft, softGracePeriod map[string]string) ([]EvictionThreshold, error) {
	merged := maps.Clone(DefaultEvictionHard)
	maps.Copy(merged, hard)
	var out []EvictionThreshold
	var errs []string
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		t, ok, err := parseEvictionThreshold(name, merged[name])
		if err != nil {
			errs = append(errs, "evictionHard: "+err.Error())
		} else if ok {
			out = append(out, t)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(soft)) {
		t, ok, err := parseEvictionThreshold(name, soft[name])
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

// parseEvictionThreshold reads one "signal: value"; ok is false for a disabled threshold (0 or 0%).
func parseEvictionThreshold(name, value string) (EvictionThreshold, bool, error) {
	s := EvictionSignal(name)
	if !slices.Contains(evictionSignals, s) {
		return EvictionThreshold{}, false, fmt.Errorf("unknown signal %q (known: %v)", name, evictionSignals)
	}
	t := EvictionThreshold{Signal: s}
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
