package prober

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// wasmPod is a pod whose readiness probe is served by the policy named in its annotation,
// with the documented exec placeholder as its handler.
func wasmPod(policyName string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "collector", Namespace: "edge", UID: "u-wasm",
			Annotations: map[string]string{policy.ProbeAnnotation("app", policy.Readiness): policyName}},
		Spec: v1.PodSpec{
			InitContainers: []v1.Container{{Name: "side", Ports: []v1.ContainerPort{{ContainerPort: 9000}}}},
			Containers: []v1.Container{{
				Name:  "app",
				Ports: []v1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 8080, Protocol: v1.ProtocolUDP}, {ContainerPort: 53, Protocol: v1.ProtocolUDP}},
				ReadinessProbe: &v1.Probe{
					ProbeHandler:  v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{policy.ProbePlaceholderCommand, policyName}}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

func wasmTarget(pod *v1.Pod) Target {
	return Target{Pod: pod, Container: &pod.Spec.Containers[0], ContainerID: "c1", Kind: Readiness,
		Probe: pod.Spec.Containers[0].ReadinessProbe, PodIP: "10.88.0.9", Pid: 4242, Timeout: time.Second}
}

type recordingPolicies struct {
	name    string
	target  policy.ProbeTarget
	success bool
	message string
	err     error
}

func (r *recordingPolicies) Probe(ctx context.Context, name string, t policy.ProbeTarget) (bool, string, error) {
	r.name, r.target = name, t
	return r.success, r.message, r.err
}

func TestWasmHandlerTarget(t *testing.T) {
	pod := wasmPod("collector-health")
	rp := &recordingPolicies{success: true, message: "all good"}
	execCalled := false
	h := NewHandlers(nil, rp)
	h.Exec = HandlerFunc(func(context.Context, Target) (Outcome, string, error) {
		execCalled = true
		return Failure, "placeholder run", nil
	})
	got, out, err := h.Probe(context.Background(), wasmTarget(pod))
	if err != nil || got != Success || out != "all good" {
		t.Fatalf("got %s %q %v", got, out, err)
	}
	if execCalled {
		t.Error("the exec placeholder ran instead of the policy")
	}
	if rp.name != "collector-health" || rp.target.Container != "app" || rp.target.PodIP != "10.88.0.9" || rp.target.RootFS != "/proc/4242/root" {
		t.Errorf("policy %q target %+v", rp.name, rp.target)
	}
	if !slices.Equal(rp.target.Ports, []int32{8080, 9000}) {
		t.Errorf("ports %v, want the pod's TCP ports [8080 9000]", rp.target.Ports)
	}

	// A policy error (failurePolicy Fail) fails the probe with the policy's message.
	rp.success, rp.message, rp.err = false, `probe policy "collector-health" (module sha256:ab) failed: trap`, errors.New("trap")
	if got, out, err := h.Probe(context.Background(), wasmTarget(pod)); err != nil || got != Failure || !strings.Contains(out, "failed: trap") {
		t.Errorf("got %s %q %v", got, out, err)
	}

	// Liveness of the same container has no annotation: its own handler runs.
	tg := wasmTarget(pod)
	tg.Kind = Liveness
	if got, _, _ := h.Probe(context.Background(), tg); got != Failure || !execCalled {
		t.Error("an unannotated probe must run its own handler")
	}

	// No policy engine on the node: errored, neither ready nor killed.
	noWasm := NewHandlers(nil, nil)
	if _, _, err := noWasm.Probe(context.Background(), wasmTarget(pod)); !errors.Is(err, ErrNoHandler) || !strings.Contains(err.Error(), "collector-health") {
		t.Errorf("err %v, want ErrNoHandler naming the policy", err)
	}

	// An annotation naming another policy than the placeholder: errored.
	bad := wasmPod("collector-health")
	bad.Annotations[policy.ProbeAnnotation("app", policy.Readiness)] = "other"
	if _, _, err := h.Probe(context.Background(), wasmTarget(bad)); err == nil || !strings.Contains(err.Error(), "placeholder") {
		t.Errorf("err %v", err)
	}
}

// TestWasmProbeThroughThePolicyManager runs real modules through package policy: the
// answer of the module becomes the probe's outcome and readiness.
func TestWasmProbeThroughThePolicyManager(t *testing.T) {
	dir := t.TempDir()
	for name, wat := range map[string]string{"ok.wasm": "probe-ok", "fail.wasm": "probe-fail"} {
		if err := os.WriteFile(filepath.Join(dir, name), wasmtest.BuildWAT(t, "agent/policy/testdata/"+wat+".wat"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n" +
		"- {name: healthy, kind: probe, module: ok.wasm}\n- {name: sick, kind: probe, module: fail.wasm}\n"
	if err := os.WriteFile(filepath.Join(dir, policy.ConfigFileName), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	pm, err := policy.Open(context.Background(), policy.Options{Dir: dir, CacheDir: wasmtest.CacheDir(t, "wazero")})
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close(context.Background())

	for _, tc := range []struct {
		policy string
		ready  bool
		event  string
	}{
		{"healthy", true, ""},
		{"sick", false, "Warning Unhealthy Readiness probe failed: db down"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			f := newFixture(t)
			f.m.cfg.Handler = NewHandlers(nil, pm)
			pod := wasmPod(tc.policy)
			f.m.UpdatePod(pod, "10.88.0.9", map[string]ContainerInfo{"app": {ID: "c1", StartedAt: t0}})
			f.step(pod, "app", Readiness)
			if got := f.m.Ready(pod.UID, "app"); got != tc.ready {
				t.Errorf("ready %v, want %v", got, tc.ready)
			}
			evs := f.events()
			if tc.event == "" && len(evs) != 0 || tc.event != "" && (len(evs) != 1 || evs[0] != tc.event) {
				t.Errorf("events %q, want %q", evs, tc.event)
			}
		})
	}
}
