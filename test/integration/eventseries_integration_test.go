package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestRepeatedEventsAreOneSeries: a container that keeps failing makes the same events again
// and again (Started, BackOff); the agent's recorder sends each again as a patch of the first
// (its count and last time), as the kubelet's does, and the apiserver takes that patch: one
// Event object whose count grows, not one object per occurrence, nor a series stuck at 1
// because the patch was refused. The patch is computed by agent/kube/patch, not strategicpatch.
func TestRepeatedEventsAreOneSeries(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	p := sleeperPod("repeats", true)
	p.Spec.RestartPolicy = v1.RestartPolicyAlways
	p.Spec.Containers[0].Command = []string{"sh", "-c", "exit 1"}
	if _, err := e.cp.Admin.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 120*time.Second, "one Started event of repeats with a count of 3 or more", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=repeats,reason=Started"})
		if err != nil {
			return err
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Count >= 3 && ev.LastTimestamp.After(ev.FirstTimestamp.Time) {
				return nil
			}
			seen = append(seen, fmt.Sprintf("%s x%d %s..%s", ev.Name, ev.Count, ev.FirstTimestamp.Format(time.RFC3339), ev.LastTimestamp.Format(time.RFC3339)))
		}
		return fmt.Errorf("Started events: %v", seen)
	})
}
