package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
