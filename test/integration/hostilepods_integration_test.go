package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestHostilePodsFromAPI: pods the API accepts but nobody would write by hand reach holdfast
// too, and each runs (or fails alone, clearly) without disturbing the others:
//   - a name at the API's limit (253 characters), with labels and annotations at theirs: the
//     log directory NAMESPACE_NAME_UID is then longer than a file name may be (255 bytes);
//   - env names that collide: a later entry wins over an earlier one, an explicit env over
//     envFrom, as in the kubelet;
//   - a liveness probe whose command prints megabytes: the output kept in the event is capped.
func TestHostilePodsFromAPI(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	cms := e.cp.Admin.CoreV1().ConfigMaps("default")

	// 253 characters: DNS labels of 63 joined by dots, as the API allows.
	label := strings.Repeat("l", 62) + "x"
	longName := strings.Join([]string{label, label, label, strings.Repeat("n", 61)}, ".")
	if len(longName) != 253 {
		t.Fatalf("name of %d characters", len(longName))
	}
	long := sleeperPod(longName, false)
	long.Labels = map[string]string{"app": strings.Repeat("v", 63)}
	// Annotations up to the API's 256 KiB total.
	long.Annotations = map[string]string{"example.com/blob": strings.Repeat("a", 255<<10)}
	long.Spec.Containers[0].Command = []string{"sh", "-c", "echo started; exec sleep 3600"}

	if _, err := cms.Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "colliding"},
		Data: map[string]string{"MODE": "from-configmap", "ONLY_CM": "cm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	collide := sleeperPod("collide", false)
	collide.Spec.Containers[0].Command = []string{"sh", "-c", `echo "MODE=$MODE DUP=$DUP ONLY_CM=$ONLY_CM"; exec sleep 3600`}
	collide.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "colliding"}}}}
	collide.Spec.Containers[0].Env = []v1.EnvVar{{Name: "DUP", Value: "first"}, {Name: "MODE", Value: "explicit"}, {Name: "DUP", Value: "second"}}

	noisy := sleeperPod("noisy", false)
	noisy.Spec.Containers[0].LivenessProbe = &v1.Probe{
		ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"sh", "-c",
			"head -c 4000000 /dev/zero | tr '\\0' 'x'; exit 1"}}},
		PeriodSeconds: 2, FailureThreshold: 1000, TimeoutSeconds: 10,
	}

	for _, p := range []*v1.Pod{long, collide, noisy} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %.40s...: %v", p.Name, err)
		}
	}
	running := e.waitAPIRunning(t, longName, "collide", "noisy")

	// The long-named pod's output is where kubectl logs reads it, through the node API.
	testenv.Eventually(t, 30*time.Second, "the long-named pod's log", func() error {
		out, err := e.localLogs(ctx, running[longName], "main")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "started") {
			return fmt.Errorf("log %q", out)
		}
		return nil
	})

	testenv.Eventually(t, 30*time.Second, "collide's environment", func() error {
		out, err := e.localLogs(ctx, running["collide"], "main")
		if err != nil {
			return err
		}
		if want := "MODE=explicit DUP=second ONLY_CM=cm"; !strings.Contains(out, want) {
			return fmt.Errorf("log %q, want %q", out, want)
		}
		return nil
	})

	var unhealthy *v1.Event
	testenv.Eventually(t, 60*time.Second, "noisy's Unhealthy event", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=noisy,reason=Unhealthy"})
		if err != nil {
			return err
		}
		if len(evs.Items) == 0 {
			return fmt.Errorf("no Unhealthy event yet")
		}
		unhealthy = &evs.Items[0]
		return nil
	})
	if n := len(unhealthy.Message); n > 12<<10 {
		t.Errorf("the Unhealthy event carries %d bytes of probe output; want it capped (about 10 KiB)", n)
	}
	if !strings.HasPrefix(unhealthy.Message, "Liveness probe failed: xxxx") {
		t.Errorf("Unhealthy message %.80q...", unhealthy.Message)
	}

	// All three still run, none restarted by the others' doings.
	for _, name := range []string{longName, "collide"} {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cs := p.Status.ContainerStatuses; p.Status.Phase != v1.PodRunning || len(cs) != 1 || cs[0].RestartCount != 0 {
			t.Errorf("%.40s: phase %s, containers %+v", name, p.Status.Phase, cs)
		}
	}
}
