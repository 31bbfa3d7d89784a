package bench

import (
	"math"
	"os"
	"strings"
	"testing"
)

// The MemStats block is the one holdfast's /debug/pprof/heap?debug=1 served in the quick run of
// 2026-12-07 04:40 UTC (30 pods, the default sampling rate); pprof-top.txt is `go tool pprof
// -top` of the profile of the next quick run, 04:44 UTC, at GODEBUG=memprofilerate=4096
// (docs/runs/2026-12-07-steady-profiles).
func TestParseMemStats(t *testing.T) {
	b, err := os.ReadFile("testdata/heap-memstats.txt")
	if err != nil {
		t.Fatal(err)
	}
	var m Memory
	if err := m.parseMemStats(string(b)); err != nil {
		t.Fatal(err)
	}
	mib := func(bytes float64) float64 { return bytes / (1 << 20) }
	for name, c := range map[string][2]float64{
		"HeapLive":         {m.HeapLiveMiB, mib(7724072)},
		"HeapInuse":        {m.HeapInuseMiB, mib(13148160)},
		"HeapIdleRetained": {m.HeapIdleRetainedMiB, mib(5988352 - 3710976)},
		"NextGC":           {m.NextGCMiB, mib(11741402)},
		"Stacks":           {m.StacksMiB, mib(1835008)},
		"GCMetadata":       {m.GCMetadataMiB, mib(4100864)},
		"Profiling":        {m.ProfilingMiB, mib(1507341)},
		"OtherRuntime":     {m.OtherRuntimeMiB, mib(293760 + 16072 + 547779)},
	} {
		if math.Abs(c[0]-c[1]) > 1e-9 {
			t.Errorf("%s = %v MiB, want %v", name, c[0], c[1])
		}
	}
	// A block missing a figure is an error, not a zero in the report.
	cut := strings.Replace(string(b), "# GCSys = 4100864\n", "", 1)
	if err := (&Memory{}).parseMemStats(cut); err == nil || !strings.Contains(err.Error(), "GCSys") {
		t.Errorf("MemStats without GCSys: err = %v, want one naming GCSys", err)
	}
	if err := (&Memory{}).parseMemStats("heap profile: 0: 0 [0: 0] @ heap/524288\n"); err == nil {
		t.Error("a profile with no MemStats block parsed")
	}
}

func TestParsePprofTop(t *testing.T) {
	b, err := os.ReadFile("testdata/pprof-top.txt")
	if err != nil {
		t.Fatal(err)
	}
	sites := parsePprofTop(string(b))
	if len(sites) != 5 {
		t.Fatalf("%d sites, want 5: %+v", len(sites), sites)
	}
	want := Site{Function: "encoding/json.typeFields", FlatKiB: 606.74, CumKiB: 775.30}
	if got := sites[0]; got.Function != want.Function || math.Abs(got.FlatKiB-want.FlatKiB) > 1e-9 || math.Abs(got.CumKiB-want.CumKiB) > 1e-9 {
		t.Errorf("first site %+v, want %+v", got, want)
	}
	if sites[4].Function != "compress/flate.(*dictDecoder).init" {
		t.Errorf("last site %q", sites[4].Function)
	}
	for in, want := range map[string]float64{"512B": 0.5, "1.50MB": 1536, "0": 0, "2kB": 2} {
		if got, ok := parseKiB(in); !ok || got != want {
			t.Errorf("parseKiB(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
}

// readSmaps on this test process: its executable's pages are resident (it is running them),
// and so is anonymous memory (its heap); nothing is the state database.
func TestReadSmaps(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var m Memory
	if err := m.readSmaps(os.Getpid(), exe); err != nil {
		t.Fatal(err)
	}
	if m.ExecutableMiB <= 0 || m.AnonymousMiB <= 0 || m.StateDBMiB != 0 {
		t.Errorf("smaps of the test process: %+v", m)
	}
}
