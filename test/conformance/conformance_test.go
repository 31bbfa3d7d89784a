package conformance

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

var (
	full        = flag.Bool("conformance.full", false, "run TestConformance: the whole selection, for each agent of -conformance.agents, and write -conformance.doc (make conformance)")
	agents      = flag.String("conformance.agents", Holdfast+","+Kubelet, "the agents TestConformance judges, in order")
	outDir      = flag.String("conformance.out", "", "where the JUnit reports and the suite's output go (default _output/conformance/DATE in the repository)")
	docPath     = flag.String("conformance.doc", "", "the page TestConformance writes (default ../../docs/conformance.md for the whole selection, ../../docs/conformance-runs/NAME.md for a run with another -conformance.focus, NAME the last element of -conformance.out)")
	procs       = flag.Int("conformance.procs", 6, "ginkgo processes running tests in parallel (the tests mostly wait for containers)")
	focus       = flag.String("conformance.focus", Focus, "the tests TestConformance runs (ginkgo --focus)")
	timeout     = flag.Duration("conformance.timeout", 110*time.Minute, "bound of each agent's suite") // the whole selection took 1h28m and 1h31m on 2 cores, both agents at once (2026-12-06); an hour cut the run of 2026-12-07 short by some 60 tests each
	reportOnly  = flag.Bool("conformance.report-only", false, "with -conformance.full: only write the page from the JUnit reports already in -conformance.out")
	runTogether = flag.Bool("conformance.parallel-agents", true, "run the agents' suites at the same time, each in its own cluster (faster, noisier)")
	slow        = flag.Bool("conformance.slow", false, "also run upstream's [Slow] tests (more than five minutes each) besides the in-place resize and pod-level resource ones, which run either way")
	seed        = flag.Int64("conformance.seed", 0, "ginkgo's --seed for every agent (0: from the clock)")
)

// requirePrerequisites fails t (skips under -short) unless everything the harness runs is
// in the cache: make deps builds it.
func requirePrerequisites(t *testing.T, withKubelet bool) {
	t.Helper()
	testenv.RequireIntegration(t)
	paths := []string{testenv.KubeControllerManagerPath(), testenv.KubeSchedulerPath(), e2eTestPath(), ginkgoPath(), agnhostPath(), nnpPath(), testenv.RegistryPath(), busyboxPath}
	if withKubelet {
		paths = append(paths, kubeletPath())
	}
	var missing []string
	for _, p := range paths {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("conformance prerequisites are missing:\n  - %s\nRun `make deps conformance-tools`%s.",
			strings.Join(missing, "\n  - "), map[bool]string{true: " and `make bench-kubelet`"}[withKubelet])
	}
}

// runAgent builds the cluster around agent as its only node, fills the registry and runs the
// suite; it returns the JUnit report's path.
func runAgent(t *testing.T, agent string, opts SuiteOptions) string {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	c := StartCluster(t, nodeName)
	// Plain HTTP, which containerd's resolvers use for loopback hosts without configuration.
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	host := reg.Host
	names, err := pushImages(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pushed to %s: %s", host, strings.Join(names, ", "))
	startNode(t, agent, c)
	t.Logf("cluster with %s as its node ready in %s", agent, time.Since(start).Round(time.Second))
	junit, err := runSuite(ctx, t, c, host, opts)
	if err != nil {
		t.Fatal(err)
	}
	return junit
}

func TestConformance(t *testing.T) {
	if !*full {
		// skip-ok: entry point of make conformance
		t.Skip("the whole suite takes an hour per agent: run it with -conformance.full (make conformance)")
	}
	list := strings.Split(*agents, ",")
	out := *outDir
	if out == "" {
		out = filepath.Join("..", "..", "_output", "conformance", time.Now().UTC().Format("2006-01-02"))
	}
	out, err := filepath.Abs(out)
	if err != nil {
		t.Fatal(err)
	}
	if !*reportOnly {
		requirePrerequisites(t, strings.Contains(*agents, Kubelet))
		started := time.Now().UTC()
		names, err := listSuite()
		if err != nil {
			t.Fatal(err)
		}
		sel, err := selectTests(names, *focus, *slow)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the suite lists %d tests; the focus matches %d; %d run (%d of in-place resize or pod-level resources)", sel.Listed, len(sel.Focused), len(sel.Run), len(sel.Resize))
		// The commit under test: the agent is built from the tree as it is now, and commits
		// may land while the suite runs.
		commit := command("git", "describe", "--always", "--dirty", "--abbrev=7")
		runSeed := *seed
		if runSeed == 0 {
			runSeed = started.Unix()
		}
		var mu sync.Mutex // the agents' subtests may run in parallel
		durations := map[string]time.Duration{}
		t.Run("agents", func(t *testing.T) {
			for _, agent := range list {
				t.Run(agent, func(t *testing.T) {
					if *runTogether {
						t.Parallel()
					}
					start := time.Now()
					runAgent(t, agent, SuiteOptions{Focus: *focus, Skip: sel.Skip(), Procs: *procs, Seed: runSeed, Timeout: *timeout, ReportDir: filepath.Join(out, agent)})
					mu.Lock()
					durations[agent] = time.Since(start).Round(time.Second)
					mu.Unlock()
				})
			}
		})
		var b strings.Builder
		fmt.Fprintf(&b, "started=%s\n", started.Format(time.RFC3339))
		fmt.Fprintf(&b, "seed=%d\ntimeout=%s\nslow=%t\n", runSeed, *timeout, *slow)
		fmt.Fprintf(&b, "commit=%s\n", commit)
		fmt.Fprintf(&b, "focus=%s\nprocs=%d\nimages=%s\n", *focus, *procs, imagesDescription)
		for _, agent := range list {
			fmt.Fprintf(&b, "%s=%s\n", agent, durations[agent])
		}
		if err := os.WriteFile(filepath.Join(out, "run.txt"), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	page := *docPath
	if page == "" {
		page = filepath.Join("..", "..", "docs", "conformance.md")
		if *focus != Focus {
			// A focused run's page is kept beside the whole selection's, named by its start.
			page = filepath.Join("..", "..", "docs", keptDir, filepath.Base(out)+".md")
		}
	}
	if err := os.MkdirAll(filepath.Dir(page), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeDocFrom(out, list, DocOptions{Path: page, Focus: *focus, Procs: *procs}); err != nil {
		t.Fatal(err)
	}
}

// slice is the fixed part of the suite `make test` runs against holdfast: a few node
// conformance tests covering a pull from the registry, the pod's view of itself, env and
// volumes, so that the harness, the images and the cluster cannot rot between full runs.
var slice = []string{
	`\[sig-node\] Containers should use the image defaults if command and args are blank`,
	`\[sig-node\] Downward API should provide pod name, namespace and IP address as env vars`,
	`\[sig-node\] Pods should get a host IP`,
}

// TestConformanceSlice runs the slice against holdfast in a cluster of its own; every test of
// it must pass.
func TestConformanceSlice(t *testing.T) {
	requirePrerequisites(t, false)
	dir := t.TempDir()
	focusRE := strings.Join(slice, "|")
	junit := runAgent(t, Holdfast, SuiteOptions{Focus: focusRE, Procs: 2, Seed: 1, Timeout: 15 * time.Minute, ReportDir: dir})
	results, err := readJUnit(junit, regexp.MustCompile(focusRE))
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(slice) {
		t.Errorf("the report holds %d of the slice's %d tests: %v", len(results), len(slice), results)
	}
	for name, r := range results {
		if r.State != "passed" {
			t.Errorf("%s: %s: %s", name, r.State, r.Message)
		}
	}
	if t.Failed() {
		b, _ := os.ReadFile(filepath.Join(dir, "e2e.log"))
		t.Logf("the suite's output:\n%s", tail(string(b), 200))
	}
}

// tail returns the last lines of s.
func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
