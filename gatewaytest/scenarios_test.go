package gatewaytest

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// Scenario 1: pods as users write them run; resource limits and OOMKilled are right under
// cgroup v2.
func TestScenario1PodsAsUsersWriteThem(t *testing.T) {
	g := startGateway(t)
	if fs := strings.TrimSpace(g.vm.MustSSH("stat -fc %T /sys/fs/cgroup")); fs != "cgroup2fs" {
		t.Fatalf("the guest's /sys/fs/cgroup is %s, want cgroup2fs (the unified hierarchy)", fs)
	}
	g.create(appConfig())
	g.create(appSecret())
	g.create(appPod("app"))
	g.create(limitedPod("limited"))
	g.create(oomPod("oom"))
	g.waitAPIRunning(podTimeout, append([]string{"app", "limited"}, staticPods...)...)

	t.Run("configuration and token reach the container", func(t *testing.T) {
		log := g.podLog("app", "main")
		for _, want := range appLogWant {
			if !strings.Contains(log, want) {
				t.Errorf("app's log lacks %q:\n%s", want, log)
			}
		}
		if m := regexp.MustCompile(`token=(\d+) ca=(\d+)`).FindStringSubmatch(log); m == nil || m[1] == "0" || m[2] == "0" {
			t.Errorf("app's service-account token or CA is empty:\n%s", log)
		}
	})

	t.Run("limits are cgroup v2 settings", func(t *testing.T) {
		dir := g.cgroupDir("limited/main")
		if got := strings.TrimSpace(g.vm.MustSSH("cat " + dir + "/memory.max")); got != strconv.Itoa(64<<20) {
			t.Errorf("%s/memory.max = %s, want %d (64Mi)", dir, got, 64<<20)
		}
		if got := strings.TrimSpace(g.vm.MustSSH("cat " + dir + "/cpu.max")); got != "20000 100000" {
			t.Errorf("%s/cpu.max = %q, want \"20000 100000\" (200m)", dir, got)
		}
	})

	// What `kubectl top` and metrics-server read, measured from the unified hierarchy: the
	// summary's CPU time lies between two readings of the container's cpu.stat, its working set
	// near memory.current less inactive_file, as the kubelet computes it.
	t.Run("stats match the cgroup v2 files", func(t *testing.T) {
		dir := g.cgroupDir("limited/main")
		read := func() (cpuNanos, workingSet uint64) {
			out := g.vm.MustSSH(fmt.Sprintf("cat %[1]s/cpu.stat %[1]s/memory.stat; echo memory.current $(cat %[1]s/memory.current)", dir))
			fields := map[string]uint64{}
			for _, line := range strings.Split(out, "\n") {
				if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
					if n, err := strconv.ParseUint(v, 10, 64); err == nil {
						fields[k] = n
					}
				}
			}
			if fields["memory.current"] > fields["inactive_file"] {
				workingSet = fields["memory.current"] - fields["inactive_file"]
			}
			return fields["usage_usec"] * 1000, workingSet
		}
		cpuBefore, wsBefore := read()
		raw := g.vm.MustSSH("/run/holdfast-payload/tools/guestprobe -stats")
		cpuAfter, wsAfter := read()
		var sum statsapi.Summary
		if err := json.Unmarshal([]byte(raw), &sum); err != nil {
			t.Fatalf("stats summary: %v\n%s", err, raw)
		}
		if sum.Node.CPU == nil || sum.Node.Memory == nil || sum.Node.Fs == nil {
			t.Errorf("node stats %+v", sum.Node)
		}
		var main *statsapi.ContainerStats
		for _, p := range sum.Pods {
			for i, c := range p.Containers {
				if p.PodRef.Name == "limited" && c.Name == "main" {
					main = &p.Containers[i]
				}
			}
		}
		if main == nil || main.CPU == nil || main.CPU.UsageCoreNanoSeconds == nil || main.Memory == nil || main.Memory.WorkingSetBytes == nil {
			t.Fatalf("limited/main's stats %+v in %s", main, raw)
		}
		if cpu := *main.CPU.UsageCoreNanoSeconds; cpu < cpuBefore || cpu > cpuAfter {
			t.Errorf("usageCoreNanoSeconds %d, cpu.stat's usage_usec gave %d before and %d after", cpu, cpuBefore, cpuAfter)
		}
		const slack = 2 << 20
		if ws := *main.Memory.WorkingSetBytes; ws == 0 || ws+slack < min(wsBefore, wsAfter) || ws > max(wsBefore, wsAfter)+slack {
			t.Errorf("workingSetBytes %d, the cgroup's %d before and %d after", ws, wsBefore, wsAfter)
		}
	})

	t.Run("OOMKilled", func(t *testing.T) {
		testenv.Eventually(t, podTimeout, "pod oom terminated OOMKilled in the API", func() error {
			pod, err := g.apiPod("oom")
			if err != nil {
				return err
			}
			if len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Terminated == nil {
				return fmt.Errorf("not terminated: %s", describe(pod.Status))
			}
			term := pod.Status.ContainerStatuses[0].State.Terminated
			if term.Reason != "OOMKilled" || term.ExitCode != 137 || pod.Status.Phase != v1.PodFailed {
				return fmt.Errorf("%s", describe(pod.Status))
			}
			return nil
		})
	})
}

// Scenario 2: a real reboot with the uplink cut brings every pod back, each with its data.
func TestScenario2OfflineReboot(t *testing.T) {
	g := startGateway(t)
	apiPods := []string{"app", "plain"}
	g.create(appConfig())
	g.create(appSecret())
	g.create(appPod("app"))
	g.create(sleeperPod("plain"))
	all := append(slices.Clone(apiPods), staticPods...)
	g.waitAPIRunning(podTimeout, all...)
	stamp := logStamp(t, g.podLog("app", "main"), "new")

	g.vm.SetUplink(false)
	g.vm.Reboot(bootTimeout)
	up := g.waitLocalRunning(podTimeout, all...)
	figure(t, "offline reboot: power-on to all pods running", up,
		fmt.Sprintf("%d pods (%d API, %d static), uplink down, %s", len(all), len(apiPods), len(staticPods), g.vm.Accel))

	log := g.podLog("app", "main")
	if got := logStamp(t, log, "kept"); got != stamp {
		t.Errorf("app's emptyDir stamp after the reboot = %q, want %q kept", got, stamp)
	}
	for _, want := range appLogWant {
		if !strings.Contains(log, want) {
			t.Errorf("app's log after the reboot lacks %q:\n%s", want, log)
		}
	}
	running := g.running()
	// Static pods' containers carry the pod's name on the node, NAME-NODE, as the mirror pod.
	for _, key := range []string{"app/main", "plain/main", "web-" + nodeName + "/server", "web-" + nodeName + "/checker",
		"uplink-monitor-" + nodeName + "/monitor"} {
		if _, ok := running[key]; !ok {
			t.Errorf("%s not running in containerd after the reboot", key)
		}
	}
}

// logStamp returns the emptyDir stamp the app's latest attempt logged as "stamp KIND X".
func logStamp(t *testing.T, log, kind string) string {
	t.Helper()
	m := regexp.MustCompile(`stamp `+kind+` (\S+)`).FindAllStringSubmatch(log, -1)
	if m == nil {
		t.Fatalf("no %q stamp in app's log:\n%s", kind, log)
	}
	return m[len(m)-1][1]
}

// Scenario 3: the uplink comes back after an offline reboot: the API matches reality, restart
// counts are right, nothing starts twice; a pod deleted in the API meanwhile is stopped then,
// and only it.
func TestScenario3UplinkBack(t *testing.T) {
	g := startGateway(t)
	apiPods := []string{"app", "plain", "doomed"}
	g.create(appConfig())
	g.create(appSecret())
	g.create(appPod("app"))
	g.create(sleeperPod("plain"))
	g.create(sleeperPod("doomed"))
	g.waitAPIRunning(podTimeout, append(slices.Clone(apiPods), staticPods...)...)
	restartsBefore := g.apiRestarts(apiPods...)

	g.vm.SetUplink(false)
	g.vm.Reboot(bootTimeout)
	g.waitLocalRunning(podTimeout, append(slices.Clone(apiPods), staticPods...)...)
	before := g.running()
	g.deletePod("doomed")

	g.vm.SetUplink(true)
	back := time.Now()
	kept := []string{"app", "plain"}
	testenv.Eventually(t, podTimeout, "the API matches the gateway", func() error {
		return g.apiMatchesGateway(append(slices.Clone(kept), staticPods...))
	})
	figure(t, "uplink back: API matches the gateway", time.Since(back), "after an offline reboot, "+g.vm.Accel)
	g.waitPodGone(podTimeout, "doomed")

	after := g.running()
	if c, ok := after["doomed/main"]; ok {
		t.Errorf("doomed/main still runs (%s) after its deletion reached the gateway", c.ID)
	}
	for key, c := range before {
		if strings.HasPrefix(key, "doomed/") {
			continue
		}
		if a, ok := after[key]; !ok || a.ID != c.ID || a.PID != c.PID {
			t.Errorf("%s: %s pid %d while offline, %s pid %d after the uplink came back: want it untouched", key, c.ID, c.PID, a.ID, a.PID)
		}
	}
	restartsAfter := g.apiRestarts(kept...)
	for key, n := range restartsAfter {
		// One restart per container: the reboot's, as the kubelet counts it.
		if want := restartsBefore[key] + 1; n != want {
			t.Errorf("%s restartCount %d after the reboot, want %d", key, n, want)
		}
		if attempt := after[key].Labels[runtime.LabelAttempt]; attempt != strconv.Itoa(int(n)) {
			t.Errorf("%s restartCount %d in the API, attempt %s in containerd", key, n, attempt)
		}
	}
}

// apiRestarts returns the restart count of every container of the named pods by "pod/container".
func (g *gateway) apiRestarts(names ...string) map[string]int32 {
	g.t.Helper()
	out := map[string]int32{}
	for _, name := range names {
		pod, err := g.apiPod(name)
		if err != nil {
			g.t.Fatal(err)
		}
		for _, cs := range pod.Status.ContainerStatuses {
			out[name+"/"+cs.Name] = cs.RestartCount
		}
	}
	return out
}

// apiMatchesGateway checks that the API shows each named pod as the gateway runs it: running
// and ready, the container IDs containerd runs, and the gateway's restart counts.
func (g *gateway) apiMatchesGateway(names []string) error {
	local, _, err := g.localPods()
	if err != nil {
		return err
	}
	running := g.running()
	for _, name := range names {
		pod, err := g.apiPod(name)
		if err != nil {
			return err
		}
		if err := runningAndReady(pod.Status); err != nil {
			return fmt.Errorf("pod %s in the API: %w", name, err)
		}
		i := slices.IndexFunc(local, func(p status.PodView) bool { return p.Name == name })
		if i < 0 {
			return fmt.Errorf("pod %s unknown to the gateway", name)
		}
		for _, cs := range pod.Status.ContainerStatuses {
			c, ok := running[name+"/"+cs.Name]
			if !ok {
				return fmt.Errorf("%s/%s not running in containerd", name, cs.Name)
			}
			if !strings.HasSuffix(cs.ContainerID, "://"+c.ID) {
				return fmt.Errorf("%s/%s: the API shows %s, containerd runs %s", name, cs.Name, cs.ContainerID, c.ID)
			}
			j := slices.IndexFunc(local[i].Status.ContainerStatuses, func(l v1.ContainerStatus) bool { return l.Name == cs.Name })
			if j < 0 || local[i].Status.ContainerStatuses[j].RestartCount != cs.RestartCount {
				return fmt.Errorf("%s/%s: restartCount %d in the API, not the gateway's", name, cs.Name, cs.RestartCount)
			}
		}
	}
	return nil
}

// Scenario 4: a power cut during pod churn, then a boot with the uplink down: the state
// database is consistent and nothing the gateway acknowledged is lost.
func TestScenario4PowerCutDuringChurn(t *testing.T) {
	g := startGateway(t)
	var keep []string
	for i := range 4 {
		name := fmt.Sprintf("keep-%d", i)
		g.create(sleeperPod(name))
		keep = append(keep, name)
	}
	g.waitAPIRunning(podTimeout, keep...)

	// Churn: create a pod every second and delete the one created three before, until the
	// power goes.
	stop := make(chan struct{})
	created := make(chan int, 100)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(created)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			pod := sleeperPod(fmt.Sprintf("churn-%d", i))
			pod.Namespace, pod.Spec.NodeName = "default", nodeName
			if _, err := g.api.CoreV1().Pods("default").Create(g.ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Errorf("churn: create %s: %v", pod.Name, err)
				return
			}
			if i >= 3 {
				_ = g.api.CoreV1().Pods("default").Delete(g.ctx, fmt.Sprintf("churn-%d", i-3), metav1.DeleteOptions{})
			}
			created <- i
		}
	}()
	// Let the churn run until the gateway has acknowledged some of it (pods it reported
	// Running, deletions it confirmed), then cut the power.
	testenv.Eventually(t, podTimeout, "churn acknowledged by the gateway", func() error {
		ack, gone := g.acknowledged()
		if len(ack) < len(keep)+2 || len(gone) < 2 {
			return fmt.Errorf("%d pods running, %d deletions confirmed", len(ack), len(gone))
		}
		return nil
	})
	ack, gone := g.acknowledged()
	g.vm.SetUplink(false)
	g.vm.PowerCut()
	close(stop)
	for range created {
	}
	wg.Wait()
	t.Logf("power cut with %d pods acknowledged running, %d deletions confirmed", len(ack), len(gone))

	g.vm.WaitSSH(bootTimeout)
	up := g.waitLocalRunning(podTimeout, ack...)
	figure(t, "power cut during churn: power-on to acknowledged pods running", up,
		fmt.Sprintf("%d pods, uplink down, %s", len(ack), g.vm.Accel))
	running := g.running()
	for _, name := range gone {
		if _, ok := running[name+"/main"]; ok {
			t.Errorf("pod %s runs again after the power cut; its deletion had been confirmed", name)
		}
	}
	if out := g.vm.MustSSH("ls /var/lib/holdfast"); strings.Contains(out, "corrupt") {
		t.Errorf("the state database was found corrupt after the power cut: /var/lib/holdfast holds\n%s", out)
	}
	journal := g.vm.MustSSH("journalctl -b --no-pager -u holdfast | grep -i 'state database' || true")
	if !strings.Contains(journal, "opened") || strings.Contains(journal, "quarantined") || strings.Contains(journal, "unusable") {
		t.Errorf("holdfast's state database after the power cut:\n%s", journal)
	}

	g.vm.SetUplink(true)
	testenv.Eventually(t, podTimeout, "the API matches the gateway after the power cut", func() error {
		pods, err := g.api.CoreV1().Pods("default").List(g.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var names []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		return g.apiMatchesGateway(names)
	})
}

// acknowledged returns the API pods (default namespace) the gateway reported Running, and the
// churn pods whose deletion it confirmed (gone from the API).
func (g *gateway) acknowledged() (running, gone []string) {
	g.t.Helper()
	pods, err := g.api.CoreV1().Pods("default").List(g.ctx, metav1.ListOptions{})
	if err != nil {
		g.t.Fatal(err)
	}
	present := map[string]bool{}
	for _, p := range pods.Items {
		present[p.Name] = true
		if p.DeletionTimestamp == nil && runningAndReady(p.Status) == nil {
			running = append(running, p.Name)
		}
	}
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("churn-%d", i)
		if present[name] {
			continue
		}
		// Created (a later one exists) and gone: confirmed.
		if present[fmt.Sprintf("churn-%d", i+1)] || present[fmt.Sprintf("churn-%d", i+2)] || present[fmt.Sprintf("churn-%d", i+3)] {
			gone = append(gone, name)
		}
	}
	return running, gone
}

// Scenario 5: the agent hangs (SIGSTOP): systemd's watchdog restarts it and the containers are
// untouched.
func TestScenario5WatchdogRestartsHungAgent(t *testing.T) {
	g := startGateway(t)
	g.create(sleeperPod("plain"))
	g.waitAPIRunning(podTimeout, append([]string{"plain"}, staticPods...)...)
	before := g.running()
	if wd := strings.TrimSpace(g.vm.MustSSH("systemctl show -p WatchdogUSec --value holdfast")); wd == "0" || wd == "infinity" || wd == "" {
		t.Errorf("holdfast.service has no watchdog (WatchdogUSec=%q): systemd cannot notice a hung agent", wd)
	}
	pid := g.mainPID()
	g.vm.MustSSH("kill -STOP " + pid)
	t.Cleanup(func() { _, _ = g.vm.SSH("kill -CONT " + pid) })

	testenv.Eventually(t, podTimeout, "systemd restarts the hung agent", func() error {
		if now := g.mainPID(); now == pid || now == "0" {
			return fmt.Errorf("MainPID %s (hung: %s)", now, pid)
		}
		return nil
	})
	g.waitNodeReady(podTimeout)
	after := g.running()
	for key, c := range before {
		if a, ok := after[key]; !ok || a.ID != c.ID || a.PID != c.PID {
			t.Errorf("%s: %s pid %d before, %s pid %d after the agent's restart: want it untouched", key, c.ID, c.PID, a.ID, a.PID)
		}
	}
}

func (g *gateway) mainPID() string {
	g.t.Helper()
	return strings.TrimSpace(g.vm.MustSSH("systemctl show -p MainPID --value holdfast"))
}

// agentUsage is what the agent uses, from /proc.
type agentUsage struct {
	PID          string
	RSSKiB       int
	Threads, FDs int
}

func (g *gateway) agentUsage() agentUsage {
	g.t.Helper()
	pid := g.mainPID()
	out := g.vm.MustSSH(fmt.Sprintf("awk '/^VmRSS:/ {print $2}' /proc/%[1]s/status; ls /proc/%[1]s/task | wc -l; ls /proc/%[1]s/fd | wc -l", pid))
	f := strings.Fields(out)
	if len(f) != 3 {
		g.t.Fatalf("agent usage: %q", out)
	}
	u := agentUsage{PID: pid}
	u.RSSKiB, _ = strconv.Atoi(f[0])
	u.Threads, _ = strconv.Atoi(f[1])
	u.FDs, _ = strconv.Atoi(f[2])
	return u
}

// Scenario 6: the uplink flaps every few seconds for minutes: no container is started twice,
// no pod killed, the agent's memory, threads and file descriptors stay flat.
func TestScenario6UplinkFlapping(t *testing.T) {
	g := startGateway(t)
	g.create(appConfig())
	g.create(appSecret())
	g.create(appPod("app"))
	names := []string{"app"}
	for i := range 3 {
		name := fmt.Sprintf("plain-%d", i)
		g.create(sleeperPod(name))
		names = append(names, name)
	}
	all := append(slices.Clone(names), staticPods...)
	g.waitAPIRunning(podTimeout, all...)
	before := g.running()
	restartsBefore := g.apiRestarts(names...)

	var warm agentUsage
	start := time.Now()
	ticker := time.NewTicker(3 * time.Second)
	defer ticker.Stop()
	up, flaps := true, 0
	for time.Since(start) < *flapFor {
		<-ticker.C
		up = !up
		g.vm.SetUplink(up)
		flaps++
		if warm.PID == "" && time.Since(start) > *flapFor/4 {
			warm = g.agentUsage() // after the first reconnects have sized the agent's buffers
		}
	}
	g.vm.SetUplink(true)
	end := g.agentUsage()
	t.Logf("%d flaps in %v; agent after a quarter: %+v, at the end: %+v", flaps, time.Since(start).Round(time.Second), warm, end)

	testenv.Eventually(t, podTimeout, "the API matches the gateway after the flapping", func() error {
		return g.apiMatchesGateway(all)
	})
	if end.PID != warm.PID {
		t.Errorf("the agent restarted while the uplink flapped (pid %s, then %s)", warm.PID, end.PID)
	}
	g.checkUntouched("the flapping", before, restartsBefore)
	// Flat: bounds wide enough for a GC cycle's noise, far below a leak per reconnect.
	if end.RSSKiB > warm.RSSKiB*3/2+8<<10 {
		t.Errorf("agent RSS grew from %d KiB to %d KiB over %d flaps", warm.RSSKiB, end.RSSKiB, flaps)
	}
	if end.Threads > warm.Threads+8 {
		t.Errorf("agent threads grew from %d to %d over %d flaps", warm.Threads, end.Threads, flaps)
	}
	if end.FDs > warm.FDs+16 {
		t.Errorf("agent file descriptors grew from %d to %d over %d flaps", warm.FDs, end.FDs, flaps)
	}
}

// checkUntouched checks that every container running before (g.running) still runs as the
// same container and process, that no other runs, and that the API's restart counts are those
// of before (g.apiRestarts): nothing was started twice or killed during what.
func (g *gateway) checkUntouched(what string, before map[string]Container, restartsBefore map[string]int32) {
	g.t.Helper()
	after := g.running()
	for key, c := range before {
		if a, ok := after[key]; !ok || a.ID != c.ID || a.PID != c.PID {
			g.t.Errorf("%s: %s pid %d before, %s pid %d after %s: want it untouched", key, c.ID, c.PID, a.ID, a.PID, what)
		}
	}
	if len(after) != len(before) {
		g.t.Errorf("%d containers running after %s, %d before", len(after), what, len(before))
	}
	pods := map[string]bool{}
	for key := range restartsBefore {
		pod, _, _ := strings.Cut(key, "/")
		pods[pod] = true
	}
	for key, n := range g.apiRestarts(slices.Sorted(maps.Keys(pods))...) {
		if n != restartsBefore[key] {
			g.t.Errorf("%s restartCount %d after %s, %d before", key, n, what, restartsBefore[key])
		}
	}
}

// Scenario 7: the uplink is bad rather than down, as a cellular or satellite link is: latency
// with jitter and loss (tc netem in the guest), then connections reset (TCP RSTs), then a
// blackhole that drops the agent's packets without an answer, so that its watches hang instead
// of failing. Pods created and deleted through the API over the bad link reach the gateway; the
// agent notices the blackhole within its timeouts; nothing already running is restarted or
// killed; and once the link is clean the API matches the gateway.
func TestScenario7BadLink(t *testing.T) {
	g := startGateway(t)
	g.create(appConfig())
	g.create(appSecret())
	g.create(appPod("app"))
	g.create(sleeperPod("plain"))
	names := []string{"app", "plain"}
	all := append(slices.Clone(names), staticPods...)
	g.waitAPIRunning(podTimeout, all...)
	before := g.running()
	restartsBefore := g.apiRestarts(names...)
	dev := g.uplinkDevice()
	toHost := "-d " + HostFromGuest

	// Latency and loss: a pod created and one deleted over the link still reach the gateway.
	g.vm.MustSSH("tc qdisc add dev " + dev + " root netem delay 300ms 100ms loss 10%")
	start := time.Now()
	g.create(sleeperPod("over-netem"))
	g.waitAPIRunning(podTimeout, "over-netem")
	figure(t, "bad link: pod Running in the API", time.Since(start), "netem 300±100 ms, 10% loss, "+g.vm.Accel)
	start = time.Now()
	g.deletePod("over-netem")
	g.waitPodGone(podTimeout, "over-netem")
	figure(t, "bad link: pod deleted and gone from the API", time.Since(start), "netem 300±100 ms, 10% loss, "+g.vm.Accel)
	// Worse: a second of latency and a quarter of the packets lost, for a minute.
	g.vm.MustSSH("tc qdisc change dev " + dev + " root netem delay 1000ms 500ms loss 25%")
	time.Sleep(time.Minute)
	// What netem did: the packets it held back and dropped, for the log.
	t.Logf("netem on %s: %s", dev, strings.Join(strings.Fields(g.vm.MustSSH("tc -s qdisc show dev "+dev)), " "))
	g.vm.MustSSH("tc qdisc del dev " + dev + " root")

	// Resets: every connection to the apiserver is answered by a RST, on and off.
	reset := "OUTPUT " + toHost + " -p tcp -j REJECT --reject-with tcp-reset"
	for range 6 {
		g.vm.MustSSH("iptables -I " + reset)
		time.Sleep(5 * time.Second)
		g.vm.MustSSH("iptables -D " + reset)
		time.Sleep(5 * time.Second)
	}

	// A blackhole: nothing answers, nothing fails fast.
	drop := "OUTPUT " + toHost + " -j DROP"
	g.vm.MustSSH("iptables -I " + drop)
	cut := time.Now()
	testenv.Eventually(t, 5*time.Minute, "the agent notices the blackhole", func() error {
		out, err := g.vm.SSH("curl -sf --max-time 10 --unix-socket /var/lib/holdfast/api.sock http://local/metrics" +
			" | awk '$1 == \"holdfast_apiserver_offline_seconds\" {print $2}'")
		if err != nil {
			return err
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(out), 64); err != nil || v <= 0 {
			return fmt.Errorf("holdfast_apiserver_offline_seconds %q", out)
		}
		return nil
	})
	figure(t, "bad link: agent notices a blackhole", time.Since(cut), g.vm.Accel)
	g.waitLocalRunning(podTimeout, all...)
	g.vm.MustSSH("iptables -D " + drop)
	repaired := time.Now()
	testenv.Eventually(t, podTimeout, "the API matches the gateway after the bad link", func() error {
		return g.apiMatchesGateway(all)
	})
	figure(t, "bad link: API matches the gateway after a blackhole", time.Since(repaired), g.vm.Accel)
	g.checkUntouched("the bad link", before, restartsBefore)
}

// uplinkDevice returns the name of the guest's uplink interface (the one with uplinkMAC).
func (g *gateway) uplinkDevice() string {
	g.t.Helper()
	out := g.vm.MustSSH("for d in /sys/class/net/*; do [ \"$(cat $d/address)\" = " + uplinkMAC + " ] && basename $d; done; true")
	dev := strings.TrimSpace(out)
	if dev == "" || strings.ContainsAny(dev, " \n") {
		g.t.Fatalf("the guest's uplink device (MAC %s): %q", uplinkMAC, out)
	}
	return dev
}
