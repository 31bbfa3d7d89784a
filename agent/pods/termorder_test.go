package pods

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Sidecars stop after the app containers, in reverse declaration order; a regular init
// container, or a container that is not running, holds nothing up.
func TestTerminationOrder(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	pod := testPod(v1.RestartPolicyAlways, "app1", "app2")
	pod.Spec.InitContainers = []v1.Container{
		{Name: "proxy", RestartPolicy: &always}, {Name: "setup"}, {Name: "logs", RestartPolicy: &always},
	}
	o := newTerminationOrder(pod, map[string]bool{"app1": true, "app2": true, "proxy": true, "logs": true})
	ctx := context.Background()

	turn := func(name string) <-chan struct{} {
		ch := make(chan struct{})
		go func() { o.waitTurn(ctx, name, time.Minute); close(ch) }()
		return ch
	}
	blocked := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
			t.Fatalf("%s went before its turn", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	went := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never got its turn", what)
		}
	}
	went("app1", turn("app1"))
	proxy, logs := turn("proxy"), turn("logs")
	blocked("logs, with app containers running", logs)
	o.exitedNow("app1")
	o.exitedNow("app2")
	went("logs, the last sidecar, after the app containers", logs)
	blocked("proxy, with logs running", proxy)
	o.exitedNow("logs")
	went("proxy after logs", proxy)

	// The budget bounds the wait: a sidecar is stopped when its grace period is spent.
	o = newTerminationOrder(pod, map[string]bool{"app1": true, "proxy": true})
	if waited := o.waitTurn(ctx, "proxy", 20*time.Millisecond); waited < 20*time.Millisecond {
		t.Errorf("waited %v, want the budget of 20ms", waited)
	}
	// Not running: nothing to wait for.
	o = newTerminationOrder(pod, map[string]bool{"proxy": true})
	went("proxy alone", turn("proxy"))
}
