// The agent's own endpoints and state: /healthz, the local socket, /metrics and what each
// test family checks of it, kubectl through the node API, the state store after the agent stopped.

package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/metrics/metricstest"
	"github.com/holdfast-dev/holdfast/offline"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// openStore opens the state database of the stopped or killed agent as its next start would;
// the test closes it.
func (e *env) openStore(t *testing.T) (*offline.BoltStore, offline.OpenReport) {
	t.Helper()
	key, err := offline.LoadKey(e.agent.Config.StateKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	store, report, err := offline.Open(filepath.Join(e.agent.Config.StateDir, "state.db"), offline.Options{Key: key})
	if err != nil {
		t.Fatalf("open the agent's state database: %v", err)
	}
	return store, report
}

// healthz asks the agent's /healthz and returns the status code and body.
func (e *env) healthz() (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + e.agent.Config.HealthzAddress + "/healthz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// localGet GETs path from the agent's local API socket (testenv.LocalGet).
func (e *env) localGet(ctx context.Context, path string) ([]byte, error) {
	return testenv.LocalGet(ctx, e.agent.Config.LocalAPISocket, path)
}

// localClient is an HTTP client of the agent's local API socket.
func (e *env) localClient(timeout time.Duration) *http.Client {
	socket := e.agent.Config.LocalAPISocket
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
}

// localLogs reads a container's log through the local API, as `holdfast logs` does.
func (e *env) localLogs(ctx context.Context, p *v1.Pod, container string) (string, error) {
	body, err := e.localGet(ctx, "/containerLogs/"+p.Namespace+"/"+p.Name+"/"+container)
	return string(body), err
}

// localMetrics scrapes /metrics on the agent's local socket, as an exporter on the gateway
// would.
func (e *env) localMetrics(ctx context.Context) (metricstest.Families, error) {
	body, err := e.localGet(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	return metricstest.Parse(bytes.NewReader(body))
}

// sttySize is a shell command that prints the terminal's size as `stty size` does. The CRI
// runtime starts an exec's command first and sets its terminal's size just after (as with the
// kubelet), so a command typed at once may run on a terminal of no size yet (busybox's stty
// then says "stty: standard input"): on that backend it waits for a size, 5 s at most, as
// TestNodeAPI's exec tty does.
func (e *env) sttySize() string {
	if e.cd.CRI {
		return `for i in $(seq 50); do case "$(stty size 2>/dev/null)" in ""|"0 0") sleep 0.1;; *) break;; esac; done; stty size`
	}
	return "stty size"
}

// kubectl runs upstream kubectl (hack/tools/kubectl) against the test's apiserver as its
// admin, in namespace default: the operator's tool, driving the node API through the apiserver.
type kubectl struct {
	kubeconfig, home string
}

// newKubectl is kubectl (the cached binary) as the cluster's admin of e's control plane.
func newKubectl(t *testing.T, e *env) *kubectl {
	return &kubectl{kubeconfig: e.cp.WriteAdminKubeconfig(), home: t.TempDir()}
}

// Cmd is kubectl with args, killed when ctx ends.
func (k *kubectl) Cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, testenv.KubectlPath(), append([]string{"--namespace=default"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.kubeconfig, "HOME="+k.home)
	return cmd
}

// Run runs kubectl with args and stdin and returns its stdout; an error carries its stderr.
func (k *kubectl) Run(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := k.Cmd(ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// PortForward starts `kubectl port-forward target :port` and returns the local port kubectl
// announces. kubectl is stopped when t ends.
func (k *kubectl) PortForward(t *testing.T, ctx context.Context, target string, port int) string {
	t.Helper()
	cmd := k.Cmd(ctx, "port-forward", target, ":"+strconv.Itoa(port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-drained // before Wait, which closes the pipe
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	forwarding := regexp.MustCompile(`^Forwarding from 127\.0\.0\.1:(\d+) -> ` + strconv.Itoa(port) + `$`)
	local := ""
	for local == "" && lines.Scan() {
		if m := forwarding.FindStringSubmatch(lines.Text()); m != nil {
			local = m[1]
		}
	}
	// kubectl logs each connection it forwards: keep reading, or it blocks on a full pipe.
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, out)
	}()
	if local == "" {
		t.Fatalf("kubectl port-forward %s: no local port announced (%v); stderr: %s", target, lines.Err(), stderr.String())
	}
	return local
}

// checkNodeMetrics checks what /metrics says of an agent that started, registered its node and
// started a pod: called by TestNodeAPI once its pod runs, through the apiserver and on the
// local socket. Only counts and presence are checked, never durations: the machine is noisy.
func checkNodeMetrics(t *testing.T, ctx context.Context, e *env) {
	via := map[string]func(context.Context) (metricstest.Families, error){
		"apiserver proxy": e.proxyMetrics,
		"local socket":    e.localMetrics,
	}
	for name, scrape := range via {
		t.Run(name, func(t *testing.T) {
			// Retried for a while: a node status sync that timed out on a busy machine makes
			// the apiserver look unreachable until the next one.
			testenv.Eventually(t, 30*time.Second, "/metrics tells what the agent did", func() error {
				f, err := scrape(ctx)
				if err != nil {
					return err
				}
				return nodeMetricsProblems(f, e.cd.CRI)
			})
		})
	}
}

// checkOfflineMetrics checks /metrics on the local socket of an agent started with the
// apiserver down, whose pods changed status since.
func checkOfflineMetrics(t *testing.T, e *env) {
	t.Helper()
	f, err := e.localMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := f.Value("holdfast_apiserver_offline_seconds"); v <= 0 {
		t.Errorf("holdfast_apiserver_offline_seconds = %v with the apiserver down, want > 0", v)
	}
	if v, _ := f.Value("holdfast_apiserver_offline_periods_total"); v != 1 {
		t.Errorf("holdfast_apiserver_offline_periods_total = %v, want 1 (offline since the start)", v)
	}
	if v, _ := f.Value("holdfast_outbox_depth"); v < 1 {
		t.Errorf("holdfast_outbox_depth = %v with statuses computed offline, want at least 1", v)
	}
	if v, _ := f.Value("holdfast_outbox_entries"); v < 1 {
		t.Errorf("holdfast_outbox_entries = %v with statuses computed offline, want at least 1", v)
	}
	if v, _ := f.Value("holdfast_event_backlog"); v < 1 {
		t.Errorf("holdfast_event_backlog = %v with events recorded offline, want at least 1", v)
	}
	if _, ok := f.Value("holdfast_boot_milestone_seconds", "milestone", "node_registered"); ok {
		t.Error("holdfast_boot_milestone_seconds says the node registered, with the apiserver down")
	}
}

// checkOnlineAgainMetrics waits for /metrics to say the apiserver is reachable again: offline
// seconds back to 0, the offline period counted.
func checkOnlineAgainMetrics(t *testing.T, e *env) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "/metrics says the apiserver is reachable", func() error {
		f, err := e.localMetrics(context.Background())
		if err != nil {
			return err
		}
		if v, _ := f.Value("holdfast_apiserver_offline_seconds"); v != 0 {
			return fmt.Errorf("holdfast_apiserver_offline_seconds = %v", v)
		}
		if v, ok := f.Value("holdfast_event_backlog"); !ok || v != 0 {
			return fmt.Errorf("holdfast_event_backlog = %v (served: %v), want 0: the events of the outage delivered", v, ok)
		}
		// At least the one: right after its restart the apiserver may refuse a write or two.
		if v, _ := f.Value("holdfast_apiserver_offline_periods_total"); v < 1 {
			return fmt.Errorf("holdfast_apiserver_offline_periods_total = %v, want at least 1", v)
		}
		return nil
	})
}

// checkPolicyMetrics checks that /metrics counted and timed the admission policy's two
// verdicts, one pod allowed and one denied.
func checkPolicyMetrics(t *testing.T, e *env, policy, kind string) {
	t.Helper()
	f, err := e.localMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, result := range []string{"allowed", "denied"} {
		if v, _ := f.Value("holdfast_policy_evaluations_total", "policy", policy, "kind", kind, "result", result); v < 1 {
			t.Errorf("holdfast_policy_evaluations_total{policy=%q,result=%q} = %v, want at least 1", policy, result, v)
		}
	}
	if v, _ := f.Value("holdfast_policy_evaluation_duration_seconds", "policy", policy, "kind", kind); v < 2 {
		t.Errorf("holdfast_policy_evaluation_duration_seconds{policy=%q} counts %v evaluations, want at least 2", policy, v)
	}
}

// checkStandaloneMetrics checks /metrics on the local socket of a standalone agent (no
// apiserver at all) running a static pod: the pod started, the store was written, and the
// agent does not call itself offline.
func checkStandaloneMetrics(t *testing.T, e *env) {
	t.Helper()
	f, err := e.localMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		metric string
		labels []string
		min    float64
	}{
		{"holdfast_pod_start_duration_seconds", nil, 1},
		{"holdfast_pod_worker_duration_seconds", []string{"operation_type", "create"}, 1},
		{"holdfast_store_writes_total", []string{"bucket", "pods"}, 1},
		{"holdfast_boot_phase_duration_seconds", []string{"phase", "start"}, 0},
		{"holdfast_boot_milestone_seconds", []string{"milestone", "first_relist"}, 0},
	} {
		if v, ok := f.Value(c.metric, c.labels...); !ok || v < c.min {
			t.Errorf("%s%v = %v (served: %v), want at least %v", c.metric, c.labels, v, ok, c.min)
		}
	}
	if v, _ := f.Value("holdfast_apiserver_offline_seconds"); v != 0 {
		t.Errorf("holdfast_apiserver_offline_seconds = %v on a standalone node, want 0", v)
	}
	if _, ok := f.Value("holdfast_boot_phase_duration_seconds", "phase", "restore_pods"); ok {
		t.Error("a standalone agent reports restoring API pods")
	}
}

// proxyMetrics scrapes /metrics through the apiserver's node proxy with the admin client, as
// Prometheus' kubernetes_sd "node" role does (the node API authorizes nodes/metrics).
func (e *env) proxyMetrics(ctx context.Context) (metricstest.Families, error) {
	raw, err := e.cp.Admin.CoreV1().RESTClient().Get().Resource("nodes").Name(node).SubResource("proxy").Suffix("metrics").Do(ctx).Raw()
	if err != nil {
		return nil, fmt.Errorf("GET /api/v1/nodes/%s/proxy/metrics: %w", node, err)
	}
	return metricstest.Parse(bytes.NewReader(raw))
}

// nodeMetricsProblems says what is missing or wrong in the metrics of an agent that started,
// registered its node and started a pod, on the CRI backend if cri.
func nodeMetricsProblems(f metricstest.Families, cri bool) error {
	var problems []string
	atLeast := func(min float64, metric string, labels ...string) {
		if v, ok := f.Value(metric, labels...); !ok || v < min {
			problems = append(problems, fmt.Sprintf("%s%v = %v (served: %v), want at least %v", metric, labels, v, ok, min))
		}
	}
	// The pod was seen, synced and started.
	atLeast(1, "holdfast_pod_start_duration_seconds")
	// Its start was traced: a container created and started, in a network of its own.
	for _, phase := range []string{"network", "create", "start"} {
		if v, ok := f.Sum("holdfast_pod_start_phase_duration_seconds", "phase", phase); !ok || v <= 0 {
			problems = append(problems, fmt.Sprintf("holdfast_pod_start_phase_duration_seconds{phase=%q} sum %v (served: %v), want above 0", phase, v, ok))
		}
	}
	atLeast(1, "holdfast_pod_worker_duration_seconds", "operation_type", "create", "result", "success")
	atLeast(1, "holdfast_pod_worker_duration_seconds", "operation_type", "sync")
	atLeast(1, "holdfast_pleg_relist_duration_seconds")
	// The pod and its statuses went through the state store.
	for _, m := range []string{"holdfast_store_transactions_total", "holdfast_store_written_bytes_total", "holdfast_store_db_size_bytes"} {
		atLeast(1, m)
	}
	atLeast(1, "holdfast_store_writes_total", "bucket", "pods")
	atLeast(1, "holdfast_store_writes_total", "bucket", "outbox")
	// The boot happened, in phases, and reached its milestones.
	phases := []string{"open_store", "install_logger", "connect_runtime", "preload_images", "identity", "load_policies", "restore_pods", "start"}
	if cri {
		// The runtime writes the containers' logs: there is no logger of holdfast's to install.
		phases = slices.DeleteFunc(phases, func(p string) bool { return p == "install_logger" })
	}
	for _, phase := range phases {
		atLeast(0, "holdfast_boot_phase_duration_seconds", "phase", phase)
	}
	for _, m := range []string{"first_relist", "node_registered"} {
		atLeast(0, "holdfast_boot_milestone_seconds", "milestone", m)
	}
	// Online.
	if v, ok := f.Value("holdfast_apiserver_offline_seconds"); !ok || v != 0 {
		problems = append(problems, fmt.Sprintf("holdfast_apiserver_offline_seconds = %v (served: %v) with the apiserver up, want 0", v, ok))
	}
	for _, m := range []string{"holdfast_outbox_depth", "holdfast_outbox_entries", "holdfast_outbox_superseded_total", "holdfast_apiserver_offline_periods_total",
		"holdfast_event_backlog", "holdfast_event_backlog_dropped_total",
		"holdfast_nodeapi_token_reviews_total", "holdfast_nodeapi_token_reviews_limited_total",
		"go_goroutines", "process_resident_memory_bytes"} {
		atLeast(0, m)
	}
	for name, fam := range f {
		if strings.HasPrefix(name, "holdfast_") && fam.GetHelp() == "" {
			problems = append(problems, name+" has no HELP")
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}
