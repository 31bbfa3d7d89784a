package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestNodeStatusKeepsOthersFields: an admin advertises an extended resource in the node's
// capacity and another controller sets a condition of its own; several holdfast status writes
// later both are still there, beside holdfast's own capacity and conditions.
func TestNodeStatusKeepsOthersFields(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		c.NodeStatus.UpdateFrequency = config.D(time.Second)
		c.NodeStatus.ReportFrequency = config.D(time.Second) // a write every second, changed or not
	})
	ctx := context.Background()
	nodes := e.cp.Admin.CoreV1().Nodes()
	testenv.Eventually(t, 60*time.Second, "the node registered and Ready", func() error {
		n, err := nodes.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if readyHeartbeat(n).IsZero() {
			return fmt.Errorf("no Ready condition yet")
		}
		return nil
	})
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{
		"capacity":    map[string]string{"example.com/dongle": "4"},
		"allocatable": map[string]string{"example.com/dongle": "4"},
		"conditions": []map[string]string{{"type": "example.com/RadioLink", "status": "True", "reason": "Associated",
			"message": "set by another controller", "lastHeartbeatTime": time.Now().UTC().Format(time.RFC3339)}},
	}})
	if _, err := nodes.Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	var n *v1.Node
	testenv.Eventually(t, 60*time.Second, "several holdfast status writes after the admin's", func() error {
		var err error
		if n, err = nodes.Get(ctx, node, metav1.GetOptions{}); err != nil {
			return err
		}
		if hb := readyHeartbeat(n); hb.Before(changed.Add(3 * time.Second)) {
			return fmt.Errorf("Ready heartbeat %s, want 3s past %s", hb, changed)
		}
		return nil
	})
	if q := n.Status.Capacity["example.com/dongle"]; q.Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("capacity %v: the extended resource was erased", n.Status.Capacity)
	}
	if q := n.Status.Allocatable["example.com/dongle"]; q.Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("allocatable %v: the extended resource was erased", n.Status.Allocatable)
	}
	if n.Status.Capacity.Cpu().IsZero() || n.Status.Capacity.Pods().Value() != 110 {
		t.Errorf("capacity %v: holdfast's own resources missing", n.Status.Capacity)
	}
	found := false
	for _, c := range n.Status.Conditions {
		if c.Type == "example.com/RadioLink" && c.Status == v1.ConditionTrue && c.Reason == "Associated" {
			found = true
		}
	}
	if !found {
		t.Errorf("conditions %+v: the other controller's condition was erased", n.Status.Conditions)
	}
}

func readyHeartbeat(n *v1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}
