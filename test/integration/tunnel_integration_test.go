package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestNodeAPIThroughKonnectivity: a gateway the apiserver cannot dial. The apiserver's
// "cluster" egress goes to a real konnectivity server (testenv), holdfast dials out to it with
// a client certificate and serves its node API through that tunnel only (tunnel.only: no TCP
// listener, so dialing the node's address directly fails). Upstream kubectl's `logs`, `exec`
// (output and exit code), `port-forward` carrying an HTTP request and `get --raw` of the node
// proxy's /stats/summary all work through the apiserver; with the konnectivity server down they fail, and they work again
// once it is back and holdfast has reconnected by itself.
func TestNodeAPIThroughKonnectivity(t *testing.T) {
	e := startEnvFor(t, &testenv.ControlPlaneOptions{Nodes: []string{node}, Konnectivity: true}, func(e *env, c *config.Config) {
		c.Kubeconfig = e.cp.WriteNodeKubeconfig(node)
		c.Authentication.X509.ClientCAFile = e.cp.KubeletClientCAFile()
		k := e.cp.Konnectivity
		certFile, keyFile, err := k.IssueAgentCertificate(e.cp.Dir, "holdfast-tunnel")
		if err != nil {
			t.Fatal(err)
		}
		c.Tunnel = config.TunnelConfig{Server: k.AgentAddress, CAFile: k.CAFile, CertFile: certFile, KeyFile: keyFile, Only: true}
	}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pods := e.cp.Admin.CoreV1().Pods("default")

	nodeIP := waitNodeAPIAdvertised(t, ctx, e)

	// As users write pods: the service account token mounted by default.
	publishRootCA(t, e, "default")
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tunneled"},
		Spec: v1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []v1.Container{{
				Name: "web", Image: "docker.io/holdfast/busybox:test", ImagePullPolicy: v1.PullNever,
				Command: []string{"sh", "-c", `echo "hello through the tunnel"; mkdir -p /www && echo "served through konnectivity" > /www/index.html && exec httpd -f -p 8080 -h /www`},
			}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "web running", func() error {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("statuses %+v", p.Status.ContainerStatuses)
		}
		return nil
	})

	// The direct path is closed: nothing listens on the node's address, so the apiserver can
	// only have reached the node API through the tunnel.
	t.Run("direct path blocked", func(t *testing.T) {
		addr := net.JoinHostPort(nodeIP, strconv.Itoa(e.agent.Config.NodeAPIPort()))
		if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
			c.Close()
			t.Fatalf("dialed the node API at %s directly: want no listener with tunnel.only", addr)
		}
	})

	// As an operator does, with kubectl through the apiserver.
	k := newKubectl(t, e)
	getLogs := func() (string, error) { return k.Run(ctx, "", "logs", pod.Name, "-c", "web") }
	t.Run("logs", func(t *testing.T) {
		// Eventually: the log file may not have its line yet when the container runs.
		testenv.Eventually(t, 30*time.Second, "web's log through the tunnel", func() error {
			got, err := getLogs()
			if err != nil {
				return err
			}
			if got != "hello through the tunnel\n" {
				return fmt.Errorf("log %q", got)
			}
			return nil
		})
	})

	t.Run("exec", func(t *testing.T) {
		out, err := k.Run(ctx, "", "exec", pod.Name, "-c", "web", "--", "sh", "-c", "echo out; cat /www/index.html; exit 3")
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
			t.Errorf("exec of exit 3: %v, want kubectl to exit 3", err)
		}
		if out != "out\nserved through konnectivity\n" {
			t.Errorf("stdout %q", out)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		port := k.PortForward(t, ctx, "pod/"+pod.Name, 8080)
		resp, err := http.Get("http://127.0.0.1:" + port + "/")
		if err != nil {
			t.Fatalf("GET through kubectl port-forward: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "served through konnectivity\n" {
			t.Errorf("GET through kubectl port-forward: %s %q", resp.Status, body)
		}
	})

	t.Run("stats through the node proxy", func(t *testing.T) {
		raw, err := k.Run(ctx, "", "get", "--raw", "/api/v1/nodes/"+node+"/proxy/stats/summary")
		if err != nil {
			t.Fatal(err)
		}
		var sum statsapi.Summary
		if err := json.Unmarshal([]byte(raw), &sum); err != nil {
			t.Fatalf("summary: %v\n%s", err, raw)
		}
		if sum.Node.NodeName != node || sum.Node.Memory == nil || sum.Node.Memory.WorkingSetBytes == nil {
			t.Errorf("node stats %+v", sum.Node)
		}
		found := false
		for _, p := range sum.Pods {
			found = found || p.PodRef.Name == pod.Name
		}
		if !found {
			t.Errorf("pod %s not in the summary:\n%s", pod.Name, raw)
		}
	})

	// The tunnel is the only path: with its server down the apiserver cannot reach the node
	// API; once the server is back holdfast reconnects by itself and the path works again.
	t.Run("server down and back", func(t *testing.T) {
		k := e.cp.Konnectivity
		if err := k.Stop(); err != nil {
			t.Fatal(err)
		}
		if got, err := getLogs(); err == nil {
			t.Errorf("logs with the konnectivity server down: %q, want an error", got)
		}
		if err := k.Start(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, "logs once the server is back", func() error {
			got, err := getLogs()
			if err != nil {
				return err
			}
			if got != "hello through the tunnel\n" {
				return fmt.Errorf("log %q", got)
			}
			return nil
		})
	})
}
