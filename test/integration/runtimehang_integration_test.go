package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestHungContainerdCallsTimeOut freezes containerd (SIGSTOP: its socket accepts, nothing
// answers) with a pod running and another created during the freeze, and asks the node API
// for stats, which calls containerd, as a scraper would, again and again. Each call to
// containerd gives up at containerd.requestTimeout: the stats request answers instead of
// hanging until its client gives up, the agent logs the calls that timed out by name, the
// relist stall makes /healthz fail, and the agent's goroutines do not pile up with the
// requests. After the thaw both pods run, each container created once, the running one
// never restarted.
func TestHungContainerdCallsTimeOut(t *testing.T) {
	const requestTimeout = 3 * time.Second
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.Containerd.RequestTimeout = config.D(requestTimeout)
		c.Pods.RelistThreshold = config.D(15 * time.Second)
		c.Pods.RelistPeriod = config.D(time.Second)
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, sleeperPod("steady", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "steady")
	before := e.goroutines(t)

	e.cd.Freeze()
	frozen := time.Now()
	if _, err := pods.Create(ctx, sleeperPod("during", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Scrapers that give up after a second, twenty of them: what they asked must not stay
	// behind in the agent.
	for range 20 {
		impatient, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = e.localGet(impatient, "/stats/summary")
		cancel()
	}
	// A patient one gets an answer: a stats request does not wait on a hung runtime for ever.
	if err := e.localAnswers(ctx, "/stats/summary", 10*requestTimeout); err != nil {
		t.Errorf("/stats/summary with containerd hung: %v", err)
	}
	// The relist's list call, by its name on the backend under test.
	timedOut := []string{"containerd call timed out", "/containerd.services.containers.v1.Containers/List"}
	if e.cd.CRI {
		timedOut = []string{"CRI call timed out", "/runtime.v1.RuntimeService/ListContainers"}
	}
	testenv.Eventually(t, 60*time.Second, "the calls to the hung containerd logged by name", func() error {
		log := e.agent.Log()
		for _, call := range timedOut {
			if !strings.Contains(log, call) {
				return fmt.Errorf("no %q in the agent's log", call)
			}
		}
		return nil
	})
	testenv.Eventually(t, 60*time.Second, "/healthz reports the stalled relist", func() error {
		code, body, err := e.healthz()
		if err != nil || code != http.StatusInternalServerError || !strings.HasPrefix(body, "PLEG is not healthy") {
			return fmt.Errorf("/healthz: %d %q %v", code, body, err)
		}
		return nil
	})
	// Long enough for every call made so far to have timed out (several times over).
	for time.Since(frozen) < 6*requestTimeout {
		time.Sleep(time.Second)
	}
	during := e.goroutines(t)
	// Each of the agent's loops may hold one call in flight; what the twenty abandoned
	// requests started must be gone.
	if during > before+40 {
		t.Errorf("goroutines: %.0f before the freeze, %.0f with containerd hung: calls pile up", before, during)
	}
	t.Logf("goroutines: %.0f before the freeze, %.0f after %s of it", before, during, time.Since(frozen).Round(time.Second))

	e.cd.Thaw()
	e.requireEachCreatedOnce(t, []string{"steady", "during"})
	testenv.Eventually(t, 60*time.Second, "agent healthy again", func() error {
		code, body, err := e.healthz()
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("/healthz: %d %q %v", code, body, err)
		}
		return nil
	})
}

// goroutines reads go_goroutines from the agent's /metrics.
func (e *env) goroutines(t *testing.T) float64 {
	t.Helper()
	f, err := e.localMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, ok := f.Value("go_goroutines")
	if !ok {
		t.Fatal("no go_goroutines in /metrics")
	}
	return v
}

// localAnswers GETs path on the agent's local socket and returns nil when the agent answers
// at all (whatever the status) within timeout.
func (e *env) localAnswers(ctx context.Context, path string, timeout time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://holdfast"+path, nil)
	if err != nil {
		return err
	}
	resp, err := e.localClient(timeout).Do(req)
	if err != nil {
		return fmt.Errorf("no answer within %s: %w", timeout, err)
	}
	return resp.Body.Close()
}
