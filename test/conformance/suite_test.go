package conformance

import (
	"compress/gzip"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// listing is e2e.test --list-tests's output of the e2e.test the harness runs
// (KubernetesVersion), captured as it printed it.
func listing(t *testing.T) string {
	t.Helper()
	f, err := os.Open("testdata/list-tests-" + KubernetesVersion + ".txt.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSelectionFromTheSuitesListing(t *testing.T) {
	names, err := parseListing(listing(t))
	if err != nil {
		t.Fatal(err)
	}
	// The listing's first test, as printed: "    FILE:LINE: NAME".
	if want := "[sig-api-machinery] API Streaming (aka. WatchList) [FeatureGate:WatchList] reflector doesn't support receiving resources as Tables [Beta]"; names[0] != want {
		t.Errorf("first test %q, want %q", names[0], want)
	}
	sel, err := selectTests(names, Focus, false)
	if err != nil {
		t.Fatal(err)
	}
	// The counts of e2e.test v1.37.2's listing, checked by hand against it with grep.
	if sel.Listed != 3206 || len(sel.Focused) != 427 || len(sel.Run) != 411 || len(sel.Resize) != 131 {
		t.Errorf("listed %d, focused %d, run %d, resize %d; want 3206, 427, 411, 131", sel.Listed, len(sel.Focused), len(sel.Run), len(sel.Resize))
	}
	if len(sel.Exclusions) != 1 || sel.Exclusions[0].Label != "[Slow]" || len(sel.Exclusions[0].Tests) != 16 {
		t.Fatalf("exclusions %+v; want the 16 [Slow] tests outside resize and pod-level resources", sel.Exclusions)
	}
	excluded := map[string]bool{}
	for _, n := range sel.Exclusions[0].Tests {
		excluded[n] = true
		if !strings.Contains(n, "[Slow]") || isResize(n) {
			t.Errorf("excluded %q", n)
		}
	}
	run := map[string]bool{}
	for _, n := range sel.Run {
		run[n] = true
	}
	// Run, with the resize and pod-level resource tests: [Slow], [Conformance] and pod-level ones.
	for _, n := range []string{
		"[sig-node] Pod InPlace Resize Container resize pod via the replace endpoint [MinimumKubeletVersion:1.34] [Conformance]",
		"[sig-node] Pod InPlace Resize Init Container [FeatureGate:InPlacePodVerticalScalingInitContainers] should support resizing a non-sidecar init container [FeatureGate:InPlacePodVerticalScaling] [FeatureGate:NodeDeclaredFeatures] [NodeConformance] [Slow]",
		"[sig-node] PLR Pod InPlace Resize [FeatureGate:InPlacePodLevelResourcesVerticalScaling] PLR guaranteed qos - 1 container with resize policy [Environment:NotInUserNS] no restart resizing pod-level mem [Beta] [FeatureGate:InPlacePodVerticalScaling] [FeatureGate:NodeDeclaredFeatures] [FeatureGate:PodLevelResources] [NodeConformance] [Slow]",
		"[sig-node] Pods should get a host IP [Conformance] [NodeConformance]",
	} {
		if !run[n] {
			t.Errorf("not run: %q", n)
		}
	}
	// ginkgo's --skip leaves out exactly the excluded tests of the whole suite.
	skip := regexp.MustCompile(sel.Skip())
	for _, n := range names {
		if skip.MatchString(n) != excluded[n] {
			t.Errorf("--skip matches %q: %t, excluded: %t", n, skip.MatchString(n), excluded[n])
		}
	}
	// -conformance.slow runs the whole focus.
	all, err := selectTests(names, Focus, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Run) != 427 || len(all.Exclusions) != 0 || all.Skip() != "" {
		t.Errorf("with slow: run %d, exclusions %v; want 427 and none", len(all.Run), all.Exclusions)
	}
}

func TestParseListingRefusesWhatIsNoListing(t *testing.T) {
	for _, out := range []string{"", "flag provided but not defined: -list-tests\n", "The following spec names can be used:\n    no location here\n"} {
		if names, err := parseListing(out); err == nil {
			t.Errorf("%q: %v, want an error", out, names)
		}
	}
}
