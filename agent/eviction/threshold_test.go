package eviction

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func thresholdStrings(ts []Threshold) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.String())
	}
	return out
}

func TestParseThresholds(t *testing.T) {
	for _, tc := range []struct {
		name            string
		hard, soft, sgp map[string]string
		want            string // thresholds joined by ", "
		wantErr         string
	}{
		{
			name: "defaults",
			want: "imagefs.available<15%, imagefs.inodesFree<5%, memory.available<100Mi, nodefs.available<10%, nodefs.inodesFree<5%, pid.available<10%",
		},
		{
			name: "a signal named replaces its default only; 0% and 0 disable",
			hard: map[string]string{"memory.available": "500Mi", "imagefs.available": "0%", "pid.available": "0", "nodefs.available": "2.5%"},
			want: "imagefs.inodesFree<5%, memory.available<500Mi, nodefs.available<2.5%, nodefs.inodesFree<5%",
		},
		{
			name: "soft thresholds with their grace periods",
			hard: map[string]string{"imagefs.available": "0%", "imagefs.inodesFree": "0%", "nodefs.inodesFree": "0%", "pid.available": "0%", "nodefs.available": "0%"},
			soft: map[string]string{"memory.available": "1Gi"},
			sgp:  map[string]string{"memory.available": "1m30s"},
			want: "memory.available<100Mi, memory.available<1Gi for 1m30s",
		},
		{name: "unknown signal", hard: map[string]string{"memory.free": "1Gi"}, wantErr: `unknown signal "memory.free"`},
		{name: "bad quantity", hard: map[string]string{"memory.available": "lots"}, wantErr: `memory.available: "lots" is neither`},
		{name: "percentage over 100", hard: map[string]string{"nodefs.available": "110%"}, wantErr: "not a percentage"},
		{name: "soft without grace period", soft: map[string]string{"memory.available": "1Gi"}, wantErr: "no grace period"},
		{name: "grace period without soft", sgp: map[string]string{"memory.available": "1m"}, wantErr: "no threshold in evictionSoft"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseThresholds(tc.hard, tc.soft, tc.sgp)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.Join(thresholdStrings(got), ", "); s != tc.want {
				t.Errorf("thresholds = %s\nwant         %s", s, tc.want)
			}
		})
	}
}

func TestThresholdMet(t *testing.T) {
	ts, err := ParseThresholds(map[string]string{"memory.available": "100Mi", "nodefs.available": "10%"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[Signal]Threshold{}
	for _, th := range ts {
		byName[th.Signal] = th
	}
	mem, disk := byName[SignalMemoryAvailable], byName[SignalNodeFsAvailable]
	for _, tc := range []struct {
		th   Threshold
		o    Observation
		want bool
	}{
		{mem, Observation{Available: 99 << 20, Capacity: 1 << 30}, true},
		{mem, Observation{Available: 100 << 20, Capacity: 1 << 30}, false},
		{disk, Observation{Available: 99, Capacity: 1000}, true},
		{disk, Observation{Available: 100, Capacity: 1000}, false},
		{disk, Observation{}, false}, // not observed
	} {
		if got := thresholdMet(tc.th, tc.o); got != tc.want {
			t.Errorf("%s met by %+v = %v, want %v", tc.th, tc.o, got, tc.want)
		}
	}
	if q := disk.QuantityFor(1000); q.Value() != 100 {
		t.Errorf("10%% of 1000 = %s, want 100", q)
	}
}

// Allocatable keeps out the memory.available and nodefs.available hard thresholds, as
// kubelet's hardEvictionReservation; soft thresholds and other signals reserve nothing.
func TestHardReservation(t *testing.T) {
	ts, err := ParseThresholds(map[string]string{"memory.available": "200Mi", "nodefs.available": "10%"},
		map[string]string{"memory.available": "1Gi"}, map[string]string{"memory.available": "1m"})
	if err != nil {
		t.Fatal(err)
	}
	capacity := v1.ResourceList{
		v1.ResourceMemory:           resource.MustParse("4Gi"),
		v1.ResourceEphemeralStorage: resource.MustParse("10Gi"),
		v1.ResourceCPU:              resource.MustParse("2"),
	}
	got := HardReservation(ts, capacity)
	if m := got[v1.ResourceMemory]; m.Value() != 200<<20 {
		t.Errorf("memory reserved = %s, want 200Mi", &m)
	}
	if s := got[v1.ResourceEphemeralStorage]; s.Value() != 1<<30 {
		t.Errorf("ephemeral-storage reserved = %s, want 1Gi (10%% of 10Gi)", &s)
	}
	if len(got) != 2 {
		t.Errorf("reserved %v, want memory and ephemeral-storage only", got)
	}
}
