package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// containerdRestartPods is how many pods TestContainerdKilledRepeatedly runs: 8 in `make
// test`; HOLDFAST_CONTAINERD_RESTART_PODS=30 is the kubelet's node e2e figure (make soak).
func containerdRestartPods(t *testing.T) int {
	if v := os.Getenv("HOLDFAST_CONTAINERD_RESTART_PODS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HOLDFAST_CONTAINERD_RESTART_PODS=%q", v)
		}
		return n
	}
	return 8
}

// TestContainerdKilledRepeatedly is the kubelet's containerd restart test (node e2e "Restart
// [Serial] [Slow] [Disruptive] Container Runtime ... should recover"): with pods running,
// containerd is killed with SIGKILL six times in a row, each time started again. The shims and
// the containers outlive it, so holdfast must restart nothing: every container is the one
// from before (same ID, same process), restartCount 0, every pod Running and Ready in the API
// afterwards. Then a container's process is killed: the exit is still seen and the container
// restarted, so the agent follows the new daemon's events (or relists) after all that.
func TestContainerdKilledRepeatedly(t *testing.T) {
	n := containerdRestartPods(t)
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	var names []string
	for i := range n {
		name := fmt.Sprintf("steady-%d", i)
		names = append(names, name)
		if _, err := pods.Create(ctx, sleeperPod(name, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := e.waitAPIRunning(t, names...)
	pids := map[string]int{}
	for _, name := range names {
		pids[name] = e.taskPid(t, strings.TrimPrefix(containerIDOf(before[name]), "containerd://"))
	}

	for i := range 6 {
		e.cd.KillDaemon()
		// A moment without a daemon, as a crash loop under systemd's RestartSec has.
		time.Sleep(500 * time.Millisecond)
		e.cd.Start()
		t.Logf("containerd killed and started again (%d of 6)", i+1)
	}

	testenv.Eventually(t, 60*time.Second, "every pod as before in the API", func() error {
		for _, name := range names {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cs := p.Status.ContainerStatuses
			if p.Status.Phase != v1.PodRunning || len(cs) != 1 || !cs[0].Ready || cs[0].State.Running == nil {
				return fmt.Errorf("%s: phase %s, containers %+v", name, p.Status.Phase, cs)
			}
			if cs[0].RestartCount != 0 || cs[0].ContainerID != containerIDOf(before[name]) {
				return fmt.Errorf("%s: restarted: container %s (restarts %d), was %s", name, cs[0].ContainerID, cs[0].RestartCount, containerIDOf(before[name]))
			}
		}
		return nil
	})
	for _, name := range names {
		if pid := e.taskPid(t, strings.TrimPrefix(containerIDOf(before[name]), "containerd://")); pid != pids[name] {
			t.Errorf("%s: its process is %d, was %d", name, pid, pids[name])
		}
	}

	// The exit of a container is still seen after the restarts.
	victim := names[0]
	if err := syscall.Kill(pids[victim], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, victim+" restarted after its process was killed", func() error {
		p, err := pods.Get(ctx, victim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 1 || cs[0].State.Running == nil {
			return fmt.Errorf("containers %+v", cs)
		}
		return nil
	})
}
