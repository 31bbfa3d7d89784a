package agent_test

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// blackhole drops every packet to the apiserver's port with iptables, as a link that dies
// without a reset does (a cellular modem losing its carrier, a NAT entry gone): connections
// are not refused, requests and watches hang. It returns the function that repairs the link;
// the end of the test repairs it too.
func blackhole(t *testing.T, host string) (repair func()) {
	t.Helper()
	u, err := url.Parse(host)
	if err != nil {
		t.Fatal(err)
	}
	rule := []string{"INPUT", "-i", "lo", "-p", "tcp", "--dport", u.Port(), "-j", "DROP", "-m", "comment", "--comment", "holdfast test blackhole"}
	if out, err := exec.Command("iptables", append([]string{"-I"}, rule...)...).CombinedOutput(); err != nil {
		t.Skipf("iptables (needs root and netfilter): %v: %s", err, out)
	}
	done := false
	repair = func() {
		if done {
			return
		}
		done = true
		if out, err := exec.Command("iptables", append([]string{"-D"}, rule...)...).CombinedOutput(); err != nil {
			t.Errorf("remove the blackhole rule: %v: %s", err, out)
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
		for _, name := range []string{"steady", "crashy"} {
			local, err := e.localPod(name)
			if err != nil {
				return err
			}
			api, err := pods.Get(ctx, name, metav1.GetOptions{})
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
	t.Logf("converged %s after the repair", time.Since(repaired).Round(time.Second))
	steady, err := pods.Get(ctx, "steady", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := steady.Status.ContainerStatuses[0]; cs.ContainerID != containerIDOf(before) || cs.RestartCount != 0 || steady.Status.Phase != v1.PodRunning {
		t.Errorf("steady was touched: phase %s, %+v", steady.Status.Phase, cs)
	}
	// No container twice: at most one running task per pod and container name.
	tasks, err := e.cd.RunningTasks(ctx, "holdfast")
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
	if perContainer[string(steady.UID)+"/main"] != 1 {
		t.Errorf("running containers %v: steady's is not among them", perContainer)
	}
}
