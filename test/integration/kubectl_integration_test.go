package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/metrics/metricstest"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestKubectl: an operator's day on a holdfast node, with upstream kubectl (built from
// k8s.io/kubectl) through the real apiserver: logs (--previous, --tail, --since,
// --timestamps, --limit-bytes, -f), exec -i with stdin and exec -it on a terminal (size,
// exit code), attach (output, then -it into a container with stdin and tty, twice: a detach
// does not end its stdin), port-forward carrying an HTTP request, and `get --raw` of the
// node's stats summary and resource metrics, checked against the container's cgroup. Then,
// with the apiserver stopped, holdfast's own CLI: logs, exec -it, restart.
func TestKubectl(t *testing.T) {
	e := startNodeAPIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k := newKubectl(t, e)
	kubectlIn := k.Cmd
	kubectlCmd := func(args ...string) *exec.Cmd { return k.Cmd(ctx, args...) }
	kubectl := func(stdin string, args ...string) (string, error) { return k.Run(ctx, stdin, args...) }

	publishRootCA(t, e, "default")
	const image = "docker.io/holdfast/busybox:test"
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ops"},
		Spec: v1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Volumes:                       []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}},
			Containers: []v1.Container{
				counterContainer(),
				{
					// A line a second on stdout, its twin on stderr.
					Name: "ticker", Image: image,
					Command: []string{"sh", "-c", `i=0; while true; do i=$((i+1)); echo "tick $i"; echo "tock $i" >&2; sleep 1; done`},
				},
				{
					Name: "web", Image: image,
					Command: []string{"sh", "-c", `mkdir -p /www && echo "hello from the pod" > /www/index.html && exec httpd -f -p 8080 -h /www`},
				},
				{
					// kubectl run -it's kind of container: a shell waiting on its terminal.
					Name: "shell", Image: image, Stdin: true, TTY: true,
					Command: []string{"sh"},
				},
				{
					// stdinOnce: its stdin ends with the first attach. It ignores the hangup
					// that follows on its terminal, so that it stays to be attached to again.
					Name: "once", Image: image, Stdin: true, StdinOnce: true, TTY: true,
					Command: []string{"sh", "-c", `trap "" HUP; read line; echo "got $line"; exec sleep 3600`},
				},
				{
					// 48 MiB in its /dev/shm (tmpfs, charged to its memory cgroup), some CPU
					// burnt, then asleep.
					Name: "hog", Image: image,
					Command: []string{"sh", "-c", `head -c 50331648 /dev/zero > /dev/shm/fill; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; exec sleep 86399`},
				},
			},
		},
	}
	pods := e.cp.Admin.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 120*time.Second, "counter restarted once and every container running", func() error {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) != len(pod.Spec.Containers) {
			return fmt.Errorf("%d container statuses", len(p.Status.ContainerStatuses))
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				return fmt.Errorf("%s not running: %+v", cs.Name, cs.State)
			}
			if cs.Name == "counter" && cs.RestartCount < 1 {
				return fmt.Errorf("counter restartCount %d", cs.RestartCount)
			}
		}
		return nil
	})

	t.Run("logs", func(t *testing.T) {
		testenv.Eventually(t, 30*time.Second, "run 2's log", func() error {
			got, err := kubectl("", "logs", "ops", "-c", "counter")
			if err != nil {
				return err
			}
			if got != "run 2\nline 1\nline 2\nline 3\n" {
				return fmt.Errorf("log %q", got)
			}
			return nil
		})
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--previous"}, "run 1\nline 1\nline 2\nline 3\n"},
			{[]string{"--tail=2"}, "line 2\nline 3\n"},
			{[]string{"--limit-bytes=8"}, "run 2\nli"},
		} {
			if got, err := kubectl("", append([]string{"logs", "ops", "-c", "counter"}, tc.args...)...); err != nil || got != tc.want {
				t.Errorf("logs %v: %q, %v; want %q", tc.args, got, err, tc.want)
			}
		}
		got, err := kubectl("", "logs", "ops", "-c", "counter", "--timestamps", "--tail=1")
		if ts, rest, _ := strings.Cut(got, " "); err != nil || rest != "line 3\n" {
			t.Errorf("--timestamps: %q, %v", got, err)
		} else if _, perr := time.Parse(time.RFC3339Nano, ts); perr != nil {
			t.Errorf("--timestamps: %q: %v", got, perr)
		}

		// --since: the ticker has run for a while; the last 3 s hold a few of its lines,
		// never its first.
		testenv.Eventually(t, 60*time.Second, "ticker at 8 lines", func() error {
			got, err := kubectl("", "logs", "ops", "-c", "ticker")
			if err != nil {
				return err
			}
			if !strings.Contains(got, "tick 8\n") {
				return fmt.Errorf("ticker log %q", got)
			}
			return nil
		})
		all, err := kubectl("", "logs", "ops", "-c", "ticker")
		if err != nil {
			t.Fatal(err)
		}
		recent, err := kubectl("", "logs", "ops", "-c", "ticker", "--since=3s")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(all, "tick 1\n") || strings.Contains(recent, "tick 1\n") || !strings.Contains(recent, "tick ") || len(recent) >= len(all) {
			t.Errorf("--since=3s: %q of all %q", recent, all)
		}

		// -f: what is there, then what comes, until kubectl is stopped.
		cmd := kubectlCmd("logs", "-f", "ops", "-c", "ticker", "--tail=1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		lines := bufio.NewScanner(out)
		first := -1
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), "tock ") {
				continue // its stderr
			}
			n, err := strconv.Atoi(strings.TrimPrefix(lines.Text(), "tick "))
			if err != nil {
				t.Fatalf("logs -f: line %q", lines.Text())
			}
			if first < 0 {
				first = n
			} else if n != first+1 {
				t.Fatalf("logs -f: tick %d after tick %d", n, first)
			} else {
				break // a line written after kubectl started following
			}
		}
		if err := lines.Err(); err != nil || first < 0 {
			t.Fatalf("logs -f ended: %v", err)
		}
	})

	t.Run("exec", func(t *testing.T) {
		if got, err := kubectl("through stdin\n", "exec", "-i", "ops", "-c", "web", "--", "cat"); err != nil || got != "through stdin\n" {
			t.Errorf("exec -i cat: %q, %v", got, err)
		}
		_, err := kubectl("", "exec", "ops", "-c", "web", "--", "sh", "-c", "exit 3")
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
			t.Errorf("exec of exit 3: %v, want kubectl to exit 3", err)
		}

		// -it on a 40x100 terminal: the shell sees the size, runs what is typed, and its
		// exit code is kubectl's.
		term := testenv.StartTerminal(t, kubectlCmd("exec", "-it", "ops", "-c", "web", "--", "sh"), 40, 100)
		term.Type(t, e.sttySize()+"; echo $((6*7))-done\r")
		at := term.WaitFor(t, 0, "40 100", 60*time.Second)
		term.WaitFor(t, at, "42-done", 30*time.Second)
		term.Type(t, "exit 5\r")
		err = term.Cmd.Wait()
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 5 {
			t.Errorf("exec -it, exit 5: %v, want kubectl to exit 5; the screen:\n%s", err, term.Screen())
		}
	})

	t.Run("attach", func(t *testing.T) {
		// Output only: what the container writes from now on, stdout and stderr apart.
		cmd := kubectlCmd("attach", "ops", "-c", "ticker")
		var stderr testenv.SyncBuffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		if !lines.Scan() || !strings.HasPrefix(lines.Text(), "tick ") {
			t.Errorf("attach: first line %q, %v", lines.Text(), lines.Err())
		}
		testenv.Eventually(t, 30*time.Second, "stderr through attach", func() error {
			if !strings.Contains(stderr.String(), "tock ") {
				return fmt.Errorf("kubectl's stderr %q", stderr.String())
			}
			return nil
		})
		_ = cmd.Process.Kill()
		_ = cmd.Wait()

		// -it into the shell, twice: the first detach leaves its stdin open.
		for round := 1; round <= 2; round++ {
			term := testenv.StartTerminal(t, kubectlCmd("attach", "-it", "ops", "-c", "shell"), 40, 100)
			// kubectl says it is attached before the stream is up: type again until the shell
			// answers. Its answer ends in "\r\n", as on a terminal.
			want := fmt.Sprintf("attached-%d\r\n", 40+round)
			at := -1
			for try := 0; try < 12 && at < 0; try++ {
				term.Type(t, fmt.Sprintf("echo attached-$((40+%d))\r", round))
				for wait := 0; wait < 50 && at < 0; wait++ {
					if i := strings.Index(term.Screen(), want); i >= 0 {
						at = i + len(want)
					} else {
						time.Sleep(100 * time.Millisecond)
					}
				}
			}
			if at < 0 {
				t.Fatalf("attach -it, round %d: the shell never answered; the screen:\n%q", round, term.Screen())
			}
			term.Type(t, "stty size\r")
			term.WaitFor(t, at, "40 100", 30*time.Second)
			_ = term.Cmd.Process.Kill()
			_ = term.Cmd.Wait()
		}
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == "shell" && (cs.State.Running == nil || cs.RestartCount != 0) {
				t.Errorf("shell after two attaches: %+v, restarts %d: a detach ended its stdin", cs.State, cs.RestartCount)
			}
		}

		// stdinOnce: the first attach feeds it; once it is over, the stdin is closed and a
		// second attach -i is refused, saying why.
		term := testenv.StartTerminal(t, kubectlCmd("attach", "-it", "ops", "-c", "once"), 40, 100)
		answered := false
		for try := 0; try < 12 && !answered; try++ {
			term.Type(t, "hello\r")
			for wait := 0; wait < 50 && !answered; wait++ {
				if answered = strings.Contains(term.Screen(), "got hello\r\n"); !answered {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
		if !answered {
			t.Fatalf("attach -it to the stdinOnce container: no answer; the screen:\n%q", term.Screen())
		}
		_ = term.Cmd.Process.Kill()
		_ = term.Cmd.Wait()
		testenv.Eventually(t, 60*time.Second, "a second attach -i refused", func() error {
			tryCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			cmd := kubectlIn(tryCtx, "attach", "-i", "ops", "-c", "once")
			cmd.Stdin = strings.NewReader("again\n")
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "stdin is closed") {
				return fmt.Errorf("second attach: %v: %s", err, out)
			}
			return nil
		})
	})

	t.Run("port-forward", func(t *testing.T) {
		port := k.PortForward(t, ctx, "pod/ops", 8080)
		resp, err := http.Get("http://127.0.0.1:" + port + "/")
		if err != nil {
			t.Fatalf("GET through kubectl port-forward: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "hello from the pod\n" {
			t.Errorf("GET through kubectl port-forward: %s %q", resp.Status, body)
		}
	})

	t.Run("stats", func(t *testing.T) {
		// Found through the runtime, not by its argv: the other backend's run of this test may
		// have a hog of its own on the same machine.
		var hogID string
		if p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "hog" {
					hogID = strings.TrimPrefix(cs.ContainerID, "containerd://")
				}
			}
		}
		if hogID == "" {
			t.Fatal("no container ID for hog in the pod's status")
		}
		cg := findCgroup(t, e.taskPid(t, hogID))
		before := cg.read(t)
		raw, err := kubectl("", "get", "--raw", "/api/v1/nodes/"+node+"/proxy/stats/summary")
		if err != nil {
			t.Fatal(err)
		}
		after := cg.read(t)
		var sum statsapi.Summary
		if err := json.Unmarshal([]byte(raw), &sum); err != nil {
			t.Fatalf("summary: %v\n%s", err, raw)
		}
		var hog *statsapi.ContainerStats
		for _, p := range sum.Pods {
			for i, c := range p.Containers {
				if p.PodRef.Name == pod.Name && c.Name == "hog" {
					hog = &p.Containers[i]
				}
			}
		}
		if hog == nil || hog.CPU == nil || hog.CPU.UsageCoreNanoSeconds == nil || hog.Memory == nil || hog.Memory.WorkingSetBytes == nil {
			t.Fatalf("hog's stats %+v in %s", hog, raw)
		}
		// CPU time only grows: the summary's reading lies between the two of the cgroup.
		if cpu := *hog.CPU.UsageCoreNanoSeconds; cpu < before.cpuNanos || cpu > after.cpuNanos {
			t.Errorf("hog's usageCoreNanoSeconds %d, the cgroup's %d before and %d after", cpu, before.cpuNanos, after.cpuNanos)
		}
		// The working set holds the 48 MiB of /dev/shm and matches the cgroup's (usage less
		// inactive file pages, as the kubelet counts it) within what a sleeping shell moves.
		const slack = 2 << 20
		ws := *hog.Memory.WorkingSetBytes
		if ws < 48<<20 || ws+slack < min(before.workingSet, after.workingSet) || ws > max(before.workingSet, after.workingSet)+slack {
			t.Errorf("hog's workingSetBytes %d, the cgroup's %d before and %d after", ws, before.workingSet, after.workingSet)
		}

		raw, err = kubectl("", "get", "--raw", "/api/v1/nodes/"+node+"/proxy/metrics/resource")
		if err != nil {
			t.Fatal(err)
		}
		families, err := metricstest.Parse(strings.NewReader(raw))
		if err != nil {
			t.Fatalf("/metrics/resource: %v\n%s", err, raw)
		}
		sample := func(family, container string) (float64, bool) {
			return families.Value(family, "pod", pod.Name, "namespace", "default", "container", container)
		}
		if v, ok := sample("container_memory_working_set_bytes", "hog"); !ok || v < 48<<20 {
			t.Errorf("container_memory_working_set_bytes of hog: %v, %v", v, ok)
		}
		if v, ok := sample("container_cpu_usage_seconds_total", "hog"); !ok || v < float64(before.cpuNanos)/1e9 {
			t.Errorf("container_cpu_usage_seconds_total of hog: %v, %v; the cgroup had %d ns", v, ok, before.cpuNanos)
		}
		for _, name := range []string{"node_cpu_usage_seconds_total", "node_memory_working_set_bytes", "resource_scrape_error"} {
			if _, ok := families[name]; !ok {
				t.Errorf("/metrics/resource lacks %s", name)
			}
		}
	})

	// The cluster out of reach: the same operations with holdfast's CLI on the gateway, over
	// its local socket; a restart made then shows in the pod's status once the apiserver is
	// back.
	t.Run("apiserver stopped", func(t *testing.T) {
		before, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		webRestarts := func(p *v1.Pod) int32 {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "web" {
					return cs.RestartCount
				}
			}
			return -1
		}
		e.cp.Stop()
		socket := e.agent.Config.LocalAPISocket
		cli := func(args ...string) *exec.Cmd {
			return exec.CommandContext(ctx, e.agent.Binary(), append([]string{args[0], "--socket", socket}, args[1:]...)...)
		}
		if out, err := cli("logs", "ops", "-c", "counter", "--previous").CombinedOutput(); err != nil || string(out) != "run 1\nline 1\nline 2\nline 3\n" {
			t.Errorf("holdfast logs --previous: %q, %v", out, err)
		}
		term := testenv.StartTerminal(t, cli("exec", "-it", "ops", "-c", "web", "--", "sh"), 30, 90)
		term.Type(t, e.sttySize()+"; echo $((6*7))-offline\r")
		at := term.WaitFor(t, 0, "30 90", 60*time.Second)
		term.WaitFor(t, at, "42-offline", 30*time.Second)
		term.Type(t, "exit\r")
		if err := term.Cmd.Wait(); err != nil {
			t.Errorf("holdfast exec -it: %v; the screen:\n%s", err, term.Screen())
		}
		if out, err := cli("restart", "ops").CombinedOutput(); err != nil {
			t.Fatalf("holdfast restart: %q, %v", out, err)
		}
		e.cp.Start()
		testenv.Eventually(t, 120*time.Second, "the offline restart in the API", func() error {
			p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got, was := webRestarts(p), webRestarts(before); got <= was {
				return fmt.Errorf("web's restartCount %d, was %d", got, was)
			}
			return nil
		})
	})
}

// containerCgroup is where a container's process is accounted, read straight from the
// cgroup file system (v1 or v2), apart from holdfast's own reading of it.
type containerCgroup struct {
	v2       bool
	cpu, mem string // the directories of the cpuacct and memory controllers (v2: one)
}

type cgroupReading struct {
	cpuNanos   uint64
	workingSet uint64
}

// findCgroup returns the cgroup of process pid.
func findCgroup(t *testing.T, pid int) containerCgroup {
	t.Helper()
	path := filepath.Join("/proc", strconv.Itoa(pid), "cgroup")
	lines, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cg containerCgroup
	for _, line := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				return containerCgroup{v2: true, cpu: "/sys/fs/cgroup" + parts[2], mem: "/sys/fs/cgroup" + parts[2]}
			}
		case strings.Contains(","+parts[1]+",", ",cpuacct,"):
			cg.cpu = filepath.Join("/sys/fs/cgroup", parts[1], parts[2])
			if _, err := os.Stat(cg.cpu); err != nil {
				cg.cpu = filepath.Join("/sys/fs/cgroup/cpuacct", parts[2])
			}
		case parts[1] == "memory":
			cg.mem = filepath.Join("/sys/fs/cgroup/memory", parts[2])
		}
	}
	if cg.cpu == "" || cg.mem == "" {
		t.Fatalf("cgroups of %s: %s", path, lines)
	}
	return cg
}

func (cg containerCgroup) read(t *testing.T) cgroupReading {
	t.Helper()
	file := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	stat := func(path, key string) uint64 {
		for _, line := range strings.Split(file(path), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatalf("%s: %s: %v", path, line, err)
				}
				return n
			}
		}
		t.Fatalf("%s has no %s", path, key)
		return 0
	}
	number := func(path string) uint64 {
		n, err := strconv.ParseUint(file(path), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return n
	}
	var r cgroupReading
	var usage, inactive uint64
	if cg.v2 {
		r.cpuNanos = stat(filepath.Join(cg.cpu, "cpu.stat"), "usage_usec") * 1000
		usage, inactive = number(filepath.Join(cg.mem, "memory.current")), stat(filepath.Join(cg.mem, "memory.stat"), "inactive_file")
	} else {
		r.cpuNanos = number(filepath.Join(cg.cpu, "cpuacct.usage"))
		usage, inactive = number(filepath.Join(cg.mem, "memory.usage_in_bytes")), stat(filepath.Join(cg.mem, "memory.stat"), "total_inactive_file")
	}
	if inactive < usage {
		r.workingSet = usage - inactive
	}
	return r
}
