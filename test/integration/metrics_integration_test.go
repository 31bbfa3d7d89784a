package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/metrics/metricstest"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

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

// localMetrics scrapes /metrics on the agent's local socket, as an exporter on the gateway
// would.
func (e *env) localMetrics(ctx context.Context) (metricstest.Families, error) {
	body, err := e.localGet(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	return metricstest.Parse(bytes.NewReader(body))
}

// localLogs reads a container's log through the local API, as `holdfast logs` does.
func (e *env) localLogs(ctx context.Context, p *v1.Pod, container string) (string, error) {
	body, err := e.localGet(ctx, "/containerLogs/"+p.Namespace+"/"+p.Name+"/"+container)
	return string(body), err
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
