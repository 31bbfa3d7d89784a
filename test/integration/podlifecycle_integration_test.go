package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// finishedPod is a pod of a Job: restartPolicy Never, its own network, the default service
// account token mounted (as the API defaults it), containers that run scripts and exit.
func finishedPod(name string, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
		NodeName: node, RestartPolicy: v1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers: containers,
	}}
}

// TestFinishedPodsReleaseResources: pods that ran to completion (Succeeded and Failed) keep
// their status (phase, exit codes, termination messages: from terminationMessagePath, a custom
// path, and the log tail with FallbackToLogsOnError), but lose what only running pods need,
// as with kubelet: their network namespace and IP (host-local's reservation), their volumes
// (the service account token's tmpfs), and their place in node admission: on a node of two
// pods, a third starts once the first two finished.
func TestFinishedPodsReleaseResources(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.MaxPods = 2
	})
	publishRootCA(t, e, "default")
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")

	custom := step("custom", "echo -n 'custom path' > /tmp/message; exit 0")
	custom.TerminationMessagePath = "/tmp/message"
	done := finishedPod("done", step("writer", "echo -n 'bye from file' > /dev/termination-log; exit 0"), custom)
	fromLogs := step("logs", "echo first words; echo last words; exit 3")
	fromLogs.TerminationMessagePolicy = v1.TerminationMessageFallbackToLogsOnError
	fileWins := step("filewins", "echo in the log; echo -n 'from the file' > /dev/termination-log; exit 4")
	fileWins.TerminationMessagePolicy = v1.TerminationMessageFallbackToLogsOnError
	// The upstream conformance test's container: its last output has no newline, so the
	// logger holds it until the stream ends, which is when the task is deleted. Started
	// first, it has exited by the time the agent lists the pod again after starting the
	// rest: a message read then, before the exit was recorded, was empty for good.
	partial := step("partial", "echo -n DONE; /bin/false")
	partial.TerminationMessagePolicy = v1.TerminationMessageFallbackToLogsOnError
	failed := finishedPod("failed", partial, fromLogs, fileWins)
	for _, p := range []*v1.Pod{done, failed} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]struct {
		phase v1.PodPhase
		exit  map[string]int32
		msg   map[string]string
	}{
		"done":   {v1.PodSucceeded, map[string]int32{"writer": 0, "custom": 0}, map[string]string{"writer": "bye from file", "custom": "custom path"}},
		"failed": {v1.PodFailed, map[string]int32{"partial": 1, "logs": 3, "filewins": 4}, map[string]string{"partial": "DONE", "logs": "first words\nlast words\n", "filewins": "from the file"}},
	}
	finished := map[string]*v1.Pod{}
	for name, w := range want {
		testenv.Eventually(t, 90*time.Second, name+" finished with its exit codes and messages", func() error {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != w.phase {
				return fmt.Errorf("phase %s, want %s", p.Status.Phase, w.phase)
			}
			for _, cs := range p.Status.ContainerStatuses {
				term := cs.State.Terminated
				if term == nil || term.ExitCode != w.exit[cs.Name] || term.Message != w.msg[cs.Name] {
					return fmt.Errorf("%s: %+v, want exit %d message %q", cs.Name, cs.State, w.exit[cs.Name], w.msg[cs.Name])
				}
			}
			if p.Status.PodIP == "" {
				return fmt.Errorf("no podIP reported")
			}
			finished[name] = p
			return nil
		})
	}

	ipamDir := filepath.Join(e.cni.ConfDir, "ipam", e.cni.Name)
	stateDir := e.agent.Config.StateDir
	for name, p := range finished {
		testenv.Eventually(t, 60*time.Second, name+": network namespace, IP and volumes released", func() error {
			netns := filepath.Join(e.agent.Config.CNI.NetNSDir, "holdfast-"+string(p.UID))
			if _, err := os.Stat(netns); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("network namespace %s still there (%v)", netns, err)
			}
			if _, err := os.Stat(filepath.Join(ipamDir, p.Status.PodIP)); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("host-local still reserves %s (%v)", p.Status.PodIP, err)
			}
			vols := filepath.Join(stateDir, "pods", string(p.UID), "volumes")
			if _, err := os.Stat(vols); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("volumes %s still there: %v", vols, mountsUnder(t, vols))
			}
			return nil
		})
	}
	// Its status is still reported, unchanged, after the release.
	if p, err := pods.Get(ctx, "failed", metav1.GetOptions{}); err != nil || p.Status.Phase != v1.PodFailed || p.Status.PodIP != finished["failed"].Status.PodIP {
		t.Fatalf("status after the release: %+v (%v)", p.Status, err)
	}

	// The agent is killed and its finished pods' containers removed meanwhile (its own GC of
	// dead containers, an operator's crictl rm, a runtime cleared by a reboot): restarted,
	// it runs neither pod again. What it recorded of them decides, not what the runtime has
	// left.
	e.agent.Kill()
	removed := 0
	for id, c := range e.containers(t) {
		if c.PodUID == string(finished["done"].UID) || c.PodUID == string(finished["failed"].UID) {
			e.removeContainer(t, id)
			removed++
		}
	}
	if removed != 5 {
		t.Fatalf("%d containers of the finished pods in the runtime, want their 5", removed)
	}
	e.agent.Start()
	consistently(t, 15*time.Second, "the finished pods not run again after the restart", func() error {
		for name, w := range want {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != w.phase {
				return fmt.Errorf("%s: phase %s, want %s", name, p.Status.Phase, w.phase)
			}
			for _, cs := range p.Status.ContainerStatuses {
				if term := cs.State.Terminated; term == nil || term.ExitCode != w.exit[cs.Name] || cs.RestartCount != 0 {
					return fmt.Errorf("%s: container %s %+v, restarts %d", name, cs.Name, cs.State, cs.RestartCount)
				}
			}
			for id, c := range e.containers(t) {
				if c.PodUID == string(p.UID) {
					return fmt.Errorf("%s: container %s (%s) made again", name, id, c.Name)
				}
			}
		}
		return nil
	})

	// Two pods finished on a node of two: a third one is admitted and runs.
	third := sleeperPod("third", false)
	if _, err := pods.Create(ctx, third, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "third")
}

// TestActiveDeadlineSeconds: a pod running past its activeDeadlineSeconds is stopped and ends
// Failed with kubelet's reason and message; its containers are killed and not restarted.
func TestActiveDeadlineSeconds(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	pod := sleeperPod("deadline", true)
	pod.Spec.ActiveDeadlineSeconds = ptr.To[int64](5)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "deadline")
	var p *v1.Pod
	testenv.Eventually(t, 90*time.Second, "pod Failed with DeadlineExceeded", func() (err error) {
		if p, err = pods.Get(ctx, "deadline", metav1.GetOptions{}); err != nil {
			return err
		}
		if p.Status.Phase != v1.PodFailed || p.Status.Reason != "DeadlineExceeded" ||
			p.Status.Message != "Pod was active on the node longer than the specified deadline" {
			return fmt.Errorf("phase %s reason %q message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		if cs := p.Status.ContainerStatuses[0]; cs.State.Terminated == nil {
			return fmt.Errorf("container not terminated: %+v", cs.State)
		}
		return nil
	})
	if hasCondition(p.Status, v1.PodReady, v1.ConditionTrue) {
		t.Errorf("a failed pod is Ready: %+v", p.Status.Conditions)
	}
	id := strings.TrimPrefix(containerIDOf(p), "containerd://")
	consistently(t, 5*time.Second, "the killed container is not restarted", func() error {
		p, err := pods.Get(ctx, "deadline", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 0 || cs.State.Terminated == nil || p.Status.Phase != v1.PodFailed {
			return fmt.Errorf("restarted: %+v phase %s", cs, p.Status.Phase)
		}
		if e.taskRunning(t, id) {
			return fmt.Errorf("container %s still running", id)
		}
		return nil
	})
}

// TestContainerRestartRules: a container's own restartPolicy and restartPolicyRules override
// the pod's (ContainerRestartRules): a container of a Never pod whose exit code matches a
// Restart rule is restarted and the pod stays Running; a container with restartPolicy Never
// in an Always pod is not, and the pod ends Failed.
func TestContainerRestartRules(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	never := v1.ContainerRestartPolicyNever
	rule := sleeperPod("rule", true)
	rule.Spec.RestartPolicy = v1.RestartPolicyNever
	rule.Spec.Containers[0].Command = []string{"sh", "-c", "exit 42"}
	rule.Spec.Containers[0].RestartPolicy = &never
	rule.Spec.Containers[0].RestartPolicyRules = []v1.ContainerRestartRule{{Action: v1.ContainerRestartRuleActionRestart,
		ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}}}
	once := sleeperPod("once", true)
	once.Spec.RestartPolicy = v1.RestartPolicyAlways
	once.Spec.Containers[0].Command = []string{"sh", "-c", "exit 1"}
	once.Spec.Containers[0].RestartPolicy = &never
	for _, p := range []*v1.Pod{rule, once} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "rule: restarted by its rule, the pod Running", func() error {
		p, err := pods.Get(ctx, "rule", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount < 2 || p.Status.Phase != v1.PodRunning {
			return fmt.Errorf("phase %s statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		return nil
	})
	p := e.waitFailed(t, "once", "", 60*time.Second)
	if cs := p.Status.ContainerStatuses[0]; cs.RestartCount != 0 || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 1 {
		t.Errorf("once: a container with restartPolicy Never was restarted or is not terminated: %+v", cs)
	}
}

// TestReadinessGates: a pod with a readiness gate is Ready only once the gate's condition,
// set by another writer through the status subresource, is True; the agent's own status
// writes keep that condition, and follow the pod's generation; set Failed by another writer, the
// pod is stopped and stays Failed.
func TestReadinessGates(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	const gate = "example.com/load-balancer"
	pod := sleeperPod("gated", true)
	pod.Spec.ReadinessGates = []v1.PodReadinessGate{{ConditionType: gate}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "gated")
	readyCond := func(p *v1.Pod) v1.PodCondition {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReady {
				return c
			}
		}
		return v1.PodCondition{}
	}
	testenv.Eventually(t, 30*time.Second, "containers ready, pod not Ready for its gate", func() error {
		p, err := pods.Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		c := readyCond(p)
		if !hasCondition(p.Status, v1.ContainersReady, v1.ConditionTrue) || c.Status != v1.ConditionFalse || c.Reason != "ReadinessGatesNotReady" ||
			c.Message != `corresponding condition of pod readiness gate "example.com/load-balancer" does not exist.` {
			return fmt.Errorf("conditions %+v", p.Status.Conditions)
		}
		return nil
	})

	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","lastTransitionTime":%q}]}}`, gate, time.Now().UTC().Format(time.RFC3339))
	if _, err := pods.Patch(ctx, "gated", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "pod Ready once its gate is True", func() error {
		p, err := pods.Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !hasCondition(p.Status, v1.PodReady, v1.ConditionTrue) || !hasCondition(p.Status, gate, v1.ConditionTrue) {
			return fmt.Errorf("conditions %+v", p.Status.Conditions)
		}
		return nil
	})
	consistently(t, 12*time.Second, "the gate's condition kept through the agent's status writes", func() error {
		p, err := pods.Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !hasCondition(p.Status, gate, v1.ConditionTrue) || !hasCondition(p.Status, v1.PodReady, v1.ConditionTrue) {
			return fmt.Errorf("conditions %+v", p.Status.Conditions)
		}
		return nil
	})

	// A spec update the pod keeps running through (a new toleration) bumps the generation: the
	// status and the agent's conditions say they describe it, as kubelet's do since 1.35.
	p, err := pods.Get(ctx, "gated", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.Tolerations = append(p.Spec.Tolerations, v1.Toleration{Key: "example.com/maintenance", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoSchedule})
	if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	gen := p.Generation
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("status observes generation %d", gen), func() error {
		p, err := pods.Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.ObservedGeneration != gen {
			return fmt.Errorf("observedGeneration %d", p.Status.ObservedGeneration)
		}
		for _, c := range p.Status.Conditions {
			if c.Type != gate && c.ObservedGeneration != gen {
				return fmt.Errorf("condition %s observedGeneration %d", c.Type, c.ObservedGeneration)
			}
		}
		return nil
	})

	// Another writer sets the running pod's phase terminal through the status subresource (a
	// controller that gave up on it, an operator): as the kubelet, the agent stops the pod and
	// keeps that phase; it does not report Running over it, nor restart the container.
	if p, err = pods.Get(ctx, "gated", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimPrefix(containerIDOf(p), "containerd://")
	p.Status.Phase, p.Status.Reason, p.Status.Message = v1.PodFailed, "Superseded", "set terminal by another writer"
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the pod set Failed by another writer stopped", func() error {
		p, err := pods.Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodFailed || p.Status.Reason != "Superseded" {
			return fmt.Errorf("phase %s reason %q", p.Status.Phase, p.Status.Reason)
		}
		if cs := p.Status.ContainerStatuses[0]; cs.State.Terminated == nil || cs.RestartCount != 0 {
			return fmt.Errorf("container %+v", cs)
		}
		if e.taskRunning(t, id) {
			return fmt.Errorf("container %s still running", id)
		}
		return nil
	})
	consistently(t, 5*time.Second, "the stopped pod stays Failed", func() error {
		p, err := pods.Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cs := p.Status.ContainerStatuses[0]; p.Status.Phase != v1.PodFailed || cs.State.Terminated == nil || cs.RestartCount != 0 {
			return fmt.Errorf("phase %s container %+v", p.Status.Phase, cs)
		}
		return nil
	})
}

// TestDeletionCancelsBlockedSync: a pod whose postStart hook sleeps for an hour (the sync that
// started its container is blocked in it) is deleted with a 2s grace period: the sync in
// progress is cancelled, and the pod is gone after its grace period, not after the hook.
func TestDeletionCancelsBlockedSync(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	pod := sleeperPod("stuck", true)
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3600) // the API bounds a sleep hook by it
	pod.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PostStart: &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 3600}}}
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the container started (its postStart hook sleeping)", func() error {
		id, ok := e.containerOf(t, created.UID, "main")
		if !ok || !e.taskRunning(t, id) {
			return fmt.Errorf("container main of the pod not running (ID %q)", id)
		}
		return nil
	})
	if err := pods.Delete(ctx, "stuck", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](2)}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	// Far within the hook's hour, which an uncancelled sync would wait out.
	testenv.Eventually(t, 45*time.Second, "the pod gone", func() error {
		if _, err := pods.Get(ctx, "stuck", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still in the API (err %v)", err)
		}
		for cid, c := range e.containers(t) {
			if c.PodUID == string(created.UID) {
				return fmt.Errorf("container %s still in containerd", cid)
			}
		}
		return nil
	})
	t.Logf("pod gone %s after its deletion (grace period 2s)", time.Since(deleted).Round(time.Millisecond))
}

// TestStaticPodBackWhileTerminating: a static pod's manifest is removed, and put back (same
// content, so the same UID) while its pod still terminates (its container ignores SIGTERM):
// once the old instance has terminated, the pod runs again, as with kubelet.
func TestStaticPodBackWhileTerminating(t *testing.T) {
	e := startEnv(t, false, nil)
	dir := e.agent.Config.ManifestDir
	manifest := `apiVersion: v1
kind: Pod
metadata:
  name: stubborn
spec:
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: ` + testenv.BusyboxImage + `
    imagePullPolicy: Never
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]
`
	path := filepath.Join(dir, "stubborn.yaml")
	write := func() {
		t.Helper()
		tmp := filepath.Join(dir, ".stubborn.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	running := func(after time.Time) (string, error) {
		p, err := e.localPod("stubborn-" + node)
		if err != nil {
			return "", err
		}
		if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil {
			return "", fmt.Errorf("phase %s %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		cs := p.Status.ContainerStatuses[0]
		if started := cs.State.Running.StartedAt.Time; started.Before(after.Truncate(time.Second)) {
			return "", fmt.Errorf("still the container started at %s", started)
		}
		return strings.TrimPrefix(cs.ContainerID, "containerd://"), nil
	}
	write()
	var id string
	testenv.Eventually(t, 90*time.Second, "static pod running", func() (err error) { id, err = running(time.Time{}); return err })

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the agent stopping the pod", func() error {
		if !strings.Contains(e.agent.Log(), "static manifest removed; stopping its pod") {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if !e.taskRunning(t, id) {
		t.Fatal("the container stopped before its grace period: the test cannot put the manifest back during the termination")
	}
	back := time.Now()
	write()
	testenv.Eventually(t, 90*time.Second, "the pod running again after its old instance terminated", func() error {
		_, err := running(back)
		return err
	})
}

// TestEditedStaticPodWaitsForItsPreviousVersion: a static pod's manifest is edited (a new
// UID) while its container ignores SIGTERM: the new version starts only once the old one has
// stopped, as with the kubelet. Before, both ran for the old one's grace period, sharing the
// host's ports and hostPath data.
func TestEditedStaticPodWaitsForItsPreviousVersion(t *testing.T) {
	e := startEnv(t, false, nil)
	dir := e.agent.Config.ManifestDir
	manifest := func(version string) string {
		return `apiVersion: v1
kind: Pod
metadata:
  name: edited
spec:
  terminationGracePeriodSeconds: 6
  containers:
  - name: main
    image: ` + testenv.BusyboxImage + `
    imagePullPolicy: Never
    env:
    - name: VERSION
      value: "` + version + `"
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]
`
	}
	path := filepath.Join(dir, "edited.yaml")
	write := func(version string) {
		t.Helper()
		tmp := filepath.Join(dir, ".edited.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(manifest(version)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	var oldUID types.UID
	var oldID string
	testenv.Eventually(t, 90*time.Second, "the first version running", func() error {
		p, err := e.localPod("edited-" + node)
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		oldUID = p.UID
		oldID = strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
		return nil
	})
	oldRuntimeID, _ := e.containerOf(t, oldUID, "main")

	write("2")
	var newUID types.UID
	overlapped := false
	testenv.Eventually(t, 90*time.Second, "the second version running, after the first stopped", func() error {
		oldRuns := e.taskRunning(t, oldID)
		for _, c := range e.containers(t) {
			if c.Name == "main" && c.PodUID != string(oldUID) && c.ID != oldRuntimeID {
				newUID = types.UID(c.PodUID)
				if oldRuns {
					overlapped = true
				}
			}
		}
		if newUID == "" {
			return fmt.Errorf("no container of the second version yet (the first runs: %v)", oldRuns)
		}
		if oldRuns {
			return fmt.Errorf("the first version still runs")
		}
		p, err := e.localPod("edited-" + node)
		if err != nil {
			return err
		}
		if p.UID != newUID || p.Status.Phase != v1.PodRunning {
			return fmt.Errorf("pod %s is %s", p.UID, p.Status.Phase)
		}
		return nil
	})
	if overlapped {
		t.Error("the second version's container was made while the first still ran")
	}
	if !strings.Contains(e.agent.Log(), "static pod waits for its previous version to stop") {
		t.Error("the wait is not in the agent's log")
	}
}
