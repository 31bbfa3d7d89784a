package gateway

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/test/testenv"
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

	// The kubelet's hierarchy on the gateway's cgroup v2 (issue 29): the Guaranteed pod's
	// container below its pod's cgroup in kubepods itself, the pod's limits its container's
	// (ResourceConfigForPod), kubepods capped at the node allocatable.
	t.Run("pod and QoS cgroups", func(t *testing.T) {
		dir := g.cgroupDir("limited/main")
		p, err := g.apiPod("limited")
		if err != nil {
			t.Fatal(err)
		}
		podDir := "/sys/fs/cgroup/kubepods/pod" + string(p.UID)
		if path.Dir(dir) != podDir {
			t.Errorf("limited/main's cgroup is %s, want one below %s", dir, podDir)
		}
		if got := strings.TrimSpace(g.vm.MustSSH("cat " + podDir + "/memory.max")); got != strconv.Itoa(64<<20) {
			t.Errorf("%s/memory.max = %s, want %d (64Mi)", podDir, got, 64<<20)
		}
		if got := strings.TrimSpace(g.vm.MustSSH("cat " + podDir + "/cpu.max")); got != "20000 100000" {
			t.Errorf("%s/cpu.max = %q, want \"20000 100000\" (200m)", podDir, got)
		}
		if got := strings.TrimSpace(g.vm.MustSSH("cat /sys/fs/cgroup/kubepods/memory.max")); got == "max" {
			t.Errorf("kubepods/memory.max = max, want the node allocatable")
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
		if attempt := after[key].Labels[containerd.LabelAttempt]; attempt != strconv.Itoa(int(n)) {
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

// Scenario 8: the state key sealed by the gateway's TPM; the disk taken to another machine
// reads nothing. The gateway has a TPM 2.0 (a host swtpm per VM) and its configuration says
// stateKeyTPM: /dev/tpmrm0, its raw key removed as docs/security.md says, so the agent makes a
// key sealed by that TPM. A pod holds a password inline in its env and a Secret's value in
// its env. An offline reboot brings it back: the same TPM unseals the key. Then the disk is
// taken as a thief takes it, from the gateway switched off: its bytes hold neither value in
// the clear but in containerd's metadata (each container's OCI spec, env included, which
// docs/security.md leaves to an encrypted data partition, as with the kubelet), and booted on
// another machine (another TPM, the uplink cut) the agent cannot unseal the key, says so, and
// starts no container of the pod.
func TestScenario8StolenDiskReadsNothing(t *testing.T) {
	g := startGatewayWith(t, gatewayOptions{
		extraConfig: "stateKeyTPM: /dev/tpmrm0\n",
		tpmStateDir: filepath.Join(t.TempDir(), "tpm"),
	})
	if head := strings.TrimSpace(g.vm.MustSSH("head -n1 /etc/holdfast/state.key")); head != "holdfast state key sealed by TPM 2.0, v1" {
		t.Fatalf("/etc/holdfast/state.key begins with %q, want the key sealed by the TPM", head)
	}
	if journal := g.stateKeyLog(); !strings.Contains(journal, "new state key made and sealed by the TPM") {
		t.Fatalf("holdfast did not make a key sealed by the TPM at its first start:\n%s", journal)
	}
	// Values of this run alone: the base image cannot hold them, so any found on the disk
	// came from this gateway.
	inline, secret := "inline-password-"+rand.Text(), "secret-token-"+rand.Text()
	g.create(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "vault", Namespace: "default"},
		StringData: map[string]string{"token": secret}})
	g.create(passwordPod("sealed", inline, "vault"))
	all := append([]string{"sealed"}, staticPods...)
	g.waitAPIRunning(podTimeout, all...)
	saw := fmt.Sprintf("env inline=%s token=%s", passwordDigest(inline), passwordDigest(secret))
	if log := g.podLog("sealed", "main"); !strings.Contains(log, saw) {
		t.Fatalf("sealed's log lacks %q: the pod did not get its values:\n%s", saw, log)
	}

	// The gateway's own reboot, offline: the Secret comes from the store, sealed with the key
	// the same TPM unseals.
	g.vm.SetUplink(false)
	g.vm.Reboot(bootTimeout)
	up := g.waitLocalRunning(podTimeout, all...)
	figure(t, "offline reboot, state key sealed by the TPM: power-on to all pods running", up,
		fmt.Sprintf("%d pods (1 API with a Secret in env, %d static), uplink down, %s", len(all), len(staticPods), g.vm.Accel))
	if journal := g.stateKeyLog(); !strings.Contains(journal, "state key loaded") || !strings.Contains(journal, "sealedBy=/dev/tpmrm0") {
		t.Errorf("holdfast after the offline reboot, on its own TPM:\n%s", journal)
	}
	if n := strings.Count(g.podLog("sealed", "main"), saw); n < 2 {
		t.Errorf("sealed logged %q %d times, want once more after the offline reboot", saw, n)
	}

	// The thief's disk: taken from the gateway switched off, read raw. The pod's log line is
	// on it (a control: the scan reads what the guest wrote last); the values must not be, in
	// the clear or as the base64 of a Secret's data in JSON, but in containerd's metadata.
	g.vm.PowerOff(bootTimeout)
	disk := g.vm.CopyDisk()
	const control = "the pod's log line (control)"
	needles := map[string]string{
		"the inline env value":          inline,
		"the inline env value (base64)": strings.TrimRight(base64.StdEncoding.EncodeToString([]byte(inline)), "="),
		"the Secret's value":            secret,
		"the Secret's value (base64)":   strings.TrimRight(base64.StdEncoding.EncodeToString([]byte(secret)), "="),
		control:                         saw,
	}
	start := time.Now()
	onDisk, inMeta := diskCopies(t, disk, containerdMeta, needles)
	t.Logf("read the stolen disk raw in %v: copies on it %v, in containerd's metadata %v", time.Since(start).Round(time.Second), onDisk, inMeta)
	if onDisk[control] == 0 {
		t.Fatalf("the scan of the disk did not find the pod's log line %q: it does not read what the guest wrote", saw)
	}

	// The disk in another machine: another TPM, the uplink cut (the thief has no cluster).
	thief := &gateway{t: t, cp: g.cp, image: g.image, payload: g.payload, api: g.api, ctx: g.ctx}
	thief.vm = StartVM(t, g.image, VMOptions{Payload: g.payload, Disk: disk, UplinkDown: true,
		TPMStateDir: filepath.Join(t.TempDir(), "thief-tpm")})
	t.Cleanup(thief.dumpOnFailure)
	thief.vm.WaitSSH(bootTimeout)
	// The static pods run (their manifests are no secret): the agent is up and restored what
	// it could.
	thief.waitLocalRunning(podTimeout, staticPods...)

	t.Run("the agent cannot unseal the key", func(t *testing.T) {
		journal := thief.stateKeyLog()
		if !strings.Contains(journal, "state key unusable") || !strings.Contains(journal, "the TPM cannot unseal the state key") {
			t.Errorf("holdfast on another machine's TPM does not say the TPM cannot unseal its key:\n%s", journal)
		}
		if !strings.Contains(journal, "encrypted with a state key that is not loaded") {
			t.Errorf("holdfast on another machine's TPM does not say its state database's key is missing:\n%s", journal)
		}
		if strings.Contains(journal, "state key loaded") {
			t.Errorf("holdfast on another machine's TPM loaded a state key:\n%s", journal)
		}
	})

	t.Run("no container of the pod starts", func(t *testing.T) {
		// Past the restore, and a relist later.
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Second) {
			if c, ok := thief.running()["sealed/main"]; ok {
				t.Fatalf("sealed/main runs on the stolen disk (%s, pid %d): the pod was restored without its key", c.ID, c.PID)
			}
		}
		// Nor does the agent show it: its record does not open, and the last status the
		// outbox kept for it is not restored (it was shown Running and ready before).
		if pods, _, err := thief.localPods(); err != nil {
			t.Errorf("the pods on the stolen disk: %v", err)
		} else if i := slices.IndexFunc(pods, func(p status.PodView) bool { return p.Name == "sealed" }); i >= 0 {
			t.Errorf("the agent on the stolen disk shows pod sealed, which does not run, as %s", describe(pods[i].Status))
		}
	})

	t.Run("the state database holds neither value", func(t *testing.T) {
		// grep's status 1 is "none found", 2 an error (no such file).
		out := thief.vm.MustSSH(fmt.Sprintf("grep -caF -e %q -e %q /var/lib/holdfast/state.db; test $? -le 1", inline, secret))
		if n := strings.TrimSpace(out); n != "0" {
			t.Errorf("/var/lib/holdfast/state.db holds the inline env value or the Secret's value in the clear (%s lines)", n)
		}
	})

	t.Run("the disk holds neither value but in containerd's metadata", func(t *testing.T) {
		var outside []string
		for name := range needles {
			if n := onDisk[name] - inMeta[name]; name != control && n > 0 {
				outside = append(outside, fmt.Sprintf("%s (%d copies)", name, n))
			}
		}
		if len(outside) == 0 {
			return
		}
		slices.Sort(outside)
		// Where: files name the culprit; a copy in no file is in free blocks or the journal's.
		files, err := thief.vm.SSH(fmt.Sprintf("find /etc /var /root /home /opt /srv /tmp -xdev -type f -print0 | xargs -0 grep -laF -e %q -e %q; true", inline, secret))
		t.Errorf("the stolen disk holds, outside %s: %s; the files that hold a value in the clear now: %q (%v)",
			containerdMeta, strings.Join(outside, ", "), files, err)
	})
}

// stateKeyLog is what holdfast logged of its state key at this boot.
func (g *gateway) stateKeyLog() string {
	g.t.Helper()
	return g.vm.MustSSH("journalctl -b --no-pager -u holdfast | grep 'state key' || true")
}

// containerdMeta is containerd's metadata database on the gateway: it keeps each container's
// OCI spec, its environment included, in the clear (docs/security.md).
const containerdMeta = "/var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"

// diskCopies counts the copies of each needle on the qcow2 disk read raw, as whoever holds
// the disk finds them (in files, in free blocks, in the file system's journal), and those in
// the file at path of the disk's file system (ext4 on the whole disk, read with debugfs).
func diskCopies(t *testing.T, disk, path string, needles map[string]string) (onDisk, inFile map[string]int) {
	t.Helper()
	raw := filepath.Join(t.TempDir(), "disk.raw")
	run(t, "", "qemu-img", "convert", "-O", "raw", disk, raw)
	defer os.Remove(raw)
	f, err := os.Open(raw)
	if err != nil {
		t.Fatalf("read the disk: %v", err)
	}
	defer f.Close()
	onDisk = countCopies(t, f, needles)
	var stderr bytes.Buffer
	cmd := exec.Command("debugfs", "-R", "cat "+path, raw)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("debugfs cat %s: %v: %s", path, err, stderr.String())
	}
	return onDisk, countCopies(t, bytes.NewReader(out), needles)
}

// countCopies counts the copies of each needle in what r reads.
func countCopies(t *testing.T, r io.Reader, needles map[string]string) map[string]int {
	t.Helper()
	longest := 0
	for _, n := range needles {
		longest = max(longest, len(n))
	}
	// Chunks that overlap by the longest needle's length less one, so a needle across two is
	// seen; a copy that lies wholly in the overlap was counted in the chunk before.
	buf := make([]byte, 4<<20+longest)
	counts, carry := map[string]int{}, 0
	for {
		n, err := io.ReadFull(r, buf[carry:])
		chunk := buf[:carry+n]
		for name, needle := range needles {
			for at := 0; ; {
				i := bytes.Index(chunk[at:], []byte(needle))
				if i < 0 {
					break
				}
				if at+i+len(needle) > carry {
					counts[name]++
				}
				at += i + len(needle)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return counts
		}
		if err != nil {
			t.Fatalf("read the disk: %v", err)
		}
		carry = min(longest-1, len(chunk))
		copy(buf, chunk[len(chunk)-carry:])
	}
}

// Scenario 9 (issue 29): on the gateway's cgroup v2, a running pod's CPU and memory limits
// raised through pods/resize are applied to its container's and its pod's cgroups in place (no
// restart), and a pod without limits that eats memory is OOM-killed inside kubepods, capped at
// the node allocatable, while the agent, its Lease and the other pods carry on.
func TestScenario9ResizeAndAllocatable(t *testing.T) {
	// 1 GiB of guest memory less 700Mi reserved for the system and the agent leaves kubepods
	// about 280Mi: the firmware's static pods and these fit, the hog's 600 MiB does not, and
	// the guest (the agent, containerd, sshd) keeps what is reserved.
	g := startGatewayWith(t, gatewayOptions{extraConfig: "kubeReserved:\n  memory: 700Mi\n"})
	// The kubelet's cap: capacity less what is reserved; the hard eviction threshold stays
	// inside kubepods (it is the node's to act on before the kernel does).
	want := g.capacityMemory() - 700<<20
	if got := strings.TrimSpace(g.vm.MustSSH("cat /sys/fs/cgroup/kubepods/memory.max")); got != strconv.FormatInt(want, 10) {
		t.Fatalf("kubepods/memory.max = %s, want the node's capacity less kubeReserved, %d", got, want)
	}
	g.create(resizablePod("resizable"))
	g.create(sleeperPod("steady"))
	g.waitAPIRunning(podTimeout, "resizable", "steady")

	t.Run("resize applied in place", func(t *testing.T) {
		before := g.running()["resizable/main"]
		// Requests with the limits: a Guaranteed pod stays Guaranteed (the API refuses a
		// resize that changes the QoS class).
		g.resize("resizable", `{"limits":{"cpu":"400m","memory":"96Mi"},"requests":{"cpu":"400m","memory":"96Mi"}}`)
		testenv.Eventually(t, podTimeout, "the resize reported done", func() error {
			cs, err := g.resized("resizable", "400m", "96Mi")
			if err != nil {
				return err
			}
			if cs.RestartCount != 0 {
				t.Errorf("restartCount %d after a resize whose policy is NotRequired", cs.RestartCount)
			}
			return nil
		})
		after := g.running()["resizable/main"]
		if after.ID != before.ID || after.PID != before.PID {
			t.Errorf("container %s pid %d before the resize, %s pid %d after: want the same process", before.ID, before.PID, after.ID, after.PID)
		}
		dir := g.cgroupDir("resizable/main")
		for _, d := range []string{dir, path.Dir(dir)} {
			if got := strings.TrimSpace(g.vm.MustSSH("cat " + d + "/cpu.max")); got != "40000 100000" {
				t.Errorf("%s/cpu.max = %q, want \"40000 100000\" (400m)", d, got)
			}
			if got := strings.TrimSpace(g.vm.MustSSH("cat " + d + "/memory.max")); got != strconv.Itoa(96<<20) {
				t.Errorf("%s/memory.max = %s, want %d (96Mi)", d, got, 96<<20)
			}
		}
	})

	t.Run("a hog is OOM-killed inside kubepods", func(t *testing.T) {
		lease, err := g.api.CoordinationV1().Leases("kube-node-lease").Get(g.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		steady := g.running()["steady/main"]
		agentPID := g.mainPID()
		g.create(hogPod("hog"))
		testenv.Eventually(t, podTimeout, "the hog OOM-killed", func() error {
			p, err := g.apiPod("hog")
			if err != nil {
				return err
			}
			if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Terminated == nil {
				return fmt.Errorf("not terminated: %s", describe(p.Status))
			}
			if term := p.Status.ContainerStatuses[0].State.Terminated; term.Reason != "OOMKilled" || p.Status.Phase != v1.PodFailed {
				return fmt.Errorf("%s", describe(p.Status))
			}
			return nil
		})
		// The kill was kubepods' (its limit hit), not the guest's.
		if events := g.vm.MustSSH("cat /sys/fs/cgroup/kubepods/memory.events"); !regexp.MustCompile(`(?m)^oom_kill [1-9]`).MatchString(events) {
			t.Errorf("kubepods/memory.events shows no OOM kill:\n%s", events)
		}
		testenv.Eventually(t, podTimeout, "the Lease renewed after the OOM kill", func() error {
			l, err := g.api.CoordinationV1().Leases("kube-node-lease").Get(g.ctx, nodeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !l.Spec.RenewTime.After(lease.Spec.RenewTime.Time) {
				return fmt.Errorf("renewTime %s not after %s", l.Spec.RenewTime, lease.Spec.RenewTime)
			}
			return nil
		})
		if now := g.mainPID(); now != agentPID {
			t.Errorf("holdfast's MainPID %s after the OOM kill, %s before: the agent was restarted", now, agentPID)
		}
		if after, ok := g.running()["steady/main"]; !ok || after.ID != steady.ID || after.PID != steady.PID {
			t.Errorf("steady: %s pid %d before, %s pid %d after the OOM kill: want it untouched", steady.ID, steady.PID, after.ID, after.PID)
		}
	})
}

// capacityMemory is the node's memory capacity in the API, in bytes.
func (g *gateway) capacityMemory() int64 {
	g.t.Helper()
	node, err := g.api.CoreV1().Nodes().Get(g.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		g.t.Fatal(err)
	}
	return node.Status.Capacity.Memory().Value()
}

// resize patches the pod's container main through the pods/resize subresource, as kubectl
// patch --subresource resize does.
func (g *gateway) resize(name, resources string) {
	g.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"main","resources":%s}]}}`, resources)
	if _, err := g.api.CoreV1().Pods("default").Patch(g.ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize"); err != nil {
		g.t.Fatalf("resize %s: %v", name, err)
	}
}
