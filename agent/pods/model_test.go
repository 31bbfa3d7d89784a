package pods_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/holdfast-dev/holdfast/agent/hollow"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/sources"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// TestLifecycleModel runs the pods manager on the hollow runtime (containers in memory), fed
// by the API source over a fake apiserver and its offline store and by the file source,
// through generated sequences: pods created, relabelled and deleted; a static pod's manifest
// written, edited (a new UID) and removed; the agent restarted with the apiserver reachable;
// the gateway rebooted with the uplink down (every task dies), then the uplink back. After
// every step, once the agent has settled, it checks what runs against a model:
//
//   - online, every pod of the apiserver runs one container, and nothing else runs but the
//     static pod while its manifest is there;
//   - offline after a reboot, exactly the API pods the node had recorded run again, and the
//     static pod;
//   - an agent restart never restarts a container of a pod that stays (same container);
//   - never two running containers for one pod, nor for two versions of the static pod.
//
// A failing sequence prints its seed and steps; HOLDFAST_LIFECYCLE_MODEL_SEQUENCES sets how
// many run (10 in make test: each edit of the static pod waits out its old version's grace
// period, a second).
func TestLifecycleModel(t *testing.T) {
	n := 10
	if v := os.Getenv("HOLDFAST_LIFECYCLE_MODEL_SEQUENCES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("HOLDFAST_LIFECYCLE_MODEL_SEQUENCES=%q: want a positive count", v)
		}
	}
	if testing.Short() {
		n = 3
	}
	for seed := range uint64(n) {
		if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runLifecycleModel(t, seed, 12) }) {
			return
		}
	}
}

type lifecycleModel struct {
	t     *testing.T
	rng   *rand.Rand
	steps []string
	dir   string

	client *fake.Clientset
	rt     *hollow.Runtime
	net    *hollow.Network
	store  *offline.MemStore

	api    map[string]types.UID // the apiserver's pods by name
	online bool                 // the agent reaches the apiserver
	// static is the version of the static pod's manifest on disk, 0 when there is none;
	// staticUID the UID the agent gives that version.
	static    int
	staticUID types.UID
	// kept is each pod's running container as last seen, for "a restart restarts nothing";
	// cleared by a reboot, whose containers are new attempts.
	kept map[string]string

	// the running agent
	cancel  context.CancelFunc
	done    sync.WaitGroup
	mgr     *pods.Manager
	src     atomic.Pointer[sources.APISource]
	uplink  context.CancelFunc // stops the API source alone (the uplink cut)
	started int
	watches atomic.Int64 // watches the fake apiserver opened
}

func runLifecycleModel(t *testing.T, seed uint64, length int) {
	m := &lifecycleModel{t: t, rng: rand.New(rand.NewPCG(seed, 0x6c6966656379636c)), dir: t.TempDir(),
		client: fake.NewClientset(), rt: hollow.NewRuntime(), net: hollow.NewNetwork("gw"),
		store: offline.NewMemStore(nil), api: map[string]types.UID{}, kept: map[string]string{}}
	key, err := offline.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	m.store.SetKey(key)
	if err := os.MkdirAll(filepath.Join(m.dir, "manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The fake apiserver's watch does not resume from a list's resourceVersion: what changes
	// between the informer's list and its watch is never delivered, which a real apiserver
	// does not do. startAPI waits for the watch before the sequence goes on.
	m.client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := m.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		m.watches.Add(1) // counted once the tracker delivers to it
		return true, w, err
	})
	defer func() {
		m.stop()
		if t.Failed() {
			t.Logf("seed %d, steps:\n  %s", seed, strings.Join(m.steps, "\n  "))
		}
	}()
	m.start(true)
	for range length {
		m.step()
		m.settle()
		if t.Failed() {
			return
		}
	}
}

func (m *lifecycleModel) logf(format string, args ...any) {
	m.steps = append(m.steps, fmt.Sprintf(format, args...))
}

var lifecycleNames = []string{"db", "web", "cache"}

func (m *lifecycleModel) step() {
	ctx := context.Background()
	name := lifecycleNames[m.rng.IntN(len(lifecycleNames))]
	pods := m.client.CoreV1().Pods("default")
	_, exists := m.api[name]
	switch r := m.rng.IntN(100); {
	case r < 30 && !exists:
		uid := types.UID(fmt.Sprintf("%s-%d", name, len(m.steps)))
		m.logf("create %s (%s), online %v", name, uid, m.online)
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: uid, Labels: map[string]string{"v": "0"}},
			Spec: v1.PodSpec{NodeName: "gw", Containers: []v1.Container{{Name: "main", Image: "registry.example/app:1", Command: []string{"sleep", "inf"}}}}}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			m.t.Fatal(err)
		}
		m.api[name] = uid
	case r < 45 && exists:
		m.logf("relabel %s, online %v", name, m.online)
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			m.t.Fatal(err)
		}
		p.Labels["v"] = strconv.Itoa(m.rng.IntN(1000))
		if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			m.t.Fatal(err)
		}
	case r < 60 && exists:
		m.logf("delete %s (%s), online %v", name, m.api[name], m.online)
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			m.t.Fatal(err)
		}
		delete(m.api, name)
	case r < 66: // the static pod's manifest written, edited (a new UID) or removed
		switch {
		case m.static == 0 || m.rng.IntN(3) > 0:
			m.static++
			m.logf("static manifest version %d", m.static)
			m.writeManifest()
		default:
			m.logf("static manifest removed")
			if err := os.Remove(filepath.Join(m.dir, "manifests", "sensor.yaml")); err != nil {
				m.t.Fatal(err)
			}
			m.static, m.staticUID = 0, ""
		}
	case r < 74:
		m.logf("agent restart, online")
		m.stop()
		m.start(true)
	case r < 86:
		m.logf("reboot with the uplink down")
		m.stop()
		m.reboot()
		m.start(false)
	default:
		if !m.online {
			m.logf("uplink back")
			m.startAPI()
		}
	}
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
	tmp := filepath.Join(dir, ".sensor.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(manifestText), 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "sensor.yaml")); err != nil {
		m.t.Fatal(err)
	}
}

// start starts an agent on the same runtime and store: restore from the store, then the
// API source if online.
func (m *lifecycleModel) start(online bool) {
	m.started++
	log := slog.New(slog.DiscardHandler)
	stateDir := filepath.Join(m.dir, fmt.Sprintf("state-%d", m.started))
	statusMgr := status.NewManager(nil, m.store, "gw", log)
	mgr := pods.NewManager(pods.Config{
		StateDir: stateDir, PodLogDir: filepath.Join(m.dir, "logs"), RelistPeriod: 50 * time.Millisecond, NodeName: "gw",
		Volumes:        volumes.NewManager(filepath.Join(stateDir, "pods"), nil, nil, log, volumes.Options{PlainDirs: true}),
		HostResolvConf: filepath.Join(m.dir, "resolv.conf"), HostsFile: filepath.Join(m.dir, "hosts"),
	}, m.rt, m.net, statusMgr, nil, log)
	mgr.SetAdmission(nil, m.store)
	files := &sources.FileSource{Dir: filepath.Join(m.dir, "manifests"), NodeName: "gw", Sink: mgr, Log: log, QuietPeriod: 10 * time.Millisecond}
	mgr.SetSourcesReady(func() bool { s := m.src.Load(); return s != nil && s.Ready() && files.Ready() })
	m.mgr = mgr
	m.src.Store(nil)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.spawn("file source", func() error { return files.Run(ctx) })
	restorer := &sources.APISource{NodeName: "gw", Sink: mgr, Store: m.store, Log: log}
	restorer.Restore()
	m.spawn("pods manager", func() error { return mgr.Run(ctx) })
	m.online = false
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

// startAPI starts the API source: the uplink is up.
func (m *lifecycleModel) startAPI() {
	src := &sources.APISource{Client: m.client, NodeName: "gw", Sink: m.mgr, Store: m.store, Log: slog.New(slog.DiscardHandler)}
	watches := m.watches.Load()
	factory := src.Start()
	m.src.Store(src)
	ctx, cancel := context.WithCancel(context.Background())
	m.uplink = cancel
	m.spawn("API source", func() error { return src.Run(ctx, factory) })
	m.online = true
	for deadline := time.Now().Add(10 * time.Second); m.watches.Load() == watches || !src.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			m.t.Fatal("the API source did not list and watch within 10 s")
		}
	}
}

// stop stops the agent (never its containers).
func (m *lifecycleModel) stop() {
	if m.cancel == nil {
		return
	}
	if m.uplink != nil {
		m.uplink()
		m.uplink = nil
	}
	m.cancel()
	m.done.Wait()
	m.cancel = nil
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
}

// running is the running containers of each pod by UID, and how many run for the static
// pod, whatever its version.
func (m *lifecycleModel) running() (byUID map[string][]string, static int) {
	cs, err := m.rt.List(context.Background())
	if err != nil {
		m.t.Fatal(err)
	}
	byUID = map[string][]string{}
	for _, c := range cs {
		if c.State != runtime.StateRunning {
			continue
		}
		byUID[c.PodUID] = append(byUID[c.PodUID], c.ID)
		if c.PodName == "sensor-gw" {
			static++
		}
	}
	return byUID, static
}

// want is what should run now: the static pod while its manifest is there; the apiserver's
// pods when online, the API pods the node recorded when offline.
func (m *lifecycleModel) want() map[string]bool {
	out := map[string]bool{}
	if m.static > 0 {
		out[string(m.staticUID)] = true
	}
	if m.online {
		for _, uid := range m.api {
			out[string(uid)] = true
		}
		return out
	}
	recs, _, err := m.store.LoadPods()
	if err != nil {
		m.t.Fatal(err)
	}
	for _, r := range recs {
		if r.Source == offline.SourceAPI {
			out[string(r.UID)] = true
		}
	}
	return out
}

// settle waits for what runs to match the model, then checks what must hold on the way.
func (m *lifecycleModel) settle() {
	deadline := time.Now().Add(10 * time.Second)
	for {
		run, static := m.running()
		if static > 1 {
			m.t.Errorf("%d versions of the static pod run at once", static)
			return
		}
		for key, ids := range run {
			if len(ids) > 1 {
				m.t.Errorf("pod %s runs %d containers: %v", key, len(ids), ids)
				return
			}
		}
		want := m.want()
		got := map[string]bool{}
		for key := range run {
			got[key] = true
		}
		if maps.Equal(got, want) {
			for key, ids := range run {
				if prev, ok := m.kept[key]; ok && prev != ids[0] {
					m.t.Errorf("pod %s: its container %s was replaced by %s though the pod stayed and the gateway did not reboot", key, prev, ids[0])
				}
				m.kept[key] = ids[0]
			}
			for key := range m.kept {
				if !got[key] {
					delete(m.kept, key)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			m.t.Errorf("after 10 s, running %v; want %v (online %v)", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)), m.online)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
