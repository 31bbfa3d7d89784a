package pods_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
	"github.com/holdfast-dev/holdfast/agent/sources"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// TestLifecycleModel runs the pods manager on the hollow runtime (containers in memory), fed
// by the API source over a fake apiserver and by the file source, with the offline store,
// through generated sequences of what a gateway lives through:
//
//   - API pods created, relabelled, deleted, and deleted and created again under their name
//     (a new UID), each seen by the watch at once, or missed while the apiserver was out of
//     reach and then either replayed by the resumed watch or found by the relist after a
//     410 (the informer's update of one UID into another);
//   - apiserver outages with no reboot: the watch stalls, or ends and the informer's lists and
//     watches are refused (connection refused) until the apiserver is back;
//   - a static pod's manifest written, edited (a new UID) and removed;
//   - the agent restarted cleanly, or killed in the middle of a change (from that instant
//     nothing it does reaches the runtime or the store); the gateway rebooted (every task
//     ends) with the apiserver reachable or not;
//   - a pod's record lost from the store behind the agent's back, or replaced by garbage in
//     the database file (sequences on the bbolt store, one in four), then found at the
//     agent's next start.
//
// After every step, once the agent has settled, it checks what runs and what the store holds
// against a model of what the sources hold:
//
//   - caught up with the apiserver, exactly its pods and the static pod run, one container
//     each: a container runs only for a UID its source holds now;
//   - out of reach, exactly the pods the agent knew (its watch's last view, or the records it
//     restored at its start) run, and at most containers that ran before and were never
//     stopped beside them;
//   - no container of a pod its source still holds is stopped or replaced but by a reboot
//     (not by a restart, a kill, a relist, an outage or a lost record), checked at every look;
//     a static pod's manifest removed and put back is no such pod: its container may be torn
//     down in between, and the pod runs again after;
//   - never two running containers for one pod, nor two versions of the static pod at once,
//     checked at every look;
//   - every start restores every API pod whose record the node had written (acknowledged)
//     and not lost since, so that an offline reboot runs it again;
//   - the store holds a record of every pod the agent runs but those whose record was lost
//     (until the agent writes it again), and nothing else: no record of a pod its source no
//     longer holds.
//
// A failing sequence prints its seed and steps; TestLifecycleModel/seed=N runs it alone.
// HOLDFAST_LIFECYCLE_MODEL_SEQUENCES sets how many run (1,000 in make test, 10,000 in make
// soak); they run lifecycleModelParallel at a time, since a sequence mostly waits (for an
// informer's back-off before a relist, above all).
func TestLifecycleModel(t *testing.T) {
	n := 1000
	if v := os.Getenv("HOLDFAST_LIFECYCLE_MODEL_SEQUENCES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("HOLDFAST_LIFECYCLE_MODEL_SEQUENCES=%q: want a positive count", v)
		}
	}
	if testing.Short() {
		n = 50
	}
	var next atomic.Uint64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range lifecycleModelParallel {
		wg.Go(func() {
			for !failed.Load() {
				seed := next.Add(1) - 1
				if seed >= uint64(n) {
					return
				}
				if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runLifecycleModel(t, seed, 12) }) {
					failed.Store(true) // one failing seed is enough to read
				}
			}
		})
	}
	wg.Wait()
}

// lifecycleModelParallel is how many sequences run at once.
const lifecycleModelParallel = 12

type lifecycleModel struct {
	t     *testing.T
	rng   *rand.Rand
	steps []string
	dir   string

	api    *fakeAPI
	client *fake.Clientset
	rt     *hollow.Runtime
	net    *hollow.Network
	key    *offline.Key
	// The store: in memory (mem), or a bbolt database at boltPath, opened at every agent
	// start and closed at its stop, as the agent does.
	mem      *offline.MemStore
	boltPath string
	store    offline.Store

	// static is the version of the static pod's manifest on disk, 0 when there is none;
	// staticUID the UID the agent gives that version.
	static    int
	staticUID types.UID
	// kept is each pod's running container as last seen, for "nothing of a pod its source
	// holds is stopped"; cleared by a reboot, whose containers are new attempts.
	kept map[types.UID]string
	// dropped is the container kept for the static pod when its manifest was removed: from
	// then on the agent may tear it down (its source no longer holds it), and a manifest put
	// back with the same content (the same UID) runs the pod again once that teardown is
	// over, as the kubelet restarts a pod its source delivers again while it terminates. That
	// container's stop is no "stopped though its source holds the pod".
	dropped map[types.UID]string
	// restored is the API pods whose records this agent's start restored.
	restored map[types.UID]bool
	// acked is the API pods whose records the store held when the agent last settled, but the
	// ones lost since: every start must restore them. unsure is the pods a change cut short by
	// a kill may or may not have recorded or removed.
	acked, unsure map[types.UID]bool
	// lost is the pods whose record was lost (deleted, or corrupt and quarantined) and not seen
	// written again since: the store may lack them. A static pod's stays lost after its
	// manifest's removal: put back with the same content (the same UID) before the file source
	// saw it go (within its quiet period), the pod was never stopped nor admitted again, and
	// its record never written again.
	lost map[types.UID]bool
	// staticUIDs is every UID the static pod's manifest has had.
	staticUIDs map[types.UID]bool
	// down: the apiserver is out of reach (since stalled steps); backoffs counts the
	// back-offs the running informer went through (each doubles the next).
	down     bool
	stalled  int
	backoffs int

	// the running agent: its sources stop first (see stop)
	cancel  context.CancelFunc
	done    sync.WaitGroup
	stopMgr context.CancelFunc
	mgrDone sync.WaitGroup
	mgr     *pods.Manager
	apiSrc  *sources.APISource
	src     atomic.Pointer[sources.APISource] // nil until the API source has synced
	uplink  context.CancelFunc                // stops the API source alone
	started int
}

func runLifecycleModel(t *testing.T, seed uint64, length int) {
	m := &lifecycleModel{t: t, rng: rand.New(rand.NewPCG(seed, 0x6c6966656379636c)), dir: t.TempDir(),
		api: newFakeAPI(), client: fake.NewClientset(), rt: hollow.NewRuntime(), net: hollow.NewNetwork("gw"),
		kept: map[types.UID]string{}, dropped: map[types.UID]string{}, restored: map[types.UID]bool{}, acked: map[types.UID]bool{},
		unsure: map[types.UID]bool{}, lost: map[types.UID]bool{}, staticUIDs: map[types.UID]bool{}}
	var err error
	if m.key, err = offline.NewKey([]byte("0123456789abcdef0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	// A process that ignores SIGTERM holds a stop for its grace period / 50: a static pod's
	// edit waits 20 ms for its previous version, not a second.
	m.rt.SetTermWait(func(g time.Duration) time.Duration { return g / 50 })
	if seed%4 == 3 {
		m.boltPath = filepath.Join(shmDir(t), "state.db")
	} else {
		m.mem = offline.NewMemStore(nil)
		m.mem.SetKey(m.key)
		m.store = m.mem
	}
	if err := os.MkdirAll(filepath.Join(m.dir, "manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	m.api.install(m.client)
	defer func() {
		m.stop(false)
		if t.Failed() {
			t.Logf("seed %d (store: %s), steps:\n  %s", seed, m.storeKind(), strings.Join(m.steps, "\n  "))
		}
	}()
	m.start(true)
	for range length {
		m.step()
		if t.Failed() {
			return
		}
		m.settle()
		if t.Failed() {
			return
		}
	}
}

// shmDir is a directory in memory for a bbolt database (its fsyncs cost nothing there), a
// temporary one on disk where there is no /dev/shm.
func shmDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "holdfast-lifecycle-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (m *lifecycleModel) storeKind() string {
	if m.mem != nil {
		return "memory"
	}
	return "bbolt"
}

func (m *lifecycleModel) logf(format string, args ...any) {
	m.steps = append(m.steps, fmt.Sprintf(format, args...))
}

var lifecycleNames = []string{"db", "web", "cache"}

// step does one generated thing.
func (m *lifecycleModel) step() {
	if m.down && m.src.Load() != nil {
		m.stalled++
	}
	if m.stalled >= 4 { // a long outage only makes the informer's back-off longer
		m.back()
		return
	}
	switch r := m.rng.IntN(100); {
	case r < 36:
		m.randomChange()
	case r < 42:
		m.staticChange()
	case r < 48:
		m.logf("agent restart (apiserver reachable %v)", !m.down)
		m.stop(false)
		m.start(!m.down)
	case r < 55: // killed in the middle of a change
		changed := m.randomChange()
		wait := time.Duration(m.rng.IntN(15)) * time.Millisecond
		m.logf("agent killed %v later (apiserver reachable %v)", wait, !m.down)
		time.Sleep(wait)
		for _, uid := range changed {
			m.unsure[uid] = true
		}
		m.stop(true)
		m.start(!m.down)
	case r < 63:
		online := !m.down && m.rng.IntN(3) == 0
		m.logf("reboot (apiserver reachable %v)", online)
		m.stop(m.rng.IntN(2) == 0)
		m.reboot()
		if !online {
			m.api.setDown(true)
			m.down = true
		}
		m.start(online)
	case r < 73:
		if m.down {
			m.back()
		} else {
			m.outage()
		}
	case r < 83:
		m.loseRecord()
	case r < 90:
		if m.mem == nil {
			m.corruptRecord()
		} else {
			m.loseRecord()
		}
	default:
		if m.down {
			m.back()
		} else {
			m.randomChange()
		}
	}
}

// randomChange creates, relabels, deletes or replaces an API pod, or changes the static pod's
// manifest; it returns the UIDs it concerns.
func (m *lifecycleModel) randomChange() []types.UID {
	if m.rng.IntN(6) == 0 {
		return m.staticChange()
	}
	name := lifecycleNames[m.rng.IntN(len(lifecycleNames))]
	old := m.api.uid(name)
	switch r := m.rng.IntN(100); {
	case old == "":
		uid := m.newUID(name)
		m.logf("create %s (%s)%s", name, uid, m.reach())
		m.api.create(name, uid)
		return []types.UID{uid}
	case r < 40:
		m.logf("relabel %s (%s)%s", name, old, m.reach())
		m.api.relabel(name, strconv.Itoa(m.rng.IntN(1000)))
		return []types.UID{old}
	case r < 70:
		m.logf("delete %s (%s)%s", name, old, m.reach())
		m.api.delete(name)
		return []types.UID{old}
	default:
		uid := m.newUID(name)
		m.logf("replace %s: %s deleted, %s created under its name%s", name, old, uid, m.reach())
		m.api.delete(name)
		m.api.create(name, uid)
		return []types.UID{old, uid}
	}
}

func (m *lifecycleModel) newUID(name string) types.UID {
	return types.UID(fmt.Sprintf("%s-%d", name, len(m.steps)))
}

func (m *lifecycleModel) reach() string {
	if m.down {
		return ", apiserver out of reach"
	}
	return ""
}

// staticChange writes, edits (a new UID) or removes the static pod's manifest.
func (m *lifecycleModel) staticChange() []types.UID {
	old := m.staticUID
	if m.static == 0 || m.rng.IntN(3) > 0 {
		m.static++
		m.logf("static manifest version %d", m.static)
		m.writeManifest()
		return []types.UID{old, m.staticUID}
	}
	m.logf("static manifest removed")
	if id := m.kept[old]; id != "" {
		m.dropped[old] = id
	}
	if err := os.Remove(filepath.Join(m.dir, "manifests", "sensor.yaml")); err != nil {
		m.t.Fatal(err)
	}
	m.static, m.staticUID = 0, ""
	return []types.UID{old}
}

// outage cuts the apiserver off: the watch stalls (a blackhole) or ends, and every list and
// watch is refused (connection refused) until back.
func (m *lifecycleModel) outage() {
	m.down, m.stalled = true, 0
	m.api.setDown(true)
	if m.src.Load() != nil && m.backoffs < 2 && m.rng.IntN(3) == 0 {
		// The informer watches again at once, is refused and backs off.
		m.logf("apiserver outage: the watch ends, lists and watches refused")
		m.api.closeStreams()
		m.backoffs++
		return
	}
	m.logf("apiserver outage: the watch stalls")
}

// back ends the outage. A running informer resumes: its watch replays what it missed, or
// ends with 410 Gone and the informer lists again (an update of a replaced pod's old UID into
// its new one); an agent that started during the outage starts its API source.
func (m *lifecycleModel) back() {
	m.down, m.stalled = false, 0
	if m.src.Load() == nil {
		m.logf("apiserver back: the API source starts")
		m.api.setDown(false)
		m.startAPI()
		return
	}
	lists, watches := m.api.counts()
	if m.backoffs < 2 && m.rng.IntN(2) == 0 && m.api.expire() {
		m.logf("apiserver back: the watch ends with 410 Gone, the informer lists again")
		m.backoffs++
		m.api.setDown(false)
		m.waitAPI(func(l, w int) bool { return l > lists && w > watches })
		return
	}
	open := m.api.setDown(false)
	if open {
		m.logf("apiserver back: the stalled watch replays what it missed")
		return
	}
	m.logf("apiserver back: the informer's next watch replays what it missed")
	m.waitAPI(func(_, w int) bool { return w > watches })
}

// waitAPI waits for the informer to have listed or watched as done says.
func (m *lifecycleModel) waitAPI(done func(lists, watches int) bool) {
	for deadline := time.Now().Add(20 * time.Second); !done(m.api.counts()); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			m.t.Fatal("the informer did not list or watch again within 20 s")
		}
	}
}

// loseRecord deletes a pod's record behind the agent's back, then sometimes restarts or
// reboots it.
func (m *lifecycleModel) loseRecord() {
	recs, _, err := m.store.LoadPods()
	if err != nil {
		m.t.Fatal(err)
	}
	if len(recs) == 0 {
		m.randomChange()
		return
	}
	uid := recs[m.rng.IntN(len(recs))].UID
	if err := m.store.DeletePod(uid); err != nil {
		m.t.Fatal(err)
	}
	m.lost[uid] = true
	delete(m.acked, uid)
	switch m.rng.IntN(3) {
	case 0:
		m.logf("record of %s lost", uid)
	case 1:
		m.logf("record of %s lost, agent restart (apiserver reachable %v)", uid, !m.down)
		m.stop(false)
		m.start(!m.down)
	default:
		m.logf("record of %s lost, reboot with the apiserver out of reach", uid)
		m.stop(false)
		m.reboot()
		m.api.setDown(true)
		m.down = true
		m.start(false)
	}
}

// corruptRecord stops the agent, replaces a pod's record by garbage in the database file,
// and starts the agent (or reboots the gateway), which finds it.
func (m *lifecycleModel) corruptRecord() {
	m.stop(m.rng.IntN(2) == 0)
	db, err := bolt.Open(m.boltPath, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		m.t.Fatal(err)
	}
	var uid types.UID
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("pods"))
		if b == nil {
			return errors.New("no pods bucket")
		}
		var uids []string
		if err := b.ForEach(func(k, v []byte) error {
			if v == nil && b.Bucket(k).Get([]byte("pod")) != nil {
				uids = append(uids, string(k))
			}
			return nil
		}); err != nil {
			return err
		}
		if len(uids) == 0 {
			return nil
		}
		uid = types.UID(uids[m.rng.IntN(len(uids))])
		return b.Bucket([]byte(uid)).Put([]byte("pod"), []byte("\x00\x01\x02 not a record"))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		m.t.Fatal(err)
	}
	reboot := m.rng.IntN(2) == 0
	if uid != "" {
		m.lost[uid] = true
		delete(m.acked, uid)
		m.logf("record of %s corrupt in the file, %s", uid, map[bool]string{true: "reboot with the apiserver out of reach", false: "agent restart"}[reboot])
	} else {
		m.logf("no record to corrupt, %s", map[bool]string{true: "reboot with the apiserver out of reach", false: "agent restart"}[reboot])
	}
	if reboot {
		m.reboot()
		m.api.setDown(true)
		m.down = true
	}
	m.start(!m.down)
}

// writeManifest writes the static pod's manifest, version m.static, as an editor does
// (a new file renamed over the old one).
func (m *lifecycleModel) writeManifest() {
	dir := filepath.Join(m.dir, "manifests")
	manifestText := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: sensor
  namespace: default
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: registry.example/sensor:1
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]
    env:
    - name: VERSION
      value: "%d"
`, m.static)
	pod, err := manifest.Decode([]byte(manifestText))
	if err != nil {
		m.t.Fatal(err)
	}
	if err := manifest.MakeStatic(pod, "gw", filepath.Join(dir, "sensor.yaml")); err != nil {
		m.t.Fatal(err)
	}
	m.staticUID = pod.UID
	m.staticUIDs[pod.UID] = true
	tmp := filepath.Join(dir, ".sensor.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(manifestText), 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "sensor.yaml")); err != nil {
		m.t.Fatal(err)
	}
}

// start starts an agent on the same runtime and store: open the store, restore from it,
// then the API source if the apiserver is reachable. It checks that the start restored every
// acknowledged pod.
func (m *lifecycleModel) start(online bool) {
	m.started++
	if m.mem == nil {
		st, _, err := offline.Open(m.boltPath, offline.Options{Key: m.key})
		if err != nil {
			m.t.Fatal(err)
		}
		m.store = st
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("HOLDFAST_LIFECYCLE_MODEL_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("agent", m.started)
	}
	stateDir := filepath.Join(m.dir, "state")
	statusMgr := status.NewManager(nil, m.store, "gw", log)
	mgr := pods.NewManager(pods.Config{
		StateDir: stateDir, PodLogDir: filepath.Join(m.dir, "logs"), RelistPeriod: 50 * time.Millisecond, NodeName: "gw",
		Volumes:        volumes.NewManager(filepath.Join(stateDir, "pods"), nil, nil, log, volumes.Options{PlainDirs: true}),
		HostResolvConf: filepath.Join(m.dir, "resolv.conf"), HostsFile: filepath.Join(m.dir, "hosts"),
	}, m.rt, m.net, statusMgr, nil, log)
	mgr.SetAdmission(nil, m.store)
	files := &sources.FileSource{Dir: filepath.Join(m.dir, "manifests"), NodeName: "gw", Sink: mgr, Log: log, QuietPeriod: 10 * time.Millisecond}
	mgr.SetSourcesReady(func() bool { s := m.src.Load(); return s != nil && s.Ready() && files.Ready() })
	mgr.SetStaticSourceReady(files.Ready) // as the agent: the file source alone decides static orphans
	m.mgr = mgr
	m.src.Store(nil)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.spawn("file source", func() error { return files.Run(ctx) })
	// Started: the file source has read its directory once (or settling could pass on the
	// static pod's container of the last run before this agent has delivered it).
	for deadline := time.Now().Add(10 * time.Second); !files.Ready(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			m.t.Fatal("the file source did not read its directory within 10 s")
		}
	}
	// One API source per agent run, as the agent has: it restores now and lists once the
	// apiserver is reachable.
	m.apiSrc = &sources.APISource{Client: kubetest.Wrap(m.client), NodeName: "gw", Sink: mgr, Store: m.store, Log: log}
	m.apiSrc.Restore()
	// What Restore delivered: the API records that read (it quarantined the others); the file
	// source writes static records alone meanwhile.
	recs, _, err := m.store.LoadPods()
	if err != nil {
		m.t.Fatal(err)
	}
	clear(m.restored)
	for _, r := range recs {
		if r.Source == offline.SourceAPI {
			m.restored[r.UID] = true
		}
	}
	for uid := range m.acked {
		if !m.restored[uid] && !m.unsure[uid] {
			m.t.Errorf("start: the record of %s, acknowledged and not lost, was not restored (restored %v)", uid, sortedUIDs(m.restored))
		}
	}
	clear(m.unsure)
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	m.stopMgr = stopMgr
	m.mgrDone.Go(func() {
		if err := mgr.Run(mgrCtx); err != nil {
			m.t.Errorf("pods manager: %v", err)
		}
	})
	if online {
		m.startAPI()
	}
}

// spawn runs a part of the agent until the agent stops (stop waits for it).
func (m *lifecycleModel) spawn(name string, run func() error) {
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		if err := run(); err != nil {
			m.t.Errorf("%s: %v", name, err)
		}
	}()
}

// startAPI starts the API source and waits for its first list and watch.
func (m *lifecycleModel) startAPI() {
	src := m.apiSrc
	_, watches := m.api.counts()
	m.backoffs = 0
	podInformer := src.Start()
	ctx, cancel := context.WithCancel(context.Background())
	m.uplink = cancel
	m.spawn("API source", func() error { return src.Run(ctx, podInformer) })
	for deadline := time.Now().Add(10 * time.Second); !src.Ready(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			m.t.Fatal("the API source did not list within 10 s")
		}
	}
	m.waitAPI(func(_, w int) bool { return w > watches })
	m.src.Store(src)
}

// errKilled is what the store and the runtime answer a killed agent.
var errKilled = errors.New("the agent was killed")

// stop stops the agent (never its containers). killed: from this instant, nothing the agent
// does reaches the runtime or the store, as for a process killed with SIGKILL; otherwise it
// stops as on SIGTERM.
func (m *lifecycleModel) stop(killed bool) {
	if m.cancel == nil {
		return
	}
	if killed {
		m.rt.FailCalls(errKilled)
		if m.mem != nil {
			m.mem.FailWrites(errKilled)
		} else {
			m.store.Close()
		}
	}
	if m.uplink != nil {
		m.uplink()
		m.uplink = nil
	}
	// The sources first: a source's delivery racing the manager's return would start a
	// worker beside its WaitGroup's Wait (see /tmp/lifecycle-model-bugs.md, bug 1).
	m.cancel()
	m.done.Wait()
	m.stopMgr()
	m.mgrDone.Wait()
	m.cancel = nil
	m.src.Store(nil)
	if killed {
		m.rt.FailCalls(nil)
		if m.mem != nil {
			m.mem.FailWrites(nil)
		}
	} else if m.mem == nil {
		m.store.Close()
	}
}

// reboot ends every task, as a reboot does; the containers stay, exited.
func (m *lifecycleModel) reboot() {
	cs, err := m.rt.List(context.Background())
	if err != nil {
		m.t.Fatal(err)
	}
	for _, c := range cs {
		if c.State == runtime.StateRunning {
			if err := m.rt.StopContainer(context.Background(), c.ID, 0); err != nil {
				m.t.Fatal(err)
			}
		}
	}
	clear(m.kept)
	clear(m.dropped)
}

// running is the running containers of each pod by UID, and how many run for the static
// pod, whatever its version.
func (m *lifecycleModel) running() (byUID map[types.UID][]string, static int) {
	cs, err := m.rt.List(context.Background())
	if err != nil {
		m.t.Fatal(err)
	}
	byUID = map[types.UID][]string{}
	for _, c := range cs {
		if c.State != runtime.StateRunning {
			continue
		}
		byUID[types.UID(c.PodUID)] = append(byUID[types.UID(c.PodUID)], c.ID)
		if c.PodName == "sensor-gw" {
			static++
		}
	}
	return byUID, static
}

// known is the pods the agent must run now: the static pod while its manifest is there; the
// API pods of its informer's view once it has listed (the apiserver's, unless it is out of
// reach), those it restored from the store before.
func (m *lifecycleModel) known() map[types.UID]bool {
	out := map[types.UID]bool{}
	if m.static > 0 {
		out[m.staticUID] = true
	}
	if m.src.Load() != nil {
		for _, uid := range m.api.viewUIDs() {
			out[uid] = true
		}
		return out
	}
	maps.Copy(out, m.restored)
	return out
}

// caughtUp: the agent's API source has listed and its watch delivers.
func (m *lifecycleModel) caughtUp() bool { return m.src.Load() != nil && !m.down }

// holds reports whether a pod's source holds it now: the apiserver, or the manifest.
func (m *lifecycleModel) holds(uid types.UID) bool {
	return (m.static > 0 && uid == m.staticUID) || m.api.has(uid)
}

// settle waits for what runs and what the store holds to match the model, checking on the
// way what must hold at every look.
func (m *lifecycleModel) settle() {
	deadline := time.Now().Add(15 * time.Second)
	for {
		run, static := m.running()
		if static > 1 {
			m.t.Errorf("%d versions of the static pod run at once", static)
			return
		}
		for uid, ids := range run {
			if len(ids) > 1 {
				m.t.Errorf("pod %s runs %d containers: %v", uid, len(ids), ids)
				return
			}
		}
		must := m.known()
		for uid, id := range m.kept {
			if (!must[uid] && !m.holds(uid)) || m.dropped[uid] == id {
				continue
			}
			if ids := run[uid]; len(ids) == 0 || ids[0] != id {
				m.t.Errorf("pod %s: its container %s was stopped (running now: %v) though its source holds the pod and the gateway did not reboot", uid, id, ids)
				return
			}
		}
		problem := m.runProblem(run, must)
		var stored map[types.UID]bool
		if problem == "" {
			stored, problem = m.storeProblem(must)
		}
		if problem == "" {
			for uid, ids := range run {
				m.kept[uid] = ids[0]
			}
			for uid := range m.kept {
				if run[uid] == nil {
					delete(m.kept, uid)
				}
			}
			for uid, id := range m.dropped {
				if m.kept[uid] != id { // stopped, or running again in a new container
					delete(m.dropped, uid)
				}
			}
			clear(m.acked)
			for uid := range stored {
				if uid != m.staticUID {
					m.acked[uid] = true
				}
				delete(m.lost, uid)
			}
			for uid := range m.lost {
				if !must[uid] && !m.staticUIDs[uid] {
					delete(m.lost, uid)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			m.t.Errorf("after 15 s: %s (apiserver reachable %v, API source listed %v)", problem, !m.down, m.src.Load() != nil)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// runProblem says how what runs differs from what must, "" when it does not.
func (m *lifecycleModel) runProblem(run map[types.UID][]string, must map[types.UID]bool) string {
	for uid := range must {
		if run[uid] == nil {
			return fmt.Sprintf("running %v; want %v", sortedUIDs(run), sortedUIDs(must))
		}
	}
	for uid := range run {
		// Out of reach, containers that ran before and that no source has delivered (a
		// record lost, a pod deleted meanwhile) wait for the apiserver.
		if !must[uid] && (m.caughtUp() || m.kept[uid] == "") {
			return fmt.Sprintf("running %v; want %v (%s is no pod its source holds)", sortedUIDs(run), sortedUIDs(must), uid)
		}
	}
	return ""
}

// storeProblem says how the store's pod records differ from the pods the agent runs: each
// there but the lost ones, and nothing else.
func (m *lifecycleModel) storeProblem(must map[types.UID]bool) (map[types.UID]bool, string) {
	recs, bad, err := m.store.LoadPods()
	if err != nil {
		m.t.Fatal(err)
	}
	if len(bad) > 0 {
		m.t.Errorf("unreadable records after the start that found them: %v", bad)
	}
	stored := map[types.UID]bool{}
	for _, r := range recs {
		stored[r.UID] = true
	}
	for uid := range stored {
		if !must[uid] {
			return nil, fmt.Sprintf("the store holds %v; the agent runs %v (%s is no pod its source holds)", sortedUIDs(stored), sortedUIDs(must), uid)
		}
	}
	for uid := range must {
		if !stored[uid] && !m.lost[uid] {
			return nil, fmt.Sprintf("the store holds %v; the agent runs %v and lost no record of %s", sortedUIDs(stored), sortedUIDs(must), uid)
		}
	}
	return stored, ""
}

func sortedUIDs[V any](set map[types.UID]V) []types.UID { return slices.Sorted(maps.Keys(set)) }

// fakeAPI is the apiserver the API source lists and watches, through the fake clientset's
// reactors. Unlike the clientset's own tracker, a watch resumes where the informer's list or
// last event left it: it first replays what changed since (as the apiserver does from a
// resourceVersion), so that nothing is lost between a list and its watch, nor across an
// outage the watch survived.
type fakeAPI struct {
	mu   sync.Mutex
	pods map[string]*v1.Pod // the apiserver's pods, by name
	rv   int
	// view is what the informer holds: its last list and the events sent to it since.
	view    map[string]*v1.Pod
	streams []*podStream
	// down: out of reach: lists and watches are refused, open watches deliver nothing.
	down           bool
	lists, watches int
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{pods: map[string]*v1.Pod{}, view: map[string]*v1.Pod{}}
}

// podStream is one watch of the informer's.
type podStream struct {
	ch   chan watch.Event
	done chan struct{}
	stop sync.Once
}

func (s *podStream) ResultChan() <-chan watch.Event { return s.ch }
func (s *podStream) Stop()                          { s.stop.Do(func() { close(s.done) }) }

// errRefused is a list or watch of an apiserver out of reach.
var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

func (a *fakeAPI) install(client *fake.Clientset) {
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.down {
			return true, nil, errRefused
		}
		a.lists++
		list := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(a.rv)}}
		clear(a.view)
		for _, name := range slices.Sorted(maps.Keys(a.pods)) {
			list.Items = append(list.Items, *a.pods[name].DeepCopy())
			a.view[name] = a.pods[name]
		}
		return true, list, nil
	})
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.down {
			return true, nil, errRefused
		}
		a.watches++
		s := &podStream{ch: make(chan watch.Event, 1024), done: make(chan struct{})}
		a.streams = append(a.streams, s)
		a.replayLocked()
		return true, s, nil
	})
}

// sendLocked sends an event to the open watches and keeps the informer's view.
func (a *fakeAPI) sendLocked(ev watch.Event) {
	open := a.streams[:0]
	for _, s := range a.streams {
		select {
		case <-s.done:
			continue // stopped by the informer
		default:
		}
		select {
		case s.ch <- watch.Event{Type: ev.Type, Object: ev.Object.DeepCopyObject()}:
		default:
			panic("fake apiserver: a watch's buffer is full")
		}
		open = append(open, s)
	}
	a.streams = open
	if len(open) == 0 {
		return // no watch open: the next one replays it
	}
	if pod, ok := ev.Object.(*v1.Pod); ok {
		if ev.Type == watch.Deleted {
			delete(a.view, pod.Name)
		} else {
			a.view[pod.Name] = pod
		}
	}
}

// replayLocked sends what the informer's view lacks: deletions (a replaced pod's old UID),
// then additions and modifications, by name.
func (a *fakeAPI) replayLocked() {
	if a.down {
		return
	}
	for _, name := range slices.Sorted(maps.Keys(a.view)) {
		if cur, ok := a.pods[name]; !ok || cur.UID != a.view[name].UID {
			a.sendLocked(watch.Event{Type: watch.Deleted, Object: a.view[name]})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(a.pods)) {
		cur := a.pods[name]
		switch old, ok := a.view[name]; {
		case !ok:
			a.sendLocked(watch.Event{Type: watch.Added, Object: cur})
		case old.ResourceVersion != cur.ResourceVersion:
			a.sendLocked(watch.Event{Type: watch.Modified, Object: cur})
		}
	}
}

func (a *fakeAPI) counts() (lists, watches int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lists, a.watches
}

// setDown puts the apiserver out of reach or back; back, a watch that stayed open replays
// what it missed. It reports whether one did.
func (a *fakeAPI) setDown(down bool) (open bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
	if down {
		return false
	}
	for _, s := range a.streams {
		select {
		case <-s.done:
		default:
			open = true
		}
	}
	if open {
		a.replayLocked()
	}
	return open
}

// closeStreams ends the open watches, as a connection reset does.
func (a *fakeAPI) closeStreams() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.streams {
		close(s.ch)
	}
	a.streams = nil
}

// expire ends the open watch with 410 Gone (the informer lists again), and reports whether
// one was open.
func (a *fakeAPI) expire() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	open := false
	for _, s := range a.streams {
		select {
		case <-s.done:
			continue
		default:
		}
		gone := apierrors.NewResourceExpired("too old resource version")
		s.ch <- watch.Event{Type: watch.Error, Object: &gone.ErrStatus}
		close(s.ch)
		open = true
	}
	a.streams = nil
	return open
}

func (a *fakeAPI) publishLocked(typ watch.EventType, pod *v1.Pod) {
	if !a.down {
		a.sendLocked(watch.Event{Type: typ, Object: pod})
	}
}

func (a *fakeAPI) create(name string, uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rv++
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: uid, ResourceVersion: strconv.Itoa(a.rv), Labels: map[string]string{"v": "0"}},
		Spec: v1.PodSpec{NodeName: "gw", Containers: []v1.Container{{Name: "main", Image: "registry.example/app:1", Command: []string{"sleep", "inf"}}}}}
	a.pods[name] = p
	a.publishLocked(watch.Added, p)
}

func (a *fakeAPI) relabel(name, v string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rv++
	p := a.pods[name].DeepCopy()
	p.Labels["v"], p.ResourceVersion = v, strconv.Itoa(a.rv)
	a.pods[name] = p
	a.publishLocked(watch.Modified, p)
}

func (a *fakeAPI) delete(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rv++
	p := a.pods[name].DeepCopy()
	p.ResourceVersion = strconv.Itoa(a.rv)
	delete(a.pods, name)
	a.publishLocked(watch.Deleted, p)
}

func (a *fakeAPI) uid(name string) types.UID {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.pods[name]; p != nil {
		return p.UID
	}
	return ""
}

func (a *fakeAPI) has(uid types.UID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.pods {
		if p.UID == uid {
			return true
		}
	}
	return false
}

func (a *fakeAPI) viewUIDs() []types.UID {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []types.UID
	for _, p := range a.view {
		out = append(out, p.UID)
	}
	return out
}
