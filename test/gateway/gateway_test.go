package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

var (
	runVM = flag.Bool("gateway.vm", false,
		"boot the Debian 12 VM and run the gateway scenarios (make gateway-test); they take minutes each")
	flapFor = flag.Duration("gateway.flap", 3*time.Minute,
		"how long scenario 6 flaps the uplink")
	figuresPath = flag.String("gateway.figures", "",
		"append each measured figure to this file, one line each (make gateway-test reports them)")
)

// nodeName is the VM's node name.
const nodeName = "gw-vm"

// Generous: under software emulation on a loaded 2-core machine a boot takes minutes.
const (
	bootTimeout = 15 * time.Minute
	podTimeout  = 10 * time.Minute
)

// gateway is a VM running holdfast joined to a test control plane.
type gateway struct {
	t       *testing.T
	cp      *testenv.ControlPlane
	vm      *VM
	image   Image
	payload string // the payload disk it was installed from (BuildPayload)
	cri     bool   // holdfast runs on its CRI backend (gatewayOptions.cri)
	api     kubernetes.Interface
	ctx     context.Context
}

// gatewayOptions is what a scenario changes of the gateway startGatewayWith boots.
type gatewayOptions struct {
	// extraConfig is added to the gateway's configuration (PayloadOptions.ExtraConfig).
	extraConfig string
	// setConfig replaces keys the firmware's configuration sets (PayloadOptions.SetConfig).
	setConfig map[string]string
	// tpmStateDir gives the VM a TPM (VMOptions.TPMStateDir).
	tpmStateDir string
	// cri runs holdfast on its CRI backend (runtime: cri) against the guest containerd's CRI
	// plugin, which the site configures (guestCRIConfig) with the agent's cgroup driver.
	cri bool
	// kernelArgs are added to the guest kernel's command line (VMOptions.KernelArgs).
	kernelArgs []string
}

// guestCRIConfig is the guest containerd's configuration for a site on holdfast's CRI backend:
// the CRI plugin's runc with the systemd cgroup driver when the agent has it (runc then takes
// the pod's slice and makes each container a cri-containerd-<id>.scope below it), the sandbox
// image the payload preloads, and the CNI plugins where Debian installs them with the
// firmware's network.
func guestCRIConfig(systemdCgroup bool) string {
	return fmt.Sprintf(`version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = %t
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
`, testenv.PauseImage, systemdCgroup)
}

// startGateway boots a gateway and waits until its Node is Ready in the API.
func startGateway(t *testing.T) *gateway {
	t.Helper()
	return startGatewayWith(t, gatewayOptions{})
}

// startGatewayWith is startGateway with opts.
func startGatewayWith(t *testing.T, opts gatewayOptions) *gateway {
	t.Helper()
	if testing.Short() {
		t.Skip("gateway VM scenario: skipped under -short")
	}
	if !*runVM {
		// skip-ok: entry point of make gateway-test
		t.Skip("gateway VM scenario: runs with -gateway.vm (make gateway-test)")
	}
	testenv.RequireIntegration(t)
	image := BuildImage(t)
	// A cluster set up for node TLS bootstrap as kubeadm sets one up: bootstrap token auth,
	// client certificates of the cluster CA, kube-controller-manager's CSR approver and signer,
	// a bootstrap token with kubeadm's RBAC bindings. The gateway gets only the token.
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{ClusterCA: true, BootstrapTokenAuth: true})
	cp.StartControllerManager(testenv.ControllerManagerOptions{})
	token := cp.CreateBootstrapToken()
	g := &gateway{t: t, cp: cp, image: image, api: cp.Admin, ctx: context.Background(), cri: opts.cri}
	// What kube-controller-manager's root CA publisher does: every service account token
	// volume projects this ConfigMap.
	g.create(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: "default"},
		Data: map[string]string{"ca.crt": string(cp.CAData())}})
	payload := PayloadOptions{
		NodeName:            nodeName,
		BootstrapKubeconfig: GuestKubeconfig(t, cp.WriteBootstrapKubeconfig(token)),
		ExtraConfig:         opts.extraConfig,
		SetConfig:           opts.setConfig,
	}
	if opts.cri {
		payload.SetConfig = maps.Clone(opts.setConfig)
		if payload.SetConfig == nil {
			payload.SetConfig = map[string]string{}
		}
		payload.SetConfig["runtime"] = "cri"
		payload.ContainerdConfig = guestCRIConfig(opts.setConfig["cgroupDriver"] == "systemd")
	}
	g.payload = BuildPayload(t, payload)
	g.vm = StartVM(t, image, VMOptions{Payload: g.payload, TPMStateDir: opts.tpmStateDir, KernelArgs: opts.kernelArgs})
	t.Logf("VM started (%s)", g.vm.Accel)
	t.Cleanup(g.dumpOnFailure)
	g.vm.WaitSSH(bootTimeout)
	t.Logf("ssh answers %v after power-on", time.Since(g.vm.PoweredOn).Round(time.Second))
	g.waitNodeReady(bootTimeout)
	figure(t, "first boot: power-on to node Ready", time.Since(g.vm.PoweredOn),
		"firmware bundle installed at boot, TLS bootstrap, "+g.vm.Accel)
	g.checkJoinedByBootstrap()
	return g
}

// checkJoinedByBootstrap checks that the gateway joined through TLS bootstrap: a node client
// CSR from the bootstrap token, approved and issued, and the guest's kubeconfig with the
// certificate holdfast keeps in its state dir.
func (g *gateway) checkJoinedByBootstrap() {
	g.t.Helper()
	csrs, err := g.api.CertificatesV1().CertificateSigningRequests().List(g.ctx, metav1.ListOptions{})
	if err != nil {
		g.t.Fatal(err)
	}
	issued := 0
	for _, csr := range csrs.Items {
		if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
			continue
		}
		if !strings.HasPrefix(csr.Spec.Username, "system:bootstrap:") || len(csr.Status.Certificate) == 0 {
			g.t.Errorf("node client CSR %s from %s: want one from the bootstrap token, issued (%d bytes of certificate)",
				csr.Name, csr.Spec.Username, len(csr.Status.Certificate))
			continue
		}
		issued++
	}
	if issued == 0 {
		g.t.Errorf("no node client CSR issued: the gateway did not join through TLS bootstrap")
	}
	out := g.vm.MustSSH("stat -L -c %a /var/lib/holdfast/pki/holdfast-client-current.pem && grep -c holdfast-client-current.pem /var/lib/holdfast/kubeconfig")
	if f := strings.Fields(out); len(f) != 2 || f[0] != "600" || f[1] == "0" {
		g.t.Errorf("the guest's node certificate and kubeconfig: %q", out)
	}
}

func (g *gateway) dumpOnFailure() {
	if !g.t.Failed() {
		return
	}
	if out, err := g.vm.SSH("journalctl -b --no-pager -u holdfast -u containerd -u holdfast-payload | tail -150"); err == nil {
		g.t.Logf("guest journal (this boot):\n%s", out)
	} else {
		g.t.Logf("guest journal: %v", err)
	}
	console := g.vm.Console()
	if len(console) > 8000 {
		console = console[len(console)-8000:]
	}
	g.t.Logf("guest console (tail):\n%s", console)
}

func (g *gateway) create(obj any) {
	g.t.Helper()
	var err error
	switch o := obj.(type) {
	case *v1.ConfigMap:
		_, err = g.api.CoreV1().ConfigMaps(o.Namespace).Create(g.ctx, o, metav1.CreateOptions{})
	case *v1.Secret:
		_, err = g.api.CoreV1().Secrets(o.Namespace).Create(g.ctx, o, metav1.CreateOptions{})
	case *v1.Pod:
		if o.Namespace == "" {
			o.Namespace = "default"
		}
		o.Spec.NodeName = nodeName
		_, err = g.api.CoreV1().Pods(o.Namespace).Create(g.ctx, o, metav1.CreateOptions{})
	default:
		g.t.Fatalf("create %T: not supported", obj)
	}
	if err != nil {
		g.t.Fatalf("create %T: %v", obj, err)
	}
}

func (g *gateway) waitNodeReady(timeout time.Duration) {
	g.t.Helper()
	testenv.Eventually(g.t, timeout, "node "+nodeName+" Ready in the API", func() error {
		node, err := g.api.CoreV1().Nodes().Get(g.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", node.Status.Conditions)
	})
}

// resized returns the pod's first container's status once it reports the CPU and memory
// limits given and no resize is pending or in progress; an error saying what it reports
// until then.
func (g *gateway) resized(name, cpu, memory string) (v1.ContainerStatus, error) {
	p, err := g.apiPod(name)
	if err != nil {
		return v1.ContainerStatus{}, err
	}
	cs := p.Status.ContainerStatuses[0]
	if cs.Resources == nil || cs.Resources.Limits.Cpu().String() != cpu || cs.Resources.Limits.Memory().String() != memory {
		return cs, fmt.Errorf("status resources %+v", cs.Resources)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodResizePending || c.Type == v1.PodResizeInProgress {
			return cs, fmt.Errorf("condition %s %s: %s", c.Type, c.Reason, c.Message)
		}
	}
	return cs, nil
}

// apiPod returns pod default/name as the API shows it.
func (g *gateway) apiPod(name string) (*v1.Pod, error) {
	return g.api.CoreV1().Pods("default").Get(g.ctx, name, metav1.GetOptions{})
}

// waitAPIRunning waits until every named pod (namespace default) is Running with all its
// containers ready in the API.
func (g *gateway) waitAPIRunning(timeout time.Duration, names ...string) {
	g.t.Helper()
	testenv.Eventually(g.t, timeout, fmt.Sprintf("pods %v running and ready in the API", names), func() error {
		for _, name := range names {
			pod, err := g.apiPod(name)
			if err != nil {
				return err
			}
			if err := runningAndReady(pod.Status); err != nil {
				return fmt.Errorf("pod %s: %w", name, err)
			}
		}
		return nil
	})
}

func runningAndReady(st v1.PodStatus) error {
	if st.Phase != v1.PodRunning {
		return fmt.Errorf("phase %q (%s)", st.Phase, describe(st))
	}
	for _, cs := range st.ContainerStatuses {
		if cs.State.Running == nil || !cs.Ready {
			return fmt.Errorf("container %s not running and ready (%s)", cs.Name, describe(st))
		}
	}
	return nil
}

// describe is a pod status in a line, for failure messages.
func describe(st v1.PodStatus) string {
	var parts []string
	for _, cs := range append(slices.Clone(st.InitContainerStatuses), st.ContainerStatuses...) {
		state := "?"
		switch {
		case cs.State.Running != nil:
			state = "running"
		case cs.State.Waiting != nil:
			state = "waiting " + cs.State.Waiting.Reason + ": " + cs.State.Waiting.Message
		case cs.State.Terminated != nil:
			state = fmt.Sprintf("terminated %s exit %d", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		}
		parts = append(parts, fmt.Sprintf("%s %s ready=%v restarts=%d", cs.Name, state, cs.Ready, cs.RestartCount))
	}
	return fmt.Sprintf("%s %s [%s]", st.Phase, st.Reason, strings.Join(parts, "; "))
}

// localPods asks the guest's holdfast for its pods (/pods on its local API socket, no
// apiserver involved) and returns them with the guest's uptime when it asked: the time since
// power-on.
func (g *gateway) localPods() ([]status.PodView, time.Duration, error) {
	out, err := g.vm.SSH("cut -d' ' -f1 /proc/uptime && curl -sf --max-time 10 --unix-socket /var/lib/holdfast/api.sock http://holdfast/pods")
	if err != nil {
		return nil, 0, err
	}
	uptimeLine, body, _ := strings.Cut(out, "\n")
	seconds, err := strconv.ParseFloat(strings.TrimSpace(uptimeLine), 64)
	if err != nil {
		return nil, 0, fmt.Errorf("guest uptime %q: %w", uptimeLine, err)
	}
	var list v1.PodList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		return nil, 0, fmt.Errorf("decode /pods: %w", err)
	}
	pods := make([]status.PodView, 0, len(list.Items))
	for i := range list.Items {
		pods = append(pods, status.ViewOf(&list.Items[i]))
	}
	return pods, time.Duration(seconds * float64(time.Second)), nil
}

// waitLocalRunning waits until the guest's holdfast reports every named pod running and
// ready, and returns the guest's uptime when it first saw them so.
func (g *gateway) waitLocalRunning(timeout time.Duration, names ...string) time.Duration {
	g.t.Helper()
	var uptime time.Duration
	testenv.Eventually(g.t, timeout, fmt.Sprintf("pods %v running and ready on the gateway", names), func() error {
		pods, up, err := g.localPods()
		if err != nil {
			return err
		}
		for _, name := range names {
			i := slices.IndexFunc(pods, func(p status.PodView) bool { return p.Name == name })
			if i < 0 {
				return fmt.Errorf("pod %s unknown to the gateway", name)
			}
			if err := runningAndReady(pods[i].Status); err != nil {
				return fmt.Errorf("pod %s: %w", name, err)
			}
		}
		uptime = up
		return nil
	})
	return uptime
}

// Container is what guestprobe reports of one containerd container.
type Container struct {
	ID     string            `json:"id"`
	Labels map[string]string `json:"labels"`
	Task   string            `json:"task"`
	PID    uint32            `json:"pid"`
}

// The kubelet's labels, which containerd's CRI plugin puts on the containers it makes for
// holdfast's CRI backend, and the plugin's own label telling sandboxes from containers.
const (
	criLabelPodName       = "io.kubernetes.pod.name"
	criLabelContainerName = "io.kubernetes.container.name"
	criLabelKind          = "io.cri-containerd.kind"
)

// pod and container name a container by holdfast's labels (its containerd backend) or by the
// kubelet's (its CRI backend).
func (c Container) pod() string { return c.label(containerd.LabelPodName, criLabelPodName) }
func (c Container) container() string {
	return c.label(containerd.LabelContainerName, criLabelContainerName)
}

func (c Container) label(holdfast, cri string) string {
	if v, ok := c.Labels[holdfast]; ok {
		return v
	}
	return c.Labels[cri]
}

// sandbox says whether the container is a CRI pod sandbox (the pause container).
func (c Container) sandbox() bool { return c.Labels[criLabelKind] == "sandbox" }

// probeCommand is guestprobe's command line in the guest listing the backend's containers:
// holdfast's namespace, or the CRI plugin's.
func (g *gateway) probeCommand() string {
	if g.cri {
		return "/run/holdfast-payload/tools/guestprobe -namespace k8s.io"
	}
	return "/run/holdfast-payload/tools/guestprobe"
}

// containers lists holdfast's containers in the guest's containerd (guestprobe, from the
// payload disk), CRI sandboxes left out.
func (g *gateway) containers() []Container {
	g.t.Helper()
	var cs []Container
	testenv.Eventually(g.t, 2*time.Minute, "list the guest's containers", func() error {
		out, err := g.vm.SSH(g.probeCommand())
		if err != nil {
			return err
		}
		return json.Unmarshal([]byte(out), &cs)
	})
	return withoutSandboxes(cs)
}

// withoutSandboxes is cs less the CRI pod sandboxes.
func withoutSandboxes(cs []Container) []Container {
	return slices.DeleteFunc(cs, Container.sandbox)
}

// running returns the running containers by "pod/container", failing the test if one has
// two running tasks (started twice).
func (g *gateway) running() map[string]Container {
	g.t.Helper()
	out := map[string]Container{}
	for _, c := range g.containers() {
		if c.Task != "running" {
			continue
		}
		key := c.pod() + "/" + c.container()
		if prev, dup := out[key]; dup {
			g.t.Errorf("container %s runs twice: %s (pid %d) and %s (pid %d)", key, prev.ID, prev.PID, c.ID, c.PID)
		}
		out[key] = c
	}
	return out
}

// cgroupDir returns the cgroup v2 directory of the running container "pod/container" in the
// guest.
func (g *gateway) cgroupDir(key string) string {
	g.t.Helper()
	c, ok := g.running()[key]
	if !ok {
		g.t.Fatalf("%s is not running in containerd", key)
	}
	cgroup := strings.TrimSpace(g.vm.MustSSH(fmt.Sprintf("cat /proc/%d/cgroup", c.PID)))
	path, found := strings.CutPrefix(cgroup, "0::")
	if !found {
		g.t.Fatalf("%s's /proc/PID/cgroup is %q, want a single cgroup v2 line", key, cgroup)
	}
	return "/sys/fs/cgroup" + path
}

// podLog returns the current log of a container of pod default/name (CRI format, every
// attempt's file) in the guest.
func (g *gateway) podLog(pod, container string) string {
	g.t.Helper()
	out, err := g.vm.SSH(fmt.Sprintf("cat /var/log/pods/default_%s_*/%s/*.log 2>/dev/null || true", pod, container))
	if err != nil {
		g.t.Fatalf("read log of %s/%s: %v", pod, container, err)
	}
	return out
}

// figure records a measured figure in the test log and in -gateway.figures.
func figure(t *testing.T, name string, value time.Duration, note string) {
	t.Helper()
	line := fmt.Sprintf("%s\t%s\t%s\t%s", time.Now().UTC().Format(time.RFC3339), name, value.Round(100*time.Millisecond), note)
	t.Logf("FIGURE %s", line)
	if *figuresPath == "" {
		return
	}
	f, err := os.OpenFile(*figuresPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("record figure: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

// deletePod deletes default/name with the given grace period.
func (g *gateway) deletePod(name string) {
	g.t.Helper()
	if err := g.api.CoreV1().Pods("default").Delete(g.ctx, name, metav1.DeleteOptions{}); err != nil {
		g.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// waitPodGone waits until default/name is gone from the API.
func (g *gateway) waitPodGone(timeout time.Duration, name string) {
	g.t.Helper()
	testenv.Eventually(g.t, timeout, "pod "+name+" gone from the API", func() error {
		_, err := g.apiPod(name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return errors.New("still there")
	})
}
