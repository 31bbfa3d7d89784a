package podcgroups

import "github.com/holdfast-dev/holdfast/agent/cgroups"

// Driver makes, updates and removes the hierarchy's cgroups, and reads them back: the seam
// between what goes in each cgroup (this package's computations, one implementation) and how
// it gets there (the kubelet's cgroupDriver). Paths are cgroup paths in the hierarchy, as
// Layout names them. cgroups.Hierarchy is the cgroupfs driver; *Systemd the systemd one,
// which makes each cgroup a transient slice through systemd's D-Bus API.
type Driver interface {
	// Exists says the cgroup at path is there.
	Exists(path string) bool
	// Ensure makes the cgroup where it is missing and writes r into it.
	Ensure(path string, r cgroups.Resources) error
	// Update writes r into the existing cgroup.
	Update(path string, r cgroups.Resources) error
	// Remove removes the cgroup once nothing runs in it; one that holds a process stays and
	// the error says so. It never kills. A cgroup already gone is not an error.
	Remove(path string) error
	// Children lists the names of the cgroups directly below path.
	Children(path string) ([]string, error)
	// SettingsAt reads back what the cgroup holds.
	SettingsAt(path string) (cgroups.Settings, error)
	// MemoryUsageAt reads the memory charged to the cgroup.
	MemoryUsageAt(path string) (int64, error)
}

var _ Driver = cgroups.Hierarchy{}
