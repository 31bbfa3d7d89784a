package node

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

const routeTable = `Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
wlan0	0000A8C0	00000000	0001	0	0	0	00FFFFFF	0	0	0
eth0	00000000	0102000A	0003	0	0	100	00000000	0	0	0
eth0	0002000A	00000000	0001	0	0	100	00FFFFFF	0	0	0
`

func TestDefaultRouteInterface(t *testing.T) {
	if got := defaultRouteInterface(routeTable); got != "eth0" {
		t.Errorf("got %q, want eth0", got)
	}
	withoutDefault := "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\nwlan0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
	if got := defaultRouteInterface(withoutDefault); got != "" {
		t.Errorf("no default route: got %q", got)
	}
}

func TestChooseHostIP(t *testing.T) {
	other := func() string { return "192.168.0.5" }
	none := func() string { return "" }
	for _, tc := range []struct {
		name                          string
		configured, route, last, want string
		anyGlobal                     func() string
	}{
		{"configured wins", "192.0.2.10", "10.0.2.15", "10.0.2.15", "192.0.2.10", other},
		{"default route", "", "10.0.2.15", "10.0.2.9", "10.0.2.15", other},
		{"uplink down: the last known address, not another interface's", "", "", "10.0.2.15", "10.0.2.15", other},
		{"never had a default route", "", "", "", "192.168.0.5", other},
		{"nothing at all", "", "", "", "127.0.0.1", none},
	} {
		if got := chooseHostIP(tc.configured, tc.route, tc.last, tc.anyGlobal); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestAddressKeeper: the default route's address is kept when the route goes, and across a
// restart (a new keeper on the same state directory) while it is still gone; the route is
// looked up again only once routeTTL has passed.
func TestAddressKeeper(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	route, lookups := "10.0.2.15", 0
	k := NewAddressKeeper("", dir)
	k.now = clock
	k.route = func() string { lookups++; return route }
	if got := k.IPs(); !reflect.DeepEqual(got, []string{"10.0.2.15"}) {
		t.Fatalf("with the default route: %v", got)
	}
	route = ""
	now = now.Add(routeTTL - time.Second)
	if got := k.IPs(); !reflect.DeepEqual(got, []string{"10.0.2.15"}) || lookups != 1 {
		t.Errorf("within routeTTL: %v after %d lookups, want the address looked up once", got, lookups)
	}
	now = now.Add(time.Second)
	if got := k.IPs(); !reflect.DeepEqual(got, []string{"10.0.2.15"}) || lookups != 2 {
		t.Errorf("default route gone: %v after %d lookups, want the last known address", got, lookups)
	}
	restarted := NewAddressKeeper("", dir)
	restarted.now = clock
	restarted.route = func() string { return "" }
	if got := restarted.IPs(); !reflect.DeepEqual(got, []string{"10.0.2.15"}) {
		t.Errorf("after a restart without default route: %v, want the persisted address", got)
	}
	restarted.route = func() string { return "10.0.3.20" }
	now = now.Add(routeTTL)
	if got := restarted.IPs(); !reflect.DeepEqual(got, []string{"10.0.3.20"}) {
		t.Errorf("new default route: %v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "node-address")); string(b) != "10.0.3.20\n" {
		t.Errorf("persisted %q", b)
	}
}
