package metrics

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/metrics/metricstest"
	"github.com/holdfast-dev/holdfast/offline"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestMetricsRecordWhatHappens(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)}
	m := newWithClock(clock.now)
	other := newWithClock(clock.now) // another agent's: must not see this one's values

	m.ObservePodSync(OperationCreate, ResultSuccess, 20*time.Millisecond)
	m.ObservePodSync(OperationSync, ResultError, time.Second)
	m.ObservePodStart(3 * time.Second)
	m.ObservePodStartPhases(map[string]time.Duration{PhaseNetwork: 2 * time.Second, PhaseOther: time.Second})
	m.ObserveRelist(10*time.Millisecond, errors.New("containerd: deadline exceeded"))
	clock.step(2 * time.Second)
	m.ObserveRelist(10*time.Millisecond, nil)
	clock.step(time.Second)
	m.ObserveRelist(10*time.Millisecond, nil) // not the first: the milestone stays
	m.ObservePolicy("no-latest", "admission", "denied", time.Millisecond)
	boot := m.Boot()
	clock.step(500 * time.Millisecond)
	boot.Done("open_store")

	f := metricstest.Scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"holdfast_pod_worker_duration_seconds", []string{"operation_type", "create", "result", "success"}, 1},
		{"holdfast_pod_worker_duration_seconds", []string{"operation_type", "sync", "result", "error"}, 1},
		{"holdfast_pod_start_duration_seconds", nil, 1},
		// Every phase has a sample for the pod, those it did not go through too.
		{"holdfast_pod_start_phase_duration_seconds", []string{"phase", PhaseNetwork}, 1},
		{"holdfast_pod_start_phase_duration_seconds", []string{"phase", PhaseImage}, 1},
		{"holdfast_pod_start_phase_duration_seconds", nil, float64(len(PodStartPhases))},
		{"holdfast_pleg_relist_duration_seconds", nil, 3},
		{"holdfast_pleg_relist_errors_total", nil, 1},
		{"holdfast_boot_milestone_seconds", []string{"milestone", "first_relist"}, 2},
		{"holdfast_policy_evaluations_total", []string{"policy", "no-latest", "kind", "admission", "result", "denied"}, 1},
		{"holdfast_policy_evaluation_duration_seconds", []string{"policy", "no-latest", "kind", "admission"}, 1},
		{"holdfast_boot_phase_duration_seconds", []string{"phase", "open_store"}, 3.5},
		{"holdfast_apiserver_offline_seconds", nil, 0},
	} {
		if got, ok := f.Value(c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got, _ := f.Sum("holdfast_pod_start_phase_duration_seconds", "phase", PhaseNetwork); got != 2 {
		t.Errorf("network phase sum %v, want 2", got)
	}
	if got, _ := f.Sum("holdfast_pod_start_phase_duration_seconds"); got != 3 {
		t.Errorf("phases' sum %v, want the start's 3 s", got)
	}
	for name, fam := range f {
		if strings.HasPrefix(name, "holdfast_") && !strings.Contains(fam.GetHelp(), " ") {
			t.Errorf("%s: no help text (%q)", name, fam.GetHelp())
		}
	}
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if f[name] == nil {
			t.Errorf("%s not served", name)
		}
	}
	if n, ok := metricstest.Scrape(t, other.Handler()).Value("holdfast_pod_start_duration_seconds"); !ok || n != 0 {
		t.Errorf("another agent's metrics: pod start count %v, present %v; want 0", n, ok)
	}
}

func TestMetricsOffline(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)}
	m := newWithClock(clock.now)
	check := func(what string, seconds, periods float64) {
		t.Helper()
		f := metricstest.Scrape(t, m.Handler())
		if got, _ := f.Value("holdfast_apiserver_offline_seconds"); got != seconds {
			t.Errorf("%s: offline seconds %v, want %v", what, got, seconds)
		}
		if got, _ := f.Value("holdfast_apiserver_offline_periods_total"); got != periods {
			t.Errorf("%s: offline periods %v, want %v", what, got, periods)
		}
	}
	check("before any sync", 0, 0)
	// Booted with no apiserver: offline since the agent started.
	clock.step(10 * time.Second)
	m.APIReachable(false)
	clock.step(5 * time.Second)
	m.APIReachable(false)
	check("booted offline", 15, 1)
	m.APIReachable(true)
	check("reachable", 0, 1)
	clock.step(30 * time.Second)
	m.APIReachable(false)
	clock.step(20 * time.Second)
	check("uplink lost", 50, 2)
}

func TestMetricsStoreAndOutbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, make([]byte, 32768), 0o600); err != nil {
		t.Fatal(err)
	}
	m := New()
	store := &fakeStore{stats: offline.Stats{Writes: 7, WritesByBucket: map[string]uint64{"pods": 4, "outbox": 3}, SkippedWrites: 3, Commits: 5, BytesWritten: 40960, OutboxSuperseded: 4}, outbox: 9}
	depth := 2
	m.WatchStore(store, path)
	m.WatchOutbox(func() int { return depth })
	// Another agent's store, in another registry: its own values.
	other := New()
	other.WatchStore(&fakeStore{stats: offline.Stats{Commits: 1}}, path)
	if got, _ := metricstest.Scrape(t, other.Handler()).Value("holdfast_store_transactions_total"); got != 1 {
		t.Errorf("another agent's store transactions: %v, want 1", got)
	}
	f := metricstest.Scrape(t, m.Handler())
	for name, want := range map[string]float64{
		"holdfast_store_transactions_total":   5,
		"holdfast_store_writes_total":         7, // the sum of its buckets'
		"holdfast_store_skipped_writes_total": 3,
		"holdfast_store_written_bytes_total":  40960,
		"holdfast_store_db_size_bytes":        32768,
		"holdfast_outbox_depth":               2,
		"holdfast_outbox_entries":             9,
		"holdfast_outbox_superseded_total":    4,
	} {
		if got, ok := f.Value(name); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	if got, _ := f.Value("holdfast_store_writes_total", "bucket", "outbox"); got != 3 {
		t.Errorf("writes to the outbox: %v, want 3", got)
	}
	// Read at each scrape.
	store.stats.Commits, depth = 6, 0
	f = metricstest.Scrape(t, m.Handler())
	if got, _ := f.Value("holdfast_store_transactions_total"); got != 6 {
		t.Errorf("transactions after a commit: %v, want 6", got)
	}
	if got, _ := f.Value("holdfast_outbox_depth"); got != 0 {
		t.Errorf("outbox depth once delivered: %v, want 0", got)
	}
}

// The node API's TokenReview counts, read at each scrape.
func TestMetricsTokenReviews(t *testing.T) {
	m := New()
	r := &fakeReviewer{reviews: 3, limited: 9}
	m.WatchTokenReviews(r)
	f := metricstest.Scrape(t, m.Handler())
	if got, _ := f.Value("holdfast_nodeapi_token_reviews_total"); got != 3 {
		t.Errorf("token reviews: %v, want 3", got)
	}
	if got, _ := f.Value("holdfast_nodeapi_token_reviews_limited_total"); got != 9 {
		t.Errorf("token reviews limited: %v, want 9", got)
	}
	r.limited = 10
	if got, _ := metricstest.Scrape(t, m.Handler()).Value("holdfast_nodeapi_token_reviews_limited_total"); got != 10 {
		t.Errorf("token reviews limited after one more: %v, want 10", got)
	}
}

type fakeReviewer struct{ reviews, limited uint64 }

func (f *fakeReviewer) TokenReviews() uint64        { return f.reviews }
func (f *fakeReviewer) TokenReviewsLimited() uint64 { return f.limited }

// fakeStore is a state store's counters and outbox length, as a test sets them.
type fakeStore struct {
	stats  offline.Stats
	outbox int
}

func (f *fakeStore) Stats() offline.Stats    { return f.stats }
func (f *fakeStore) OutboxLen() (int, error) { return f.outbox, nil }

// The instrumented parts run without metrics in their own unit tests.
func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	m.ObservePodSync(OperationKill, ResultSuccess, time.Second)
	m.ObservePodStart(time.Second)
	m.ObserveRelist(time.Second, nil)
	m.ObservePolicy("p", "probe", "success", time.Second)
	m.Milestone(MilestoneNodeRegistered)
	m.APIReachable(false)
	m.Boot().Done("start")
	m.WatchStore(nil, "")
	m.WatchOutbox(nil)
}
