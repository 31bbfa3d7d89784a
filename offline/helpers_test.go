package offline

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// helperEnv selects a helper mode when the test binary is re-executed as a
// child process (see TestMain).
const helperEnv = "HOLDFAST_OFFLINE_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode, os.Getenv(helperEnv+"_PATH")))
	}
	os.Exit(m.Run())
}

// openTestStore opens a BoltStore and registers, in t.Cleanup, its Close
// followed by bbolt's consistency check of the file.
func openTestStore(t testing.TB, path string, opts Options) (*BoltStore, OpenReport) {
	t.Helper()
	s, rep, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { checkConsistency(t, path) })
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return s, rep
}

// testKey and otherKey are state keys for tests (KeySize bytes each).
var (
	testKey  = mustKey([]byte("0123456789abcdef0123456789abcdef"))
	otherKey = mustKey([]byte("fedcba9876543210fedcba9876543210"))
)

func mustKey(raw []byte) *Key {
	k, err := NewKey(raw)
	if err != nil {
		panic(err)
	}
	return k
}

// newTestBolt opens a fresh BoltStore with testKey.
func newTestBolt(t testing.TB) *BoltStore {
	t.Helper()
	s, rep := openTestStore(t, filepath.Join(t.TempDir(), "state.db"), Options{Key: testKey})
	if !rep.Created || rep.Recovered != nil {
		t.Fatalf("fresh open report: %+v", rep)
	}
	return s
}

// checkConsistency runs bbolt's tx.Check on a closed database file.
func checkConsistency(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		return
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Errorf("consistency check: open %s: %v", path, err)
		return
	}
	defer db.Close()
	if err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			t.Errorf("consistency check of %s: %v", path, err)
		}
		return nil
	}); err != nil {
		t.Errorf("consistency check: %v", err)
	}
}

var t0 = time.Date(2026, 11, 2, 8, 0, 0, 0, time.UTC)

func testPod(uid, name string) *v1.Pod {
	return &v1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: name, UID: types.UID(uid), ResourceVersion: "100",
			Labels: map[string]string{"app": name},
		},
		Spec: v1.PodSpec{
			NodeName: "gw-01",
			Containers: []v1.Container{
				{
					Name: "app", Image: "docker.io/local/busybox:1", Command: []string{"sleep", "3600"},
					Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
						v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("32Mi"),
					}},
				},
				{Name: "sidecar", Image: "docker.io/local/busybox:1", Command: []string{"sleep", "3600"}},
			},
		},
	}
}

func testStatus(phase v1.PodPhase, restarts int32) v1.PodStatus {
	return v1.PodStatus{
		Phase: phase,
		ContainerStatuses: []v1.ContainerStatus{{
			Name: "app", RestartCount: restarts, Ready: phase == v1.PodRunning,
		}},
	}
}

// corrupter lets the contract suite damage one stored record in place, the
// way bit rot or a torn write would, whatever the implementation.
type corrupter interface {
	corruptRecord(t testing.TB, kind, key string, raw []byte)
}

// garbage fails the checksum of any framed value.
var garbage = []byte("\x00\x01\x02 not a record")

func (s *BoltStore) corruptRecord(t testing.TB, kind, key string, raw []byte) {
	t.Helper()
	err := s.db.Update(func(tx *bolt.Tx) error {
		var b *bolt.Bucket
		var k []byte
		switch kind {
		case "pod", "admission":
			b, k = bucketAt(tx, bucketPods, []byte(key)), []byte(kind)
		case "token":
			uid, name, _ := strings.Cut(key, "/")
			b, k = bucketAt(tx, bucketPods, []byte(uid), bucketTokens), []byte(name)
		case "configmap":
			b, k = tx.Bucket(bucketConfigMaps), []byte(key)
		case "secret":
			b, k = tx.Bucket(bucketSecrets), []byte(key)
		case "policymodule":
			b, k = tx.Bucket(bucketPolicyModules), []byte(key)
		default:
			t.Fatalf("unknown kind %q", kind)
		}
		if b == nil || b.Get(k) == nil {
			t.Fatalf("corrupt %s %s: no such record", kind, key)
		}
		return b.Put(k, raw)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (m *MemStore) corruptRecord(t testing.TB, kind, key string, raw []byte) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	var slot *[]byte
	switch kind {
	case "pod", "admission":
		if p := m.pods[types.UID(key)]; p != nil {
			slot = map[string]*[]byte{"pod": &p.pod, "admission": &p.admission}[kind]
		}
	case "token":
		uid, name, _ := strings.Cut(key, "/")
		if p := m.pods[types.UID(uid)]; p != nil && p.tokens[name] != nil {
			p.tokens[name] = clone(raw)
			return
		}
	case "configmap", "secret":
		table := map[string]map[string][]byte{"configmap": m.configMaps, "secret": m.secrets}[kind]
		if table[key] != nil {
			table[key] = clone(raw)
			return
		}
	case "policymodule":
		if m.policyModules[key] != nil {
			m.policyModules[key] = clone(raw)
			return
		}
	default:
		t.Fatalf("unknown kind %q", kind)
	}
	if slot == nil || *slot == nil {
		t.Fatalf("corrupt %s %s: no such record", kind, key)
	}
	*slot = clone(raw)
}
