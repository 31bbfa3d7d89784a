package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Probes end to end: the real holdfast binary, a real apiserver and containerd. Each test
// changes the container's health from the outside, through the container's root filesystem
// as the host sees it (/proc/<pid>/root), and asserts what the pod's status and events say.

// probePod is a one-container pod bound to the test node; mod sets its probes.
func probePod(name, command string, mod func(*v1.Container)) *v1.Pod {
	c := v1.Container{Name: "app", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", command}}
	if mod != nil {
		mod(&c)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PodSpec{
			NodeName: node,
			// busybox as PID 1 ignores SIGTERM: a liveness kill ends with SIGKILL after 1 s.
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers:                    []v1.Container{c},
		},
	}
}

func execAction(cmd ...string) v1.ProbeHandler {
	return v1.ProbeHandler{Exec: &v1.ExecAction{Command: cmd}}
}

type probeEnv struct {
	*env
	t *testing.T
}

func startProbeEnv(t *testing.T) *probeEnv {
	return &probeEnv{env: startEnv(t, true, nil), t: t}
}

func (e *probeEnv) create(pod *v1.Pod) {
	e.t.Helper()
	if _, err := e.cp.Admin.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// status returns the pod and the status of its only container.
func (e *probeEnv) status(name string) (*v1.Pod, v1.ContainerStatus, error) {
	p, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, v1.ContainerStatus{}, err
	}
	if len(p.Status.ContainerStatuses) != 1 {
		return p, v1.ContainerStatus{}, fmt.Errorf("container statuses %+v", p.Status.ContainerStatuses)
	}
	return p, p.Status.ContainerStatuses[0], nil
}

// running waits until the pod's container runs, and returns its status.
func (e *probeEnv) running(name string) v1.ContainerStatus {
	e.t.Helper()
	var cs v1.ContainerStatus
	testenv.Eventually(e.t, 60*time.Second, name+" running", func() error {
		p, s, err := e.status(name)
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning || s.State.Running == nil {
			return fmt.Errorf("phase %s, state %+v", p.Status.Phase, s.State)
		}
		cs = s
		return nil
	})
	return cs
}

// rootfs is the container's root filesystem as the host sees it: writing there is what a
// process inside the container writing its own files would do.
func (e *probeEnv) rootfs(containerID string) string {
	e.t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), e.namespace())
	c, err := e.cd.Client.LoadContainer(ctx, strings.TrimPrefix(containerID, "containerd://"))
	if err != nil {
		e.t.Fatalf("load container %s: %v", containerID, err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		e.t.Fatalf("task of %s: %v", containerID, err)
	}
	return fmt.Sprintf("/proc/%d/root", task.Pid())
}

func (e *probeEnv) write(containerID, path, content string) {
	e.t.Helper()
	if err := os.WriteFile(filepath.Join(e.rootfs(containerID), path), []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *probeEnv) remove(containerID, path string) {
	e.t.Helper()
	if err := os.Remove(filepath.Join(e.rootfs(containerID), path)); err != nil {
		e.t.Fatal(err)
	}
}

// event waits for an event on the pod with that reason and a message containing all of parts.
func (e *probeEnv) event(pod, reason string, parts ...string) v1.Event {
	e.t.Helper()
	var found v1.Event
	testenv.Eventually(e.t, 60*time.Second, fmt.Sprintf("%s event on %s with %q", reason, pod, parts), func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return err
		}
		var seen []string
	next:
		for _, ev := range evs.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Reason != reason {
				continue
			}
			for _, p := range parts {
				if !strings.Contains(ev.Message, p) {
					continue next
				}
			}
			found = ev
			return nil
		}
		return fmt.Errorf("events %q", seen)
	})
	return found
}

func readyCondition(p *v1.Pod, t v1.PodConditionType) v1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// TestReadinessProbeHTTPGet: a readiness httpGet probe on a named port decides Ready: not
// ready while the path answers 404 (with kubelet's event), ready once the file is served,
// unready again when it goes, and never a restart.
func TestReadinessProbeHTTPGet(t *testing.T) {
	e := startProbeEnv(t)
	e.create(probePod("ready-web", "mkdir -p /www && echo home > /www/index.html && exec httpd -f -p 8080 -h /www", func(c *v1.Container) {
		c.Ports = []v1.ContainerPort{{Name: "http", ContainerPort: 8080}}
		c.ReadinessProbe = &v1.Probe{
			ProbeHandler:     v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/ready.html", Port: intstr.FromString("http")}},
			PeriodSeconds:    1,
			FailureThreshold: 1,
		}
	}))
	cs := e.running("ready-web")
	e.event("ready-web", "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 404")

	ready := func(want bool) func() error {
		return func() error {
			p, s, err := e.status("ready-web")
			if err != nil {
				return err
			}
			cond := v1.ConditionFalse
			if want {
				cond = v1.ConditionTrue
			}
			if s.Ready != want || readyCondition(p, v1.PodReady) != cond || readyCondition(p, v1.ContainersReady) != cond {
				return fmt.Errorf("container ready %v, conditions %+v", s.Ready, p.Status.Conditions)
			}
			if s.State.Running == nil || s.RestartCount != 0 || s.ContainerID != cs.ContainerID {
				return fmt.Errorf("the container restarted or stopped: %+v", s)
			}
			return nil
		}
	}
	consistently(t, 3*time.Second, "not ready while /ready.html is missing", ready(false))

	e.write(cs.ContainerID, "www/ready.html", "ok\n")
	testenv.Eventually(t, 30*time.Second, "ready once /ready.html is served", ready(true))

	e.remove(cs.ContainerID, "www/ready.html")
	testenv.Eventually(t, 30*time.Second, "unready once /ready.html is gone", ready(false))
}

// TestLivenessProbeExecRestartsOncePerFailureStreak: an exec liveness probe that fails
// failureThreshold times makes the agent kill the container, which restarts: restartCount
// goes from 0 to 1, with the probe's output in an event, and stays 1 while the new instance
// passes.
func TestLivenessProbeExecRestartsOncePerFailureStreak(t *testing.T) {
	e := startProbeEnv(t)
	e.create(probePod("live", "touch /tmp/healthy; exec sleep 3600", func(c *v1.Container) {
		c.LivenessProbe = &v1.Probe{ProbeHandler: execAction("cat", "/tmp/healthy"), PeriodSeconds: 1, FailureThreshold: 3}
	}))
	first := e.running("live")
	consistently(t, 4*time.Second, "healthy: no restart", func() error {
		_, s, err := e.status("live")
		if err != nil {
			return err
		}
		if s.RestartCount != 0 || s.ContainerID != first.ContainerID {
			return fmt.Errorf("restarted while its liveness probe passes: %+v", s)
		}
		return nil
	})

	e.remove(first.ContainerID, "tmp/healthy")
	var second v1.ContainerStatus
	testenv.Eventually(t, 60*time.Second, "restarted once after the failure streak", func() error {
		_, s, err := e.status("live")
		if err != nil {
			return err
		}
		if s.RestartCount != 1 || s.State.Running == nil {
			return fmt.Errorf("restartCount %d, state %+v", s.RestartCount, s.State)
		}
		second = s
		return nil
	})
	if second.ContainerID == first.ContainerID {
		t.Fatalf("same container ID %s after the restart", first.ContainerID)
	}
	if term := second.LastTerminationState.Terminated; term == nil || term.ContainerID != first.ContainerID || term.ExitCode == 0 {
		t.Errorf("lastState %+v, want the killed first instance", second.LastTerminationState)
	}
	e.event("live", "Unhealthy", "Liveness probe failed:", "/tmp/healthy")
	e.event("live", "Killing", "failed liveness probe")

	// The new instance created /tmp/healthy again: its probe passes, nothing more happens
	// (several times failureThreshold x periodSeconds).
	consistently(t, 10*time.Second, "one restart per failure streak", func() error {
		_, s, err := e.status("live")
		if err != nil {
			return err
		}
		if s.RestartCount != 1 || s.ContainerID != second.ContainerID || s.State.Running == nil {
			return fmt.Errorf("restartCount %d, container %s (want 1, %s), state %+v", s.RestartCount, s.ContainerID, second.ContainerID, s.State)
		}
		return nil
	})
}

// TestStartupProbeGatesLivenessAndReadiness: until the startup probe passes, the container
// is neither started nor ready, and its liveness probe (which would fail at once) does not
// run; once it passes, readiness runs and the pod becomes ready, without a restart.
func TestStartupProbeGatesLivenessAndReadiness(t *testing.T) {
	e := startProbeEnv(t)
	e.create(probePod("slow-start", "exec sleep 3600", func(c *v1.Container) {
		c.StartupProbe = &v1.Probe{ProbeHandler: execAction("cat", "/tmp/started"), PeriodSeconds: 1, FailureThreshold: 120}
		c.LivenessProbe = &v1.Probe{ProbeHandler: execAction("cat", "/tmp/started"), PeriodSeconds: 1, FailureThreshold: 1}
		c.ReadinessProbe = &v1.Probe{ProbeHandler: execAction("true"), PeriodSeconds: 1}
	}))
	cs := e.running("slow-start")
	e.event("slow-start", "Unhealthy", "Startup probe failed:", "/tmp/started")
	consistently(t, 5*time.Second, "gated while the startup probe fails", func() error {
		_, s, err := e.status("slow-start")
		if err != nil {
			return err
		}
		if s.Started == nil || *s.Started || s.Ready {
			return fmt.Errorf("started %v ready %v before the startup probe passed", s.Started, s.Ready)
		}
		if s.RestartCount != 0 || s.State.Running == nil {
			return fmt.Errorf("restarted (liveness ran before startup passed?): %+v", s)
		}
		return nil
	})

	e.write(cs.ContainerID, "tmp/started", "")
	testenv.Eventually(t, 30*time.Second, "started and ready once the startup probe passes", func() error {
		p, s, err := e.status("slow-start")
		if err != nil {
			return err
		}
		if s.Started == nil || !*s.Started || !s.Ready || readyCondition(p, v1.PodReady) != v1.ConditionTrue {
			return fmt.Errorf("started %v ready %v conditions %+v", s.Started, s.Ready, p.Status.Conditions)
		}
		if s.RestartCount != 0 || s.ContainerID != cs.ContainerID {
			return fmt.Errorf("restarted: %+v", s)
		}
		return nil
	})
}

// TestReadinessProbeTCPSocket: a tcpSocket readiness probe fails with the dial's error while
// nothing listens, and passes once the server starts.
func TestReadinessProbeTCPSocket(t *testing.T) {
	e := startProbeEnv(t)
	e.create(probePod("tcp", "until [ -f /tmp/go ]; do sleep 0.2; done; exec httpd -f -p 9000 -h /", func(c *v1.Container) {
		c.ReadinessProbe = &v1.Probe{
			ProbeHandler:     v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(9000)}},
			PeriodSeconds:    1,
			FailureThreshold: 1,
		}
	}))
	cs := e.running("tcp")
	p, _, err := e.status("tcp")
	if err != nil {
		t.Fatal(err)
	}
	e.event("tcp", "Unhealthy", "Readiness probe failed:", p.Status.PodIP+":9000", "connection refused")
	if _, s, err := e.status("tcp"); err != nil || s.Ready {
		t.Fatalf("ready %v (%v) while nothing listens", s.Ready, err)
	}

	e.write(cs.ContainerID, "tmp/go", "")
	testenv.Eventually(t, 30*time.Second, "ready once the port is open", func() error {
		p, s, err := e.status("tcp")
		if err != nil {
			return err
		}
		if !s.Ready || readyCondition(p, v1.PodReady) != v1.ConditionTrue {
			return fmt.Errorf("ready %v conditions %+v", s.Ready, p.Status.Conditions)
		}
		return nil
	})
}

// TestReadinessKeptAcrossAgentRestart: killing the agent (kill -9) and starting it again does
// not flap a ready pod to unready while its readiness probe runs again: the instance the
// pod's status reports ready stays ready until its probe says otherwise.
func TestReadinessKeptAcrossAgentRestart(t *testing.T) {
	e := startProbeEnv(t)
	e.create(probePod("steady", "touch /tmp/ready; exec sleep 3600", func(c *v1.Container) {
		// A probe that takes a while: an agent that forgot the readiness would report the
		// pod unready for that long after its restart.
		c.ReadinessProbe = &v1.Probe{ProbeHandler: execAction("sh", "-c", "sleep 1; cat /tmp/ready"), PeriodSeconds: 2, TimeoutSeconds: 5}
	}))
	var before v1.ContainerStatus
	testenv.Eventually(t, 60*time.Second, "ready", func() error {
		_, s, err := e.status("steady")
		if err != nil {
			return err
		}
		if !s.Ready {
			return fmt.Errorf("not ready: %+v", s)
		}
		before = s
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := e.cp.Admin.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=steady"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	e.agent.Kill()
	e.agent.Start()
	restarted := time.Now()
	// Watch every status the new agent writes for 10 s (probe attempts and resyncs).
	deadline := time.After(10 * time.Second)
	writes := 0
	for done := false; !done; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch closed")
			}
			p, isPod := ev.Object.(*v1.Pod)
			if !isPod {
				continue
			}
			writes++
			for _, s := range p.Status.ContainerStatuses {
				if !s.Ready || readyCondition(p, v1.PodReady) != v1.ConditionTrue {
					t.Fatalf("%s after the agent restart the pod went unready: %+v", time.Since(restarted).Round(time.Millisecond), p.Status)
				}
			}
		case <-deadline:
			done = true
		}
	}
	_, after, err := e.status("steady")
	if err != nil {
		t.Fatal(err)
	}
	if after.ContainerID != before.ContainerID || after.RestartCount != before.RestartCount || !after.Ready {
		t.Errorf("after the restart %+v, before %+v", after, before)
	}
	t.Logf("%d status writes watched after the restart, all ready", writes)
}

// TestTerminatingPodGoesUnreadyWhileItDrains: a deleted pod whose readiness probe fails once
// it is asked to stop goes unready while its container still runs (its SIGTERM handler drains
// for 15 s), as the kubelet reports it: its readiness probe goes on during the termination,
// its liveness probe does not, and a liveness probe failing then kills nothing (the upstream
// "should mark readiness on pods to false and disable liveness probes while pod is in
// progress of terminating"). Before, the agent stopped every probe at the deletion and the
// pod stayed Ready until its container was gone.
func TestTerminatingPodGoesUnreadyWhileItDrains(t *testing.T) {
	e := startProbeEnv(t)
	drain := `trap 'rm -f /tmp/ready /tmp/healthy; sleep 15; exit 0' TERM; touch /tmp/ready /tmp/healthy; while true; do sleep 1; done`
	pod := probePod("draining", drain, func(c *v1.Container) {
		c.ReadinessProbe = &v1.Probe{ProbeHandler: execAction("cat", "/tmp/ready"), PeriodSeconds: 1, FailureThreshold: 1}
		c.LivenessProbe = &v1.Probe{ProbeHandler: execAction("cat", "/tmp/healthy"), PeriodSeconds: 1, FailureThreshold: 1}
	})
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30)
	// As users write it: the service-account token the API mounts by default, whose volume is
	// torn down only once the drain is over.
	pod.Spec.AutomountServiceAccountToken = nil
	publishRootCA(t, e.env, "default")
	e.create(pod)
	cs := e.running("draining")
	testenv.Eventually(t, 30*time.Second, "ready", func() error {
		p, s, err := e.status("draining")
		if err != nil {
			return err
		}
		if !s.Ready || readyCondition(p, v1.PodReady) != v1.ConditionTrue {
			return fmt.Errorf("container ready %v, conditions %+v", s.Ready, p.Status.Conditions)
		}
		return nil
	})

	if err := e.cp.Admin.CoreV1().Pods("default").Delete(context.Background(), "draining", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Within the 15 s its handler drains: unready, the same container still running.
	testenv.Eventually(t, 10*time.Second, "unready while it drains", func() error {
		p, s, err := e.status("draining")
		if err != nil {
			return err
		}
		if s.Ready || readyCondition(p, v1.PodReady) != v1.ConditionFalse {
			return fmt.Errorf("container ready %v, conditions %+v", s.Ready, p.Status.Conditions)
		}
		if s.State.Running == nil || s.ContainerID != cs.ContainerID {
			return fmt.Errorf("not the draining container any more: %+v", s)
		}
		return nil
	})
	testenv.Eventually(t, 60*time.Second, "the pod gone", func() error {
		_, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), "draining", metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	evs, err := e.cp.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=draining"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if strings.Contains(ev.Message, "failed liveness probe") || strings.HasPrefix(ev.Message, "Liveness probe") {
			t.Errorf("liveness probed while the pod terminated: %s: %s", ev.Reason, ev.Message)
		}
	}
}
