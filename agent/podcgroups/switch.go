package podcgroups

import (
	"fmt"
	"log/slog"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
)

// CheckDriverSwitch is what a start does about the hierarchy the other cgroup driver made,
// left by a run before a change of cgroupDriver: pods still running in it (their containers
// in /kubepods/... while the agent now makes /kubepods.slice/..., or the other way) refuse
// the start, since two kubepods side by side would each be given the node's allocatable and
// the pods of the old one would never be counted or removed; the kubelet does not mix them
// either. An old hierarchy with nothing in it goes (the cgroupfs driver's is removed with
// rmdir; systemd's empty slices are left to systemd, which a reboot clears).
func CheckDriverSwitch(h cgroups.Hierarchy, driver, root string, log *slog.Logger) error {
	other := Layout{Root: root, Systemd: driver != DriverSystemd}
	otherName := DriverCgroupfs
	if other.Systemd {
		otherName = DriverSystemd
	}
	top := other.Kubepods()
	busy, err := h.Populated(top)
	if err != nil {
		return fmt.Errorf("look for pods the %s driver made in %s: %w", otherName, top, err)
	}
	if busy {
		return fmt.Errorf("cgroupDriver is %s, but containers of pods made with cgroupDriver %s still run in %s: "+
			"holdfast does not run pods in both hierarchies (as the kubelet does not); reboot the gateway "+
			"(its pods are then made again in the new hierarchy) or stop the containers in %s, "+
			"or set cgroupDriver back to %s", driver, otherName, top, top, otherName)
	}
	if !h.Exists(top) || other.Systemd {
		return nil
	}
	if err := h.Remove(top); err != nil {
		log.Warn("could not remove the empty pod cgroups of the earlier cgroup driver", "driver", otherName, "cgroup", top, "err", err)
		return nil
	}
	log.Info("removed the empty pod cgroups of the earlier cgroup driver", "driver", otherName, "cgroup", top)
	return nil
}
