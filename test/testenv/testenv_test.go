package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	gocni "github.com/containerd/go-cni"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestVersionsMatchToolModules keeps the binary names testenv looks for in step with the
// versions hack/build-tools.sh builds, which come from the tool modules' go.mod files.
func TestVersionsMatchToolModules(t *testing.T) {
	for _, tt := range []struct {
		goMod, module, want string
	}{
		{"../../hack/tools/kube-apiserver/go.mod", "k8s.io/kubernetes", KubeAPIServerVersion},
		{"../../hack/tools/etcd/go.mod", "go.etcd.io/etcd/server/v3", EtcdVersion},
		{"../../hack/tools/registry/go.mod", "github.com/distribution/distribution/v3", RegistryVersion},
		{"../../hack/tools/opa/go.mod", "github.com/open-policy-agent/opa", OPAVersion},
		{"../../hack/tools/crictl/go.mod", "sigs.k8s.io/cri-tools", CrictlVersion},
		// The library is at v0.X.Y for release v1.X.Y.
		{"../../hack/tools/kubectl/go.mod", "k8s.io/kubectl", "v0." + strings.TrimPrefix(KubeAPIServerVersion, "v1.")},
	} {
		data, err := os.ReadFile(tt.goMod)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(tt.module) + `\s+(v\S+)`).FindSubmatch(data)
		if m == nil {
			t.Fatalf("%s does not require %s", tt.goMod, tt.module)
		}
		if got := string(m[1]); got != tt.want {
			t.Errorf("%s requires %s %s, testenv expects %s: update the constant", tt.goMod, tt.module, got, tt.want)
		}
	}
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestEnvironment starts a control plane, a containerd and a CNI network together, the way an
// integration test of the agent does, and checks that each is what it claims to be.
func TestEnvironment(t *testing.T) {
	RequireIntegration(t)
	start := time.Now()
	cp := StartControlPlane(t, ControlPlaneOptions{Nodes: []string{"node-a", "node-b"}})
	ctrd := StartContainerd(t, ContainerdOptions{})
	network := CNI(t)
	t.Logf("environment started in %v", time.Since(start).Round(time.Millisecond))

	t.Run("ControlPlane", func(t *testing.T) { testControlPlane(t, cp) })
	t.Run("Containerd", func(t *testing.T) { testRunToCompletion(t, ctrd) })
	t.Run("CNI", func(t *testing.T) { testCNI(t, ctrd, network) })
	t.Run("ControlPlaneRestart", func(t *testing.T) { testControlPlaneRestart(t, cp) })
}

func testControlPlane(t *testing.T, cp *ControlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	body, err := cp.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil || string(body) != "ok" {
		t.Fatalf("/readyz = %q, %v", body, err)
	}
	version, err := cp.Admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	t.Logf("kube-apiserver reports %s", version.GitVersion)
	if _, err := cp.Admin.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("ServiceAccount default/default: %v", err)
	}
	if _, err := cp.Admin.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("admin cannot list secrets: %v", err)
	}

	// The node's kubeconfig is all an agent gets; use it the way the agent would.
	restConfig, err := clientcmd.BuildConfigFromFlags("", cp.WriteNodeKubeconfig("node-a"))
	if err != nil {
		t.Fatalf("load node kubeconfig: %v", err)
	}
	node, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	review, err := node.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node whoami: %v", err)
	}
	if got := review.Status.UserInfo.Username; got != "system:node:node-a" {
		t.Errorf("node authenticates as %q, want system:node:node-a", got)
	}
	_, err = node.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node lists secrets cluster-wide: err = %v, want 403 Forbidden", err)
	}
	// NodeRestriction: a node may create its own Node object, not another's.
	if _, err := node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("node-a creates Node node-a: %v", err)
	}
	_, err = node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node-a creates Node node-b: err = %v, want 403 Forbidden", err)
	}
	// With the default ServiceAccount in place, a pod can be placed on the node by name.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:   "node-a",
			Containers: []corev1.Container{{Name: "main", Image: BusyboxImage, Command: []string{"sleep", "3600"}}},
		},
	}
	if _, err := cp.Admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	// As a kubelet does: list the pods bound to this node (a node may list no others).
	pods, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "sleeper" {
		t.Errorf("node-a lists the pods bound to it: %v, %v", pods, err)
	}
	if _, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node-a lists all pods: err = %v, want 403 Forbidden", err)
	}
}

func testControlPlaneRestart(t *testing.T, cp *ControlPlane) {
	node := kubernetes.NewForConfigOrDie(cp.NodeConfig("node-a"))
	stopStart := time.Now()
	cp.Stop()
	t.Logf("apiserver stopped in %v", time.Since(stopStart).Round(time.Millisecond))
	if cp.Running() {
		t.Fatal("apiserver still running after Stop")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := node.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err == nil {
		t.Fatal("the apiserver answered while stopped")
	}
	start := time.Now()
	cp.Start()
	t.Logf("apiserver restarted in %v", time.Since(start).Round(time.Millisecond))
	// Same port, same etcd: the node's client works again and the objects are still there.
	if _, err := node.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Errorf("Node node-a after restart: %v", err)
	}
}

// runContainer creates a container from image running args, starts its task and returns it
// with the channel of its exit status. The container and task are removed when t ends.
func runContainer(t *testing.T, ctx context.Context, c *client.Client, image string, out *SyncBuffer, opts ...oci.SpecOpts) (client.Task, <-chan client.ExitStatus) {
	t.Helper()
	img, err := c.GetImage(ctx, image)
	if err != nil {
		t.Fatalf("get image: %v", err)
	}
	id := "testenv-" + randomSuffix()
	ctr, err := c.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithNewSnapshot(id, img),
		client.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img)}, opts...)...),
	)
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	t.Cleanup(func() {
		ctx := namespaces.WithNamespace(context.Background(), mustNamespace(t, ctx))
		if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("delete container %s: %v", id, err)
		}
	})
	creator := cio.NullIO
	if out != nil {
		creator = cio.NewCreator(cio.WithStreams(nil, out, out))
	}
	task, err := ctr.NewTask(ctx, creator)
	if err != nil {
		t.Fatalf("create task: %v", err)
	}
	t.Cleanup(func() {
		ctx := namespaces.WithNamespace(context.Background(), mustNamespace(t, ctx))
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("delete task %s: %v", id, err)
		}
	})
	exitC, err := task.Wait(ctx)
	if err != nil {
		t.Fatalf("wait task: %v", err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
	return task, exitC
}

func mustNamespace(t *testing.T, ctx context.Context) string {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// waitExit waits for a task to exit, deletes it (which also waits for its output to be
// copied) and returns its exit code.
func waitExit(t *testing.T, ctx context.Context, task client.Task, exitC <-chan client.ExitStatus) uint32 {
	t.Helper()
	select {
	case status := <-exitC:
		code, _, err := status.Result()
		if err != nil {
			t.Fatalf("task exit status: %v", err)
		}
		if _, err := task.Delete(ctx); err != nil {
			t.Fatalf("delete task: %v", err)
		}
		return code
	case <-ctx.Done():
		t.Fatalf("task did not exit: %v", ctx.Err())
		return 0
	}
}

func testRunToCompletion(t *testing.T, ctrd *Containerd) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, "testenv")
	ctrd.ImportTestImages(ctx, "testenv")
	ctrd.ImportTestImages(ctx, "testenv") // present now: nothing to do
	for _, name := range []string{BusyboxImage, PauseImage} {
		if _, err := ctrd.Client.GetImage(ctx, name); err != nil {
			t.Errorf("image %s after import: %v", name, err)
		}
	}

	var out SyncBuffer
	start := time.Now()
	task, exitC := runContainer(t, ctx, ctrd.Client, BusyboxImage, &out, oci.WithProcessArgs("echo", "hi"))
	if code := waitExit(t, ctx, task, exitC); code != 0 {
		t.Errorf("echo hi exited with %d, output %q", code, out.String())
	}
	if got := strings.TrimSpace(out.String()); got != "hi" {
		t.Errorf("echo hi printed %q", got)
	}
	t.Logf("busybox container ran to completion in %v", time.Since(start).Round(time.Millisecond))
}

func testCNI(t *testing.T, ctrd *Containerd, network *CNINetwork) {
	if len(network.Bridge) > 15 {
		t.Errorf("bridge name %q is longer than 15 bytes", network.Bridge)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, "testenv")
	ctrd.ImportTestImages(ctx, "testenv")

	netnsName := "hft-" + randomSuffix()
	if out, err := exec.Command("ip", "netns", "add", netnsName).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", netnsName).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete: %v: %s", err, out)
		}
	})
	netnsPath := filepath.Join("/var/run/netns", netnsName)

	cni, err := gocni.New(gocni.WithPluginDir([]string{network.BinDir}), gocni.WithMinNetworkCount(2))
	if err != nil {
		t.Fatal(err)
	}
	// The bridge network first so that it is eth0; loopback configures lo whatever it is called.
	if err := cni.Load(gocni.WithConfListFile(network.ConfListFile), gocni.WithConfListFile(network.LoopbackConfListFile)); err != nil {
		t.Fatalf("load CNI configuration: %v", err)
	}
	result, err := cni.Setup(ctx, netnsName, netnsPath)
	if err != nil {
		t.Fatalf("CNI ADD: %v", err)
	}
	t.Cleanup(func() {
		if err := cni.Remove(context.Background(), netnsName, netnsPath); err != nil {
			t.Errorf("CNI DEL: %v", err)
		}
	})
	eth0 := result.Interfaces["eth0"]
	if eth0 == nil || len(eth0.IPConfigs) == 0 {
		t.Fatalf("CNI result has no eth0 address: %+v", result.Interfaces)
	}
	ip := eth0.IPConfigs[0].IP
	if !network.Subnet.Contains(ip) {
		t.Errorf("eth0 got %v, outside %v", ip, network.Subnet)
	}

	var out SyncBuffer
	task, exitC := runContainer(t, ctx, ctrd.Client, BusyboxImage, &out,
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netnsPath}),
		oci.WithProcessArgs("sh", "-c", "ip -o -4 addr show eth0 && ip -o link show lo && ping -c 1 -W 5 "+network.Gateway.String()))
	if code := waitExit(t, ctx, task, exitC); code != 0 {
		t.Fatalf("network check in the container exited with %d:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), ip.String()+"/") {
		t.Errorf("the container does not see its address %v:\n%s", ip, out.String())
	}
	if !regexp.MustCompile(`lo: <[^>]*\bUP\b`).MatchString(out.String()) {
		t.Errorf("lo is not up in the container:\n%s", out.String())
	}
}

// TestContainerdRestart checks what the reboot and crash tests of the agent stand on: after
// Stop and Start the containers remain and their tasks are gone; after StopDaemon and Start the
// tasks still run and can be re-attached.
func TestContainerdRestart(t *testing.T) {
	RequireIntegration(t)
	ctrd := StartContainerd(t, ContainerdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, "restart")
	ctrd.ImportTestImages(ctx, "restart")

	task, _ := runContainer(t, ctx, ctrd.Client, PauseImage, nil)
	id := task.ID()

	// A daemon crash: the task survives and is found again.
	ctrd.StopDaemon()
	if err := syscall.Kill(int(task.Pid()), 0); err != nil {
		t.Fatalf("task process %d died with the daemon: %v", task.Pid(), err)
	}
	ctrd.Start()
	ctr, err := ctrd.Client.LoadContainer(ctx, id)
	if err != nil {
		t.Fatalf("load container after daemon restart: %v", err)
	}
	reattached, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatalf("re-attach task after daemon restart: %v", err)
	}
	if status, err := reattached.Status(ctx); err != nil || status.Status != client.Running {
		t.Fatalf("task after daemon restart: %+v, %v", status, err)
	}

	// A reboot: the container record remains, the task is gone.
	ctrd.Stop()
	ctrd.Start()
	ctr, err = ctrd.Client.LoadContainer(ctx, id)
	if err != nil {
		t.Fatalf("load container after reboot: %v", err)
	}
	if _, err := ctr.Task(ctx, nil); !errdefs.IsNotFound(err) {
		t.Fatalf("task after reboot: err = %v, want not found", err)
	}
	// And the container can run again from its record, as the agent will do after a reboot.
	task2, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatalf("new task after reboot: %v", err)
	}
	if err := task2.Start(ctx); err != nil {
		t.Fatalf("start task after reboot: %v", err)
	}
	// Left running on purpose: the cleanup must kill it.
}

// TestContainerdCRI checks that the CRI plugin loads when asked for.
func TestContainerdCRI(t *testing.T) {
	RequireIntegration(t)
	network := CNI(t)
	ctrd := StartContainerd(t, ContainerdOptions{EnableCRI: true, CNI: network})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := ctrd.Client.IntrospectionService().Plugins(ctx, "id==cri")
	if err != nil {
		t.Fatalf("list plugins: %v", err)
	}
	if len(resp.Plugins) != 1 {
		t.Fatalf("CRI plugin not listed: %+v", resp.Plugins)
	}
	if initErr := resp.Plugins[0].InitErr; initErr != nil {
		t.Fatalf("CRI plugin failed to load: %v", initErr)
	}
}

// TestContainerdCleanupAfterStopDaemon ends a test with the daemon down and a task running:
// the cleanup must still leave no shim, container process, mount or directory behind.
func TestContainerdCleanupAfterStopDaemon(t *testing.T) {
	RequireIntegration(t)
	var ctrd *Containerd
	t.Cleanup(func() { // runs after the containerd cleanup
		if shims, children, err := findShims(ctrd.Address); err != nil || len(shims)+len(children) > 0 {
			t.Errorf("after cleanup: shims %v and their children %v remain (%v)", shims, children, err)
		}
		if _, err := os.Stat(ctrd.Root); !os.IsNotExist(err) {
			t.Errorf("after cleanup: %s remains (%v)", ctrd.Root, err)
		}
	})
	ctrd = StartContainerd(t, ContainerdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, "leftover")
	ctrd.ImportTestImages(ctx, "leftover")
	img, err := ctrd.Client.GetImage(ctx, PauseImage)
	if err != nil {
		t.Fatal(err)
	}
	id := "testenv-" + randomSuffix()
	ctr, err := ctrd.Client.NewContainer(ctx, id, client.WithNewSnapshot(id, img), client.WithNewSpec(oci.WithImageConfig(img)))
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ctrd.StopDaemon()
}
