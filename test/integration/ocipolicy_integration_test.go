package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	agentnode "github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/test/testenv"
	"github.com/holdfast-dev/holdfast/wasm"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// TestOCIPolicies: the node's admission policy is delivered from a registry, pinned by
// digest. Version A (allowed-registries) is pulled and decides; version B
// (no-privileged-or-hostpath) replaces it when policies.yaml names its digest; a broken
// version C leaves B serving, and a Node event and the HoldfastPoliciesReady condition say so;
// after the fleet rolls back to B, an offline reboot (no registry, no apiserver) loads B from
// the state store and it still decides.
func TestOCIPolicies(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	hostsDir := filepath.Join(t.TempDir(), "certs.d")
	reg.WriteHostsDir(hostsDir)
	ctx := context.Background()
	moduleA := wasmtest.BuildGo(t, "policies/examples/admission/allowed-registries")
	moduleB := wasmtest.BuildGo(t, "policies/examples/admission/no-privileged-or-hostpath")
	digestA := reg.PushArtifact(ctx, "policies/node-policy:a", policy.MediaTypeWasmLayer, moduleA)
	digestB := reg.PushArtifact(ctx, "policies/node-policy:b", policy.MediaTypeWasmLayer, moduleB)
	digestC := reg.PushArtifact(ctx, "policies/node-policy:c", policy.MediaTypeWasmLayer, []byte("not a Wasm module"))

	policyDir := t.TempDir()
	configure := func(d digest.Digest, settings string) {
		t.Helper()
		cfg := fmt.Sprintf("apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n- name: node-policy\n  kind: admission\n  module: oci://%s/policies/node-policy@%s\n  failurePolicy: Fail\n",
			reg.Host, d)
		if settings != "" {
			cfg += "  settings: " + settings + "\n"
		}
		tmp := filepath.Join(policyDir, ".policies.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(policyDir, "policies.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	configure(digestA, "{registries: [docker.io/holdfast]}")
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.PolicyDir = policyDir
		c.Containerd.RegistryConfigPath = hostsDir // the one configuration image pulls use too
	})
	pods := e.cp.Admin.CoreV1().Pods("default")
	waitDenied := func(p *v1.Pod, reason string, module []byte) {
		t.Helper()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 90*time.Second, p.Name+" denied by "+reason, func() error {
			got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Status.Phase != v1.PodFailed || got.Status.Reason != reason || !strings.Contains(got.Status.Message, wasm.Digest(module)) {
				return fmt.Errorf("status %s %s %q", got.Status.Phase, got.Status.Reason, got.Status.Message)
			}
			return nil
		})
	}
	waitCondition := func(status v1.ConditionStatus, reason string, mention ...string) {
		t.Helper()
		// Compiling a module of the Go examples takes tens of seconds under -race.
		testenv.Eventually(t, 120*time.Second, fmt.Sprintf("%s %s %s", agentnode.ConditionPoliciesReady, status, reason), func() error {
			n, err := e.cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range n.Status.Conditions {
				if c.Type != agentnode.ConditionPoliciesReady {
					continue
				}
				if c.Status != status || c.Reason != reason {
					return fmt.Errorf("condition %s %s %q", c.Status, c.Reason, c.Message)
				}
				for _, m := range mention {
					if !strings.Contains(c.Message, m) {
						return fmt.Errorf("condition message %q does not mention %s", c.Message, m)
					}
				}
				return nil
			}
			return fmt.Errorf("no %s condition in %+v", agentnode.ConditionPoliciesReady, n.Status.Conditions)
		})
	}

	// A, pulled at start (until it is, the policy is not loaded and its failurePolicy, Fail,
	// refuses every pod): a foreign registry is refused, a host-network pod from ours runs.
	waitCondition(v1.ConditionTrue, "PoliciesLoaded", wasm.Digest(moduleA))
	foreign := sleeperPod("a-foreign", true)
	foreign.Spec.Containers[0].Image = "docker.io/elsewhere/busybox:test"
	waitDenied(foreign, "RegistryNotAllowed", moduleA)
	if _, err := pods.Create(ctx, sleeperPod("a-host", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "a-host")

	// B, by a new digest in policies.yaml: host-network pods are now refused.
	configure(digestB, "")
	waitCondition(v1.ConditionTrue, "PoliciesLoaded", wasm.Digest(moduleB))
	waitDenied(sleeperPod("b-host", true), "HostNamespace", moduleB)

	// C does not load: B keeps deciding, and the Node says so.
	configure(digestC, "")
	waitCondition(v1.ConditionFalse, "PolicyLoadFailed", digestC.String(), "keeps serving", wasm.Digest(moduleB))
	testenv.Eventually(t, 60*time.Second, "a PolicyLoadFailed event on the Node", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,reason=PolicyLoadFailed"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Type == v1.EventTypeWarning && ev.InvolvedObject.Name == node &&
				strings.Contains(ev.Message, `"node-policy"`) && strings.Contains(ev.Message, digestC.String()) &&
				strings.Contains(ev.Message, "keeps serving") {
				return nil
			}
		}
		return fmt.Errorf("%d PolicyLoadFailed events, none naming %s", len(evs.Items), digestC)
	})
	waitDenied(sleeperPod("c-host", true), "HostNamespace", moduleB)

	// The fleet rolls back to B; then an offline reboot: no registry, no apiserver. B comes
	// from the state store and judges a static pod.
	configure(digestB, "")
	waitCondition(v1.ConditionTrue, "PoliciesLoaded", wasm.Digest(moduleB))
	reg.Stop()
	e.cp.Stop()
	testenv.Reboot(e.cd, e.agent)
	e.agent.Start()
	manifest := strings.Replace(fmt.Sprintf(staticPod, "x"), "spec:\n", "spec:\n  hostNetwork: true\n", 1)
	e.judgeStaticPod(t, manifest, "static host-network pod denied by B after the offline reboot", 90*time.Second, func(st v1.PodStatus) error {
		if st.Phase != v1.PodFailed || st.Reason != "HostNamespace" || !strings.Contains(st.Message, wasm.Digest(moduleB)) {
			return fmt.Errorf("status %s %s %q", st.Phase, st.Reason, st.Message)
		}
		return nil
	})
}
