package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// agentKillRounds is how many times TestAgentKilledDuringPodStarts kills the agent: 6 in `make
// test`, HOLDFAST_AGENT_KILL_ROUNDS more (`make soak`).
func agentKillRounds(t *testing.T) int {
	if v := os.Getenv("HOLDFAST_AGENT_KILL_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HOLDFAST_AGENT_KILL_ROUNDS=%q", v)
		}
		return n
	}
	return 6
}

// TestAgentKilledDuringPodStarts crosses every persistence boundary of a pod's start with a
// kill -9 of the agent: pods are created, and the agent is killed at a different moment of
// their start each round (before the store write, between it and the container's creation,
// between the creation and its record, during the start, after it) and started again. At the
// end every pod runs, each of its containers created exactly once (one container record, its
// first attempt, running), restartCount 0: nothing ran twice and nothing was lost.
func TestAgentKilledDuringPodStarts(t *testing.T) {
	rounds := agentKillRounds(t)
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	var names []string
	checked := 0
	for round := range rounds {
		for j := range 3 {
			name := fmt.Sprintf("r%02d-%d", round, j)
			names = append(names, name)
			if _, err := pods.Create(ctx, sleeperPod(name, false), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// From 0 to 1.5 s after the Create calls, a different moment each round.
		time.Sleep(time.Duration(round*317%1500) * time.Millisecond)
		e.agent.Kill()
		e.agent.Start()
		if (round+1)%agentKillBatch != 0 && round != rounds-1 {
			continue
		}
		// The batch's pods are checked, then deleted: a soak's hundred rounds never hold more
		// than the node's maxPods (110).
		e.requireEachCreatedOnce(t, names)
		for _, name := range names {
			if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range names {
			e.waitPodGone(t, name)
		}
		checked += len(names)
		names = nil
	}
	t.Logf("%d rounds, %d pods: every pod running, each container created once", rounds, checked)
}

// agentKillBatch is how many rounds of TestAgentKilledDuringPodStarts pile up (3 pods each)
// before their pods are checked and deleted.
const agentKillBatch = 10

// requireEachCreatedOnce waits for the named pods (one container each) to run in the API and
// checks that nothing ran twice and nothing was lost: each has exactly one container that ran,
// its first attempt, whose task runs, and its status names that container with restartCount 0.
//
// On the CRI backend, one more attempt is allowed per start the agent's death cut off: the
// runtime ends a StartContainer whose client went away and records it as never started
// (StartError), as the kubelet's would be, and the attempt after it is the one that runs,
// counted as a restart. Still each pod has one sandbox and one container that ever ran, and
// every other record left is a start cut off.
func (e *env) requireEachCreatedOnce(t *testing.T, names []string) {
	t.Helper()
	ctx := context.Background()
	running := e.waitAPIRunning(t, names...)
	tasks, err := e.cd.RunningTasks(ctx, e.namespace())
	if err != nil {
		t.Fatal(err)
	}
	records := map[string][]string{} // pod UID -> its container records' IDs
	for id, c := range e.containers(t) {
		records[c.PodUID] = append(records[c.PodUID], id)
	}
	sandboxes := e.sandboxes(t)
	for _, name := range names {
		p := running[name]
		if e.cd.CRI && len(sandboxes[string(p.UID)]) != 1 {
			t.Errorf("%s: %d sandboxes %v, want 1: a sandbox made twice", name, len(sandboxes[string(p.UID)]), sandboxes[string(p.UID)])
		}
		ids := records[string(p.UID)]
		ran, neverStarted := ids, 0
		if e.cd.CRI {
			ran = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return e.startCutOff(t, id) })
			if neverStarted = len(ids) - len(ran); neverStarted > 0 {
				t.Logf("%s: %d start(s) cut off by the agent's death, then the container ran", name, neverStarted)
			}
		}
		if len(ran) != 1 {
			t.Errorf("%s: %d container records %v (%d never started), want 1 that ran: a container created twice%s", name, len(ids), ids, neverStarted, e.runtimeView(t, ids))
			continue
		}
		if _, ok := tasks[ran[0]]; !ok {
			t.Errorf("%s: its container %s does not run", name, ran[0])
		}
		// Restarts: none, or on CRI one per start cut off, which is the attempt of the one that
		// ran (the records of the oldest cut-off attempts are collected, as any attempt's
		// older than the last two).
		restarts := 0
		if e.cd.CRI {
			restarts = e.criStatus(t, ran[0]).Metadata.Attempt
		}
		cs := p.Status.ContainerStatuses
		if len(cs) != 1 || int(cs[0].RestartCount) != restarts || restarts < neverStarted || cs[0].ContainerID != "containerd://"+ran[0] {
			t.Errorf("%s: status %+v, want the one container %s, restarted %d times (by %d starts cut off)%s", name, cs, ran[0], restarts, neverStarted, e.runtimeView(t, ids))
		}
		if p.Status.Phase != v1.PodRunning {
			t.Errorf("%s: phase %s", name, p.Status.Phase)
		}
	}
}

// runtimeView is what the CRI runtime says of each container, for a failure's message (nothing
// on the containerd backend).
func (e *env) runtimeView(t *testing.T, ids []string) string {
	t.Helper()
	var b strings.Builder
	for _, id := range ids {
		if e.cd.CRI {
			st := e.criStatus(t, id)
			fmt.Fprintf(&b, "\n\t%s: %s %s (exit %d, attempt %d): %s", id, st.State, st.Reason, st.ExitCode, st.Metadata.Attempt, st.Message)
		}
	}
	return b.String()
}

// criContainerStatus is what crictl inspect says of a container.
type criContainerStatus struct {
	State, Reason, Message string
	ExitCode               int
	Metadata               struct{ Attempt int }
}

// criStatus is the container's status as crictl inspect shows it.
func (e *env) criStatus(t *testing.T, id string) criContainerStatus {
	t.Helper()
	var inspect struct{ Status criContainerStatus }
	if err := json.Unmarshal([]byte(testenv.Crictl(t, "unix://"+e.cd.Address, "inspect", id)), &inspect); err != nil {
		t.Fatalf("crictl inspect %s: %v", id, err)
	}
	return inspect.Status
}

// startCutOff reports whether the CRI runtime recorded the container's start as failed
// (StartError): the container never ran. The tests that call this run plain sleepers, whose
// starts fail only when the agent's death cuts them off; how the runtime says so depends on
// where the cut fell ("failed to create shim task: context canceled", "failed to start shim:
// ... signal: killed").
func (e *env) startCutOff(t *testing.T, id string) bool {
	t.Helper()
	st := e.criStatus(t, id)
	return st.State == "CONTAINER_EXITED" && st.Reason == "StartError"
}
