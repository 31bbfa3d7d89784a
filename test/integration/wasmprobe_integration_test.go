package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// withHealthPolicy installs the example http-json probe policy, built from source: the pod's
// GET /health on port 8080 must return JSON whose "status" is "ok".
func withHealthPolicy(t *testing.T) func(*config.Config) {
	return withPolicy(t, "policies/examples/probe/http-json", `- name: health
  kind: probe
  module: http-json.wasm
  grants: {http: true}
  settings: {port: 8080, path: /health, field: status, equals: ok}
`)
}

// wasmProbed is a pod serving /health from /www, whose readiness or liveness probe is the
// "health" Wasm policy. The probe's own handler is the documented placeholder.
func wasmProbed(name, kind, start string) *v1.Pod {
	pod := sleeperPod(name, false)
	pod.Annotations = map[string]string{"probe.holdfast.dev/web." + kind: "health"}
	pod.Spec.Containers[0] = step("web", start+"; exec httpd -f -p 8080 -h /www")
	// The policy's http grant reaches only the pod's IP on the ports the pod declares.
	pod.Spec.Containers[0].Ports = []v1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	probe := &v1.Probe{
		ProbeHandler:  v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"holdfast-wasm-probe", "health"}}},
		PeriodSeconds: 1, FailureThreshold: 3, TimeoutSeconds: 2,
	}
	if kind == "readiness" {
		pod.Spec.Containers[0].ReadinessProbe = probe
	} else {
		pod.Spec.Containers[0].LivenessProbe = probe
	}
	return pod
}

// TestWasmReadinessProbe: a pod whose Wasm readiness probe fails is not Ready, and becomes
// Ready once the condition the policy checks is met.
func TestWasmReadinessProbe(t *testing.T) {
	e := startEnv(t, true, withHealthPolicy(t))
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	pod := wasmProbed("judged", "readiness", `mkdir -p /www && echo '{"status":"starting"}' > /www/health`)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var id string
	testenv.Eventually(t, 90*time.Second, "running but not ready while the policy fails", func() error {
		p, err := pods.Get(ctx, "judged", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("not running yet (%v)", err)
		}
		if p.Status.ContainerStatuses[0].Ready || hasCondition(p.Status, v1.PodReady, v1.ConditionTrue) {
			return fmt.Errorf("ready while /health says starting")
		}
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=judged"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "Unhealthy" && strings.Contains(ev.Message, "Readiness probe failed") {
				id = strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
				return nil
			}
		}
		return fmt.Errorf("no Unhealthy event from the Wasm probe yet")
	})
	if out, err := e.exec(id, "sh", "-c", `echo '{"status":"ok"}' > /www/health`); err != nil {
		t.Fatalf("flip health: %v %s", err, out)
	}
	testenv.Eventually(t, 60*time.Second, "ready once the policy passes", func() error {
		p, err := pods.Get(ctx, "judged", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !hasCondition(p.Status, v1.PodReady, v1.ConditionTrue) {
			return fmt.Errorf("not ready: %+v", p.Status.Conditions)
		}
		return nil
	})
}

// TestWasmLivenessProbe: a Wasm liveness failure restarts the container exactly once per
// failure streak: the new instance starts healthy and is not restarted again.
func TestWasmLivenessProbe(t *testing.T) {
	e := startEnv(t, true, withHealthPolicy(t))
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	pod := wasmProbed("watched", "liveness", `mkdir -p /www && echo '{"status":"ok"}' > /www/health`)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := e.waitAPIRunning(t, "watched")["watched"]
	id := strings.TrimPrefix(containerIDOf(first), "containerd://")
	if out, err := e.exec(id, "sh", "-c", `echo '{"status":"broken"}' > /www/health`); err != nil {
		t.Fatalf("break health: %v %s", err, out)
	}
	testenv.Eventually(t, 60*time.Second, "restarted once after the failure streak", func() error {
		p, err := pods.Get(ctx, "watched", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		cs := p.Status.ContainerStatuses[0]
		if cs.RestartCount != 1 || cs.State.Running == nil {
			return fmt.Errorf("restartCount %d state %+v", cs.RestartCount, cs.State)
		}
		return nil
	})
	// The new instance writes a healthy /health at start: several probe periods later it has
	// not been restarted again.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		p, err := pods.Get(ctx, "watched", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 1 {
			t.Fatalf("restartCount %d: restarted more than once for one failure streak", rc)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
