package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestExitsFollowedThroughContainerdRestart: with the periodic relist out of the way (an
// hour), a container's exit still reaches its pod through containerd's task events, and so
// does one that happens while containerd itself is down (shims and containers keep running):
// the agent notices the broken subscription, subscribes again once containerd is back, and
// relists to learn what it missed (a successful relist after containerd is back: with the
// hour-long period, only that one). Each exit shows as a restart of the container.
func TestExitsFollowedThroughContainerdRestart(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.Pods.RelistPeriod = config.D(time.Hour)
		c.Pods.RelistThreshold = config.D(2 * time.Hour)
	})
	ctx := context.Background()
	if _, err := e.cp.Admin.CoreV1().Pods("default").Create(ctx, sleeperPod("follow", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLocalRunning(t, "follow")

	// running waits for the container to run after restarts restarts and returns its process.
	running := func(restarts int32) (id string, pid int) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, fmt.Sprintf("follow running after %d restarts", restarts), func() error {
			p, err := e.localPod("follow")
			if err != nil {
				return err
			}
			if len(p.Status.ContainerStatuses) != 1 {
				return fmt.Errorf("statuses %+v", p.Status.ContainerStatuses)
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.State.Running == nil || cs.RestartCount != restarts {
				return fmt.Errorf("state %+v, restarts %d", cs.State, cs.RestartCount)
			}
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
			return nil
		})
		return id, e.taskPid(t, id)
	}
	kill := func(pid int) {
		t.Helper()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	restartedAfter := func(what string, restarts int32, killed string) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, "follow restarted after "+what, func() error {
			p, err := e.localPod("follow")
			if err != nil {
				return err
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.RestartCount < restarts || cs.LastTerminationState.Terminated == nil ||
				strings.TrimPrefix(cs.LastTerminationState.Terminated.ContainerID, "containerd://") != killed {
				return fmt.Errorf("restarts %d, last termination %+v", cs.RestartCount, cs.LastTerminationState)
			}
			if cs.LastTerminationState.Terminated.ExitCode != 128+int32(syscall.SIGKILL) {
				return fmt.Errorf("exit code %d, want %d", cs.LastTerminationState.Terminated.ExitCode, 128+int32(syscall.SIGKILL))
			}
			return nil
		})
	}

	id, pid := running(0)
	kill(pid)
	restartedAfter("an exit with containerd up", 1, id)

	// Containerd stops (shims and tasks keep running); the container exits meanwhile.
	id, pid = running(1)
	relisted := e.successfulRelists(t)
	e.cd.StopDaemon()
	kill(pid)
	// Not a wait for a condition: the exit must happen long enough before containerd is back
	// for the shim to give up publishing it (its publisher retries for 1+2+...+6 = 21 s).
	time.Sleep(25 * time.Second)
	e.cd.Start()
	restartedAfter("an exit while containerd was down", 2, id)
	testenv.Eventually(t, 60*time.Second, "a relist once containerd is back", func() error {
		if n := e.successfulRelists(t); n <= relisted {
			return fmt.Errorf("%v successful relists, as before containerd stopped", n)
		}
		return nil
	})

	// The new subscription delivers the next exit.
	id, pid = running(2)
	kill(pid)
	restartedAfter("an exit after containerd's restart", 3, id)

	p, err := e.localPod("follow")
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != v1.PodRunning {
		t.Errorf("phase %s", p.Status.Phase)
	}
}

// successfulRelists is how many relists of the runtime succeeded so far, from the agent's
// metrics (relists counted, less the failed ones).
func (e *env) successfulRelists(t *testing.T) float64 {
	t.Helper()
	f, err := e.localMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all, _ := f.Value("holdfast_pleg_relist_duration_seconds")
	failed, _ := f.Value("holdfast_pleg_relist_errors_total")
	return all - failed
}
