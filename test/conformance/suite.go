package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Focus selects the node's tests: every [NodeConformance] test and the [sig-node]
// [Conformance] tests, as issue #10 defines the judge.
const Focus = `\[NodeConformance\]|\[sig-node\].*\[Conformance\]`

// Skip is a test the harness does not run, with the reason: only tests that need a part of
// the cluster that is not the node's.
type Skip struct {
	// Pattern is a regular expression matched against the full test name (ginkgo --skip).
	Pattern string
	// Reason is why the test is not the node's to pass.
	Reason string
}

// Skips are the only tests the selection leaves out. The reasons are quoted in
// docs/conformance.md.
var Skips = []Skip{
	{
		Pattern: `Pod InPlace Resize`,
		Reason: "in-place pod resize (131 tests, 127 of them with pod-level resources): holdfast implements neither " +
			"(a pod with spec.resources is refused as UnsupportedPodSpec; a resized container is restarted), which is " +
			"issue-sized work of its own. The kubelet cannot pass them in this harness either (no QoS cgroups on cgroup v1), " +
			"and each takes it more than 10 minutes to fail, which would triple the run",
	},
}

// slowSkip leaves out upstream's [Slow] tests (more than five minutes each), unless
// -conformance.slow: with them a run of both agents takes hours on two cores.
var slowSkip = Skip{
	Pattern: `\[Slow\]`,
	Reason:  "upstream marks these as taking more than five minutes each; left out unless `-conformance.slow` (16 tests outside the resize tests above)",
}

// skips returns the skips of this run.
func skips(slow bool) []Skip {
	if slow {
		return Skips
	}
	return append(append([]Skip(nil), Skips...), slowSkip)
}

// skipRegexp joins the skip patterns for ginkgo's --skip.
func skipRegexp(skips []Skip) string {
	var parts []string
	for _, s := range skips {
		parts = append(parts, s.Pattern)
	}
	return strings.Join(parts, "|")
}

// SuiteOptions says what runSuite runs.
type SuiteOptions struct {
	// Focus and Skip are ginkgo's regular expressions.
	Focus, Skip string
	// Procs is how many ginkgo processes run specs in parallel.
	Procs int
	// Seed orders the specs (ginkgo --seed): the same for every agent of a run, so that a run
	// cut short by its timeout has reached the same tests on each.
	Seed int64
	// Timeout bounds the whole suite (ginkgo --timeout).
	Timeout time.Duration
	// ReportDir receives junit_01.xml and the suite's output (e2e.log).
	ReportDir string
}

// runSuite runs e2e.test against the cluster with ginkgo, pointing the suite's images at the
// registry at host. It returns the JUnit report's path; a suite with failed tests is no error
// here (the report says which), a suite that did not run is.
func runSuite(ctx context.Context, t testing.TB, c *Cluster, host string, opts SuiteOptions) (string, error) {
	t.Helper()
	if err := os.MkdirAll(opts.ReportDir, 0o755); err != nil {
		return "", err
	}
	repoList := filepath.Join(opts.ReportDir, "repo-list.yaml")
	if err := writeRepoList(repoList, host); err != nil {
		return "", err
	}
	args := []string{
		"--procs=" + strconv.Itoa(opts.Procs),
		"--seed=" + strconv.FormatInt(opts.Seed, 10),
		"--timeout=" + opts.Timeout.String(),
		"--no-color",
		"--focus=" + opts.Focus,
	}
	if opts.Skip != "" {
		args = append(args, "--skip="+opts.Skip)
	}
	// ginkgo runs a compiled suite only when its name ends in .test.
	suite := filepath.Join(opts.ReportDir, "e2e.test")
	_ = os.Remove(suite)
	if err := os.Symlink(e2eTestPath(), suite); err != nil {
		return "", err
	}
	args = append(args, suite, "--",
		"--kubeconfig="+c.AdminKubeconfig,
		"--provider=skeleton",
		"--report-dir="+opts.ReportDir,
		"--dump-logs-on-failure=false",
		// Every test namespace is deleted as on any cluster (the controller-manager does it);
		// not waiting for it saves minutes on two cores.
		"--delete-namespace-on-failure=true",
		"--allowed-not-ready-nodes=0",
		"--node-schedulable-timeout=2m",
	)
	logPath := filepath.Join(opts.ReportDir, "e2e.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, ginkgoPath(), args...)
	cmd.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+repoList)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.WaitDelay = time.Minute
	t.Logf("running %s %s (output in %s)", ginkgoPath(), strings.Join(args, " "), logPath)
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("the suite ran for %s: %v", time.Since(start).Round(time.Second), runErr)
	junit := filepath.Join(opts.ReportDir, "junit_01.xml")
	if _, err := os.Stat(junit); err != nil {
		return "", fmt.Errorf("the suite wrote no JUnit report (%v); see %s", runErr, logPath)
	}
	return junit, nil
}
