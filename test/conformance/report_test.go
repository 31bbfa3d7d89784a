package conformance

import (
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
