package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestCrictl: on the CRI backend, an operator's crictl (built from sigs.k8s.io/cri-tools) sees
// holdfast's pod and its container with the kubelet's labels, reads its logs and runs a command
// in it, with no apiserver at all.
func TestCrictl(t *testing.T) {
	e := startEnvOn(t, config.RuntimeCRI, false, nil)
	if err := os.WriteFile(filepath.Join(e.agent.Config.ManifestDir, "sensor.yaml"), []byte(fmt.Sprintf(staticPod, "crictl")), 0o644); err != nil {
		t.Fatal(err)
	}
	e.waitLocalRunning(t, "sensor-"+node)
	pod, err := e.localPod("sensor-" + node)
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + e.cd.Address
	crictl := func(args ...string) string { return testenv.Crictl(t, endpoint, args...) }

	var sandboxes struct {
		Items []struct {
			ID       string `json:"id"`
			State    string `json:"state"`
			Metadata struct{ Name, Namespace, UID string }
			Labels   map[string]string
		}
	}
	if err := json.Unmarshal([]byte(crictl("pods", "--name", pod.Name, "-o", "json")), &sandboxes); err != nil {
		t.Fatal(err)
	}
	if len(sandboxes.Items) != 1 {
		t.Fatalf("crictl pods --name %s: %+v", pod.Name, sandboxes.Items)
	}
	sb := sandboxes.Items[0]
	if sb.State != "SANDBOX_READY" || sb.Metadata.Name != pod.Name || sb.Metadata.Namespace != pod.Namespace || sb.Metadata.UID != string(pod.UID) ||
		sb.Labels["io.kubernetes.pod.name"] != pod.Name || sb.Labels["io.kubernetes.pod.namespace"] != pod.Namespace ||
		sb.Labels["io.kubernetes.pod.uid"] != string(pod.UID) {
		t.Errorf("crictl pods: %+v, want pod %s/%s (%s)", sb, pod.Namespace, pod.Name, pod.UID)
	}
	var inspect struct {
		Status struct {
			Network struct{ IP string }
		}
	}
	if err := json.Unmarshal([]byte(crictl("inspectp", sb.ID)), &inspect); err != nil {
		t.Fatal(err)
	}
	if inspect.Status.Network.IP == "" || inspect.Status.Network.IP != pod.Status.PodIP {
		t.Errorf("crictl inspectp: IP %q, the pod's status says %q", inspect.Status.Network.IP, pod.Status.PodIP)
	}

	var containers struct {
		Containers []struct {
			ID       string `json:"id"`
			State    string `json:"state"`
			Metadata struct{ Name string }
			Labels   map[string]string
		}
	}
	if err := json.Unmarshal([]byte(crictl("ps", "--pod", sb.ID, "-o", "json")), &containers); err != nil {
		t.Fatal(err)
	}
	if len(containers.Containers) != 1 {
		t.Fatalf("crictl ps --pod %s: %+v", sb.ID, containers.Containers)
	}
	c := containers.Containers[0]
	if c.State != "CONTAINER_RUNNING" || c.Metadata.Name != "reader" || c.Labels["io.kubernetes.container.name"] != "reader" ||
		c.Labels["io.kubernetes.pod.name"] != pod.Name || c.Labels["io.kubernetes.pod.uid"] != string(pod.UID) {
		t.Errorf("crictl ps: %+v", c)
	}
	if want := pod.Status.ContainerStatuses[0].ContainerID; want != "containerd://"+c.ID {
		t.Errorf("the pod's status names container %s, crictl %s", want, c.ID)
	}
	testenv.Eventually(t, 10*time.Second, "crictl logs", func() error {
		if out := crictl("logs", c.ID); !strings.Contains(out, "reading crictl") {
			return fmt.Errorf("crictl logs: %q", out)
		}
		return nil
	})
	if out := crictl("exec", c.ID, "sh", "-c", "echo hello from $(hostname)"); strings.TrimSpace(out) != "hello from "+pod.Name {
		t.Errorf("crictl exec: %q", out)
	}
}
