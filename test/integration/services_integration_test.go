package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	agentnode "github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

func envPod(name string, links *bool) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
		NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		EnableServiceLinks: links,
		Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
			Command: []string{"sh", "-c", "env; echo END=1; exec sleep 3600"}}},
	}}
}

// TestServiceLinkEnv: containers get KUBERNETES_SERVICE_HOST/PORT always and the docker-link
// variables of their namespace's services unless enableServiceLinks is false; offline, after an
// agent restart with the apiserver gone, a new pod still gets the last known ones.
func TestServiceLinkEnv(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	core := e.cp.Admin.CoreV1()
	svc, err := core.Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-front"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 8080, Protocol: v1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kube, err := core.Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	linked, err := core.Pods("default").Create(ctx, envPod("linked", nil), metav1.CreateOptions{}) // API default: true
	if err != nil {
		t.Fatal(err)
	}
	unlinked, err := core.Pods("default").Create(ctx, envPod("unlinked", ptr.To(false)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	envOf := func(p *v1.Pod) map[string]string {
		env, err := containerEnvFromLog(filepath.Join(e.agent.Config.PodLogDir, "default_"+p.Name+"_"+string(p.UID), "c", "0.log"))
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	waitOutput(t, e, linked, "c", "END=1")
	waitOutput(t, e, unlinked, "c", "END=1")
	kubeHost, kubePort := kube.Spec.ClusterIP, strconv.Itoa(int(kube.Spec.Ports[0].Port))
	want := map[string]string{
		"KUBERNETES_SERVICE_HOST":       kubeHost,
		"KUBERNETES_SERVICE_PORT":       kubePort,
		"KUBERNETES_PORT":               "tcp://" + net.JoinHostPort(kubeHost, kubePort),
		"WEB_FRONT_SERVICE_HOST":        svc.Spec.ClusterIP,
		"WEB_FRONT_SERVICE_PORT":        "8080",
		"WEB_FRONT_SERVICE_PORT_HTTP":   "8080",
		"WEB_FRONT_PORT":                "tcp://" + svc.Spec.ClusterIP + ":8080",
		"WEB_FRONT_PORT_8080_TCP_PROTO": "tcp",
		"WEB_FRONT_PORT_8080_TCP_ADDR":  svc.Spec.ClusterIP,
	}
	got := envOf(linked)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("linked pod: %s=%q, want %q", k, got[k], v)
		}
	}
	got = envOf(unlinked)
	if got["KUBERNETES_SERVICE_HOST"] != kubeHost || got["WEB_FRONT_SERVICE_HOST"] != "" {
		t.Errorf("enableServiceLinks false: KUBERNETES_SERVICE_HOST=%q WEB_FRONT_SERVICE_HOST=%q, want %q and none",
			got["KUBERNETES_SERVICE_HOST"], got["WEB_FRONT_SERVICE_HOST"], kubeHost)
	}

	// Offline: the services the agent saved serve a static pod started after a restart with
	// no apiserver.
	saved := filepath.Join(e.agent.Config.StateDir, "services.json")
	testenv.Eventually(t, 60*time.Second, "the services saved", func() error {
		b, err := os.ReadFile(saved)
		if err != nil || !strings.Contains(string(b), "web-front") {
			return fmt.Errorf("%v: %s", err, b)
		}
		return nil
	})
	e.cp.Stop()
	e.agent.Kill()
	e.agent.Start()
	manifest := "apiVersion: v1\nkind: Pod\nmetadata: {name: offline-env, namespace: default}\nspec:\n" +
		"  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: " + testenv.BusyboxImage +
		", imagePullPolicy: Never, command: [sh, -c, 'env; echo END=1; exec sleep 3600']}\n"
	if err := os.WriteFile(filepath.Join(e.agent.Config.ManifestDir, "offline-env.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	var env map[string]string
	testenv.Eventually(t, 90*time.Second, "the offline static pod's env", func() error {
		p, err := e.localPod("offline-env-" + node) // a static pod's name ends with its node's
		if err != nil {
			return err
		}
		env, err = containerEnvFromLog(filepath.Join(e.agent.Config.PodLogDir, "default_offline-env-"+node+"_"+string(p.UID), "c", "0.log"))
		if err != nil || env["END"] != "1" {
			return fmt.Errorf("%v (phase %s)", err, p.Status.Phase)
		}
		return nil
	})
	if env["KUBERNETES_SERVICE_HOST"] != kubeHost || env["WEB_FRONT_SERVICE_HOST"] != svc.Spec.ClusterIP {
		t.Errorf("offline: KUBERNETES_SERVICE_HOST=%q WEB_FRONT_SERVICE_HOST=%q, want %q and %q",
			env["KUBERNETES_SERVICE_HOST"], env["WEB_FRONT_SERVICE_HOST"], kubeHost, svc.Spec.ClusterIP)
	}
}

// TestHostPort: a hostPort of a pod with its own network is reachable on the node's address
// (CNI portmap, as containerd's CRI plugin sets it up); a second pod asking for the same port
// is refused at admission with the kubelet's reason; deleting the first removes the mapping.
func TestHostPort(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	hostPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	web := func(name string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
			NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
			Containers: []v1.Container{{Name: "web", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
				Command: []string{"sh", "-c", "mkdir -p /www && echo hello-from-" + name + " > /www/index.html && exec httpd -f -p 80 -h /www"},
				Ports:   []v1.ContainerPort{{ContainerPort: 80, HostPort: int32(hostPort), Protocol: v1.ProtocolTCP}}}},
		}}
	}
	if _, err := pods.Create(ctx, web("web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodIP(t, "web")
	hostIP := agentnode.HostIPs("")[0]
	url := "http://" + net.JoinHostPort(hostIP, strconv.Itoa(hostPort)) + "/"
	client := &http.Client{Timeout: 3 * time.Second}
	testenv.Eventually(t, 60*time.Second, "the pod answering on "+url, func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), "hello-from-web") {
			return fmt.Errorf("answer %q", b)
		}
		return nil
	})

	if _, err := pods.Create(ctx, web("web-twin"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the second pod refused", func() error {
		p, err := pods.Get(ctx, "web-twin", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodFailed || p.Status.Reason != "NodePorts" ||
			p.Status.Message != "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports" {
			return fmt.Errorf("phase %s reason %q message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		return nil
	})

	if err := pods.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodGone(t, "web")
	if resp, err := client.Get(url); err == nil {
		resp.Body.Close()
		t.Errorf("%s still answers after the pod was deleted", url)
	}
}
