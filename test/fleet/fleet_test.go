package fleet_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/fleet"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Flags of the full run; `make fleet` passes them after -args.
var (
	full     = flag.Bool("fleet.full", false, "run TestFleet, the full measurement (make fleet)")
	nodes    = flag.Int("fleet.nodes", 100, "hollow nodes of each agent")
	perNode  = flag.Int("fleet.pods-per-node", 3, "pods bound to each node")
	idle     = flag.Duration("fleet.idle", time.Minute, "window over the control plane alone")
	settle   = flag.Duration("fleet.settle", time.Minute, "wait after every pod is Running, before the window")
	window   = flag.Duration("fleet.window", 3*time.Minute, "steady-state window")
	agents   = flag.String("fleet.agents", "holdfast,kubemark", "agents measured, in order")
	kubemark = flag.String("fleet.kubemark", "", "kubemark binary (default: kubemark-"+testenv.KubeAPIServerVersion+" in the test binary cache)")
	out      = flag.String("fleet.out", "", "results directory (default: _output/fleet/DATE at the module root)")
)

// kubemarkPath returns the kubemark hack/build-kubemark.sh builds, or "" if it has not been.
func kubemarkPath() string {
	if *kubemark != "" {
		return *kubemark
	}
	p := filepath.Join(testenv.BinDir(), "kubemark-"+testenv.KubeAPIServerVersion)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
		return p
	}
	return ""
}

// TestFleet is the measurement `make fleet` runs: a fleet of each agent, one after the other,
// written to the results directory as Markdown (for docs/fleet.md) and JSON. Not part of `go
// test ./...`: it runs only with -fleet.full.
func TestFleet(t *testing.T) {
	if !*full {
		// skip-ok: entry point of make fleet
		t.Skip("the full fleet runs with -fleet.full (make fleet)")
	}
	testenv.RequireIntegration(t)
	opts := fleet.Options{
		Nodes: *nodes, PodsPerNode: *perNode, Idle: *idle, Settle: *settle, Window: *window,
		Agents: strings.Split(*agents, ","), KubemarkPath: kubemarkPath(),
	}
	start := time.Now().UTC()
	results := fleet.Run(t, opts)
	md := fleet.Markdown(results)
	t.Logf("fleet of %d nodes per agent, %s:\n%s", opts.Nodes, start.Format("2006-01-02 15:04Z"), md)
	dir := *out
	if dir == "" {
		dir = filepath.Join("..", "..", "_output", "fleet", start.Format("20060102-150405"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	js, err := json.MarshalIndent(struct {
		Start   time.Time      `json:"start"`
		Options fleet.Options  `json:"options"`
		Results []fleet.Result `json:"results"`
	}{start, opts, results}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("results in %s", dir)
}

// TestFleetSmoke runs the fleet harness through every step with three hollow holdfast nodes
// and two pods each (and two kubemark nodes if hack/build-kubemark.sh has built it), so that
// neither the hollow mode nor the harness rots between `make fleet` runs. It asserts what the
// fleet did (nodes Ready and pods Running, or the harness fails; every node renewing its
// Lease; every figure measured), never how fast.
func TestFleetSmoke(t *testing.T) {
	testenv.RequireIntegration(t)
	opts := fleet.Options{Nodes: 3, PodsPerNode: 2, Idle: 5 * time.Second, Settle: time.Second, Window: 25 * time.Second,
		Agents: []string{fleet.Holdfast}}
	if opts.KubemarkPath = kubemarkPath(); opts.KubemarkPath != "" {
		opts.Agents = append(opts.Agents, fleet.Kubemark)
	} else {
		t.Logf("kubemark not built (hack/build-kubemark.sh): hollow holdfast only")
	}
	results := fleet.Run(t, opts)
	if t.Failed() {
		return
	}
	t.Logf("\n%s", fleet.Markdown(results))
	if len(results) != len(opts.Agents) {
		t.Fatalf("%d results for %d agents", len(results), len(opts.Agents))
	}
	for _, r := range results {
		// The Lease is renewed every 10 s: a 25 s window sees every node renew it twice.
		if got := r.Fleet.RequestsPerMinute["PUT leases"] * r.Fleet.Seconds / 60; got < float64(r.Nodes) {
			t.Errorf("%s: %.0f Lease renewals in the window, want at least one per node (%d)", r.Agent, got, r.Nodes)
		}
		if r.Fleet.APIServerRSSMiB == 0 || r.Fleet.EtcdRSSMiB == 0 || r.Fleet.AgentsRSSMiB == 0 {
			t.Errorf("%s: a resident set was not measured: %+v", r.Agent, r.Fleet)
		}
	}
}
