package agent_test

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
	"github.com/holdfast-dev/holdfast/internal/testenv"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// withPolicy builds an example policy from source into a policy dir of its own, with the
// given policies.yaml entry, and returns the config change that makes it the node's policy.
func withPolicy(t *testing.T, pkgDir, entry string) func(*config.Config) {
	module := wasmtest.BuildGo(t, pkgDir)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(pkgDir)+".wasm"), module, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n" + entry
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

// TestWasmAdmissionPolicy: a pod denied by an example admission policy ends Failed with the
// policy's reason, a message naming the policy and its module digest, and an Event; an
// allowed pod runs; with the apiserver gone, a static pod is judged the same way.
func TestWasmAdmissionPolicy(t *testing.T) {
	e := startEnv(t, true, withAdmissionPolicy(t))
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	denied := sleeperPod("foreign", true)
	denied.Spec.Containers[0].Image = "docker.io/elsewhere/busybox:test"
	for _, p := range []*v1.Pod{sleeperPod("local", true), denied} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 90*time.Second, "denied pod Failed with the policy's reason", func() error {
		p, err := pods.Get(ctx, "foreign", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodFailed || p.Status.Reason != "RegistryNotAllowed" ||
			!strings.Contains(p.Status.Message, `"allowed-registries"`) || !strings.Contains(p.Status.Message, "sha256:") {
			return fmt.Errorf("status %s %s %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "an event for the denial", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=foreign"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "RegistryNotAllowed" && ev.Type == v1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("%d events, none RegistryNotAllowed", len(evs.Items))
	})
	e.waitAPIRunning(t, "local")
	checkPolicyMetrics(t, e, "allowed-registries")

	// Offline: the same policy judges a static pod with no apiserver.
	e.cp.Stop()
	manifest := strings.Replace(fmt.Sprintf(staticPod, "x"), "docker.io/holdfast/busybox:test", "docker.io/elsewhere/busybox:test", 1)
	if err := os.WriteFile(filepath.Join(e.agent.Config.ManifestDir, "sensor.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "static pod denied offline", func() error {
		p, err := e.localPod("sensor-" + node)
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodFailed || p.Status.Reason != "RegistryNotAllowed" {
			return fmt.Errorf("status %s %s %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		return nil
	})
}
