package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// nodeReady returns the Node's Ready condition as the API has it.
func (e *env) nodeReady() (v1.NodeCondition, error) {
	n, err := e.cp.Admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		return v1.NodeCondition{}, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c, nil
		}
	}
	return v1.NodeCondition{}, fmt.Errorf("no Ready condition in %+v", n.Status.Conditions)
}

// TestRelistStallMakesAgentUnhealthy: when the runtime stops answering (containerd frozen
// with SIGSTOP, so relisting stalls), /healthz fails with kubelet's "PLEG is not healthy"
// message once pods.relistThreshold has passed, and the Node's Ready condition turns False in
// the API; both recover once containerd runs again, and the pod that ran through the stall
// is untouched (same container, no restart).
func TestRelistStallMakesAgentUnhealthy(t *testing.T) {
	const threshold = 3 * time.Second
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.NodeStatus.UpdateFrequency = config.D(time.Second)
		c.Pods.RelistThreshold = config.D(threshold)
		c.Pods.RelistPeriod = config.D(time.Second) // a stall shows within the threshold
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, sleeperPod("steady", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.waitAPIRunning(t, "steady")["steady"].Status.ContainerStatuses[0]

	healthy := func() error {
		code, body, err := e.healthz()
		if err != nil || code != http.StatusOK || body != "ok" {
			return fmt.Errorf("/healthz: %d %q %v", code, body, err)
		}
		return nil
	}
	ready := func() error {
		c, err := e.nodeReady()
		if err != nil || c.Status != v1.ConditionTrue {
			return fmt.Errorf("Ready %+v (%v)", c, err)
		}
		return nil
	}
	testenv.Eventually(t, 60*time.Second, "agent healthy", healthy)
	testenv.Eventually(t, 60*time.Second, "node Ready", ready)

	e.cd.Freeze()
	testenv.Eventually(t, 60*time.Second, "/healthz unhealthy with the PLEG message", func() error {
		code, body, err := e.healthz()
		if err != nil {
			return fmt.Errorf("/healthz must answer even with the runtime stalled: %v", err)
		}
		if code != http.StatusInternalServerError || !strings.HasPrefix(body, "PLEG is not healthy: pleg was last seen active ") ||
			!strings.HasSuffix(body, "; threshold is "+threshold.String()) {
			return fmt.Errorf("/healthz: %d %q", code, body)
		}
		return nil
	})
	testenv.Eventually(t, 60*time.Second, "node NotReady in the API", func() error {
		c, err := e.nodeReady()
		if err != nil {
			return err
		}
		// The runtime does not answer at all: the node controller says so, or reports the
		// stalled relist; either way the node is not Ready.
		if c.Status != v1.ConditionFalse || c.Reason != "KubeletNotReady" ||
			!strings.Contains(c.Message, "PLEG is not healthy") && !strings.Contains(c.Message, "container runtime is down") {
			return fmt.Errorf("Ready %+v", c)
		}
		t.Logf("node condition while frozen: %s: %s", c.Reason, c.Message)
		return nil
	})

	e.cd.Thaw()
	testenv.Eventually(t, 60*time.Second, "agent healthy again", healthy)
	testenv.Eventually(t, 60*time.Second, "node Ready again", ready)
	after := e.waitAPIRunning(t, "steady")["steady"].Status.ContainerStatuses[0]
	if after.ContainerID != before.ContainerID || after.RestartCount != before.RestartCount {
		t.Errorf("the pod's container changed across the stall: %s/%d -> %s/%d",
			before.ContainerID, before.RestartCount, after.ContainerID, after.RestartCount)
	}
}
