package sources

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/holdfast-dev/holdfast/offline"
)

// modelSequences is how many generated sequences TestSourceModel runs: 1,000 in make test,
// HOLDFAST_SOURCE_MODEL_SEQUENCES of them in make soak.
func modelSequences(t *testing.T) int {
	n := 1000
	if v := os.Getenv("HOLDFAST_SOURCE_MODEL_SEQUENCES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("HOLDFAST_SOURCE_MODEL_SEQUENCES=%q: want a positive count", v)
		}
	}
	return n
}

// TestSourceModel drives the API source, its offline store and the agent's restarts with
// generated sequences of what a gateway lives through, and checks after every step that what
// the source delivered and what the store keeps agree with a model of the apiserver:
//
//   - pods created, updated (their spec, or their status alone), deleted, and deleted and
//     created again under the same name, each seen at once by the watch or only by a relist
//     after the watch was away (the informer, keyed by namespace/name, then reports an update
//     of one UID into another, or a deletion whose final state is unknown);
//   - the agent restarted with the apiserver reachable (restore from the store, then the
//     first list and the cache's reconcile), or rebooted offline (restore alone);
//   - a record lost (quarantined) or the state key replaced.
//
// Invariants: the sink (the pods manager) runs a UID only if the apiserver has it or it was
// restored offline from a record of the node's; never two UIDs under one name after the
// watch caught up; online and caught up, the sink and the store hold exactly the apiserver's
// pods; offline after a reboot, the sink holds exactly the readable records, and those are
// the pods the node had accepted, none lost but the ones whose records were.
//
// A failing sequence prints its seed and steps; TestSourceModel/seed=N runs it alone.
func TestSourceModel(t *testing.T) {
	n := modelSequences(t)
	if testing.Short() {
		n = 200
	}
	for seed := range uint64(n) {
		if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runSourceModel(t, seed, 40) }) {
			return // one failing seed is enough to read
		}
	}
}

// sourceModel is the apiserver as the model sees it, and the agent under test.
type sourceModel struct {
	t     *testing.T
	rng   *rand.Rand
	steps []string

	api      map[string]*v1.Pod // the apiserver's pods, by name
	uidSeq   int
	watching bool // the watch delivers events as they happen; false: only the next relist

	store   *offline.MemStore
	key     int // which key the store is opened with
	sink    *recordingSink
	src     *APISource
	indexer cache.Indexer // the informer's cache
	online  bool          // the agent reached the apiserver since its last start
}

var modelKeys = func() []*offline.Key {
	var ks []*offline.Key
	for _, raw := range []string{"0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"} {
		k, err := offline.NewKey([]byte(raw))
		if err != nil {
			panic(err)
		}
		ks = append(ks, k)
	}
	return ks
}()

func runSourceModel(t *testing.T, seed uint64, length int) {
	m := &sourceModel{t: t, rng: rand.New(rand.NewPCG(seed, 0x686f6c6466617374)), api: map[string]*v1.Pod{},
		store: offline.NewMemStore(nil)}
	m.store.SetKey(modelKeys[0])
	m.start(true)
	defer func() {
		if t.Failed() {
			t.Logf("seed %d, steps:\n  %s", seed, strings.Join(m.steps, "\n  "))
		}
	}()
	for range length {
		m.step()
		m.check()
		if t.Failed() {
			return
		}
	}
}

func (m *sourceModel) logf(format string, args ...any) {
	m.steps = append(m.steps, fmt.Sprintf(format, args...))
}

var podNames = []string{"db-0", "db-1", "web", "job"}

func (m *sourceModel) newPod(name string) *v1.Pod {
	m.uidSeq++
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(fmt.Sprintf("uid-%d", m.uidSeq)),
		Labels: map[string]string{"v": "0"}}, Spec: v1.PodSpec{NodeName: "gw"}}
}

// step does one generated thing.
func (m *sourceModel) step() {
	name := podNames[m.rng.IntN(len(podNames))]
	cur := m.api[name]
	switch r := m.rng.IntN(100); {
	case r < 20: // create (or, if it exists, delete and create again under the name)
		p := m.newPod(name)
		if cur != nil {
			m.logf("replace %s: %s -> %s (watching %v)", name, cur.UID, p.UID, m.watching)
			if m.watching && m.online {
				m.deliverDelete(cur)
			}
		} else {
			m.logf("create %s as %s (watching %v)", name, p.UID, m.watching)
		}
		m.api[name] = p
		if m.watching && m.online {
			m.deliverAddOrUpdate(p)
		}
	case r < 35 && cur != nil: // update: the spec, or the status alone
		p := cur.DeepCopy()
		if m.rng.IntN(2) == 0 {
			p.Labels["v"] = fmt.Sprint(m.rng.IntN(1000))
			m.logf("update %s (%s) labels", name, p.UID)
		} else {
			p.Status.Phase = []v1.PodPhase{v1.PodPending, v1.PodRunning, v1.PodSucceeded}[m.rng.IntN(3)]
			m.logf("update %s (%s) status %s", name, p.UID, p.Status.Phase)
		}
		m.api[name] = p
		if m.watching && m.online {
			m.deliverAddOrUpdate(p)
		}
	case r < 45 && cur != nil: // delete
		m.logf("delete %s (%s) (watching %v)", name, cur.UID, m.watching)
		delete(m.api, name)
		if m.watching && m.online {
			m.deliverDelete(cur)
		}
	case r < 55: // the watch goes away (the uplink cut, a compaction), or comes back with a relist
		if m.watching {
			m.logf("watch lost")
			m.watching = false
		} else if m.online {
			m.logf("relist")
			m.relist()
			m.watching = true
		}
	case r < 65: // the agent restarts with the apiserver reachable
		m.logf("agent restart, online")
		m.start(true)
	case r < 75: // the gateway reboots with the uplink down
		m.logf("offline reboot")
		m.start(false)
	case r < 82: // the uplink comes back to an agent that booted offline
		if !m.online {
			m.logf("apiserver reachable: first list")
			m.firstList()
		}
	case r < 90: // a record lost (bit rot, quarantined when the next start reads it)
		recs, _, err := m.store.LoadPods()
		if err != nil || len(recs) == 0 {
			return
		}
		uid := recs[m.rng.IntN(len(recs))].UID
		online := m.rng.IntN(2) == 0
		m.logf("record of %s lost, then a start (online %v)", uid, online)
		if err := m.store.DeletePod(uid); err != nil {
			m.t.Fatal(err)
		}
		m.start(online)
	default: // the state key replaced (a new TPM), at the next start
		m.key = 1 - m.key
		m.logf("state key replaced (key %d)", m.key)
		m.store.SetKey(modelKeys[m.key])
		m.start(m.rng.IntN(2) == 0)
	}
}

// start stands for an agent start: a new source and sink on the same store, restoring what
// it cached; online, the informer's first list follows.
func (m *sourceModel) start(online bool) {
	m.sink = &recordingSink{pods: map[types.UID]*v1.Pod{}}
	m.src = &APISource{NodeName: "gw", Sink: m.sink, Store: m.store, Log: slog.New(slog.DiscardHandler)}
	m.indexer = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	m.src.indexer = m.indexer
	m.online, m.watching = false, false
	m.src.Restore()
	m.checkRestored()
	if online {
		m.firstList()
	}
}

// firstList is the informer's first complete list and the cache's reconcile after it.
func (m *sourceModel) firstList() {
	m.relist()
	m.src.reconcileCache()
	m.online, m.watching = true, true
}

// relist is what the informer does with a complete list: an update for a name it had (its
// UID may have changed), an add for a new one, a deletion with an unknown final state for a
// name the list lacks.
func (m *sourceModel) relist() {
	h := m.src.handler()
	listed := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(m.api)) {
		p := m.api[name].DeepCopy()
		listed["default/"+name] = true
		if old, ok, _ := m.indexer.GetByKey("default/" + name); ok {
			must(m.t, m.indexer.Update(p))
			h.OnUpdate(old, p)
		} else {
			must(m.t, m.indexer.Add(p))
			h.OnAdd(p, true)
		}
	}
	for _, key := range m.indexer.ListKeys() {
		if listed[key] {
			continue
		}
		old, _, _ := m.indexer.GetByKey(key)
		must(m.t, m.indexer.Delete(old))
		h.OnDelete(cache.DeletedFinalStateUnknown{Key: key, Obj: old})
	}
}

func (m *sourceModel) deliverAddOrUpdate(p *v1.Pod) {
	p = p.DeepCopy()
	h := m.src.handler()
	key := "default/" + p.Name
	if old, ok, _ := m.indexer.GetByKey(key); ok {
		must(m.t, m.indexer.Update(p))
		h.OnUpdate(old, p)
		return
	}
	must(m.t, m.indexer.Add(p))
	h.OnAdd(p, false)
}

func (m *sourceModel) deliverDelete(p *v1.Pod) {
	old, ok, _ := m.indexer.GetByKey("default/" + p.Name)
	if !ok {
		return
	}
	must(m.t, m.indexer.Delete(old))
	m.src.handler().OnDelete(old)
}

// apiUIDs is the apiserver's pods by UID.
func (m *sourceModel) apiUIDs() map[types.UID]string {
	out := map[types.UID]string{}
	for name, p := range m.api {
		out[p.UID] = name
	}
	return out
}

// checkRestored: right after a start, the sink holds exactly the records that read.
func (m *sourceModel) checkRestored() {
	recs, _, err := m.store.LoadPods()
	must(m.t, err)
	want := map[types.UID]bool{}
	for _, r := range recs {
		want[r.UID] = true
	}
	got := map[types.UID]bool{}
	m.sink.mu.Lock()
	for uid := range m.sink.pods {
		got[uid] = true
	}
	m.sink.mu.Unlock()
	if !maps.Equal(got, want) {
		m.t.Errorf("restored %v, want the readable records %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}

// check holds after every step.
func (m *sourceModel) check() {
	m.sink.mu.Lock()
	running := maps.Clone(m.sink.pods)
	m.sink.mu.Unlock()
	api := m.apiUIDs()
	recs, bad, err := m.store.LoadPods()
	must(m.t, err)
	stored := map[types.UID]bool{} // every record, readable or sealed with another key
	for _, r := range recs {
		stored[r.UID] = true
	}
	for key := range bad {
		stored[types.UID(key)] = true
	}

	// A UID runs only if the apiserver has it, or it was cached by the node (offline, or not
	// caught up yet): never one the node never accepted.
	for uid := range running {
		if _, ok := api[uid]; !ok && !stored[uid] && m.online && m.watching {
			m.t.Errorf("runs %s, which neither the apiserver nor the store has", uid)
		}
	}
	if !m.online || !m.watching {
		return
	}
	// Caught up: the sink and the store hold the apiserver's pods, by UID, one per name.
	byName := map[string]types.UID{}
	for uid, p := range running {
		if other, ok := byName[p.Name]; ok {
			m.t.Errorf("two UIDs run under the name %s: %s and %s", p.Name, other, uid)
		}
		byName[p.Name] = uid
	}
	want := map[types.UID]bool{}
	for uid := range api {
		want[uid] = true
	}
	got := map[types.UID]bool{}
	for uid := range running {
		got[uid] = true
	}
	if !maps.Equal(got, want) {
		m.t.Errorf("caught up, the sink runs %v; the apiserver has %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	if !maps.Equal(stored, want) {
		m.t.Errorf("caught up, the store holds %v; the apiserver has %v", slices.Sorted(maps.Keys(stored)), slices.Sorted(maps.Keys(want)))
	}
	for uid := range running {
		if p := running[uid]; p.Labels["v"] != m.api[p.Name].Labels["v"] {
			m.t.Errorf("%s runs labels %v, the apiserver has %v", uid, p.Labels, m.api[p.Name].Labels)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
