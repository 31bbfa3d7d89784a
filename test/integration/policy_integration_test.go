package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// registriesRego is the allowed-registries example written in Rego, as a cluster that keeps its
// admission rules in OPA has it.
const registriesRego = `package kubernetes.admission

import rego.v1

deny contains msg if {
	some c in input.request.object.spec.containers
	not startswith(c.image, "docker.io/holdfast/")
	msg := sprintf("container %s: image %s is not from docker.io/holdfast", [c.name, c.image])
}
`

// withOPAPolicy compiles registriesRego with opa build -t wasm, as its user does, and makes the
// bundle the node's only policy.
func withOPAPolicy(t *testing.T) func(*config.Config) {
	bundle, err := os.ReadFile(testenv.OPABundle(t, registriesRego, "", "kubernetes/admission/deny"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "registries.tar.gz"), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n" +
		"- {name: registries, kind: opa, module: registries.tar.gz, entrypoint: kubernetes/admission/deny}\n"
	if err := os.WriteFile(filepath.Join(dir, "policies.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(c *config.Config) {
		quickBackoff(c)
		c.PolicyDir = dir
	}
}

// withAdmissionPolicy installs the example allowed-registries policy as the node's only
// policy: images must come from docker.io/holdfast.
func withAdmissionPolicy(t *testing.T) func(*config.Config) {
	return withPolicy(t, "policies/examples/admission/allowed-registries", `- name: allowed-registries
  kind: admission
  module: allowed-registries.wasm
  failurePolicy: Fail
  settings: {registries: [docker.io/holdfast]}
`)
}

// TestWasmAdmissionPolicy: a pod denied by an admission policy ends Failed with the policy's
// reason, a message naming the policy and its module digest and carrying the policy's own
// words, and an Event; an allowed pod runs; with the apiserver gone, a static pod is judged the
// same way. Once for each kind of policy: a Go policy of holdfast's ABI (the allowed-registries
// example) and the same rule in Rego, compiled by OPA.
func TestWasmAdmissionPolicy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		install func(*testing.T) func(*config.Config)
		policy  string
		kind    string // the policy's kind, its metrics' label
		reason  string // the denied pod's status.reason
		message string // in its status.message
	}{
		{"holdfast ABI", withAdmissionPolicy, "allowed-registries", "admission", "RegistryNotAllowed", "docker.io/elsewhere/busybox:test"},
		{"OPA Rego", withOPAPolicy, "registries", "opa", "PolicyDenied", "image docker.io/elsewhere/busybox:test is not from docker.io/holdfast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testAdmissionPolicy(t, tc.install(t), tc.policy, tc.kind, tc.reason, tc.message)
		})
	}
}

func testAdmissionPolicy(t *testing.T, install func(*config.Config), policy, kind, reason, message string) {
	e := startEnv(t, true, install)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	denied := sleeperPod("foreign", true)
	denied.Spec.Containers[0].Image = "docker.io/elsewhere/busybox:test"
	for _, p := range []*v1.Pod{sleeperPod("local", true), denied} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	judged := func(st v1.PodStatus) error {
		if st.Phase != v1.PodFailed || st.Reason != reason || !strings.Contains(st.Message, message) ||
			!strings.Contains(st.Message, `"`+policy+`"`) || !strings.Contains(st.Message, "sha256:") {
			return fmt.Errorf("status %s %s %q", st.Phase, st.Reason, st.Message)
		}
		return nil
	}
	testenv.Eventually(t, 90*time.Second, "denied pod Failed with the policy's reason and message", func() error {
		p, err := pods.Get(ctx, "foreign", metav1.GetOptions{})
		if err != nil {
			return err
		}
		return judged(p.Status)
	})
	testenv.Eventually(t, 30*time.Second, "an event for the denial", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=foreign"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == reason && ev.Type == v1.EventTypeWarning && strings.Contains(ev.Message, message) {
				return nil
			}
		}
		return fmt.Errorf("%d events, none %s with %q", len(evs.Items), reason, message)
	})
	e.waitAPIRunning(t, "local")
	checkPolicyMetrics(t, e, policy, kind)

	// Offline: the same policy judges a static pod with no apiserver.
	e.cp.Stop()
	manifest := strings.Replace(fmt.Sprintf(staticPod, "x"), "docker.io/holdfast/busybox:test", "docker.io/elsewhere/busybox:test", 1)
	e.judgeStaticPod(t, manifest, "static pod denied offline", 60*time.Second, judged)
}
