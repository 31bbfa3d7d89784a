package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// The agents a fleet is made of.
const (
	// Holdfast: hollow holdfast nodes, all in one `holdfast hollow` process.
	Holdfast = "holdfast"
	// Kubemark: upstream's hollow kubelets, one kubemark process per node, as kubemark runs.
	Kubemark = "kubemark"
)

// Options sizes a run.
type Options struct {
	// Nodes is how many hollow nodes each agent's fleet has; PodsPerNode how many pods each
	// runs.
	Nodes, PodsPerNode int
	// Idle is the window over which the control plane is measured before any node starts.
	Idle time.Duration
	// Settle is how long the pods run before the window opens, so that it sees the fleet at
	// steady state rather than finishing its starts.
	Settle time.Duration
	// Window is the steady-state window.
	Window time.Duration
	// Agents are the fleets measured, in order (Holdfast, Kubemark).
	Agents []string
	// HoldfastPath and KubemarkPath are the binaries; HoldfastPath defaults to the test
	// environment's holdfast.
	HoldfastPath, KubemarkPath string
}

// Usage is what the control plane used over one window.
type Usage struct {
	Seconds float64 `json:"seconds"`
	// APIServerCores and EtcdCores are CPU seconds per second of the window.
	APIServerCores float64 `json:"apiserverCores"`
	EtcdCores      float64 `json:"etcdCores"`
	// The resident sets, mean and peak of samples every few seconds, in MiB.
	APIServerRSSMiB    float64 `json:"apiserverRSSMiB"`
	APIServerRSSMaxMiB float64 `json:"apiserverRSSMaxMiB"`
	EtcdRSSMiB         float64 `json:"etcdRSSMiB"`
	EtcdRSSMaxMiB      float64 `json:"etcdRSSMaxMiB"`
	// AgentsRSSMiB is the agents' processes' resident sets summed (mean): the simulation's
	// own cost on this machine, not a gateway's.
	AgentsRSSMiB float64 `json:"agentsRSSMiB"`
	// RequestsPerMinute are the apiserver's resource requests by "VERB resource[/subresource]"
	// (apiserver_request_total), every client together.
	RequestsPerMinute map[string]float64 `json:"requestsPerMinute"`
}

// TotalRequestsPerMinute sums RequestsPerMinute.
func (u Usage) TotalRequestsPerMinute() float64 {
	var sum float64
	for _, v := range u.RequestsPerMinute {
		sum += v
	}
	return sum
}

// Result is one agent's fleet.
type Result struct {
	Agent string `json:"agent"`
	Nodes int    `json:"nodes"`
	Pods  int    `json:"pods"`
	// ReadySeconds is from the agents' start to every node Ready; RunningSeconds from the
	// pods' creation to every pod Running.
	ReadySeconds   float64 `json:"readySeconds"`
	RunningSeconds float64 `json:"runningSeconds"`
	// Idle is the control plane before any node; Fleet during the steady window.
	Idle  Usage `json:"idle"`
	Fleet Usage `json:"fleet"`
}

// Run measures each agent's fleet in turn, each in a subtest with a control plane of its own.
func Run(t *testing.T, opts Options) []Result {
	t.Helper()
	if opts.Nodes < 1 || opts.PodsPerNode < 0 || opts.Window <= 0 {
		t.Fatalf("fleet options: %d nodes, %d pods per node, window %v", opts.Nodes, opts.PodsPerNode, opts.Window)
	}
	if opts.HoldfastPath == "" {
		opts.HoldfastPath = testenv.HoldfastBinary(t)
	}
	var results []Result
	for _, agent := range opts.Agents {
		t.Run(agent, func(t *testing.T) {
			results = append(results, runFleet(t, opts, agent))
		})
	}
	return results
}

// nodeNames names a fleet's nodes.
func nodeNames(agent string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%04d", agent, i)
	}
	return names
}

func runFleet(t *testing.T, opts Options, agent string) Result {
	names := nodeNames(agent, opts.Nodes)
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{Nodes: names})
	adminCfg := rest.CopyConfig(cp.AdminConfig)
	adminCfg.QPS, adminCfg.Burst = 200, 400 // the harness's own requests end before the window
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	res := Result{Agent: agent, Nodes: opts.Nodes, Pods: opts.Nodes * opts.PodsPerNode}
	ctx := t.Context()
	m := &meter{cp: cp, admin: admin}

	// Past the apiserver's start (its controllers' first syncs) before the idle window.
	sleep(t, opts.Settle)
	t.Logf("%s: the control plane alone for %v", agent, opts.Idle)
	if res.Idle, err = m.measure(ctx, opts.Idle, nil); err != nil {
		t.Fatalf("measure the idle control plane: %v", err)
	}

	start := time.Now()
	var agentPids func() []int
	switch agent {
	case Holdfast:
		agentPids = startHollowHoldfast(t, cp, opts.HoldfastPath, names)
	case Kubemark:
		agentPids = startKubemark(t, cp, opts.KubemarkPath, names)
	default:
		t.Fatalf("unknown agent %q", agent)
	}
	// Generous: a hundred agents start at once on a couple of cores.
	waitFor(t, 5*time.Minute+time.Duration(opts.Nodes)*3*time.Second, fmt.Sprintf("%d nodes Ready", opts.Nodes), func() (int, error) {
		return readyNodes(ctx, admin)
	}, opts.Nodes)
	res.ReadySeconds = time.Since(start).Seconds()
	t.Logf("%s: %d nodes Ready in %.0fs", agent, opts.Nodes, res.ReadySeconds)

	start = time.Now()
	if err := publishRootCA(ctx, admin, cp.CAData()); err != nil {
		t.Fatal(err)
	}
	if err := createPods(ctx, admin, names, opts.PodsPerNode); err != nil {
		t.Fatalf("create pods: %v", err)
	}
	waitFor(t, 5*time.Minute+time.Duration(res.Pods)*time.Second, fmt.Sprintf("%d pods Running", res.Pods), func() (int, error) {
		return runningPods(ctx, admin)
	}, res.Pods)
	res.RunningSeconds = time.Since(start).Seconds()
	t.Logf("%s: %d pods Running in %.0fs; settling for %v, then measuring for %v", agent, res.Pods, res.RunningSeconds, opts.Settle, opts.Window)

	sleep(t, opts.Settle)
	if res.Fleet, err = m.measure(ctx, opts.Window, agentPids); err != nil {
		t.Fatalf("measure the fleet: %v", err)
	}
	// Still all there at the end of the window: what was measured is a steady fleet.
	if n, err := readyNodes(ctx, admin); err != nil || n != opts.Nodes {
		t.Errorf("after the window: %d of %d nodes Ready (%v)", n, opts.Nodes, err)
	}
	return res
}

// sleep waits for d, or fails t when it ends first.
func sleep(t *testing.T, d time.Duration) {
	select {
	case <-time.After(d):
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
}

// startHollowHoldfast writes one configuration per node and runs them all in one `holdfast
// hollow` process, stopped when t ends. It returns the process's pid.
func startHollowHoldfast(t *testing.T, cp *testenv.ControlPlane, bin string, names []string) func() []int {
	dir := t.TempDir()
	args := []string{bin, "hollow", "--log-level=warn"}
	for _, name := range names {
		nodeDir := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(nodeDir, "manifests"), 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := config.Config{
			NodeName:        name,
			Kubeconfig:      cp.WriteNodeKubeconfig(name),
			StateDir:        filepath.Join(nodeDir, "state"),
			ManifestDir:     filepath.Join(nodeDir, "manifests"),
			PodLogDir:       filepath.Join(nodeDir, "pods"),
			PolicyDir:       filepath.Join(nodeDir, "policies"), // none
			ImagePreloadDir: "-",
			// The disk is the machine's, shared by every node and other tests: a node must
			// not refuse pods for a DiskPressure the simulation did not cause.
			EvictionHard: map[string]string{"nodefs.available": "1%", "imagefs.available": "1%"},
		}
		b, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(nodeDir, "config.yaml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, path)
	}
	proc := testenv.NewProcess("holdfast-hollow", filepath.Join(dir, "holdfast-hollow.log"), args...)
	t.Cleanup(func() {
		if err := proc.Stop(syscall.SIGTERM, time.Minute); err != nil {
			t.Errorf("stop holdfast hollow: %v", err)
		}
		if b, _ := os.ReadFile(proc.LogPath()); bytes.Contains(b, []byte("WARNING: DATA RACE")) {
			t.Errorf("data race in holdfast hollow (log %s):\n%s", proc.LogPath(), raceReports(b))
		}
	})
	if err := proc.Start(); err != nil {
		t.Fatalf("start holdfast hollow: %v", err)
	}
	return func() []int { return []int{proc.Pid()} }
}

// startKubemark runs one kubemark hollow kubelet per node, as kubemark does, each stopped
// when t ends, and returns their pids.
func startKubemark(t *testing.T, cp *testenv.ControlPlane, bin string, names []string) func() []int {
	if bin == "" {
		t.Fatal("no kubemark binary: build it with hack/build-kubemark.sh")
	}
	dir := t.TempDir()
	procs := make([]*testenv.Process, len(names))
	nextPort := 20000
	for i, name := range names {
		nodeDir := filepath.Join(dir, name)
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			t.Fatal(err)
		}
		port, err := freePort(&nextPort)
		if err != nil {
			t.Fatal(err)
		}
		// TMPDIR: the hollow kubelet makes its root directory there, and its fake runtime's
		// socket; each node's own, removed with the test's.
		procs[i] = testenv.NewProcess("kubemark-"+name, filepath.Join(nodeDir, "kubemark.log"),
			"env", "TMPDIR="+nodeDir, bin,
			"--morph=kubelet",
			"--name="+name,
			"--kubeconfig="+cp.WriteNodeKubeconfig(name),
			"--kubelet-port="+strconv.Itoa(port),
			"--kubelet-read-only-port=0",
			"--use-host-image-service=false",
		)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			if err := p.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Errorf("stop kubemark: %v", err)
			}
		}
	})
	for _, p := range procs {
		if err := p.Start(); err != nil {
			t.Fatalf("start kubemark: %v", err)
		}
	}
	return func() []int {
		pids := make([]int, 0, len(procs))
		for _, p := range procs {
			pids = append(pids, p.Pid())
		}
		return pids
	}
}

// freePort returns the first port from *next on that nothing listens on, and moves *next
// past it. Below the kernel's ephemeral range (32768 and up): a port the kernel handed out and
// took back would soon be another connection's source port, and a hundred kubelets starting
// at once make many connections (one of them took a node's port in the first 100-node run).
func freePort(next *int) (int, error) {
	for ; *next < 32768; *next++ {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(*next))
		if err != nil {
			continue
		}
		ln.Close()
		*next++
		return *next - 1, nil
	}
	return 0, fmt.Errorf("no free port below 32768")
}

// raceReports returns the race detector's reports in a log, the agents' lines around them
// left out.
func raceReports(log []byte) string {
	var out []string
	in := false
	for line := range strings.SplitSeq(string(log), "\n") {
		switch {
		case strings.HasPrefix(line, "WARNING: DATA RACE"):
			in = true
		case in && strings.HasPrefix(line, "=================="):
			in = false
			out = append(out, "----")
		}
		if in {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// createPods binds perNode pods to each node: a long-running container each, as a gateway's
// workloads, with the default service account's token mounted (both agents request and
// refresh it).
func createPods(ctx context.Context, admin kubernetes.Interface, names []string, perNode int) error {
	grace := int64(1)
	for _, node := range names {
		for i := range perNode {
			pod := &v1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-p%d", node, i), Labels: map[string]string{"app": "fleet"}},
				Spec: v1.PodSpec{
					NodeName:                      node,
					TerminationGracePeriodSeconds: &grace,
					Containers: []v1.Container{{
						Name:            "app",
						Image:           "busybox:1.36",
						Command:         []string{"sleep", "infinity"},
						ImagePullPolicy: v1.PullIfNotPresent,
					}},
				},
			}
			if _, err := admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create pod %s: %w", pod.Name, err)
			}
		}
	}
	return nil
}

// publishRootCA writes the ConfigMap kube-root-ca.crt into the pods' namespace, as the
// controller-manager's root-ca-cert-publisher does (none runs here): every pod's service
// account token volume projects it.
func publishRootCA(ctx context.Context, admin kubernetes.Interface, ca []byte) error {
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(ca)}}
	if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("publish kube-root-ca.crt: %w", err)
	}
	return nil
}

// readyNodes counts the fleet's nodes whose Ready condition is True.
func readyNodes(ctx context.Context, admin kubernetes.Interface) (int, error) {
	list, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, node := range list.Items {
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				n++
			}
		}
	}
	return n, nil
}

// runningPods counts the pods in phase Running.
func runningPods(ctx context.Context, admin kubernetes.Interface) (int, error) {
	list, err := admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range list.Items {
		if p.Status.Phase == v1.PodRunning {
			n++
		}
	}
	return n, nil
}

// waitFor polls count until it reaches want, failing t after timeout with the last count.
func waitFor(t *testing.T, timeout time.Duration, what string, count func() (int, error), want int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, err := count()
		if err == nil && n >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %d after %v (last error: %v)", what, n, timeout, err)
		}
		select {
		case <-time.After(2 * time.Second):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}
