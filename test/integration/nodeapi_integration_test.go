package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/util/retry"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	utilexec "k8s.io/utils/exec"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestNodeAPI: the kubelet API through the real apiserver, as kubectl uses it. The apiserver
// presents its kubelet client certificate (testenv) and dials the node's InternalIP on the port
// the Node advertises. `kubectl logs` (tail, previous after a restart), `kubectl exec` over SPDY
// and WebSocket (stdout, stdin, exit code), `kubectl port-forward` to an HTTP server in the
// pod's own network namespace; and directly: anonymous 401, a token without nodes/proxy 403.
func TestNodeAPI(t *testing.T) {
	e := startNodeAPIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pods := e.cp.Admin.CoreV1().Pods("default")

	nodeIP := waitNodeAPIAdvertised(t, ctx, e)

	// As users write pods: the service account token mounted by default.
	publishRootCA(t, e, "default")
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nodeapi"},
		Spec: v1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Volumes:                       []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}},
			Containers: []v1.Container{
				counterContainer(),
				{
					Name: "web", Image: "docker.io/holdfast/busybox:test", ImagePullPolicy: v1.PullNever,
					Command: []string{"sh", "-c", `mkdir -p /www && echo "hello from the pod" > /www/index.html && exec httpd -f -p 8080 -h /www`},
				},
			},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "counter restarted once and both containers running", func() error {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		running := 0
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				return fmt.Errorf("%s not running: %+v", cs.Name, cs.State)
			}
			if cs.Name == "counter" && cs.RestartCount < 1 {
				return fmt.Errorf("counter restartCount %d", cs.RestartCount)
			}
			running++
		}
		if running != 2 {
			return fmt.Errorf("%d containers running", running)
		}
		return nil
	})

	t.Run("logs", func(t *testing.T) {
		getLogs := func(opts *v1.PodLogOptions) (string, error) {
			b, err := pods.GetLogs(pod.Name, opts).Do(ctx).Raw()
			return string(b), err
		}
		var got string
		testenv.Eventually(t, 30*time.Second, "run 2's log", func() error {
			var err error
			got, err = getLogs(&v1.PodLogOptions{Container: "counter"})
			if err != nil {
				return err
			}
			if got != "run 2\nline 1\nline 2\nline 3\n" {
				return fmt.Errorf("log %q", got)
			}
			return nil
		})
		if got, err := getLogs(&v1.PodLogOptions{Container: "counter", TailLines: ptr.To[int64](2)}); err != nil || got != "line 2\nline 3\n" {
			t.Errorf("tailLines=2: %q, %v", got, err)
		}
		if got, err := getLogs(&v1.PodLogOptions{Container: "counter", Previous: true}); err != nil || got != "run 1\nline 1\nline 2\nline 3\n" {
			t.Errorf("previous: %q, %v", got, err)
		}
		if got, err := getLogs(&v1.PodLogOptions{Container: "counter", LimitBytes: ptr.To[int64](8)}); err != nil || got != "run 2\nli" {
			t.Errorf("limitBytes=8: %q, %v", got, err)
		}
		got, err := getLogs(&v1.PodLogOptions{Container: "counter", Timestamps: true, TailLines: ptr.To[int64](1)})
		if ts, rest, _ := strings.Cut(got, " "); err != nil || rest != "line 3\n" {
			t.Errorf("timestamps: %q, %v", got, err)
		} else if _, perr := time.Parse(time.RFC3339Nano, ts); perr != nil {
			t.Errorf("timestamps: %q: %v", got, perr)
		}
		// kubectl logs -f: what is there, then the stream stays open; closing it ends it.
		stream, err := pods.GetLogs(pod.Name, &v1.PodLogOptions{Container: "counter", Follow: true}).Stream(ctx)
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		want := "run 2\nline 1\nline 2\nline 3\n"
		buf := make([]byte, len(want))
		if _, err := io.ReadFull(stream, buf); err != nil || string(buf) != want {
			t.Errorf("follow: %q, %v", buf, err)
		}
		stream.Close()
		if _, err := getLogs(&v1.PodLogOptions{Container: "nope"}); err == nil {
			t.Error("logs of an unknown container: no error")
		}
	})

	execURL := func(cmd ...string) *url.URL {
		return e.cp.Admin.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod.Name).SubResource("exec").
			VersionedParams(&v1.PodExecOptions{Container: "counter", Command: cmd, Stdin: cmd[0] == "cat", Stdout: true, Stderr: true}, scheme.ParameterCodec).URL()
	}
	executors := map[string]func(u *url.URL) (remotecommand.Executor, error){
		"spdy": func(u *url.URL) (remotecommand.Executor, error) {
			return remotecommand.NewSPDYExecutor(e.cp.AdminConfig, "POST", u)
		},
		"websocket": func(u *url.URL) (remotecommand.Executor, error) {
			return remotecommand.NewWebSocketExecutor(e.cp.AdminConfig, "GET", u.String())
		},
	}
	for name, newExec := range executors {
		t.Run("exec "+name, func(t *testing.T) {
			run := func(stdin io.Reader, cmd ...string) (string, error) {
				ex, err := newExec(execURL(cmd...))
				if err != nil {
					t.Fatal(err)
				}
				var out, errOut bytes.Buffer
				err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: &out, Stderr: &errOut})
				return out.String() + errOut.String(), err
			}
			if out, err := run(nil, "echo", "hello from exec"); err != nil || out != "hello from exec\n" {
				t.Errorf("echo: %q, %v", out, err)
			}
			if out, err := run(strings.NewReader("through stdin\n"), "cat"); err != nil || out != "through stdin\n" {
				t.Errorf("cat with stdin: %q, %v", out, err)
			}
			_, err := run(nil, "sh", "-c", "exit 3")
			var exitErr utilexec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitStatus() != 3 {
				t.Errorf("exit 3: %v, want an exit error with status 3", err)
			}
		})
	}

	t.Run("exec tty", func(t *testing.T) {
		// The size comes on the resize stream after the request; on the containerd backend the
		// command starts on it. The CRI runtime (containerd 1.6) starts the command first and
		// resizes its terminal just after, as with the kubelet: there the command waits for a
		// size (for 5 s at most, then says what it has).
		cmd := e.sttySize()
		u := e.cp.Admin.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod.Name).SubResource("exec").
			VersionedParams(&v1.PodExecOptions{Container: "counter", TTY: true, Stdout: true,
				Command: []string{"sh", "-c", cmd},
			}, scheme.ParameterCodec).URL()
		ex, err := remotecommand.NewSPDYExecutor(e.cp.AdminConfig, "POST", u)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Tty: true, TerminalSizeQueue: &fixedSize{size: remotecommand.TerminalSize{Width: 100, Height: 40}}})
		if err != nil || strings.TrimSpace(out.String()) != "40 100" {
			t.Errorf("stty size on a 100x40 terminal: %q, %v", out.String(), err)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		u := e.cp.Admin.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod.Name).SubResource("portforward").URL()
		transport, upgrader, err := spdy.RoundTripperFor(e.cp.AdminConfig)
		if err != nil {
			t.Fatal(err)
		}
		dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", u)
		stop, ready := make(chan struct{}), make(chan struct{})
		var pfOut, pfErr bytes.Buffer
		fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:8080"}, stop, ready, &pfOut, &pfErr)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- fw.ForwardPorts() }()
		ended := false
		defer func() {
			close(stop)
			if !ended {
				<-done
			}
		}()
		select {
		case <-ready:
		case err := <-done:
			ended = true
			t.Fatalf("port-forward ended: %v (%s)", err, pfErr.String())
		case <-ctx.Done():
			t.Fatal("port-forward never ready")
		}
		ports, err := fw.GetPorts()
		if err != nil || len(ports) != 1 {
			t.Fatalf("ports %v, %v", ports, err)
		}
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(int(ports[0].Local)) + "/")
		if err != nil {
			t.Fatalf("GET through the forward: %v (%s)", err, pfErr.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello from the pod\n" {
			t.Errorf("GET through the forward: %s %q", resp.Status, body)
		}
	})

	// kubectl debug --target=web: an ephemeral container added to the running pod starts in
	// web's PID namespace (it sees httpd), serves logs and exec, and is never restarted.
	t.Run("ephemeral container", func(t *testing.T) {
		// As kubectl debug does: read, add, write; again if the agent wrote the pod's status in
		// between (a conflict).
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, v1.EphemeralContainer{
				EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debugger", Image: "docker.io/holdfast/busybox:test",
					ImagePullPolicy: v1.PullNever, Stdin: true, TTY: true,
					Command: []string{"sh", "-c", "echo polo; ps -o comm; exec sleep 3600"}},
				TargetContainerName: "web",
			})
			_, err = pods.UpdateEphemeralContainers(ctx, pod.Name, p, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, "debugger running", func() error {
			p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(p.Status.EphemeralContainerStatuses) != 1 || p.Status.EphemeralContainerStatuses[0].State.Running == nil {
				return fmt.Errorf("ephemeral statuses %+v", p.Status.EphemeralContainerStatuses)
			}
			return nil
		})
		testenv.Eventually(t, 30*time.Second, "debugger's log shows its target's processes", func() error {
			b, err := pods.GetLogs(pod.Name, &v1.PodLogOptions{Container: "debugger"}).Do(ctx).Raw()
			if err != nil {
				return err
			}
			if out := string(b); !strings.Contains(out, "polo\n") || !strings.Contains(out, "httpd") {
				return fmt.Errorf("log %q: want polo and web's httpd", out)
			}
			return nil
		})
		u := e.cp.Admin.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod.Name).SubResource("exec").
			VersionedParams(&v1.PodExecOptions{Container: "debugger", Command: []string{"echo", "marco"}, Stdout: true, Stderr: true}, scheme.ParameterCodec).URL()
		ex, err := remotecommand.NewSPDYExecutor(e.cp.AdminConfig, "POST", u)
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut}); err != nil || out.String() != "marco\n" {
			t.Errorf("exec in the ephemeral container: %q, %q, %v", out.String(), errOut.String(), err)
		}
	})

	// What metrics-server and kubectl top read, through the apiserver's node proxy.
	t.Run("stats", func(t *testing.T) {
		proxy := func(path string) ([]byte, error) {
			return e.cp.Admin.CoreV1().RESTClient().Get().Resource("nodes").Name(node).SubResource("proxy").Suffix(path).Do(ctx).Raw()
		}
		raw, err := proxy("stats/summary")
		if err != nil {
			t.Fatal(err)
		}
		var sum statsapi.Summary
		if err := json.Unmarshal(raw, &sum); err != nil {
			t.Fatalf("summary: %v\n%s", err, raw)
		}
		if sum.Node.NodeName != node || sum.Node.CPU == nil || sum.Node.Memory == nil || sum.Node.Memory.WorkingSetBytes == nil || sum.Node.Fs == nil {
			t.Errorf("node stats %+v", sum.Node)
		}
		var web *statsapi.ContainerStats
		for _, p := range sum.Pods {
			if p.PodRef.Name != pod.Name {
				continue
			}
			for i, c := range p.Containers {
				if c.Name == "web" {
					web = &p.Containers[i]
				}
			}
			if p.Network == nil || p.Network.RxBytes == nil {
				t.Errorf("pod network stats %+v", p.Network)
			}
		}
		if web == nil || web.CPU == nil || web.CPU.UsageCoreNanoSeconds == nil || *web.CPU.UsageCoreNanoSeconds == 0 ||
			web.Memory == nil || web.Memory.WorkingSetBytes == nil || *web.Memory.WorkingSetBytes == 0 {
			t.Fatalf("web's stats %+v in %s", web, raw)
		}
		raw, err = proxy("metrics/resource")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`container_memory_working_set_bytes{container="web",namespace="default",pod="nodeapi"}`,
			`container_cpu_usage_seconds_total{container="counter",namespace="default",pod="nodeapi"}`, "node_memory_working_set_bytes ", "resource_scrape_error 0"} {
			if !strings.Contains(string(raw), want) {
				t.Errorf("/metrics/resource lacks %q:\n%s", want, raw)
			}
		}
	})

	// holdfast's own metrics, with the pod above started (metrics_integration_test.go).
	t.Run("metrics", func(t *testing.T) { checkNodeMetrics(t, ctx, e) })

	t.Run("direct", func(t *testing.T) {
		base := "https://" + net.JoinHostPort(nodeIP, strconv.Itoa(e.agent.Config.NodeAPIPort()))
		// An admin certificate (system:masters) from a CA the node does not trust.
		dir := t.TempDir()
		otherCA, err := testenv.NewCA(dir, "other-ca", "another cluster's CA")
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile, err := otherCA.IssueClient(dir, "intruder", "intruder", "system:masters")
		if err != nil {
			t.Fatal(err)
		}
		alien, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		do := func(method, path, token string, cert *tls.Certificate) (int, string) {
			tlsConfig := &tls.Config{InsecureSkipVerify: true}
			if cert != nil {
				tlsConfig.Certificates = []tls.Certificate{*cert}
			}
			client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
			req, _ := http.NewRequestWithContext(ctx, method, base+path, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		get := func(path, token string) (int, string) { return do("GET", path, token, nil) }
		if code, body := get("/containerLogs/default/nodeapi/counter", ""); code != http.StatusUnauthorized {
			t.Errorf("anonymous: %d %s, want 401", code, body)
		}
		if code, body := get("/healthz", ""); code != http.StatusUnauthorized {
			t.Errorf("anonymous /healthz: %d %s, want 401", code, body)
		}
		if code, body := do("GET", "/pods", "", &alien); code != http.StatusUnauthorized {
			t.Errorf("a certificate of another CA: %d %s, want 401", code, body)
		}
		// The node's own token has no nodes/proxy right: no logs, no exec.
		if code, body := get("/containerLogs/default/nodeapi/counter", e.cp.NodeToken(node)); code != http.StatusForbidden {
			t.Errorf("logs with a token without nodes/proxy: %d %s, want 403", code, body)
		}
		if code, body := do("POST", "/exec/default/nodeapi/counter?command=id&output=1", e.cp.NodeToken(node), nil); code != http.StatusForbidden {
			t.Errorf("exec with a token without nodes/proxy: %d %s, want 403", code, body)
		}
		if code, body := get("/pods", e.cp.AdminConfig.BearerToken); code != http.StatusOK || !strings.Contains(body, `"name":"nodeapi"`) {
			t.Errorf("/pods as admin: %d %.200s", code, body)
		}

		// A monitoring service account, as they are commonly granted: get, list and watch on
		// nodes/proxy, nodes/stats and nodes/metrics. It reads logs and pods; it opens no
		// exec, attach or port-forward, as WebSocket (a GET) or SPDY (a POST).
		reader := readOnlyNodeToken(t, ctx, e)
		if code, body := get("/containerLogs/default/nodeapi/counter", reader); code != http.StatusOK {
			t.Errorf("logs with a read-only token: %d %s, want 200", code, body)
		}
		if code, body := get("/pods", reader); code != http.StatusOK {
			t.Errorf("/pods with a read-only token: %d %.200s, want 200", code, body)
		}
		readerConfig := &rest.Config{Host: base, BearerToken: reader, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
		ex, err := remotecommand.NewWebSocketExecutor(readerConfig, "GET", base+"/exec/default/nodeapi/counter?command=id&output=1&error=1")
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out}); err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("WebSocket exec with a read-only token: %v, output %q; want 403 Forbidden", err, out.String())
		}
		for _, path := range []string{"/exec/default/nodeapi/counter?command=id&output=1", "/attach/default/nodeapi/counter?output=1", "/portForward/default/nodeapi?port=8080"} {
			for _, method := range []string{"GET", "POST"} {
				if code, body := upgrade(ctx, t, method, base+path, reader); code != http.StatusForbidden {
					t.Errorf("%s %s upgraded with a read-only token: %d %.200s, want 403", method, path, code, body)
				}
			}
		}
	})
}

// readOnlyNodeToken returns a token of a service account allowed what monitoring is commonly
// allowed on nodes: get, list and watch on nodes/proxy, nodes/stats and nodes/metrics.
func readOnlyNodeToken(t *testing.T, ctx context.Context, e *env) string {
	t.Helper()
	rbac := e.cp.Admin.RbacV1()
	if _, err := e.cp.Admin.CoreV1().ServiceAccounts("default").Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "node-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy", "nodes/stats", "nodes/metrics"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scraper-node-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "node-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "scraper"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.cp.Admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "scraper", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// upgrade sends what a WebSocket client sends to open a stream (the kubelet API's v5 channel
// protocol) with token, and returns the answer's status and body.
func upgrade(ctx context.Context, t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Sec-WebSocket-Protocol", "v5.channel.k8s.io")
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// fixedSize is a terminal of one size: it reports it once, then nothing until the end.
type fixedSize struct {
	size remotecommand.TerminalSize
	sent bool
}

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	if !f.sent {
		f.sent = true
		return &f.size
	}
	return nil // no more changes: the queue ends
}
