package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/internal/failpoint"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// failpointIterations is how many times TestFailpointsCrossedByKill stops the agent at each
// failpoint: 3 in `make test`, HOLDFAST_FAILPOINT_ITERATIONS in `make soak`.
func failpointIterations(t *testing.T) int {
	if v := os.Getenv("HOLDFAST_FAILPOINT_ITERATIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HOLDFAST_FAILPOINT_ITERATIONS=%q", v)
		}
		return n
	}
	return 3
}

// failpointRound is how many kills at one point pile up before the pods are checked and
// deleted, so that a soak of hundreds of iterations never runs more than a few pods at once.
const failpointRound = 5

// TestFailpointsCrossedByKill stops the agent dead at each persistence boundary of the state
// store, the status outbox and a container's start (internal/failpoint), by construction
// rather than by timing as TestAgentKilledDuringPodStarts does, and kills it with SIGKILL
// there. Each iteration creates two pods while the agent is down, starts it armed to stop at
// the point's nth crossing (a different one each iteration), waits until it has stopped
// there and kills it. After each round the agent runs unarmed and the round's pods must run,
// each container created exactly once and never restarted; then the agent is killed once
// more and its database must open as it was left (no recovery) with every pod of the round,
// admitted.
func TestFailpointsCrossedByKill(t *testing.T) {
	iterations := failpointIterations(t)
	e := startEnv(t, true, nil)
	e.waitNodeReady(t)
	e.agent.Kill()
	marker := filepath.Join(t.TempDir(), "failpoint-reached")
	start := time.Now()
	for _, point := range failpoint.All {
		t.Run(point, func(t *testing.T) {
			if only, ok := failpoint.OnlyBackend[point]; ok && only != testenv.RuntimeUnderTest() {
				// skip-ok: a failpoint of the other runtime backend
				t.Skipf("only the %s backend crosses %s", only, point)
			}
			e.crossFailpoint(t, point, iterations, marker)
		})
	}
	if log := e.agent.Log(); strings.Contains(log, "state database was unusable") {
		t.Errorf("the state database had to be recovered after a kill at a failpoint:\n%s", log)
	}
	t.Logf("%d failpoints x %d iterations: every pod ran, each container created once, every pod in the store; %s",
		len(failpoint.All), iterations, time.Since(start).Round(time.Second))
}

// crossFailpoint runs TestFailpointsCrossedByKill's iterations at one point, the agent killed
// on entry and on return.
func (e *env) crossFailpoint(t *testing.T, point string, iterations int, marker string) {
	t.Cleanup(e.agent.Kill) // a failed round leaves no agent running for the next point's
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	for first := 0; first < iterations; first += failpointRound {
		var names []string
		for i := first; i < min(first+failpointRound, iterations); i++ {
			for j := range 2 {
				name := fmt.Sprintf("fp-%s-%d-%d", point, i, j)
				names = append(names, name)
				if _, err := pods.Create(ctx, sleeperPod(name, false), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// The first crossing or the second: of the start's first commit (the boot
			// count) or the next; of the first new container's create or start, or the
			// second's. Pods of earlier iterations may cross no point again: their task
			// made, a start after the kill goes on from it.
			arm := fmt.Sprintf("%s@%d", point, 1+i%2)
			e.stopAtFailpoint(t, arm, marker)
		}
		e.agent.SetEnv(nil)
		e.agent.Start()
		e.requireEachCreatedOnce(t, names)
		e.agent.Kill()
		e.requireStoreHasPods(t, names)
		for _, name := range names {
			if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		e.agent.Start()
		for _, name := range names {
			e.waitPodGone(t, name)
		}
		e.agent.Kill()
	}
}

// stopAtFailpoint starts the agent armed to stop at arm ("point@n"), waits until it has, and
// kills it with SIGKILL there.
func (e *env) stopAtFailpoint(t *testing.T, arm, marker string) {
	t.Helper()
	if err := os.Remove(marker); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	e.agent.SetEnv([]string{failpoint.EnvPoint + "=" + arm, failpoint.EnvMarker + "=" + marker})
	e.agent.Start()
	testenv.Eventually(t, 90*time.Second, "agent stopped at failpoint "+arm, func() error {
		_, err := os.Stat(marker)
		return err
	})
	e.agent.Kill()
}

// requireStoreHasPods opens the state database of the killed agent as the next start would,
// and checks that it needed no recovery and holds every named pod, admitted.
func (e *env) requireStoreHasPods(t *testing.T, names []string) {
	t.Helper()
	store, report := e.openStore(t)
	defer store.Close()
	if report.Recovered != nil || len(report.Quarantined) > 0 {
		t.Errorf("the state database after a kill: %s", report)
	}
	recs, bad, err := store.LoadPods()
	if err != nil || len(bad) > 0 {
		t.Fatalf("load pods: %v %v", err, bad)
	}
	admitted := map[string]bool{}
	for _, r := range recs {
		admitted[r.Pod.Name] = r.Admission.Accepted
	}
	for _, name := range names {
		if !admitted[name] {
			t.Errorf("%s: running, but not in the store as admitted (present: %v)", name, admitted[name])
		}
	}
}
