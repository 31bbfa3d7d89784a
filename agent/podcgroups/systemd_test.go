package podcgroups

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
)

// TestLayoutNames: the kubelet's names for each driver (CgroupName.ToCgroupfs and ToSystemd,
// pkg/kubelet/cm cgroup_manager_linux.go), and the pod UID read back from a QoS level's
// child, as the kubelet's GetAllPodsFromCgroups reads it.
func TestLayoutNames(t *testing.T) {
	pod := func(uid string, qos v1.PodQOSClass) *v1.Pod {
		var p *v1.Pod
		switch qos {
		case v1.PodQOSGuaranteed:
			p = podWith(nil, requirements(resourceList("1", "1Gi"), resourceList("1", "1Gi")))
		case v1.PodQOSBurstable:
			p = podWith(nil, requirements(resourceList("100m", ""), nil))
		default:
			p = podWith(nil, v1.ResourceRequirements{})
		}
		p.UID = types.UID(uid)
		return p
	}
	const uid = "1234-abcd-5678-efgh"
	for _, tt := range []struct {
		layout                               Layout
		kubepods, burstable, besteffort      string
		guaranteedPod, burstablePod, bestPod string
	}{
		{Layout{Root: "/"}, "/kubepods", "/kubepods/burstable", "/kubepods/besteffort",
			"/kubepods/pod" + uid, "/kubepods/burstable/pod" + uid, "/kubepods/besteffort/pod" + uid},
		{Layout{Root: "/", Systemd: true}, "/kubepods.slice", "/kubepods.slice/kubepods-burstable.slice", "/kubepods.slice/kubepods-besteffort.slice",
			"/kubepods.slice/kubepods-pod1234_abcd_5678_efgh.slice",
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice",
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_abcd_5678_efgh.slice"},
		{Layout{Root: "/edge"}, "/edge/kubepods", "/edge/kubepods/burstable", "/edge/kubepods/besteffort",
			"/edge/kubepods/pod" + uid, "/edge/kubepods/burstable/pod" + uid, "/edge/kubepods/besteffort/pod" + uid},
		// The kubelet's cgroupRoot with the systemd driver: its components lead every name.
		{Layout{Root: "/edge-gw", Systemd: true}, "/edge_gw.slice/edge_gw-kubepods.slice",
			"/edge_gw.slice/edge_gw-kubepods.slice/edge_gw-kubepods-burstable.slice",
			"/edge_gw.slice/edge_gw-kubepods.slice/edge_gw-kubepods-besteffort.slice",
			"/edge_gw.slice/edge_gw-kubepods.slice/edge_gw-kubepods-pod1234_abcd_5678_efgh.slice",
			"/edge_gw.slice/edge_gw-kubepods.slice/edge_gw-kubepods-burstable.slice/edge_gw-kubepods-burstable-pod1234_abcd_5678_efgh.slice",
			"/edge_gw.slice/edge_gw-kubepods.slice/edge_gw-kubepods-besteffort.slice/edge_gw-kubepods-besteffort-pod1234_abcd_5678_efgh.slice"},
	} {
		l := tt.layout
		for _, c := range []struct{ got, want string }{
			{l.Kubepods(), tt.kubepods},
			{l.QOSDir(v1.PodQOSGuaranteed), tt.kubepods},
			{l.QOSDir(v1.PodQOSBurstable), tt.burstable},
			{l.QOSDir(v1.PodQOSBestEffort), tt.besteffort},
			{l.PodDir(pod(uid, v1.PodQOSGuaranteed)), tt.guaranteedPod},
			{l.PodDir(pod(uid, v1.PodQOSBurstable)), tt.burstablePod},
			{l.PodDir(pod(uid, v1.PodQOSBestEffort)), tt.bestPod},
		} {
			if c.got != c.want {
				t.Errorf("%+v: %s, want %s", l, c.got, c.want)
			}
		}
		for _, dir := range []string{tt.guaranteedPod, tt.burstablePod, tt.bestPod} {
			if got, ok := l.PodUID(filepath.Base(dir)); !ok || got != uid {
				t.Errorf("%+v: PodUID(%s) = %q, %v; want %s", l, filepath.Base(dir), got, ok, uid)
			}
		}
		for _, notPod := range []string{filepath.Base(tt.burstable), filepath.Base(tt.besteffort), "holdfast-c1.scope", "pod"} {
			if got, ok := l.PodUID(notPod); ok {
				t.Errorf("%+v: PodUID(%s) = %q, want no pod", l, notPod, got)
			}
		}
	}
}

// TestExpandSlice is runc's table (opencontainers/cgroups systemd_test.go TestExpandSlice),
// with the names it refuses.
func TestExpandSlice(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"-.slice", "/"},
		{"system.slice", "/system.slice"},
		{"test-a-b.slice", "/test.slice/test-a.slice/test-a-b.slice"},
		{"kubepods-burstable-pod12_ab.slice", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice"},
	} {
		if got, err := ExpandSlice(tt.in); err != nil || got != tt.want {
			t.Errorf("ExpandSlice(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", ".slice", "a", "a.scope", "a/b.slice", "a--b.slice", "-a.slice", "a-.slice"} {
		if got, err := ExpandSlice(bad); err == nil {
			t.Errorf("ExpandSlice(%q) = %q, want an error", bad, got)
		}
	}
}

// TestSystemdResources: each Resources field as the unit property runc sets for it on
// cgroup v2 and v1, "none" as systemd's infinity, and the CPU quota rounded up to systemd's
// whole percent of a CPU, the rounded quota being what is written to the files too.
func TestSystemdResources(t *testing.T) {
	type prop = map[string]any
	for _, tt := range []struct {
		name      string
		r         cgroups.Resources
		unified   bool
		version   int
		want      prop
		wantQuota *int64
	}{
		{"weight", cgroups.Resources{CPUShares: ptr.To(uint64(1024))}, true, 252, prop{"CPUWeight": uint64(39)}, nil},
		{"least weight", cgroups.Resources{CPUShares: ptr.To(uint64(2))}, true, 252, prop{"CPUWeight": uint64(1)}, nil},
		{"shares on v1", cgroups.Resources{CPUShares: ptr.To(uint64(1024))}, false, 247, prop{"CPUShares": uint64(1024)}, nil},
		{"quota 200m", cgroups.Resources{CPUQuota: ptr.To(int64(20000)), CPUPeriod: ptr.To(uint64(100000))}, true, 252,
			prop{"CPUQuotaPeriodUSec": uint64(100000), "CPUQuotaPerSecUSec": uint64(200000)}, ptr.To(int64(20000))},
		{"quota 15m rounded up", cgroups.Resources{CPUQuota: ptr.To(int64(1500)), CPUPeriod: ptr.To(uint64(100000))}, true, 252,
			prop{"CPUQuotaPeriodUSec": uint64(100000), "CPUQuotaPerSecUSec": uint64(20000)}, ptr.To(int64(2000))},
		{"no period property before 242", cgroups.Resources{CPUQuota: ptr.To(int64(50000)), CPUPeriod: ptr.To(uint64(100000))}, true, 241,
			prop{"CPUQuotaPerSecUSec": uint64(500000)}, ptr.To(int64(50000))},
		{"no quota", cgroups.Resources{CPUQuota: ptr.To(int64(-1)), CPUPeriod: ptr.To(uint64(100000))}, true, 252,
			prop{"CPUQuotaPeriodUSec": uint64(100000), "CPUQuotaPerSecUSec": uint64(math.MaxUint64)}, ptr.To(int64(-1))},
		{"memory", cgroups.Resources{Memory: ptr.To(int64(64 << 20))}, true, 252, prop{"MemoryMax": uint64(64 << 20)}, nil},
		{"no memory limit", cgroups.Resources{Memory: ptr.To(int64(-1))}, true, 252, prop{"MemoryMax": uint64(math.MaxUint64)}, nil},
		{"memory on v1", cgroups.Resources{Memory: ptr.To(int64(64 << 20))}, false, 247, prop{"MemoryLimit": uint64(64 << 20)}, nil},
		{"pids", cgroups.Resources{PidsLimit: ptr.To(int64(512))}, true, 252, prop{"TasksMax": uint64(512)}, nil},
		{"no pids limit", cgroups.Resources{PidsLimit: ptr.To(int64(0))}, true, 252, prop{"TasksMax": uint64(math.MaxUint64)}, nil},
		{"nothing set", cgroups.Resources{}, true, 252, prop{}, nil},
	} {
		props, applied := systemdResources(tt.r, tt.unified, tt.version)
		got := prop{}
		for _, p := range props {
			if _, dup := got[p.Name]; dup {
				t.Errorf("%s: %s twice", tt.name, p.Name)
			}
			got[p.Name] = p.Value.Value()
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: properties %v, want %v", tt.name, got, tt.want)
		}
		switch {
		case tt.wantQuota == nil && applied.CPUQuota != nil:
			t.Errorf("%s: applied quota %d, want none", tt.name, *applied.CPUQuota)
		case tt.wantQuota != nil && (applied.CPUQuota == nil || *applied.CPUQuota != *tt.wantQuota):
			t.Errorf("%s: applied quota %v, want %d", tt.name, show(applied), *tt.wantQuota)
		}
	}
}

func TestParseSystemdVersion(t *testing.T) {
	for in, want := range map[string]int{`"252.36-1~deb12u1"`: 252, "v245.4-1.fc32": 245, "245": 245, `"v239"`: 239, "unknown": 0, "": 0} {
		if got := parseSystemdVersion(in); got != want {
			t.Errorf("parseSystemdVersion(%q) = %d, want %d", in, got, want)
		}
	}
}

// fakeSystemd plays systemd's unit manager for the driver's own logic: a transient unit once
// started exists (UnitExists on a second start), stopping one it does not know is
// NoSuchUnit, and every call is recorded.
type fakeSystemd struct {
	mu     sync.Mutex
	units  map[string][]sddbus.Property
	calls  []string
	closed bool
}

func (f *fakeSystemd) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeSystemd) StartTransientUnitContext(_ context.Context, name, mode string, props []sddbus.Property, ch chan<- string) (int, error) {
	f.record("start " + name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.units[name]; ok {
		return 0, godbus.Error{Name: "org.freedesktop.systemd1.UnitExists", Body: []any{"Unit " + name + " already exists."}}
	}
	f.units[name] = props
	ch <- "done"
	return 1, nil
}

func (f *fakeSystemd) SetUnitPropertiesContext(_ context.Context, name string, runtime bool, props ...sddbus.Property) error {
	f.record(fmt.Sprintf("set %s runtime=%v", name, runtime))
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.units[name]; !ok {
		return godbus.Error{Name: "org.freedesktop.systemd1.NoSuchUnit", Body: []any{"Unit " + name + " not loaded."}}
	}
	f.units[name] = append(f.units[name], props...)
	return nil
}

func (f *fakeSystemd) StopUnitContext(_ context.Context, name, mode string, ch chan<- string) (int, error) {
	f.record("stop " + name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.units[name]; !ok {
		return 0, godbus.Error{Name: "org.freedesktop.systemd1.NoSuchUnit", Body: []any{"Unit " + name + " not loaded."}}
	}
	delete(f.units, name)
	ch <- "done"
	return 2, nil
}

func (f *fakeSystemd) ResetFailedUnitContext(context.Context, string) error { return nil }
func (f *fakeSystemd) GetManagerProperty(string) (string, error)            { return `"252.36-1~deb12u1"`, nil }
func (f *fakeSystemd) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

// property is the last value unit was given for name.
func (f *fakeSystemd) property(unit, name string) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	var v any
	for _, p := range f.units[unit] {
		if p.Name == name {
			v = p.Value.Value()
		}
	}
	return v
}

// fakeV2 is a cgroup v2 tree of plain directories, as fakeV1.
func fakeV2(t *testing.T) cgroups.Hierarchy {
	t.Helper()
	return cgroups.Hierarchy{Root: t.TempDir(), Mode: cgroups.Unified}
}

// TestManagerSystemd: with the systemd driver the same Manager makes kubepods, the QoS
// levels and a pod's cgroup as transient slices with the kubelet's names, their parents as
// Wants=, the limits ResourceConfigForPod computes as properties and in the files; a
// restarted agent's Start finds them there and sets their properties; a resize sets them in
// place; removing the pod stops its slice, but never one a process is in.
func TestManagerSystemd(t *testing.T) {
	h := fakeV2(t)
	sd := &fakeSystemd{units: map[string][]sddbus.Property{}}
	dial := func(context.Context) (UnitConn, error) { return sd, nil }
	// The slices' directories, as systemd makes them when it starts each unit.
	mkdirs := func(p string) {
		if err := os.MkdirAll(filepath.Join(h.Root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/kubepods.slice/kubepods-burstable.slice", "/kubepods.slice/kubepods-besteffort.slice"} {
		mkdirs(p)
	}
	newManager := func() *Manager {
		return NewManager(Config{Hierarchy: h, Driver: NewSystemd(h, dial), Root: "/", EnforceCPULimits: true,
			Kubepods: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("300Mi")}})
	}
	m := newManager()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	if got := sd.property("kubepods.slice", "MemoryMax"); got != uint64(300<<20) {
		t.Errorf("kubepods.slice MemoryMax %v, want 300Mi", got)
	}
	if got := sd.property("kubepods.slice", "Wants"); fmt.Sprint(got) != "[-.slice]" {
		t.Errorf("kubepods.slice Wants %v, want [-.slice]", got)
	}
	if got := sd.property("kubepods-burstable.slice", "Wants"); fmt.Sprint(got) != "[kubepods.slice]" {
		t.Errorf("kubepods-burstable.slice Wants %v, want [kubepods.slice]", got)
	}
	if got := sd.property("kubepods-besteffort.slice", "CPUWeight"); got != uint64(1) {
		t.Errorf("kubepods-besteffort.slice CPUWeight %v, want 1 (2 shares)", got)
	}
	if got := readFile(t, h, "/kubepods.slice", "", "memory.max"); got != "314572800" {
		t.Errorf("kubepods.slice/memory.max %s, want 300Mi written there too", got)
	}

	pod := podWith(nil, requirements(resourceList("500m", "64Mi"), resourceList("1", "128Mi")))
	pod.UID = "b1-c2"
	const slice = "kubepods-burstable-podb1_c2.slice"
	const dir = "/kubepods.slice/kubepods-burstable.slice/" + slice
	mkdirs(dir)
	got, err := m.EnsurePod(pod)
	if err != nil {
		t.Fatal(err)
	}
	if got != dir {
		t.Fatalf("EnsurePod = %s, want %s", got, dir)
	}
	// The directory exists (mkdirs played systemd), so EnsurePod takes the cgroup for made:
	// the kubelet's EnsureExists. Make it as a first start would.
	if err := m.h.Ensure(dir, m.podResources(pod)); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]any{
		"CPUWeight": uint64(20), "CPUQuotaPerSecUSec": uint64(1000000), "MemoryMax": uint64(128 << 20),
		"Wants": []string{"kubepods-burstable.slice"}, "DefaultDependencies": false, "MemoryAccounting": true,
	} {
		if got := sd.property(slice, name); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s %s = %v, want %v", slice, name, got, want)
		}
	}
	if got := sd.property(slice, "Delegate"); got != nil {
		t.Errorf("%s Delegate = %v: runc delegates scopes, not slices", slice, got)
	}
	if got := readFile(t, h, dir, "", "cpu.max"); got != "100000 100000" {
		t.Errorf("%s/cpu.max = %s", dir, got)
	}

	// A restarted agent: the units are there; Start sets them again.
	sd.calls = nil
	if err := newManager().Start(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(sd.calls, "set kubepods.slice runtime=true") {
		t.Errorf("restart's calls %v: want kubepods.slice's properties set on the existing unit", sd.calls)
	}

	// Resize in place.
	resized := pod.DeepCopy()
	resized.Spec.Containers[0].Resources.Limits = resourceList("1500m", "256Mi")
	if err := m.UpdatePod(resized); err != nil {
		t.Fatal(err)
	}
	if got := sd.property(slice, "MemoryMax"); got != uint64(256<<20) {
		t.Errorf("after resize MemoryMax %v, want 256Mi", got)
	}

	// A process in the pod's cgroup: the slice is not stopped.
	if err := os.WriteFile(filepath.Join(h.Root, dir, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.RemovePod(pod.UID); err == nil || !strings.Contains(err.Error(), "still in it") {
		t.Errorf("RemovePod of a busy pod cgroup: %v, want an error saying it is in use", err)
	}
	if sd.property(slice, "MemoryMax") == nil {
		t.Errorf("the busy pod's slice was stopped")
	}
	if err := os.WriteFile(filepath.Join(h.Root, dir, "cgroup.events"), []byte("populated 0\nfrozen 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The other QoS classes' names of the pod are stopped too, which systemd does not know:
	// not an error. The fake tree's files keep its directory (rmdir of a plain directory with
	// files fails), so only the unit is checked.
	_ = m.RemovePod(pod.UID)
	sd.mu.Lock()
	_, there := sd.units[slice]
	sd.mu.Unlock()
	if there {
		t.Errorf("the pod's slice was not stopped: calls %v", sd.calls)
	}

	// The agent stops: the connection to systemd is closed, the slices stay.
	m.Close()
	sd.mu.Lock()
	closed, units := sd.closed, len(sd.units)
	sd.mu.Unlock()
	if !closed {
		t.Errorf("Close left the connection to systemd open")
	}
	if units == 0 {
		t.Errorf("Close stopped the slices")
	}
}

// TestCheckDriverSwitch: pods the other driver made, still running, refuse the start with an
// error that says what to do; an empty hierarchy of the cgroupfs driver goes.
func TestCheckDriverSwitch(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	h := fakeV1(t)
	for _, c := range []string{"cpu", "memory"} {
		if err := os.MkdirAll(h.Dir("/kubepods/besteffort/podold/c1", c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	procs := filepath.Join(h.Dir("/kubepods/besteffort/podold/c1", "memory"), "cgroup.procs")
	if err := os.WriteFile(procs, []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := CheckDriverSwitch(h, DriverSystemd, "/", log)
	if err == nil || !strings.Contains(err.Error(), "still run in /kubepods") || !strings.Contains(err.Error(), "reboot") {
		t.Fatalf("switch to systemd with a running cgroupfs pod: %v, want an error naming /kubepods and what to do", err)
	}
	// The same driver as before: nothing to say.
	if err := CheckDriverSwitch(h, DriverCgroupfs, "/", log); err != nil {
		t.Errorf("cgroupfs again: %v", err)
	}
	// The container gone: the empty cgroupfs hierarchy is removed.
	if err := os.Remove(procs); err != nil {
		t.Fatal(err)
	}
	if err := CheckDriverSwitch(h, DriverSystemd, "/", log); err != nil {
		t.Fatalf("switch to systemd, nothing running: %v", err)
	}
	if h.Exists("/kubepods") {
		t.Errorf("the empty /kubepods of the cgroupfs driver is still there")
	}
	// Back to cgroupfs with systemd's slices busy (cgroup v2).
	h2 := fakeV2(t)
	if err := os.MkdirAll(filepath.Join(h2.Root, "kubepods.slice"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h2.Root, "kubepods.slice", "cgroup.events"), []byte("populated 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckDriverSwitch(h2, DriverCgroupfs, "/", log); err == nil || !strings.Contains(err.Error(), "/kubepods.slice") {
		t.Errorf("switch to cgroupfs with running systemd pods: %v, want an error naming /kubepods.slice", err)
	}
}

// closingConn is a connection systemd closed: every call fails as go-systemd's does then.
type closingConn struct{ fakeSystemd }

func (c *closingConn) SetUnitPropertiesContext(context.Context, string, bool, ...sddbus.Property) error {
	return fmt.Errorf("read unix @->/run/dbus/system_bus_socket: %w", net.ErrClosed)
}

// TestSystemdConnection: the connection outlives the call that dialled it (go-systemd closes
// a connection when the context it was dialled with ends, and a job's result arrives on it
// after the call: the gateway VM's first run waited 30s for every job); a connection systemd
// closed is dialled again and the call tried once more.
func TestSystemdConnection(t *testing.T) {
	h := fakeV2(t)
	if err := os.MkdirAll(filepath.Join(h.Root, "kubepods.slice"), 0o755); err != nil {
		t.Fatal(err)
	}
	live := &fakeSystemd{units: map[string][]sddbus.Property{"kubepods.slice": nil}}
	var dialled []context.Context
	conns := []UnitConn{&closingConn{}, live}
	s := NewSystemd(h, func(ctx context.Context) (UnitConn, error) {
		dialled = append(dialled, ctx)
		c := conns[0]
		conns = conns[1:]
		return c, nil
	})
	if err := s.Update("/kubepods.slice", cgroups.Resources{Memory: ptr.To(int64(1 << 30))}); err != nil {
		t.Fatalf("Update over a connection closed under it: %v", err)
	}
	if len(dialled) != 2 {
		t.Fatalf("dialled %d times, want 2 (once more after the close)", len(dialled))
	}
	for i, ctx := range dialled {
		if ctx.Err() != nil {
			t.Errorf("dial %d's context has ended after the call (%v): the connection would close with it", i, ctx.Err())
		}
	}
	if got := live.property("kubepods.slice", "MemoryMax"); got != uint64(1<<30) {
		t.Errorf("MemoryMax %v after the retry, want 1Gi", got)
	}
}
