package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/prereq"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// blackhole drops every packet to the apiserver's port with iptables, as a link that dies
// without a reset does (a cellular modem losing its carrier, a NAT entry gone): connections
// are not refused, requests and watches hang. It returns the function that repairs the link;
// the end of the test repairs it too.
func blackhole(t *testing.T, host string) (repair func()) {
	t.Helper()
	return cutLink(t, host, "DROP")
}

// cutLink cuts the link to the apiserver's port with an iptables target: DROP (a blackhole),
// or REJECT with TCP resets (a link that fails fast: a modem that resets, a NAT that knows
// the connection is gone). It returns the repair, also run at the end of the test.
func cutLink(t *testing.T, host, target string) (repair func()) {
	t.Helper()
	u, err := url.Parse(host)
	if err != nil {
		t.Fatal(err)
	}
	rule := []string{"INPUT", "-i", "lo", "-p", "tcp", "--dport", u.Port(), "-j", target}
	if target == "REJECT" {
		rule = append(rule, "--reject-with", "tcp-reset")
	}
	rule = append(rule, "-m", "comment", "--comment", "holdfast test link cut")
	if out, err := exec.Command("iptables", append([]string{"-I"}, rule...)...).CombinedOutput(); err != nil {
		prereq.NoError(t, fmt.Errorf("%w: %s", err, out), "iptables (root and netfilter) to cut the link")
	}
	done := false
	repair = func() {
		if done {
			return
		}
		done = true
		if out, err := exec.Command("iptables", append([]string{"-D"}, rule...)...).CombinedOutput(); err != nil {
			t.Errorf("remove the link cut rule: %v: %s", err, out)
		}
	}
	t.Cleanup(repair)
	return repair
}

// TestApiserverBlackhole: the link to the apiserver dies without a reset, so that requests and
// watches hang instead of failing. holdfast notices within its heartbeat timeouts (its
// /metrics says it is offline), keeps its pods running and restarting as they should, and
// once the link is repaired converges: the Node Ready again, the statuses in the API those of
// the gateway, no container started twice, no pod killed.
func TestApiserverBlackhole(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		c.Pods.BackOffBase = config.D(time.Second)
		c.Pods.BackOffMax = config.D(2 * time.Second)
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	crashy := sleeperPod("crashy", false)
	crashy.Spec.RestartPolicy = v1.RestartPolicyOnFailure
	crashy.Spec.Containers[0].Command = []string{"sh", "-c", "sleep 2; exit 3"}
	for _, p := range []*v1.Pod{sleeperPod("steady", false), crashy} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := e.waitAPIRunning(t, "steady")["steady"]

	repair := blackhole(t, e.cp.Host)
	cut := time.Now()
	// The admin client's requests would hang too: only the local socket is used from here on.
	testenv.Eventually(t, 3*time.Minute, "the agent notices the apiserver is out of reach", func() error {
		f, err := e.localMetrics(ctx)
		if err != nil {
			return err
		}
		if v, _ := f.Value("holdfast_apiserver_offline_seconds"); v <= 0 {
			return fmt.Errorf("holdfast_apiserver_offline_seconds = %v", v)
		}
		return nil
	})
	t.Logf("the agent noticed the blackhole after %s", time.Since(cut).Round(time.Second))
	var offlineRestarts int32
	testenv.Eventually(t, 60*time.Second, "crashy restarts while the link is dead", func() error {
		p, err := e.localPod("crashy")
		if err != nil {
			return err
		}
		if offlineRestarts = p.Status.ContainerStatuses[0].RestartCount; offlineRestarts < 3 {
			return fmt.Errorf("restartCount %d", offlineRestarts)
		}
		return nil
	})
	if p, err := e.localPod("steady"); err != nil || p.Status.ContainerStatuses[0].ContainerID != containerIDOf(before) {
		t.Fatalf("steady changed while the link was dead: %+v %v", p.Status.ContainerStatuses, err)
	}

	repair()
	repaired := time.Now()
	e.waitConverged(t, repaired, "steady", "crashy")
	t.Logf("converged %s after the repair", time.Since(repaired).Round(time.Second))
	e.checkUntouched(t, "steady", before)
}

// waitConverged waits, after the link to the apiserver was repaired at repaired, until the
// Lease is renewed again, the Node Ready, and the named pods' statuses in the API are those the
// gateway has (restart counts and container IDs).
func (e *env) waitConverged(t *testing.T, repaired time.Time, names ...string) {
	t.Helper()
	ctx := context.Background()
	testenv.Eventually(t, 3*time.Minute, "the Lease renewed again, the Node Ready", func() error {
		l, err := e.cp.Admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(repaired) {
			return fmt.Errorf("lease renewed at %v, the link repaired at %s", l.Spec.RenewTime, repaired.Format(time.RFC3339Nano))
		}
		n, err := e.cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", n.Status.Conditions)
	})
	testenv.Eventually(t, 2*time.Minute, "the statuses in the API those of the gateway", func() error {
		for _, name := range names {
			local, err := e.localPod(name)
			if err != nil {
				return err
			}
			api, err := e.cp.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(api.Status.ContainerStatuses) == 0 {
				return fmt.Errorf("%s: no container status in the API", name)
			}
			l, a := local.Status.ContainerStatuses[0], api.Status.ContainerStatuses[0]
			if l.RestartCount != a.RestartCount || l.ContainerID != a.ContainerID {
				return fmt.Errorf("%s: API restartCount %d container %s, gateway %d %s", name, a.RestartCount, a.ContainerID, l.RestartCount, l.ContainerID)
			}
		}
		return nil
	})
}

// checkUntouched checks that the pod name still runs the container it ran before (never
// restarted, never killed), and that no container of any pod runs twice.
func (e *env) checkUntouched(t *testing.T, name string, before *v1.Pod) {
	t.Helper()
	ctx := context.Background()
	pod, err := e.cp.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := pod.Status.ContainerStatuses[0]; cs.ContainerID != containerIDOf(before) || cs.RestartCount != 0 || pod.Status.Phase != v1.PodRunning {
		t.Errorf("%s was touched: phase %s, %+v", name, pod.Status.Phase, cs)
	}
	// No container twice: at most one running task per pod and container name.
	tasks, err := e.cd.RunningTasks(ctx, e.namespace())
	if err != nil {
		t.Fatal(err)
	}
	records := e.containers(t)
	perContainer := map[string]int{}
	for id := range tasks {
		if c, ok := records[id]; ok {
			perContainer[c.PodUID+"/"+c.Name]++
		}
	}
	for k, n := range perContainer {
		if n > 1 {
			t.Errorf("%d running tasks for %s: a container started twice", n, k)
		}
	}
	if perContainer[string(pod.UID)+"/main"] != 1 {
		t.Errorf("running containers %v: %s's is not among them", perContainer, name)
	}
}

// TestLinkFlapping: the link to the apiserver goes down and up again and again, alternately as
// a blackhole (packets dropped) and as resets, for random stretches of 5 to 40 s each way.
// After every repair the agent converges (Node Ready, statuses in the API those of the
// gateway), the steady pod is never touched, no container runs twice, and the agent's
// goroutines and open files stay flat across the flaps. Two flaps in `make test`;
// HOLDFAST_FLAP_DURATION (a Go duration) flaps for that long (`make soak`).
func TestLinkFlapping(t *testing.T) {
	duration := time.Duration(0)
	if v := os.Getenv("HOLDFAST_FLAP_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("HOLDFAST_FLAP_DURATION=%q: %v", v, err)
		}
		duration = d
	}
	e := startEnv(t, true, func(c *config.Config) {
		c.Pods.BackOffBase = config.D(time.Second)
		c.Pods.BackOffMax = config.D(2 * time.Second)
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	crashy := sleeperPod("crashy", false)
	crashy.Spec.RestartPolicy = v1.RestartPolicyOnFailure
	crashy.Spec.Containers[0].Command = []string{"sh", "-c", "sleep 5; exit 3"}
	for _, p := range []*v1.Pod{sleeperPod("steady", false), crashy} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := e.waitAPIRunning(t, "steady")["steady"]

	type sample struct {
		goroutines, fds, rssMiB, heapMiB float64
	}
	read := func() sample {
		f, err := e.localMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var s sample
		s.goroutines, _ = f.Value("go_goroutines")
		s.fds, _ = f.Value("process_open_fds")
		rss, _ := f.Value("process_resident_memory_bytes")
		s.rssMiB = rss / (1 << 20)
		heap, _ := f.Value("go_memstats_heap_inuse_bytes")
		s.heapMiB = heap / (1 << 20)
		return s
	}
	// settled is the least of each figure over a few seconds: what a flap leaves behind, not
	// what is in flight at one instant (the crashy pod's restart and its logger, an exec
	// probe, a connection being replaced), which made a single reading vary by 20 open files.
	settled := func() sample {
		s := read()
		for range 5 {
			time.Sleep(2 * time.Second)
			n := read()
			s.goroutines, s.fds = min(s.goroutines, n.goroutines), min(s.fds, n.fds)
			s.rssMiB, s.heapMiB = min(s.rssMiB, n.rssMiB), min(s.heapMiB, n.heapMiB)
		}
		return s
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	stretch := func() time.Duration { return 5*time.Second + time.Duration(rng.Int64N(int64(35*time.Second))) }
	var samples []sample
	began := time.Now()
	for flap := 0; flap < 2 || time.Since(began) < duration; flap++ {
		target := []string{"DROP", "REJECT"}[flap%2]
		repair := cutLink(t, e.cp.Host, target)
		down := stretch()
		time.Sleep(down)
		repair()
		repaired := time.Now()
		e.waitConverged(t, repaired, "steady", "crashy")
		if t.Failed() {
			return
		}
		s := settled()
		samples = append(samples, s)
		t.Logf("flap %d (%s for %s): converged %s after the repair; goroutines %.0f, open files %.0f, RSS %.1f MiB, Go heap in use %.1f MiB",
			flap+1, target, down.Round(time.Second), time.Since(repaired).Round(100*time.Millisecond), s.goroutines, s.fds, s.rssMiB, s.heapMiB)
		time.Sleep(stretch())
	}
	e.checkUntouched(t, "steady", before)

	// Flat: after the last flap no more goroutines or open files than after the first, but for
	// those a pod's restart or an exec probe may hold for a moment.
	first, last := samples[0], samples[len(samples)-1]
	if last.goroutines > first.goroutines+20 || last.fds > first.fds+10 {
		t.Errorf("after %d flaps: goroutines %.0f -> %.0f, open files %.0f -> %.0f: they grow with the flaps",
			len(samples), first.goroutines, last.goroutines, first.fds, last.fds)
		// Where they are, for whoever reads the failure.
		if b, err := testenv.LocalGet(ctx, e.agent.Config.LocalAPISocket, "/debug/pprof/goroutine?debug=1"); err == nil {
			t.Logf("the agent's goroutines:\n%.12000s", b)
		}
		if entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.agent.Pid())); err == nil {
			var targets []string
			for _, en := range entries {
				if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", e.agent.Pid(), en.Name())); err == nil {
					targets = append(targets, l)
				}
			}
			t.Logf("the agent's open files: %v", targets)
		}
	}
	t.Logf("%d flaps in %s: goroutines %.0f -> %.0f, open files %.0f -> %.0f, RSS %.1f -> %.1f MiB, Go heap in use %.1f -> %.1f MiB",
		len(samples), time.Since(began).Round(time.Second), first.goroutines, last.goroutines, first.fds, last.fds, first.rssMiB, last.rssMiB, first.heapMiB, last.heapMiB)
}
