// Pods and containers as the tests write them, and what tests read back from a pod.

package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// sleeperPod is an API pod bound to the node: one busybox container that sleeps, a grace
// period of 1 s, no service account token.
func sleeperPod(name string, hostNetwork bool) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
		NodeName: node, HostNetwork: hostNetwork, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		// Longer than any soak: `make soak`'s two hours of TestLinkFlapping saw its steady pod's
		// `sleep 3600` end after one, and the restart that rightly followed fail the test.
		Containers: []v1.Container{{Name: "main", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "1000000"}}},
	}}
}

// staticPod is a static manifest of the pod "sensor"; its command prints "reading " and the
// value given to fmt.Sprintf (a version), so a test sees which manifest runs.
const staticPod = `apiVersion: v1
kind: Pod
metadata:
  name: sensor
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: reader
    image: docker.io/holdfast/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "echo reading %s; exec sleep 3600"]
`

// step is a busybox container that runs script with sh -c.
func step(name, script string) v1.Container {
	return v1.Container{Name: name, Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", script}}
}

// counterContainer prints "run N" and three lines; run 1 exits 1, run 2 stays. It counts in
// the pod's emptyDir volume "data", which survives the restart.
func counterContainer() v1.Container {
	return v1.Container{
		Name: "counter", Image: "docker.io/holdfast/busybox:test",
		Command:      []string{"sh", "-c", `n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo "run $n"; echo "line 1"; echo "line 2"; echo "line 3"; if [ $n -ge 2 ]; then exec sleep 3600; fi; exit 1`},
		VolumeMounts: []v1.VolumeMount{{Name: "data", MountPath: "/data"}},
	}
}

// containerIDOf is the ID the status gives the pod's first container.
func containerIDOf(p *v1.Pod) string { return p.Status.ContainerStatuses[0].ContainerID }

// containerIDs is the keys of m, sorted: the container IDs of a map keyed by them.
func containerIDs[T any](m map[string]T) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// hasCondition tells whether the status has the condition t, with status want.
func hasCondition(st v1.PodStatus, t v1.PodConditionType, want v1.ConditionStatus) bool {
	for _, c := range st.Conditions {
		if c.Type == t {
			return c.Status == want
		}
	}
	return false
}

// mustUID is the UID of the API pod name in namespace default.
func mustUID(t *testing.T, e *env, name string) string {
	t.Helper()
	p, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(p.UID)
}

// podStatusSummary is a one-line view of a pod's container states, for failure messages.
func podStatusSummary(ctx context.Context, e *env, name string) string {
	p, err := e.cp.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting %s: %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Running != nil:
			parts = append(parts, cs.Name+" running")
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated %d", cs.Name, cs.State.Terminated.ExitCode))
		}
	}
	return string(p.Status.Phase) + " [" + strings.Join(parts, "; ") + "]"
}
