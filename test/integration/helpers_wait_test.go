// Waiting for what the agent reports, through the apiserver or its local socket, with a
// deadline; and checking that something stays as it is.

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// localPod returns the pod as the agent itself reports it (no apiserver involved).
func (e *env) localPod(name string) (status.PodView, error) {
	pods, err := e.agent.Pods(context.Background())
	if err != nil {
		return status.PodView{}, err
	}
	for _, p := range pods {
		if p.Name == name {
			return p, nil
		}
	}
	return status.PodView{}, fmt.Errorf("agent does not report pod %s", name)
}

// waitAPIRunning waits until the apiserver shows each pod Running with its first container
// running, and returns the pods as last read.
func (e *env) waitAPIRunning(t *testing.T, names ...string) map[string]*v1.Pod {
	t.Helper()
	out := map[string]*v1.Pod{}
	for _, n := range names {
		testenv.Eventually(t, 90*time.Second, n+" Running in the API", func() error {
			p, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
				return fmt.Errorf("phase %s %+v", p.Status.Phase, p.Status.ContainerStatuses)
			}
			out[n] = p
			return nil
		})
	}
	return out
}

// waitLocalRunning waits until the agent itself (its local socket) reports each pod Running.
func (e *env) waitLocalRunning(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		testenv.Eventually(t, 90*time.Second, "agent reports "+n+" Running", func() error {
			p, err := e.localPod(n)
			if err != nil {
				return err
			}
			if p.Status.Phase != v1.PodRunning {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			return nil
		})
	}
}

// waitPodGone waits until the API pod is deleted (the agent confirmed its end).
func (e *env) waitPodGone(t *testing.T, name string) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, name+" deleted", func() error {
		_, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

// waitPodIP waits until the API pod is Running with a pod IP, and returns it.
func (e *env) waitPodIP(t *testing.T, name string) *v1.Pod {
	t.Helper()
	var p *v1.Pod
	testenv.Eventually(t, 90*time.Second, name+" running with an IP", func() error {
		var err error
		if p, err = e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, podIP %q", p.Status.Phase, p.Status.PodIP)
		}
		return nil
	})
	return p
}

// waitNodeReady waits until the Node is Ready, and returns it.
func (e *env) waitNodeReady(t *testing.T) *v1.Node {
	t.Helper()
	var n *v1.Node
	testenv.Eventually(t, 2*time.Minute, "node Ready", func() error {
		var err error
		if n, err = e.cp.Admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{}); err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", n.Status.Conditions)
	})
	return n
}

// waitFailed waits until the pod is Failed in the API with the reason and returns it.
func (e *env) waitFailed(t *testing.T, name, reason string, timeout time.Duration) *v1.Pod {
	t.Helper()
	var p *v1.Pod
	testenv.Eventually(t, timeout, name+" Failed with "+reason, func() error {
		var err error
		if p, err = e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}
		if p.Status.Phase != v1.PodFailed || p.Status.Reason != reason {
			return fmt.Errorf("phase %s, reason %q, message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		return nil
	})
	return p
}

// waitOutput waits until the container's log holds marker and returns it.
func waitOutput(t *testing.T, e *env, pod *v1.Pod, container, marker string) string {
	t.Helper()
	path := filepath.Join(e.agent.Config.PodLogDir, logs.PodDirName(pod.Namespace, pod.Name, string(pod.UID)), container, "0.log")
	var out string
	testenv.Eventually(t, 90*time.Second, "the output of "+pod.Name, func() error {
		var err error
		if out, err = containerOutput(path); err != nil || !strings.Contains(out, marker) {
			return fmt.Errorf("%v (output %q; status: %s)", err, out, podStatusSummary(context.Background(), e, pod.Name))
		}
		return nil
	})
	return out
}

// waitNodeAPIAdvertised waits until the Node advertises the agent's node API port (what the
// apiserver dials, directly or through a tunnel) and returns its InternalIP.
func waitNodeAPIAdvertised(t *testing.T, ctx context.Context, e *env) string {
	t.Helper()
	var nodeIP string
	testenv.Eventually(t, 60*time.Second, "node advertises its API", func() error {
		n, err := e.cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p := n.Status.DaemonEndpoints.KubeletEndpoint.Port; int(p) != e.agent.Config.NodeAPIPort() {
			return fmt.Errorf("kubeletEndpoint port %d, want %d", p, e.agent.Config.NodeAPIPort())
		}
		for _, a := range n.Status.Addresses {
			if a.Type == v1.NodeInternalIP {
				nodeIP = a.Address
				return nil
			}
		}
		return fmt.Errorf("no InternalIP in %v", n.Status.Addresses)
	})
	return nodeIP
}

// volRunning waits until the API pod name runs all its containers.
func volRunning(t *testing.T, e *env, name string) {
	t.Helper()
	ctx := context.Background()
	testenv.Eventually(t, 90*time.Second, name+" running", func() error {
		p, err := e.cp.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning {
			return fmt.Errorf("%s", podStatusSummary(ctx, e, name))
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				return fmt.Errorf("%s", podStatusSummary(ctx, e, name))
			}
		}
		return nil
	})
}

// consistently checks cond every 200ms for d; it fails t at the first violation.
func consistently(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := cond(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// requireUntouched checks a pod runs on, its container never restarted.
func (e *env) requireUntouched(t *testing.T, name string) {
	t.Helper()
	p, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != v1.PodRunning || p.Status.Reason != "" || len(p.Status.ContainerStatuses) != 1 ||
		p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].State.Running == nil {
		t.Errorf("%s was touched: phase %s, reason %q, containers %+v", name, p.Status.Phase, p.Status.Reason, p.Status.ContainerStatuses)
	}
}

// judgeStaticPod writes manifest as the static pod "sensor" and waits until check accepts the
// status the agent gives it, which it reads from the agent's own socket (no apiserver needed).
func (e *env) judgeStaticPod(t *testing.T, manifest, what string, timeout time.Duration, check func(v1.PodStatus) error) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(e.agent.Config.ManifestDir, "sensor.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, timeout, what, func() error {
		p, err := e.localPod("sensor-" + node)
		if err != nil {
			return err
		}
		return check(p.Status)
	})
}
