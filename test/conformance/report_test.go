package conformance

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const junitSample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="0" errors="0" failures="1" time="10">
  <testsuite name="Kubernetes e2e suite" package="/" tests="4" failures="1">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[It] [sig-node] Pods should get a host IP [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="passed" time="3.5"></testcase>
    <testcase name="[It] [sig-node] Kubelet should print the output to logs [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="failed" time="5">
      <failure message="[FAILED] error dialing backend: dial tcp 10.0.0.1:10250: connect: connection refused" type="failed">[FAILED] more</failure>
    </testcase>
    <testcase name="[It] [sig-node] Probing container should be restarted [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped - not selected"></skipped>
    </testcase>
    <testcase name="[It] [sig-apps] Deployment works [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0"></testcase>
  </testsuite>
</testsuites>`

func TestParseJUnitKeepsTheSelection(t *testing.T) {
	rs, err := parseJUnit(strings.NewReader(junitSample), regexp.MustCompile(Focus))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"[sig-node] Pods should get a host IP [NodeConformance] [Conformance]":               "passed",
		"[sig-node] Kubelet should print the output to logs [NodeConformance] [Conformance]": "failed",
		"[sig-node] Probing container should be restarted [NodeConformance] [Conformance]":   "skipped",
	}
	if len(rs) != len(want) {
		t.Fatalf("got %d results, want %d: %v", len(rs), len(want), rs)
	}
	for n, s := range want {
		if rs[n].State != s {
			t.Errorf("%s: %q, want %q", n, rs[n].State, s)
		}
	}
}

// pageMessages are first lines of failure messages e2e.test gave in the run of 2026-12-03
// (docs/conformance.md of that date), with the cause each must get.
var pageMessages = map[string]string{
	`cmd [ip link add dummy1 type dummy], stdout "", stderr "ip: RTNETLINK answers: Operation not supported": command terminated with exit code 2`:                                             "kernel: operation not supported",
	`timed out waiting for the pod: Failed to read container status: context deadline exceeded; last observed error from wait loop: failed to get container status: context deadline exceeded`: "timed out",
	`Error dialing UDP from node to pod: failed to find expected endpoints,`:                                                                                                                   "",
}

// junitFailures are failures of holdfast that e2e.test reported in two focused runs of
// 2026-12-06 (testdata/junit-failures.xml: the test cases as its JUnit reports have them), with
// the cause each must get ("" for none): the env tests before the busybox image's fix
// (docs/conformance-runs/2026-12-06-env-before.md) and a first run of resize tests, made from
// this harness's tree before its commit (docs/conformance-runs/2026-12-06-resize.md runs them
// again).
var junitFailures = map[string]string{
	"[sig-node] ConfigMap should be consumable via the environment [Conformance] [NodeConformance]":                          "variable named with a dash missing from env's output",
	"[sig-node] Secrets should be consumable via the environment [Conformance] [NodeConformance]":                            "variable named with a dash missing from env's output",
	"[sig-node] Pod InPlace Resize Container resize pod via the replace endpoint [MinimumKubeletVersion:1.34] [Conformance]": "cgroup file unreadable in the container",
	"[sig-node] PLR Pod InPlace Resize [FeatureGate:InPlacePodLevelResourcesVerticalScaling] PLR guaranteed qos - 1 container with resize policy [Environment:NotInUserNS] no restart resizing pod-level mem [Beta] [FeatureGate:InPlacePodVerticalScaling] [FeatureGate:NodeDeclaredFeatures] [FeatureGate:PodLevelResources] [NodeConformance] [Slow]":                                                   "",
	"[sig-node] PLR Pod InPlace Resize [FeatureGate:InPlacePodLevelResourcesVerticalScaling] PLR guaranteed qos - 1 container with resize policy [Environment:NotInUserNS] cpu & mem restart + resize initContainers resizing cpu & mem in opposite directions [Beta] [FeatureGate:InPlacePodVerticalScaling] [FeatureGate:NodeDeclaredFeatures] [FeatureGate:PodLevelResources] [NodeConformance] [Slow]": "oom_score_adj above the QoS class's",
}

func readFailures(t *testing.T) map[string]Result {
	t.Helper()
	rs, err := readJUnit("testdata/junit-failures.xml", regexp.MustCompile(Focus))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(junitFailures) {
		t.Fatalf("testdata holds %d failures, want %d: %v", len(rs), len(junitFailures), rs)
	}
	return rs
}

func causeName(r Result) string {
	if c := classify(Causes, r); c != nil {
		return c.Name
	}
	return ""
}

func TestCausesFromRealMessages(t *testing.T) {
	for msg, want := range pageMessages {
		if got := causeName(Result{State: "failed", Message: msg}); got != want {
			t.Errorf("%q: cause %q, want %q", msg, got, want)
		}
	}
	for n, r := range readFailures(t) {
		want, ok := junitFailures[n]
		if !ok || r.State != "failed" {
			t.Errorf("%q: %s, not a failure of the testdata", n, r.State)
			continue
		}
		if got := causeName(r); got != want {
			t.Errorf("%s: cause %q, want %q; message:\n%s", n, got, want, r.Message)
		}
	}
}

func TestFirstLineSaysWhatAWaitWasFor(t *testing.T) {
	plr := "[sig-node] PLR Pod InPlace Resize [FeatureGate:InPlacePodLevelResourcesVerticalScaling] PLR guaranteed qos - 1 container with resize policy [Environment:NotInUserNS] no restart resizing pod-level mem [Beta] [FeatureGate:InPlacePodVerticalScaling] [FeatureGate:NodeDeclaredFeatures] [FeatureGate:PodLevelResources] [NodeConformance] [Slow]"
	got := firstLine(readFailures(t)[plr].Message)
	if want := "Told to stop trying after 2.028s. The phase of Pod resize-test-mcmcg is Failed which is unexpected."; got != want {
		t.Errorf("first line %q, want %q", got, want)
	}
	if got, want := firstLine("[FAILED] expected \"data-1=value-1\" in container output: Expected\n    <string>: PATH=/bin"), `expected "data-1=value-1" in container output: Expected`; got != want {
		t.Errorf("first line %q, want %q", got, want)
	}
}

func TestWriteDocTellsEveryFailureByItsMessage(t *testing.T) {
	failures := readFailures(t)
	env := "[sig-node] ConfigMap should be consumable via the environment [Conformance] [NodeConformance]"
	replace := "[sig-node] Pod InPlace Resize Container resize pod via the replace endpoint [MinimumKubeletVersion:1.34] [Conformance]"
	// Both fail the env test with the same message; only holdfast fails the resize test.
	kubelet := map[string]Result{env: failures[env], replace: {State: "passed", Seconds: 60}}
	holdfast := map[string]Result{env: failures[env], replace: failures[replace]}
	// A focused run kept after this one, in which holdfast passed the env test and the kubelet
	// failed the resize test.
	later := []KeptRun{{Name: "2026-12-06-env-after", Page: "conformance-runs/2026-12-06-env-after.md", Started: "2026-12-06T13:40:54Z", Commit: "c39a3e3",
		Results: map[string]map[string]Result{Holdfast: {env: {State: "passed"}, replace: {State: "failed"}}, Kubelet: {replace: {State: "failed"}}}}}
	var b strings.Builder
	if err := WriteDoc(&b, DocInput{Kubelet: kubelet, Holdfast: holdfast, Causes: Causes, Later: later}); err != nil {
		t.Fatal(err)
	}
	doc := b.String()
	for _, s := range []string{
		"Both pass 0 tests and both fail 1; the kubelet passes 1 that holdfast does not",
		// A failure both share is told by its message, like any other.
		"| variable named with a dash missing from env's output | 1 | 1 | 1 |",
		"| cgroup file unreadable in the container | 0 | 1 | 0 |",
		"| " + replace + ` | cgroup file unreadable in the container: [failed to verify cpu limit cgroup value: Timed out after 60.000s. |`,
		"| " + env + ` | failed | failed | variable named with a dash missing from env's output: expected "data-1=value-1" in container output: Expected | variable named with a dash missing from env's output: expected "data-1=value-1" in container output: Expected |`,
		"## Failed in this run, passed in a later focused run",
		"| " + env + " | holdfast | [2026-12-06-env-after](conformance-runs/2026-12-06-env-after.md) (started 2026-12-06T13:40:54Z, commit c39a3e3) |",
	} {
		if !strings.Contains(doc, s) {
			t.Errorf("the page lacks %q:\n%s", s, doc)
		}
	}
	for _, s := range []string{"environment's", "| " + env + " | kubelet |", "| " + replace + " | holdfast | ["} {
		if strings.Contains(doc, s) {
			t.Errorf("the page has %q:\n%s", s, doc)
		}
	}
	// Without a later run that passed it, no test is said to have passed later.
	b.Reset()
	if err := WriteDoc(&b, DocInput{Kubelet: kubelet, Holdfast: holdfast, Causes: Causes}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "passed in a later") {
		t.Errorf("a page with no kept run says a test passed later:\n%s", b.String())
	}
}

func TestReadKeptRunsKeepsThoseAfterTheRun(t *testing.T) {
	dir := t.TempDir()
	for name, started := range map[string]string{"before": "2026-12-03T22:00:00Z", "same": "2026-12-03T22:15:47Z", "after": "2026-12-06T13:40:54Z", "after2": "2026-12-05T10:00:00Z"} {
		data := `{"Started": "` + started + `", "Commit": "abc", "Results": {"holdfast": {"t": {"State": "passed"}}}}`
		if err := os.WriteFile(filepath.Join(dir, name+".json"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runs, err := readKeptRuns(dir, "2026-12-03T22:15:47Z")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Name != "after2" || runs[1].Name != "after" || runs[1].Page != keptDir+"/after.md" || runs[1].Results[Holdfast]["t"].State != "passed" {
		t.Errorf("kept runs %+v; want after2 then after", runs)
	}
}
