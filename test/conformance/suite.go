package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Focus selects the node's tests: every [NodeConformance] test and the [sig-node]
// [Conformance] tests, as issue #10 defines the judge.
const Focus = `\[NodeConformance\]|\[sig-node\].*\[Conformance\]`

// The selection is computed at each run from the suite's own listing (e2e.test --list-tests):
// the tests Focus matches, less the exclusions below, each a rule on the tests' labels whose
// count is the listing's. Nothing in it is written by hand.

// Exclusion is a rule that leaves tests of the focus out of the run, with its reason.
type Exclusion struct {
	// Label is what the rule matches in a test's name, e.g. "[Slow]".
	Label string
	// Reason is why the tests are not run.
	Reason string
	// Tests are the tests of the focus it leaves out, by full name.
	Tests []string
}

// resizeLabels mark the in-place resize and pod-level resource tests: issue 29 has them run
// for both agents, [Slow] as most of them are.
var resizeLabels = []string{
	"[FeatureGate:InPlacePodVerticalScaling]",
	"[FeatureGate:InPlacePodLevelResourcesVerticalScaling]",
	"[FeatureGate:PodLevelResources]",
}

// isResize says the test is one of in-place resize or pod-level resources: by its labels, or
// by upstream's name for the resize tests (its [Conformance] ones, GA, carry no feature gate).
func isResize(name string) bool {
	if strings.Contains(name, "Pod InPlace Resize") {
		return true
	}
	for _, l := range resizeLabels {
		if strings.Contains(name, l) {
			return true
		}
	}
	return false
}

// Selection is what a run runs, computed from the suite's listing.
type Selection struct {
	// Focus is the regular expression that selects the tests (ginkgo --focus).
	Focus string
	// Listed is how many tests the suite holds.
	Listed int
	// Focused are the tests Focus matches; Run those of them the run runs.
	Focused, Run []string
	// Resize are the tests of Run that isResize says are in-place resize or pod-level
	// resources.
	Resize []string
	// Exclusions left the other tests of Focused out.
	Exclusions []Exclusion
}

// slowReason is the [Slow] exclusion's reason.
const slowReason = "upstream labels these as taking more than five minutes each; left out unless `-conformance.slow`. " +
	"The in-place resize and pod-level resource tests (labelled " + "`[FeatureGate:InPlacePodVerticalScaling]`, " +
	"`[FeatureGate:InPlacePodLevelResourcesVerticalScaling]` or `[FeatureGate:PodLevelResources]`) are run though most are [Slow]"

// selectTests computes the selection from the suite's test names: the tests focus matches,
// less the [Slow] ones (unless slow) that are not in-place resize or pod-level resources.
func selectTests(names []string, focus string, slow bool) (Selection, error) {
	re, err := regexp.Compile(focus)
	if err != nil {
		return Selection{}, fmt.Errorf("focus: %w", err)
	}
	sel := Selection{Focus: focus, Listed: len(names)}
	slowEx := Exclusion{Label: "[Slow]", Reason: slowReason}
	for _, n := range names {
		if !re.MatchString(n) {
			continue
		}
		sel.Focused = append(sel.Focused, n)
		if !slow && strings.Contains(n, "[Slow]") && !isResize(n) {
			slowEx.Tests = append(slowEx.Tests, n)
			continue
		}
		sel.Run = append(sel.Run, n)
		if isResize(n) {
			sel.Resize = append(sel.Resize, n)
		}
	}
	if len(slowEx.Tests) > 0 {
		sel.Exclusions = append(sel.Exclusions, slowEx)
	}
	return sel, nil
}

// Skip is ginkgo's --skip for the selection: the excluded tests by their full names.
func (s Selection) Skip() string {
	var parts []string
	for _, e := range s.Exclusions {
		for _, n := range e.Tests {
			parts = append(parts, regexp.QuoteMeta(n))
		}
	}
	return strings.Join(parts, "|")
}

// parseListing returns the test names of e2e.test --list-tests's output: after a heading, one
// "    FILE:LINE: NAME" a test.
func parseListing(out string) ([]string, error) {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "    ") {
			continue
		}
		_, name, ok := strings.Cut(strings.TrimSpace(l), ": ")
		if !ok || name == "" {
			return nil, fmt.Errorf("a line of the listing is not FILE:LINE: NAME: %q", l)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, errors.New("the listing names no test")
	}
	return names, nil
}

// listSuite runs e2e.test --list-tests and returns the suite's test names.
func listSuite() ([]string, error) {
	out, err := exec.Command(e2eTestPath(), "--list-tests").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-tests: %w", e2eTestPath(), err)
	}
	return parseListing(string(out))
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
