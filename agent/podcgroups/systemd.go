package podcgroups

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
)

// UnitConn is the part of systemd's D-Bus API the systemd driver calls: go-systemd's
// *dbus.Conn, as runc's systemd cgroup manager (opencontainers/cgroups/systemd) calls it.
type UnitConn interface {
	StartTransientUnitContext(ctx context.Context, name, mode string, props []sddbus.Property, ch chan<- string) (int, error)
	SetUnitPropertiesContext(ctx context.Context, name string, runtime bool, props ...sddbus.Property) error
	StopUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error)
	ResetFailedUnitContext(ctx context.Context, name string) error
	GetManagerProperty(name string) (string, error)
	Close()
}

// DialSystemd connects to systemd as runc does: the system bus, or systemd's private socket
// (/run/systemd/private, root only) where there is no bus daemon.
func DialSystemd(ctx context.Context) (UnitConn, error) {
	c, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus (cgroupDriver: systemd needs systemd as init): %w", err)
	}
	return c, nil
}

// Systemd is the systemd cgroup driver: each cgroup of the hierarchy is a transient slice
// unit, made with StartTransientUnit and changed with SetUnitProperties (runtime only: gone
// at reboot, with the pods), the properties runc's systemd manager sets for the same
// Resources; then, as runc's Set does, the same values written to the cgroup's files, so that
// a value systemd cannot express yet (an old systemd without CPUQuotaPeriodUSec) is there
// too. A slice's path (Layout) names its unit: its last element. Reads are the cgroupfs
// driver's, on the slices' directories.
type Systemd struct {
	cgroups.Hierarchy // reads, and the files' writes
	dial              func(context.Context) (UnitConn, error)
	// Timeout bounds each call and each job's wait (runc waits 30s for a job).
	Timeout time.Duration

	mu      sync.Mutex // protects conn, version
	conn    UnitConn
	version int // systemd's, 0 until read
}

// NewSystemd returns the systemd driver for h, connecting with dial (DialSystemd) at its
// first call, and again when systemd closed the connection (a daemon-reexec).
func NewSystemd(h cgroups.Hierarchy, dial func(context.Context) (UnitConn, error)) *Systemd {
	return &Systemd{Hierarchy: h, dial: dial, Timeout: 30 * time.Second}
}

// Close closes the connection to systemd.
func (s *Systemd) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// call runs f on the connection, dialling first; a connection systemd closed is dialled
// again and f tried once more (runc's retryOnDisconnect).
func (s *Systemd) call(f func(context.Context, UnitConn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.Timeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if s.conn == nil {
			// Not ctx: go-systemd ties the connection's life to the context it is dialled
			// with, and this one ends with the call. The job signals arrive later on it.
			c, err := s.dial(context.Background())
			if err != nil {
				s.mu.Unlock()
				return err
			}
			s.conn = c
		}
		c := s.conn
		s.mu.Unlock()
		err := f(ctx, c)
		if attempt > 0 || !disconnected(err) {
			return err
		}
		s.mu.Lock()
		if s.conn == c {
			c.Close()
			s.conn = nil
		}
		s.mu.Unlock()
	}
}

// systemdVersion is systemd's version number (255 for "255.4-1"), read once; 0 when it
// cannot be read, which leaves out what needs a known version.
func (s *Systemd) systemdVersion() int {
	s.mu.Lock()
	v := s.version
	s.mu.Unlock()
	if v != 0 {
		return v
	}
	var raw string
	if err := s.call(func(_ context.Context, c UnitConn) (err error) {
		raw, err = c.GetManagerProperty("Version")
		return err
	}); err != nil {
		return 0
	}
	v = parseSystemdVersion(raw)
	s.mu.Lock()
	s.version = v
	s.mu.Unlock()
	return v
}

// parseSystemdVersion is runc's systemdVersionAtoi: the leading number of "\"v255.4-1\"",
// "255", "v245-1.fc32"; 0 if there is none.
func parseSystemdVersion(s string) int {
	s = strings.TrimLeft(s, `"v`)
	end := 0
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	v, err := strconv.Atoi(s[:end])
	if err != nil {
		return 0
	}
	return v
}

// unitOf is the slice unit of a cgroup path and the slice it is below: the kubelet splits a
// systemd name the same way (libctCgroupConfig).
func unitOf(p string) (unit, parent string, err error) {
	dir, base := path.Split(path.Clean("/" + p))
	if !strings.HasSuffix(base, sliceSuffix) {
		return "", "", fmt.Errorf("cgroup %s is not a systemd slice (cgroupDriver: systemd makes slices only)", p)
	}
	parent = path.Base(dir)
	if dir == "/" {
		parent = "-.slice"
	}
	return base, parent, nil
}

// Ensure makes the slice at p a transient unit with r's properties, or, if it is there
// already, sets them (runc's Apply(-1) then Set, which is the kubelet's Create).
func (s *Systemd) Ensure(p string, r cgroups.Resources) error {
	unit, parent, err := unitOf(p)
	if err != nil {
		return err
	}
	if s.Exists(p) {
		// There already (an agent restart, a QoS level updated for each pod): its properties
		// set. Where that fails (systemd does not know a unit of that name), the unit is
		// started, which says what is wrong if it is there after all.
		if err := s.Update(p, r); err == nil {
			return nil
		}
	}
	version := s.systemdVersion()
	props, applied := systemdResources(r, s.Mode == cgroups.Unified, version)
	start := append(sliceProperties(unit, parent, s.Mode == cgroups.Unified), props...)
	err = s.runJob(unit, func(ctx context.Context, c UnitConn, ch chan<- string) (int, error) {
		return c.StartTransientUnitContext(ctx, unit, "replace", start, ch)
	})
	switch {
	case isDBusError(err, "org.freedesktop.systemd1.UnitExists"):
		// There: an agent restart, or a pod cgroup being made again.
		return s.Update(p, r)
	case err != nil:
		return fmt.Errorf("make slice %s: %w", unit, err)
	}
	return s.Hierarchy.Update(p, applied)
}

// Update sets r's properties on the unit whose cgroup is at p, for its runtime only, then
// writes them to its files (runc's Set). The unit is a slice of the hierarchy, or the
// service or scope of kubeReservedCgroup and systemReservedCgroup.
func (s *Systemd) Update(p string, r cgroups.Resources) error {
	unit := path.Base(path.Clean("/" + p))
	if !strings.HasSuffix(unit, sliceSuffix) && !strings.HasSuffix(unit, ".service") && !strings.HasSuffix(unit, ".scope") {
		return fmt.Errorf("cgroup %s is not a systemd unit's (a slice, service or scope): the systemd driver sets limits through its unit", p)
	}
	props, applied := systemdResources(r, s.Mode == cgroups.Unified, s.systemdVersion())
	if len(props) > 0 {
		if err := s.call(func(ctx context.Context, c UnitConn) error {
			return c.SetUnitPropertiesContext(ctx, unit, true, props...)
		}); err != nil {
			return fmt.Errorf("set properties of %s: %w", unit, err)
		}
	}
	return s.Hierarchy.Update(p, applied)
}

// Applied is r as a cgroup holds it once this driver has set it (systemdResources): what a
// read-back is compared with.
func (s *Systemd) Applied(r cgroups.Resources) cgroups.Resources {
	_, applied := systemdResources(r, s.Mode == cgroups.Unified, 0)
	return applied
}

// Remove stops the slice at p once nothing runs in it, then removes what systemd left of its
// cgroup. Stopping a slice stops every unit in it, a container's scope too: a cgroup that
// holds a process is left, with an error that says so, as the cgroupfs driver's rmdir
// leaves it. A slice systemd does not know is not an error.
func (s *Systemd) Remove(p string) error {
	unit, _, err := unitOf(p)
	if err != nil {
		return err
	}
	if busy, err := s.Populated(p); err != nil {
		return err
	} else if busy {
		return fmt.Errorf("remove slice %s: %w", unit, ErrInUse)
	}
	err = s.runJob(unit, func(ctx context.Context, c UnitConn, ch chan<- string) (int, error) {
		return c.StopUnitContext(ctx, unit, "replace", ch)
	})
	if err != nil && !isDBusError(err, "org.freedesktop.systemd1.NoSuchUnit") {
		return fmt.Errorf("stop slice %s: %w", unit, err)
	}
	// A unit that failed stays loaded until this (runc's stopUnit does the same).
	_ = s.call(func(ctx context.Context, c UnitConn) error { return c.ResetFailedUnitContext(ctx, unit) })
	return s.Hierarchy.Remove(p)
}

// ErrInUse is a cgroup not removed because a process is in it.
var ErrInUse = errors.New("a process is still in it; left in place")

// runJob starts a job with start and waits until systemd has run it: "done", or an error
// naming the result.
func (s *Systemd) runJob(unit string, start func(context.Context, UnitConn, chan<- string) (int, error)) error {
	ch := make(chan string, 1)
	if err := s.call(func(ctx context.Context, c UnitConn) error {
		_, err := start(ctx, c, ch)
		return err
	}); err != nil {
		return err
	}
	timer := time.NewTimer(s.Timeout)
	defer timer.Stop()
	select {
	case result := <-ch:
		if result != "done" {
			_ = s.call(func(ctx context.Context, c UnitConn) error { return c.ResetFailedUnitContext(ctx, unit) })
			return fmt.Errorf("systemd job for %s: %s", unit, result)
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("systemd job for %s: no result after %v", unit, s.Timeout)
	}
}

// disconnected says err is the connection's end (systemd re-executed, the bus restarted),
// not systemd's answer.
func disconnected(err error) bool {
	return errors.Is(err, godbus.ErrClosed) || errors.Is(err, net.ErrClosed)
}

func isDBusError(err error, name string) bool {
	var e godbus.Error
	return errors.As(err, &e) && e.Name == name
}

// sliceProperties are what runc gives a slice it makes (Apply(-1)): its description, its
// parent slice as a Wants= (a slice's place in the tree comes from its name), accounting on
// for every controller the limits use, and no default dependencies. No Delegate=: runc sets it
// on the scopes it puts containers in, never on a slice.
func sliceProperties(unit, parent string, unified bool) []sddbus.Property {
	io := "IOAccounting"
	if !unified {
		io = "BlockIOAccounting"
	}
	return []sddbus.Property{
		sddbus.PropDescription("holdfast " + unit),
		sddbus.PropWants(parent),
		newProp("MemoryAccounting", true),
		newProp("CPUAccounting", true),
		newProp(io, true),
		newProp("TasksAccounting", true),
		newProp("DefaultDependencies", false),
	}
}

func newProp(name string, value any) sddbus.Property {
	return sddbus.Property{Name: name, Value: godbus.MakeVariant(value)}
}

// infinity is systemd's USEC_INFINITY and "no limit" of MemoryMax, TasksMax.
const infinity = uint64(math.MaxUint64)

// systemdResources are r as systemd unit properties, as runc's genV2ResourcesProperties and
// genV1ResourcesProperties make them (unified: cgroup v2), for a systemd of version (0:
// unknown); and r as it is then applied: systemd keeps a CPU quota as a whole percentage of a
// CPU (CPUQuotaPerSecUSec in 10ms steps), so runc rounds a quota up to it and writes the
// rounded one to the files too. r's "none" (-1 or 0 for the memory and tasks limits, a quota
// of 0 or -1) is systemd's infinity.
func systemdResources(r cgroups.Resources, unified bool, version int) (props []sddbus.Property, applied cgroups.Resources) {
	applied = r
	if r.CPUShares != nil {
		if unified {
			props = append(props, newProp("CPUWeight", cgroups.SharesToWeight(*r.CPUShares)))
		} else {
			props = append(props, newProp("CPUShares", *r.CPUShares))
		}
	}
	if r.CPUQuota != nil || r.CPUPeriod != nil {
		var quota int64
		var period uint64
		if r.CPUQuota != nil {
			quota = *r.CPUQuota
		}
		if r.CPUPeriod != nil {
			period = *r.CPUPeriod
		}
		// CPUQuotaPeriodUSec came with systemd 242.
		if period != 0 && version >= 242 {
			props = append(props, newProp("CPUQuotaPeriodUSec", period))
		}
		perSec := infinity
		if quota > 0 {
			p := period
			if p == 0 {
				p = QuotaPeriod
			}
			perSec = uint64(quota) * 1000000 / p
			if perSec%10000 != 0 {
				perSec = (perSec/10000 + 1) * 10000
				rounded := int64(perSec * p / 1000000)
				applied.CPUQuota = &rounded
			}
		}
		props = append(props, newProp("CPUQuotaPerSecUSec", perSec))
	}
	if r.Memory != nil {
		limit := infinity
		if *r.Memory > 0 {
			limit = uint64(*r.Memory)
		}
		if unified {
			props = append(props, newProp("MemoryMax", limit))
		} else {
			props = append(props, newProp("MemoryLimit", limit))
		}
	}
	if r.PidsLimit != nil {
		limit := infinity
		if *r.PidsLimit > 0 {
			limit = uint64(*r.PidsLimit)
		}
		props = append(props, newProp("TasksMax", limit))
	}
	return props, applied
}
