package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/internal/procfs"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// podCommand is what every pod's one container runs, and the floor's container too.
var podCommand = []string{"sleep", "86400"}

// benchConfigMap is the ConfigMap every bench pod mounts.
const benchConfigMap = "holdfast-bench"

// benchPod is the pod spec every agent gets, as users write pods: one busybox container, image
// already present, pod network through the CNI bridge, the default service account's token
// (the API's ServiceAccount admission adds the projected volume: token, kube-root-ca.crt,
// namespace), a ConfigMap volume, the node's DNS, 1s grace.
func benchPod(name, node string) *v1.Pod {
	grace := int64(1)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "holdfast-bench"}},
		Spec: v1.PodSpec{
			NodeName: node,
			Containers: []v1.Container{{
				Name: "main", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: podCommand,
				VolumeMounts: []v1.VolumeMount{{Name: "config", MountPath: "/etc/bench", ReadOnly: true}},
			}},
			Volumes: []v1.Volume{{Name: "config", VolumeSource: v1.VolumeSource{
				ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: benchConfigMap}},
			}}},
			TerminationGracePeriodSeconds: &grace,
			DNSPolicy:                     v1.DNSDefault,
		},
	}
}

// createConfigMaps creates what the pods' volumes read: the bench's ConfigMap, and
// kube-root-ca.crt, which kube-controller-manager's root CA publisher would create in every
// namespace (none runs here) and every service account token volume projects.
func createConfigMaps(ctx context.Context, cp *testenv.ControlPlane) error {
	for _, cm := range []*v1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(cp.CAData())}},
		{ObjectMeta: metav1.ObjectMeta{Name: benchConfigMap}, Data: map[string]string{"greeting": "hello", "level": "info"}},
	} {
		if _, err := cp.Admin.CoreV1().ConfigMaps(metav1.NamespaceDefault).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ConfigMap %s: %w", cm.Name, err)
		}
	}
	return nil
}

// podTimeout bounds every wait for pods or a node: far above anything either agent needs on
// a loaded machine, so a stuck agent fails the run instead of hanging it.
const podTimeout = 3 * time.Minute

// Run measures holdfast, then holdfast on its CRI backend if opts.HoldfastCRI is set, then the
// kubelet if opts.KubeletPath is set, each in a subtest of t on a fresh containerd and CNI
// network, against one control plane; then the Wasm benchmarks. It returns the report, also
// written to opts.OutDir, and the policy figures of its Wasm benchmarks to the pages under
// opts.PolicyDocsRoot.
func Run(t *testing.T, opts Options) *Report {
	t.Helper()
	testenv.RequireIntegration(t)
	if err := opts.validate(); err != nil {
		t.Fatal(err)
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	rep := newReport(opts)
	if opts.OutDir != "" {
		if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	agents := []string{Holdfast}
	if opts.HoldfastCRI {
		agents = append(agents, HoldfastCRI)
	} else {
		rep.Notes = append(rep.Notes, "holdfast-cri (holdfast on its CRI backend) not measured (-bench.cri=false)")
	}
	if opts.KubeletPath != "" {
		agents = append(agents, Kubelet)
	} else {
		rep.Notes = append(rep.Notes, "kubelet not measured: no kubelet binary (hack/build-kubelet.sh builds it; `make bench` does)")
	}
	if opts.HoldfastProfile != "" {
		rep.Notes = append(rep.Notes, "holdfast (every backend measured) ran with uplinkProfile: "+opts.HoldfastProfile)
	}
	if opts.MemProfileRate != 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("holdfast (every backend measured) ran with GODEBUG=memprofilerate=%d: a finer heap profile, whose buckets its RSS includes", opts.MemProfileRate))
	}
	agents, err := agentOrder(agents, opts.OrderFile)
	if err != nil {
		t.Fatal(err)
	}
	rep.Notes = append(rep.Notes, "agents measured in this order (the reverse of the run before's): "+strings.Join(agents, ", "))
	var nodes []string
	for _, a := range agents {
		nodes = append(nodes, NodeName(a))
	}
	holdfastBin := buildHoldfast(t)
	// The apiserver's audit log counts the agents' requests (see Uplink).
	audit, auditLog, err := auditArgs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{Nodes: nodes, ExtraAPIServerArgs: audit})
	if err := createConfigMaps(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	for _, kind := range agents {
		res := &AgentResult{Agent: kind}
		rep.Agents = append(rep.Agents, res)
		bin := holdfastBin
		if kind == Kubelet {
			bin = opts.KubeletPath
		}
		t.Run(kind, func(t *testing.T) { runAgent(t, cp, auditLog, kind, bin, opts, res) })
	}
	if opts.WasmBenchtime != "" && opts.Only == "" {
		opts.Logf("wasm: go test -bench . -benchtime %s ./wasm/", opts.WasmBenchtime)
		rep.Wasm = runWasmBench(t, ".", opts.WasmBenchtime)
	}
	rep.finish()
	if opts.OutDir != "" {
		if err := rep.write(opts.OutDir); err != nil {
			t.Errorf("write results: %v", err)
		}
	}
	if opts.PolicyDocsRoot != "" && rep.Wasm != nil {
		if err := WritePolicyDocs(opts.PolicyDocsRoot, PolicyRun{Target: "make bench", Machine: rep.Machine, Wasm: rep.Wasm}); err != nil {
			t.Errorf("policy figures (%s, %s): %v", policyDocsPage, policyDocsReadme, err)
		}
	}
	return rep
}

// env is one agent's run: its containerd, network, process and watch.
type env struct {
	t     *testing.T
	opts  Options
	cp    *testenv.ControlPlane
	relay *relay // between the agent and the apiserver
	audit string // the apiserver's audit log
	cd    *testenv.Containerd
	cni   *testenv.CNINetwork
	agent *agentProc
	tr    *tracker
	ns    string // containerd namespace
	pods  podsClient
	res   *AgentResult
}

type podsClient = interface {
	Create(context.Context, *v1.Pod, metav1.CreateOptions) (*v1.Pod, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
}

func (e *env) logf(format string, args ...any) {
	e.opts.Logf(e.agent.kind+": "+format, args...)
}

func runAgent(t *testing.T, cp *testenv.ControlPlane, auditLog, kind, bin string, opts Options, res *AgentResult) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	cni := testenv.CNI(t)
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{EnableCRI: true, CNI: cni})
	ns := containerdNamespace(kind)
	cd.ImportTestImages(ctx, ns)
	cd.ImportTestImages(ctx, floorNamespace)

	if opts.Only == "" {
		measureFloors(t, cd, cni, kind, bin, opts, res)
	}

	dir := t.TempDir()
	rl := startRelay(t, cp.Host)
	kubeconfig := writeRelayKubeconfig(t, cp, NodeName(kind), rl)
	var a *agentProc
	if kind == Kubelet {
		a = newKubelet(t, dir, bin, kubeconfig, cd)
	} else {
		a = newHoldfast(t, kind, dir, bin, kubeconfig, opts.HoldfastProfile, cd, cni)
		if opts.MemProfileRate != 0 {
			a.proc.SetEnv(fmt.Sprintf("GODEBUG=memprofilerate=%d", opts.MemProfileRate))
		}
	}
	if fi, err := os.Stat(a.bin); err == nil {
		res.BinaryMiB = float64(fi.Size()) / (1 << 20)
	}
	e := &env{t: t, opts: opts, cp: cp, relay: rl, audit: auditLog, cd: cd, cni: cni, agent: a, ns: ns, pods: cp.Admin.CoreV1().Pods(metav1.NamespaceDefault), res: res}
	// Runs before containerd's cleanup (cleanups run last-registered first): the agent
	// deletes what pods remain, as on a real node, then dies; whatever is left is removed
	// from the API and killed in containerd.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- last lines of %s's log ----\n%s", kind, a.proc.LogTail(80))
		}
		if !cp.Running() {
			cp.Start()
		}
		// The agent stops its own pods first, as it would on a real node; what is left after
		// that (the agent died, the run failed) is removed and killed here.
		if a.proc.Running() {
			if err := deleteNodePods(context.Background(), cp.Admin, a.node, nil); err != nil {
				t.Errorf("delete the pods of %s: %v", a.node, err)
			}
			deadline := time.Now().Add(time.Minute)
			for time.Now().Before(deadline) {
				tasks, err := runningTasks(context.Background(), cd, ns)
				left, lerr := nodePods(context.Background(), cp.Admin, a.node)
				if err != nil || lerr != nil || (len(tasks) == 0 && left == 0) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		if err := deleteNodePods(context.Background(), cp.Admin, a.node, new(int64)); err != nil {
			t.Errorf("delete the pods of %s: %v", a.node, err)
		}
		_ = a.proc.Stop(syscall.SIGKILL, 0)
		if opts.OutDir != "" {
			// The agent's log and configuration, to check what ran.
			copyFile(a.proc.LogPath(), filepath.Join(opts.OutDir, kind+".log"))
			copyFile(filepath.Join(dir, "config.yaml"), filepath.Join(opts.OutDir, kind+"-config.yaml"))
			copyFile(filepath.Join(dir, "kubelet-config.yaml"), filepath.Join(opts.OutDir, "kubelet-config.yaml"))
			if log := containerdLog(cd.Address); log != "" {
				copyFile(log, filepath.Join(opts.OutDir, "containerd-"+kind+".log"))
			}
		}
		if err := killLeftovers(context.Background(), cd, ns); err != nil {
			t.Errorf("kill what %s left running: %v", kind, err)
		}
		if err := testenv.UnmountUnder(dir); err != nil {
			t.Errorf("unmount under %s: %v", dir, err)
		}
	})
	tr, err := startTracker(ctx, cp.Admin, a.node)
	if err != nil {
		t.Fatal(err)
	}
	e.tr = tr

	start := time.Now()
	a.start(t)
	if _, err := tr.nodeReadyAfter(time.Time{}, podTimeout); err != nil {
		t.Fatal(err)
	}
	if n, err := cp.Admin.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{}); err == nil {
		res.Version = n.Status.NodeInfo.KubeletVersion
	}
	e.logf("node Ready %.1fs after start (%s)", time.Since(start).Seconds(), res.Version)
	res.FirstNodeReadyS = time.Since(start).Seconds()

	if opts.Only == OnlyFlash {
		e.logf("flash wear alone: %d pods at once", opts.Pods)
		_, names := e.burst(0)
		res.Flash = e.flash(len(names))
		e.deleteAndDrain(names)
		return
	}

	// The latency pods are the churn: each created, started, deleted and gone, one after the
	// other, while the uplink is counted.
	churn := e.relay.mark()
	res.StartPhasesMS = e.tracePhases("startup", false, func() { res.StartupMS = durationsMS(e.startupLatency()) })
	res.Churn = e.uplinkSince(churn, 0)
	res.ChurnPods = opts.LatencyPods
	var steadyPods []string
	for rep := range opts.Reps {
		var wall time.Duration
		var names []string
		phases := e.tracePhases("burst", false, func() { wall, names = e.burst(rep) })
		if rep == opts.Reps-1 {
			res.BurstPhasesMS = phases
		}
		res.BurstS = append(res.BurstS, wall.Seconds())
		if rep < opts.Reps-1 {
			e.deleteAndDrain(names)
		} else {
			steadyPods = names
		}
	}
	e.logf("steady state: settle %s, then measure %s with %d pods", opts.Settle, opts.Steady, len(steadyPods))
	time.Sleep(opts.Settle)
	res.Steady = e.steady(len(steadyPods))
	if opts.FlashWindow > 0 {
		res.Flash = e.flash(len(steadyPods))
		// The agent done with the flipping pod's deletion before it is killed.
		time.Sleep(opts.Settle)
	}
	for rep := range opts.Reps {
		res.Restarts = append(res.Restarts, e.restart(rep, steadyPods))
	}
	if isHoldfast(kind) && !opts.SkipOffline {
		var boot, floor time.Duration
		// The boot floor's loop restarts the containerd backend's containers, not the CRI
		// plugin's (see the note Report.finish adds).
		withFloor := kind == Holdfast
		res.BootPhasesMS = e.tracePhases("offline boot", true, func() { boot, floor = e.offlineBoot(steadyPods, withFloor) })
		res.OfflineBootS = append(res.OfflineBootS, boot.Seconds())
		if withFloor {
			res.BootFloorS = append(res.BootFloorS, floor.Seconds())
		}
	}
	e.deleteAndDrain(steadyPods)
}

// measureFloors measures the floors (1, the network floor, the burst floors) on the agent's
// containerd and CNI network, before the agent starts.
func measureFloors(t *testing.T, cd *testenv.Containerd, cni *testenv.CNINetwork, kind, bin string, opts Options, res *AgentResult) {
	opts.Logf("%s: floor, %d containers through the containerd client", kind, opts.LatencyPods)
	res.FloorMS = durationsMS(measureFloor(t, cd, opts.LatencyPods))
	opts.Logf("%s: network floor, %d CNI ADD and DEL in fresh network namespaces", kind, opts.LatencyPods)
	add, del := measureNetworkFloor(t, cni, opts.LatencyPods)
	res.NetworkAddMS, res.NetworkDelMS = durationsMS(add), durationsMS(del)
	for rep := range opts.Reps {
		took := measureBurstFloor(t, cd, opts.Pods, "")
		opts.Logf("%s: burst floor %d/%d: %d containers started at once in %.2fs", kind, rep+1, opts.Reps, opts.Pods, took.Seconds())
		res.BurstFloorS = append(res.BurstFloorS, took.Seconds())
		// holdfast's containerd backend only: on its CRI backend the runtime writes the logs.
		if kind == Holdfast {
			took := measureBurstFloor(t, cd, opts.Pods, installFloorLogger(t, bin))
			opts.Logf("%s: burst floor with holdfast's logger %d/%d: %d containers started at once in %.2fs", kind, rep+1, opts.Reps, opts.Pods, took.Seconds())
			res.LoggedBurstFloorS = append(res.LoggedBurstFloorS, took.Seconds())
		}
	}
}

// installFloorLogger makes the holdfast-logger built beside the agent at bin the container
// logger of this process (the harness runs no agent of its own) and returns a directory for
// the floor's logs.
func installFloorLogger(t testing.TB, bin string) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := logs.Install(logs.Config{StateDir: dir, Binary: filepath.Join(filepath.Dir(bin), logs.LoggerName)}); err != nil {
		t.Fatalf("burst floor with holdfast's logger: %v", err)
	}
	return filepath.Join(dir, "logs")
}

// startupLatency creates LatencyPods pods one after the other, each timed from just before
// Create to the watch event showing it Running and Ready, then deletes them.
func (e *env) startupLatency() []time.Duration {
	t := e.t
	e.logf("startup latency: %d pods one after the other", e.opts.LatencyPods)
	var out []time.Duration
	var names []string
	for i := range e.opts.LatencyPods {
		name := fmt.Sprintf("lat-%02d", i)
		start := time.Now()
		if _, err := e.pods.Create(context.Background(), benchPod(name, e.agent.node), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		at, err := e.tr.podsReadyAfter([]string{name}, start, podTimeout)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, at.Sub(start))
		names = append(names, name)
	}
	e.deleteAndDrain(names)
	return out
}

// burst creates Pods pods at once and returns the wall time until all are Running and Ready.
func (e *env) burst(rep int) (time.Duration, []string) {
	t := e.t
	e.logf("burst %d/%d: %d pods at once", rep+1, e.opts.Reps, e.opts.Pods)
	names := make([]string, e.opts.Pods)
	for i := range names {
		names[i] = fmt.Sprintf("burst%d-%02d", rep, i)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		wg.Go(func() {
			_, errs[i] = e.pods.Create(context.Background(), benchPod(name, e.agent.node), metav1.CreateOptions{})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	at, err := e.tr.podsReadyAfter(names, start, podTimeout)
	if err != nil {
		t.Fatal(err)
	}
	e.logf("burst %d/%d: all ready in %.2fs", rep+1, e.opts.Reps, at.Sub(start).Seconds())
	return at.Sub(start), names
}

// deleteAndDrain deletes the pods as a user would (graceful, the pods' 1s grace period),
// waits until the agent has finished them and removed them from the API, and until their
// containers are gone from containerd (the kubelet removes them in its container garbage
// collection, every minute), so the next measurement starts clean. (A forced deletion
// would leave the kubelet retrying status updates of pods that no longer exist for minutes,
// and bill that to its steady state.)
func (e *env) deleteAndDrain(names []string) {
	t := e.t
	for _, n := range names {
		if err := e.pods.Delete(context.Background(), n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := e.tr.podsGone(names, podTimeout); err != nil {
		t.Fatal(err)
	}
	gone := time.Since(start)
	if e.opts.FastDrain {
		waitNoTasks(t, e.cd, e.ns, podTimeout)
	} else {
		waitDrained(t, e.cd, e.ns, podTimeout)
	}
	drained := time.Since(start)
	if len(names) == e.opts.Pods {
		e.res.GoneS = append(e.res.GoneS, gone.Seconds())
		e.res.DrainS = append(e.res.DrainS, drained.Seconds())
	}
	e.logf("%d pods deleted: gone from the API after %.1fs, their containers from containerd after %.1fs", len(names), gone.Seconds(), drained.Seconds())
}

// steady samples the agent and the node's processes over the window.
func (e *env) steady(pods int) *Steady {
	t := e.t
	pid := e.agent.pid()
	if pid == 0 {
		t.Fatal("agent not running")
	}
	interval := min(2*time.Second, e.opts.Steady/3)
	np := findNodeProcs(e.cd.Address, isHelper)
	overhead := append([]int{pid}, np.overhead()...)
	logSize := func() int64 {
		fi, err := os.Stat(e.agent.proc.LogPath())
		if err != nil {
			return 0
		}
		return fi.Size()
	}

	read := func() (time.Time, procfs.Process, map[int]procfs.Process) {
		now := time.Now()
		agent, err := procfs.ReadProcess(pid, true)
		if err != nil {
			t.Fatalf("read the agent's /proc: %v", err)
		}
		set := map[int]procfs.Process{}
		for _, p := range overhead {
			if s, err := procfs.ReadProcess(p, true); err == nil {
				set[p] = s
			}
		}
		return now, agent, set
	}
	t0, a0, set0 := read()
	log0 := logSize()
	link0 := e.relay.mark()
	var rss, rssFile, rssAnon, pss []float64
	for {
		time.Sleep(interval)
		now, a, set := read()
		rss = append(rss, float64(a.RSS))
		rssFile = append(rssFile, float64(a.RSSFile))
		rssAnon = append(rssAnon, float64(a.RSSAnon))
		var sum uint64
		for _, s := range set {
			sum += s.PSS
		}
		pss = append(pss, float64(sum))
		if now.Sub(t0) >= e.opts.Steady {
			break
		}
	}
	t1, a1, set1 := read()
	log1 := logSize()
	uplink := e.uplinkSince(link0, e.opts.Uplink)
	window := t1.Sub(t0)
	perMin := 60 / window.Seconds()
	cores := func(ticks uint64) float64 { return float64(ticks) / procfs.ClockTicks / window.Seconds() }

	category := map[int]string{pid: "agent", np.containerd: "containerd"}
	for _, p := range np.shims {
		category[p] = "shims"
	}
	for _, p := range np.helpers {
		category[p] = "helpers"
	}
	breakdown := map[string]*Share{}
	var setTicks, setWrites uint64
	for p, s0 := range set0 {
		if s1, ok := set1[p]; ok && s1.StartTime == s0.StartTime {
			setTicks += s1.CPUTicks - s0.CPUTicks
			setWrites += s1.WriteBytes - s0.WriteBytes
			c := breakdown[category[p]]
			if c == nil {
				c = &Share{}
				breakdown[category[p]] = c
			}
			c.Processes++
			c.CPUMillicores += 1000 * cores(s1.CPUTicks-s0.CPUTicks)
			c.WriteKiBPerMin += float64(s1.WriteBytes-s0.WriteBytes) / 1024 * perMin
			c.PSSMiB += float64(s1.PSS) / (1 << 20)
		}
	}
	st := &Steady{
		WindowS:             window.Seconds(),
		Pods:                pods,
		AgentRSSMiB:         mean(rss) / (1 << 20),
		AgentRSSMaxMiB:      maxOf(rss) / (1 << 20),
		AgentRSSFileMiB:     mean(rssFile) / (1 << 20),
		AgentRSSAnonMiB:     mean(rssAnon) / (1 << 20),
		AgentCPUMillicores:  1000 * cores(a1.CPUTicks-a0.CPUTicks),
		AgentWriteKiBPerMin: float64(a1.WriteBytes-a0.WriteBytes) / 1024 * perMin,
		AgentLogKiBPerMin:   float64(log1-log0) / 1024 * perMin,
		NodePSSMiB:          mean(pss) / (1 << 20),
		NodeCPUMillicores:   1000 * cores(setTicks),
		NodeWriteKiBPerMin:  float64(setWrites) / 1024 * perMin,
		HelperProcesses:     len(np.helpers),
		Shims:               len(np.shims),
		ContainerdFound:     np.containerd != 0,
		WorkloadProcesses:   len(np.workload),
		Samples:             len(rss),
		Breakdown:           breakdown,
		Uplink:              uplink,
	}
	if isHoldfast(e.agent.kind) {
		m, err := memory(context.Background(), e.agent.kind, pid, e.agent.bin, e.agent.socket, e.opts.OutDir, e.opts.MemProfileRate)
		if err != nil {
			// An extra figure: the run's others stand without it.
			e.logf("steady: no memory breakdown: %v", err)
		} else {
			st.Memory = m
			e.logf("steady: memory: executable %.1f MiB, state db %.1f, other files %.1f, anonymous %.1f; Go heap live %.1f, in use %.1f, idle retained %.1f, stacks %.1f, GC metadata %.1f, profiler %.1f, other %.1f; %d goroutines",
				m.ExecutableMiB, m.StateDBMiB, m.OtherFilesMiB, m.AnonymousMiB, m.HeapLiveMiB, m.HeapInuseMiB, m.HeapIdleRetainedMiB, m.StacksMiB, m.GCMetadataMiB, m.ProfilingMiB, m.OtherRuntimeMiB, m.Goroutines)
		}
	}
	for k, v := range breakdown {
		e.logf("steady: %s (%d processes): CPU %.1f millicores, PSS %.1f MiB, writes %.1f KiB/min", k, v.Processes, v.CPUMillicores, v.PSSMiB, v.WriteKiBPerMin)
	}
	e.logf("steady: RSS %.1f MiB, CPU %.1f millicores, writes %.1f KiB/min (log %.1f); node overhead PSS %.1f MiB, CPU %.1f millicores, %d helpers, %d shims",
		st.AgentRSSMiB, st.AgentCPUMillicores, st.AgentWriteKiBPerMin, st.AgentLogKiBPerMin, st.NodePSSMiB, st.NodeCPUMillicores, st.HelperProcesses, st.Shims)
	return st
}

// uplinkSince waits until the uplink window that opened at m has lasted at least window,
// then returns what the agent exchanged with the apiserver in it: bytes from the relay,
// requests from the audit log.
func (e *env) uplinkSince(m uplinkMark, window time.Duration) *Uplink {
	if rest := window - time.Since(m.at); rest > 0 {
		time.Sleep(rest)
	}
	u := e.relay.since(m)
	reqs, err := countRequests(e.audit, "system:node:"+e.agent.node, m.at, m.at.Add(time.Duration(u.WindowS*float64(time.Second))))
	if err != nil {
		e.t.Fatal(err)
	}
	u.Requests = reqs
	e.logf("uplink: %.0fs, %d bytes up, %d down (%.2f and %.2f MB/day), %d connections opened, %d open; requests: %s",
		u.WindowS, u.UpBytes, u.DownBytes, u.PerDay(u.UpBytes)/1e6, u.PerDay(u.DownBytes)/1e6, u.ConnectionsOpened, u.ConnectionsOpen,
		strings.Join(sortedRequests(reqs), ", "))
	return u
}

// restart kills the agent with SIGKILL, does to the node what the node lifecycle controller
// does to a node that stopped posting status (Node conditions Unknown, every pod's Ready
// condition False), starts the agent again and times the recovery.
func (e *env) restart(rep int, names []string) Restart {
	t := e.t
	ctx := context.Background()
	e.logf("restart %d/%d: kill -9 with %d pods running", rep+1, e.opts.Reps, len(names))
	before, err := runningTasks(ctx, e.cd, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	e.agent.kill(t)
	if err := markNodeLost(ctx, e.cp.Admin, e.agent.node, names); err != nil {
		t.Fatal(err)
	}
	if err := e.tr.nodeNotReady(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.tr.podsNotReady(names, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, mark := e.tr.nodeConditionsSince(0)
	start := time.Now()
	e.agent.start(t)
	nodeAt, err := e.tr.nodeReadyAfter(start, podTimeout)
	if err != nil {
		t.Fatal(err)
	}
	podsAt, err := e.tr.podsReadyAfter(names, start, podTimeout)
	if err != nil {
		t.Fatal(err)
	}
	// Let anything the agent does after reporting ready (a late restart) happen before
	// containerd is asked.
	time.Sleep(min(5*time.Second, max(e.opts.Settle, time.Second)))
	after, err := runningTasks(ctx, e.cd, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	r := Restart{
		NodeReadyS:          nodeAt.Sub(start).Seconds(),
		PodsReadyS:          podsAt.Sub(start).Seconds(),
		ContainersRestarted: restartedTasks(before, after),
		TasksBefore:         len(before),
	}
	conds, _ := e.tr.nodeConditionsSince(mark)
	e.logf("restart %d/%d: the Node's Ready condition after the start: %s", rep+1, e.opts.Reps, strings.Join(conds, " | "))
	e.logf("restart %d/%d: node Ready %.2fs, all pods Ready %.2fs, %d of %d tasks restarted",
		rep+1, e.opts.Reps, r.NodeReadyS, r.PodsReadyS, r.ContainersRestarted, len(before))
	return r
}

// markNodeLost sets what kube-controller-manager's node lifecycle controller sets when a node
// stops renewing its Lease past the grace period: every Node condition Unknown, and the Ready
// condition of every pod on it False. No controller-manager runs here; without this an
// agent's restart would leave nothing visible to recover.
func markNodeLost(ctx context.Context, c kubernetes.Interface, node string, pods []string) error {
	now := metav1.Now()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range n.Status.Conditions {
			cond := &n.Status.Conditions[i]
			cond.Status, cond.Reason, cond.Message = v1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status."
			cond.LastTransitionTime = now
		}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("mark node %s Unknown: %w", node, err)
	}
	for _, name := range pods {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := c.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for i := range p.Status.Conditions {
				if cond := &p.Status.Conditions[i]; cond.Type == v1.PodReady {
					cond.Status, cond.LastTransitionTime = v1.ConditionFalse, now
				}
			}
			_, err = c.CoreV1().Pods(metav1.NamespaceDefault).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("mark pod %s not ready: %w", name, err)
		}
	}
	return nil
}

// offlineBoot reboots the gateway with the apiserver out of reach: apiserver stopped, agent
// killed, containerd stopped as a reboot stops it (every task gone), the pods' network
// namespaces and volume tmpfs with it (they live on tmpfs on a real machine), then started
// again; the agent is timed from its start until it reports every pod Running and ready from
// its cache. With withFloor, before the agent starts, the boot floor is measured on the same
// reboot (measureBootFloor), then the node is rebooted again, so the agent boots as if the
// floor had not run. It returns the agent's boot and the floor (0 without it).
func (e *env) offlineBoot(names []string, withFloor bool) (boot, floor time.Duration) {
	t := e.t
	ctx := context.Background()
	e.logf("offline boot: apiserver down, reboot, %d cached pods", len(names))
	e.cp.Stop()
	e.agent.kill(t)
	e.reboot()
	if withFloor {
		var bf *bootFloor
		floor, bf = measureBootFloor(t, e.cd, e.cni, e.ns)
		if bf.tasks != len(names) {
			t.Errorf("boot floor: %d tasks started, want one per pod, %d", bf.tasks, len(names))
		}
		e.logf("boot floor: %d tasks (%d pod networks) started %.2fs after containerd answered", bf.tasks, len(bf.networks), floor.Seconds())
		if err := bf.teardown(ctx); err != nil {
			t.Fatal(err)
		}
		e.reboot()
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	start := time.Now()
	e.agent.start(t)
	var took time.Duration
	var last error
	for {
		pods, err := e.agent.localPods(ctx)
		if err == nil && localRunning(pods, want) == len(names) {
			took = time.Since(start)
			break
		}
		if err == nil {
			err = fmt.Errorf("%d of %d pods Running and ready", localRunning(pods, want), len(names))
		}
		last = err
		if time.Since(start) > podTimeout {
			t.Fatalf("offline boot: %v after %s", last, podTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The pods' containers, not the CRI plugin's sandboxes (holdfast-cri's pause containers).
	tasks, err := runningContainerTasks(ctx, e.cd, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	if tasks != len(names) {
		t.Errorf("offline boot: holdfast reports %d pods running, containerd runs %d containers' tasks", len(names), tasks)
	}
	e.logf("offline boot: %d pods running %.2fs after the agent started", len(names), took.Seconds())
	e.cp.Start()
	return took, floor
}

// reboot does to the node what a reboot does, with the agent down: containerd loses every task
// and its state, the agent's directory every mount (pod network namespaces, tmpfs volumes) and
// what was on them, the CRI plugin's sandboxes their network namespaces (bind mounts under
// /var/run/netns, a tmpfs on a real machine; found from the sandboxes' specs, since other
// containerd daemons on this machine keep theirs there too), and containerd starts again.
func (e *env) reboot() {
	t := e.t
	criNetNS, err := sandboxNetNS(context.Background(), e.cd, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	e.cd.Stop()
	if err := testenv.LoseVolatileState(e.agent.dir, filepath.Join(e.agent.dir, "netns")); err != nil {
		t.Fatal(err)
	}
	if err := removeNetNS(criNetNS); err != nil {
		t.Fatal(err)
	}
	e.cd.Start()
}

// deleteNodePods deletes every pod bound to node, with the given grace period (nil: the
// pod's own; 0: removed from the API at once).
func deleteNodePods(ctx context.Context, c kubernetes.Interface, node string, grace *int64) error {
	pods := c.CoreV1().Pods(metav1.NamespaceDefault)
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range list.Items {
		if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: grace}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// nodePods counts the pods bound to node in the API.
func nodePods(ctx context.Context, c kubernetes.Interface, node string) (int, error) {
	list, err := c.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return 0, err
	}
	return len(list.Items), nil
}

func durationsMS(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = millis(d)
	}
	return out
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func maxOf(xs []float64) float64 {
	var m float64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func copyFile(from, to string) {
	b, err := os.ReadFile(from)
	if err == nil {
		_ = os.WriteFile(to, b, 0o644)
	}
}

// agentOrder returns the agents in the order this run measures them: the reverse of the order
// the run before measured them in, which file keeps (none yet: the order given). The agent
// measured first warms the page cache and the image store for the others, the one measured
// last meets what the others left on the machine: alternating, no agent is always either.
func agentOrder(agents []string, file string) ([]string, error) {
	if file == "" {
		return agents, nil
	}
	order := slices.Clone(agents)
	if last, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(last)) == strings.Join(order, ",") {
		slices.Reverse(order)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read the last run's agent order: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return nil, fmt.Errorf("keep the agent order: %w", err)
	}
	if err := os.WriteFile(file, []byte(strings.Join(order, ",")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("keep the agent order: %w", err)
	}
	return order, nil
}
