package offline

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/test/prereq"
)

func TestReopenKeepsEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, rep := openTestStore(t, path, Options{})
	if !rep.Created || rep.String() == "" {
		t.Fatalf("first open: %v", rep)
	}
	must(t, s.PutPod(SourceFile, testPod("uid-1", "web")))
	must(t, s.SetAdmission("uid-1", Admission{Accepted: true, At: t0}))
	_, err := s.AppendStatus(StatusUpdate{UID: "uid-1", Namespace: "default", Name: "web", Status: testStatus(v1.PodRunning, 3), Timestamp: t0})
	must(t, err)
	must(t, s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cfg"}, Data: map[string]string{"k": "v"}}))
	digest := "sha256:" + strings.Repeat("d", 64)
	must(t, s.PutPolicyModule(digest, []byte("\x00asm")))
	must(t, s.Close())

	s, rep = openTestStore(t, path, Options{})
	if rep.Created || rep.Recovered != nil || rep.MigratedFrom != 0 {
		t.Fatalf("reopen: %v", rep)
	}
	got, err := s.GetPod("uid-1")
	must(t, err)
	if got.Source != SourceFile || !got.Admission.Accepted || got.Pod.Status.ContainerStatuses[0].RestartCount != 3 {
		t.Errorf("pod after reopen: %+v", got)
	}
	cm, _ := s.GetConfigMap("default", "cfg")
	module, _ := s.GetPolicyModule(digest)
	pending, _, _ := s.PendingStatuses()
	if cm == nil || cm.Data["k"] != "v" || string(module) != "\x00asm" || len(pending) != 1 || !pending[0].Timestamp.Equal(t0) {
		t.Errorf("after reopen: configmap %+v, module %q, pending %+v", cm, module, pending)
	}
}

// TestOpenTimeoutSameProcess: flock locks belong to open file descriptions,
// so two opens in one process conflict just as two processes do.
func TestOpenTimeoutSameProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	openTestStore(t, path, Options{})
	start := time.Now()
	s, _, err := Open(path, Options{Timeout: 150 * time.Millisecond})
	if err == nil {
		s.Close()
		t.Fatal("second Open of the same file succeeded")
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), path) ||
		!strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) ||
		!strings.Contains(err.Error(), "another holdfast may be running") {
		t.Errorf("second Open: %v", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("second Open gave up after %s", d)
	}
}

// TestBoltFlockSameProcess checks the premise above on bbolt itself.
func TestBoltFlockSameProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raw.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	must(t, err)
	defer db.Close()
	db2, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 100 * time.Millisecond})
	if err == nil {
		db2.Close()
		t.Fatal("bbolt opened the same file twice in one process")
	}
	if !errors.Is(err, berrors.ErrTimeout) {
		t.Errorf("second bolt.Open: %v, want ErrTimeout", err)
	}
	// And a store fails clearly if a foreign tool holds bbolt's own lock.
	_, _, err = Open(path, Options{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), path) {
		t.Errorf("Open while bbolt's lock is held elsewhere: %v", err)
	}
}

// writeValidDB creates a database with enough data to span many pages.
func writeValidDB(t *testing.T, path string) {
	t.Helper()
	s, _, err := Open(path, Options{})
	must(t, err)
	for i := range 60 {
		uid := types.UID(fmt.Sprintf("uid-%03d", i))
		pod := testPod(string(uid), string(uid))
		pod.Annotations = map[string]string{"padding": strings.Repeat("x", 1500)}
		must(t, s.PutPod(SourceAPI, pod))
		must(t, s.SetAdmission(uid, Admission{Accepted: true, At: t0}))
	}
	must(t, s.Close())
}

func TestCorruptFileIsMovedAside(t *testing.T) {
	pageSize := os.Getpagesize()
	cases := []struct {
		name   string
		damage func(t *testing.T, valid []byte) []byte
		// kinds are the acceptable classifications: whether bbolt itself
		// refuses the file or our checks after it opened catch the damage
		// depends on which pages were hit (the freelist is read by Open).
		kinds []RecoveryKind
	}{
		{"zero bytes", func(*testing.T, []byte) []byte { return []byte{} }, []RecoveryKind{RecoveryEmptyFile}},
		{"truncated to half", func(_ *testing.T, b []byte) []byte { return b[:len(b)/2] }, []RecoveryKind{RecoveryUnreadable, RecoveryInconsistent}},
		{"truncated to one page", func(_ *testing.T, b []byte) []byte { return b[:pageSize] }, []RecoveryKind{RecoveryUnreadable}},
		{"truncated mid-page, freelist intact (fault on a page past the end)", func(t *testing.T, b []byte) []byte {
			g := relocateFreelists(t, b, 10)
			root := newestMeta(g).root
			return g[:int(root)*pageSize-pageSize/2]
		}, []RecoveryKind{RecoveryInconsistent}},
		{"root page garbled", func(t *testing.T, b []byte) []byte {
			g := bytes.Clone(b)
			root := int(newestMeta(g).root)
			r := rand.New(rand.NewPCG(5, 6))
			for i := root*pageSize + 8; i < (root+1)*pageSize; i++ {
				g[i] = byte(r.Uint32())
			}
			return g
		}, []RecoveryKind{RecoveryInconsistent}},
		{"leaf page zeroed", func(t *testing.T, b []byte) []byte {
			g := bytes.Clone(b)
			clear(g[30*pageSize : 31*pageSize])
			return g
		}, []RecoveryKind{RecoveryInconsistent}},
		{"random garbage", func(_ *testing.T, b []byte) []byte {
			r := rand.New(rand.NewPCG(1, 2))
			g := make([]byte, len(b))
			for i := range g {
				g[i] = byte(r.Uint32())
			}
			return g
		}, []RecoveryKind{RecoveryUnreadable}},
		{"small text file", func(*testing.T, []byte) []byte { return []byte("hello, I am not a database\n") }, []RecoveryKind{RecoveryUnreadable}},
		{"valid header then garbage", func(_ *testing.T, b []byte) []byte {
			r := rand.New(rand.NewPCG(3, 4))
			g := bytes.Clone(b)
			for i := 2 * pageSize; i < len(g); i++ {
				g[i] = byte(r.Uint32())
			}
			return g
		}, []RecoveryKind{RecoveryUnreadable, RecoveryInconsistent}},
		{"valid header then zeros", func(_ *testing.T, b []byte) []byte {
			g := bytes.Clone(b)
			clear(g[2*pageSize:])
			return g
		}, []RecoveryKind{RecoveryUnreadable, RecoveryInconsistent}},
		{"both meta pages damaged", func(_ *testing.T, b []byte) []byte {
			g := bytes.Clone(b)
			for _, off := range []int{0, pageSize} {
				copy(g[off+16:off+64], bytes.Repeat([]byte{0xAB}, 48))
			}
			return g
		}, []RecoveryKind{RecoveryUnreadable}},
	}
	valid := filepath.Join(t.TempDir(), "valid.db")
	writeValidDB(t, valid)
	good, err := os.ReadFile(valid)
	must(t, err)
	if len(good) < 8*pageSize {
		t.Fatalf("valid database is only %d bytes", len(good))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.db")
			damaged := c.damage(t, good)
			must(t, os.WriteFile(path, damaged, 0o600))
			when := time.Date(2026, 11, 2, 9, 30, 0, 0, time.UTC)

			s, rep := openTestStore(t, path, Options{Now: func() time.Time { return when }})
			t.Logf("report: %v", rep)
			r := rep.Recovered
			if r == nil {
				t.Fatalf("no recovery reported: %v", rep)
			}
			if !slices.Contains(c.kinds, r.Kind) {
				t.Errorf("kind %s, want one of %v (%v)", r.Kind, c.kinds, r.Err)
			}
			if want := path + ".corrupt-20261102T093000Z"; r.MovedTo != want {
				t.Errorf("moved to %s, want %s", r.MovedTo, want)
			}
			if !rep.Created || r.Err == nil || r.Size != int64(len(damaged)) || !strings.Contains(rep.String(), r.MovedTo) {
				t.Errorf("report %+v", rep)
			}
			kept, err := os.ReadFile(r.MovedTo)
			must(t, err)
			if !bytes.Equal(kept, damaged) {
				t.Errorf("the file kept for inspection differs from the damaged one (%d vs %d bytes)", len(kept), len(damaged))
			}
			// The fresh store works and is empty.
			recs, _, err := s.LoadPods()
			must(t, err)
			if len(recs) != 0 {
				t.Errorf("fresh store has %d pods", len(recs))
			}
			must(t, s.PutPod(SourceAPI, testPod("uid-new", "new")))
			must(t, s.Close())
			// Next boot: a normal open; a second recovery would not clobber
			// the first file kept.
			s2, rep2 := openTestStore(t, path, Options{Now: func() time.Time { return when }})
			if rep2.Recovered != nil || rep2.Created {
				t.Errorf("second open: %v", rep2)
			}
			if _, err := s2.GetPod("uid-new"); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestMoveAsideNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	when := time.Date(2026, 11, 2, 9, 30, 0, 0, time.UTC)
	var moved []string
	for range 3 {
		must(t, os.WriteFile(path, []byte("garbage"), 0o600))
		s, rep := openTestStore(t, path, Options{Now: func() time.Time { return when }})
		must(t, s.Close())
		moved = append(moved, rep.Recovered.MovedTo)
	}
	base := path + ".corrupt-20261102T093000Z"
	want := []string{base, base + "-2", base + "-3"}
	if strings.Join(moved, " ") != strings.Join(want, " ") {
		t.Errorf("moved to %v, want %v", moved, want)
	}
}

// TestOpenSchemaProblems covers files bbolt reads fine but that are not a
// state database this version can use.
func TestOpenSchemaProblems(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(tx *bolt.Tx) error
		kind    RecoveryKind // "" for no recovery
		created bool
	}{
		{"no buckets (first boot interrupted)", func(*bolt.Tx) error { return nil }, "", true},
		{"foreign database", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("allocations"))
			if err != nil {
				return err
			}
			return b.Put([]byte("k"), []byte("v"))
		}, RecoveryForeign, true},
		{"newer schema", func(tx *bolt.Tx) error {
			if err := initSchema(tx); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyVersion, []byte(strconv.Itoa(SchemaVersion+1)))
		}, RecoveryNewerSchema, true},
		{"garbled version", func(tx *bolt.Tx) error {
			if err := initSchema(tx); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyVersion, []byte("two"))
		}, RecoveryForeign, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			db, err := bolt.Open(path, 0o600, nil)
			must(t, err)
			must(t, db.Update(c.prepare))
			must(t, db.Close())
			s, rep := openTestStore(t, path, Options{})
			t.Logf("report: %v", rep)
			switch {
			case c.kind == "" && rep.Recovered != nil:
				t.Errorf("unexpected recovery: %v", rep)
			case c.kind != "" && (rep.Recovered == nil || rep.Recovered.Kind != c.kind):
				t.Errorf("recovery %+v, want kind %s", rep.Recovered, c.kind)
			}
			if rep.Created != c.created {
				t.Errorf("Created = %t, want %t", rep.Created, c.created)
			}
			must(t, s.PutPod(SourceAPI, testPod("u", "p")))
		})
	}
}

// TestBitRotInAValueIsARecordProblem: a flipped byte inside one value
// leaves the file structurally sound; the record's checksum catches it at
// load, it is quarantined, and everything else loads.
func TestBitRotInAValueIsARecordProblem(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	writeValidDB(t, path)
	raw, err := os.ReadFile(path)
	must(t, err)
	// Flip one byte of the padding annotation of one pod, in the file.
	marker := []byte(`"uid-017","resourceVersion"`)
	i := bytes.Index(raw, marker)
	if i < 0 {
		t.Fatal("pod uid-017 not found in the file")
	}
	j := bytes.Index(raw[i:], []byte("xxxx"))
	raw[i+j] = 'y'
	must(t, os.WriteFile(path, raw, 0o600))

	s, rep := openTestStore(t, path, Options{})
	if rep.Recovered != nil {
		t.Fatalf("a bad value made the whole file unusable: %v", rep)
	}
	recs, errs, err := s.LoadPods()
	must(t, err)
	if len(recs) != 59 || len(errs) != 1 || !strings.Contains(fmt.Sprint(errs["uid-017"]), "checksum") {
		t.Errorf("load: %d pods, errs %v", len(recs), errs)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	must(t, err)
	defer in.Close()
	out, err := os.Create(to)
	must(t, err)
	_, err = io.Copy(out, in)
	must(t, err)
	must(t, out.Close())
}

// TestMigrateFromV1 opens the committed schema v1 file (see
// internal/genv1db) and checks what the migration made of it.
func TestMigrateFromV1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, "testdata/schema-v1.db", path)
	s, rep := openTestStore(t, path, Options{Key: testKey})
	t.Logf("report: %v", rep)
	if rep.MigratedFrom != 1 || rep.Recovered != nil || rep.Created {
		t.Fatalf("report %v, want a migration from v1", rep)
	}
	for _, k := range []string{"pods/default/no-uid", "pods/default/torn"} {
		if !errors.Is(rep.Quarantined[k], errUndecodable) {
			t.Errorf("report.Quarantined[%s] = %v", k, rep.Quarantined[k])
		}
	}
	if len(rep.Quarantined) != 2 {
		t.Errorf("quarantined %v", rep.Quarantined)
	}
	recs, errs, err := s.LoadPods()
	must(t, err)
	if len(errs) != 0 || len(recs) != 2 {
		t.Fatalf("pods %+v, errs %v", recs, errs)
	}
	want := map[types.UID]struct {
		name   string
		source Source
		at     time.Time
	}{
		"6f1b6a3e-0000-4000-8000-000000000001": {"sensor-reader", SourceAPI, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)},
		"6f1b6a3e-0000-4000-8000-000000000002": {"edge-proxy-gw-01", SourceFile, time.Date(2026, 3, 1, 12, 1, 0, 0, time.UTC)},
	}
	for _, r := range recs {
		w, ok := want[r.UID]
		if !ok || r.Pod.Name != w.name || r.Source != w.source || !r.Admission.Accepted || !r.Admission.At.Equal(w.at) {
			t.Errorf("migrated pod %s: %+v", r.UID, r)
		}
		// The empty containers bucket of v2, for an older agent after a rollback.
		if c := legacyContainers(t, s, r.UID); c == nil || len(c) != 0 {
			t.Errorf("migrated pod %s: containers bucket %v, want an empty one", r.UID, c)
		}
	}
	cm, err := s.GetConfigMap("default", "sensor-config")
	must(t, err)
	sec, err := s.GetSecret("default", "sensor-token")
	must(t, err)
	// The legacy parts no method reads (doc.go), as an older agent would read them.
	var node v1.Node
	if err := decodeValue(rawRecord(t, s, "node", "node"), &node); err != nil {
		t.Errorf("migrated node/node: %v", err)
	}
	name := rawRecord(t, s, "meta", "node_name")
	boots := rawRecord(t, s, "meta", "boot_count")
	if cm.Data["interval"] != "5s" || cm.ResourceVersion != "17" || string(sec.Data["token"]) != "s3cr3t" ||
		node.ResourceVersion != "99" || string(name) != "gw-01" || !bytes.Equal(boots, make([]byte, 8)) {
		t.Errorf("migrated: cm %+v, secret %+v, node %+v, name %q, boots %x", cm, sec, node, name, boots)
	}
	q, err := s.Quarantined()
	must(t, err)
	if len(q) != 2 || !strings.HasPrefix(string(q[1].Value), `{"source":"api","pod":{"metadata":{"name":"to`) {
		t.Errorf("quarantine %+v", q)
	}
	must(t, s.Close())

	s, rep = openTestStore(t, path, Options{Key: testKey})
	if rep.MigratedFrom != 0 || rep.Recovered != nil {
		t.Errorf("second open migrated again: %v", rep)
	}
	recs, errs, _ = s.LoadPods()
	if len(recs) != 2 || len(errs) != 0 {
		t.Errorf("after reopen: %+v, %v", recs, errs)
	}
}

// rawRecord is the raw value at path (buckets, then the key) in the store's file, nil if
// absent: what an older agent reads of the legacy parts of the schema (doc.go).
func rawRecord(t *testing.T, s *BoltStore, path ...string) []byte {
	t.Helper()
	buckets := make([][]byte, len(path)-1)
	for i, name := range path[:len(path)-1] {
		buckets[i] = []byte(name)
	}
	var raw []byte
	must(t, s.view(func(tx *bolt.Tx) error {
		if b := bucketAt(tx, buckets...); b != nil {
			raw = clone(b.Get([]byte(path[len(path)-1])))
		}
		return nil
	}))
	return raw
}

// legacyContainers is the raw content of the pod's containers bucket (doc.go), nil if there
// is none.
func legacyContainers(t *testing.T, s *BoltStore, uid types.UID) map[string][]byte {
	t.Helper()
	var records map[string][]byte
	must(t, s.view(func(tx *bolt.Tx) error {
		b := bucketAt(tx, bucketPods, []byte(uid), bucketContainers)
		if b == nil {
			return nil
		}
		records = map[string][]byte{}
		return b.ForEach(func(k, v []byte) error {
			records[string(k)] = clone(v)
			return nil
		})
	}))
	return records
}

// TestContainerRecordsOfEarlierVersionsAreIgnored: a file in which an earlier version of the
// store kept container records (pods/<uid>/containers/, doc.go), some of them damaged since,
// opens, and its pods load, with nothing reported or quarantined; the records go with their pod.
func TestContainerRecordsOfEarlierVersionsAreIgnored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	must(t, s.SetAdmission("uid-1", Admission{Accepted: true, At: t0}))
	must(t, s.PutPod(SourceAPI, testPod("uid-2", "db")))
	record, err := encodeValue(map[string]any{"name": "app", "containerID": "c-app-3", "attempt": 3, "restartCount": 3})
	must(t, err)
	must(t, s.db.Update(func(tx *bolt.Tx) error {
		b, err := bucketAt(tx, bucketPods, []byte("uid-1")).CreateBucket(bucketContainers)
		if err != nil {
			return err
		}
		if err := b.Put([]byte("app"), record); err != nil {
			return err
		}
		if err := b.Put([]byte("sidecar"), garbage); err != nil {
			return err
		}
		_, err = b.CreateBucket([]byte("nested"))
		return err
	}))
	must(t, s.Close())

	s, rep := openTestStore(t, path, Options{Key: testKey})
	if rep.Recovered != nil || rep.MigratedFrom != 0 || len(rep.Quarantined) != 0 {
		t.Fatalf("open: %v", rep)
	}
	recs, errs, err := s.LoadPods()
	must(t, err)
	if len(recs) != 2 || len(errs) != 0 || recs[0].UID != "uid-1" || !recs[0].Admission.Accepted {
		t.Errorf("LoadPods = %+v, %v", recs, errs)
	}
	if rec, err := s.GetPod("uid-1"); err != nil || rec.Pod.Name != "web" {
		t.Errorf("GetPod = %+v, %v", rec, err)
	}
	if q, _ := s.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined: %+v", q)
	}
	if c := legacyContainers(t, s, "uid-1"); len(c) != 3 {
		t.Errorf("containers bucket after the loads: %v, want it left as it was", c)
	}
	must(t, s.DeletePod("uid-1"))
	if c := legacyContainers(t, s, "uid-1"); c != nil {
		t.Errorf("containers bucket after DeletePod: %v, want gone with the pod", c)
	}
}

// TestFailedMigrationChangesNothing: the migration is one transaction, so a
// failure halfway leaves the old file byte for byte as it was, moved aside.
func TestFailedMigrationChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, "testdata/schema-v1.db", path)
	before, err := os.ReadFile(path)
	must(t, err)
	last := SchemaVersion - 1 // the whole chain runs before the failure
	orig := migrations[last]
	t.Cleanup(func() { migrations[last] = orig })
	migrations[last] = func(tx *bolt.Tx, q *quarantiner, key *Key) error {
		if err := orig(tx, q, key); err != nil {
			return err
		}
		return errors.New("injected failure after the whole migration ran")
	}
	s, rep := openTestStore(t, path, Options{})
	if rep.Recovered == nil || rep.Recovered.Kind != RecoveryMigrationFailed || rep.MigratedFrom != 0 || rep.Quarantined != nil {
		t.Fatalf("report %v", rep)
	}
	after, err := os.ReadFile(rep.Recovered.MovedTo)
	must(t, err)
	if !bytes.Equal(before, after) {
		t.Error("the failed migration changed the old file")
	}
	if recs, _, _ := s.LoadPods(); len(recs) != 0 {
		t.Errorf("fresh store has pods: %v", recs)
	}
}

func TestOpenErrorsThatRecoveryCannotFix(t *testing.T) {
	dir := t.TempDir()
	// A directory where the file should be.
	path := filepath.Join(dir, "state.db")
	must(t, os.Mkdir(path, 0o700))
	if _, _, err := Open(path, Options{}); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Open on a directory: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the directory was moved: %v", err)
	}
	if os.Geteuid() != 0 {
		// An unreadable file is a permission problem, not corruption.
		path := filepath.Join(dir, "unreadable.db")
		writeValidDB(t, path)
		must(t, os.Chmod(path, 0))
		if _, _, err := Open(path, Options{}); !errors.Is(err, os.ErrPermission) {
			t.Errorf("Open of an unreadable file: %v", err)
		}
	}
}

// bbolt's meta page, for the damage tests: after the 16-byte page header,
// magic, version, pageSize, flags (4 bytes each), root bucket (pgid,
// sequence), freelist pgid, high-water pgid, txid, then an FNV-64a checksum
// of everything before it. Little-endian on every platform we build for.
const (
	metaAt         = 16
	metaRoot       = metaAt + 16
	metaFreelist   = metaAt + 32
	metaTxid       = metaAt + 48
	metaChecksum   = metaAt + 56
	pageHeaderSize = 16
)

type metaInfo struct {
	offset             int
	root, freelist, tx uint64
}

func readMeta(b []byte, offset int) metaInfo {
	return metaInfo{
		offset:   offset,
		root:     binary.LittleEndian.Uint64(b[offset+metaRoot:]),
		freelist: binary.LittleEndian.Uint64(b[offset+metaFreelist:]),
		tx:       binary.LittleEndian.Uint64(b[offset+metaTxid:]),
	}
}

func newestMeta(b []byte) metaInfo {
	m0, m1 := readMeta(b, 0), readMeta(b, os.Getpagesize())
	if m1.tx > m0.tx {
		return m1
	}
	return m0
}

// relocateFreelists copies each meta page's freelist page to a low page
// (to, to+1) and points the meta there, re-sealing its checksum: a file
// whose freelist survives a truncation that takes data pages with it.
func relocateFreelists(t *testing.T, b []byte, to int) []byte {
	t.Helper()
	ps := os.Getpagesize()
	g := bytes.Clone(b)
	for i, off := range []int{0, ps} {
		m := readMeta(g, off)
		dst := to + i
		copy(g[dst*ps:(dst+1)*ps], g[int(m.freelist)*ps:(int(m.freelist)+1)*ps])
		binary.LittleEndian.PutUint64(g[dst*ps:], uint64(dst)) // the page's own id
		binary.LittleEndian.PutUint64(g[off+metaFreelist:], uint64(dst))
		h := fnv.New64a()
		h.Write(g[off+metaAt : off+metaChecksum])
		binary.LittleEndian.PutUint64(g[off+metaChecksum:], h.Sum64())
	}
	// The relocated file must still open in bbolt, or the test proves nothing.
	path := filepath.Join(t.TempDir(), "relocated.db")
	must(t, os.WriteFile(path, g, 0o600))
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatalf("relocated file does not open: %v", err)
	}
	must(t, db.Close())
	return g
}

// TestStaleNewFileFromACrashedCreate: a crash while creating a database
// leaves "<path>.new" behind and nothing at path; the next boot is a plain
// first boot.
func TestStaleNewFileFromACrashedCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	must(t, os.WriteFile(path+".new", []byte{}, 0o600))
	s, rep := openTestStore(t, path, Options{})
	if !rep.Created || rep.Recovered != nil {
		t.Errorf("report %v", rep)
	}
	if _, err := os.Stat(path + ".new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale .new file left: %v", err)
	}
	must(t, s.PutPod(SourceAPI, testPod("u", "p")))
}

// TestMigrateFromV2: a v2 file (Secrets in the clear) opens as v3 with its
// pods and ConfigMaps, and the container records, boot counter and pod list
// resourceVersion an older agent reads after a rollback; with a key its
// Secrets are sealed, without one they are dropped.
func TestMigrateFromV2(t *testing.T) {
	for _, key := range []*Key{testKey, nil} {
		t.Run(fmt.Sprintf("key=%t", key != nil), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			copyFile(t, "testdata/schema-v2.db", path)
			s, rep := openTestStore(t, path, Options{Key: key})
			t.Logf("report: %v", rep)
			if rep.MigratedFrom != 2 || rep.Recovered != nil || rep.Created || len(rep.Quarantined) != 0 {
				t.Fatalf("report %v, want a clean migration from v2", rep)
			}
			const uid = "6f1b6a3e-0000-4000-8000-000000000003"
			rec, err := s.GetPod(uid)
			must(t, err)
			if rec.Pod.Name != "meter" || !rec.Admission.Accepted {
				t.Errorf("migrated pod %+v", rec)
			}
			// The legacy parts no method reads (doc.go), as an older agent would read them.
			var c struct {
				ContainerID  string `json:"containerID"`
				RestartCount int32  `json:"restartCount"`
			}
			if err := decodeValue(legacyContainers(t, s, uid)["app"], &c); err != nil || c.RestartCount != 2 || c.ContainerID != "c-app-2" {
				t.Errorf("migrated container record %+v, %v", c, err)
			}
			var rv string
			if err := decodeValue(rawRecord(t, s, "sync", "pods_resource_version"), &rv); err != nil || rv != "1234" {
				t.Errorf("migrated pod list resourceVersion %q, %v", rv, err)
			}
			cm, err := s.GetConfigMap("default", "meter-config")
			must(t, err)
			boots := rawRecord(t, s, "meta", "boot_count")
			if cm.Data["interval"] != "10s" || len(boots) != 8 || binary.BigEndian.Uint64(boots) != 7 {
				t.Errorf("migrated: cm %+v, boots %x", cm, boots)
			}
			sec, err := s.GetSecret("default", "meter-secret")
			switch {
			case key != nil && (err != nil || string(sec.Data["password"]) != "pl41n"):
				t.Errorf("secret sealed by the migration: %+v, %v", sec, err)
			case key == nil && !errors.Is(err, ErrNotFound):
				t.Errorf("secret without a key: %+v, %v, want it dropped", sec, err)
			}
			// The container records go with their pod.
			must(t, s.DeletePod(uid))
			if c := legacyContainers(t, s, uid); c != nil {
				t.Errorf("containers bucket after DeletePod: %v", c)
			}
		})
	}
}

// TestSecretsAndTokensEncryptedOnDisk: neither a Secret's data nor a token
// can be read from the file, and rewriting them unchanged writes nothing.
func TestSecretsAndTokensEncryptedOnDisk(t *testing.T) {
	s := newTestBolt(t)
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	sec := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"}, Data: map[string][]byte{"password": []byte("hunter2hunter2")}}
	tok := Token{Token: "eyJhbGciOiJSUzI1NiJ9.secret-token-body", ExpiresAt: t0}
	must(t, s.PutSecret(sec))
	must(t, s.PutToken("u1", "t", tok))
	before := s.Stats()
	must(t, s.PutSecret(sec))
	must(t, s.PutToken("u1", "t", tok))
	if d := s.Stats(); d.Commits != before.Commits || d.SkippedWrites != before.SkippedWrites+2 {
		t.Errorf("unchanged secret and token written again: %+v -> %+v", before, d)
	}
	must(t, s.Close())
	raw, err := os.ReadFile(s.Path())
	must(t, err)
	for _, plain := range []string{"hunter2hunter2", base64.StdEncoding.EncodeToString([]byte("hunter2hunter2")), "secret-token-body"} {
		if bytes.Contains(raw, []byte(plain)) {
			t.Errorf("%q readable in the database file", plain)
		}
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadKey(filepath.Join(dir, "absent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing key file: %v, want fs.ErrNotExist", err)
	}
	short := filepath.Join(dir, "short")
	must(t, os.WriteFile(short, []byte("too short"), 0o600))
	if _, err := LoadKey(short); !errors.Is(err, ErrInvalid) {
		t.Errorf("short key file: %v, want ErrInvalid", err)
	}
	long := filepath.Join(dir, "long")
	must(t, os.WriteFile(long, bytes.Repeat([]byte("k"), KeySize+1), 0o600))
	if _, err := LoadKey(long); !errors.Is(err, ErrInvalid) {
		t.Errorf("key file of %d bytes: %v, want ErrInvalid", KeySize+1, err)
	}
	good := filepath.Join(dir, "good")
	must(t, os.WriteFile(good, []byte("0123456789abcdef0123456789abcdef"), 0o600))
	k, err := LoadKey(good)
	must(t, err)
	if k.ID() != testKey.ID() || k.ID() == otherKey.ID() || len(k.ID()) != 16 {
		t.Errorf("key IDs: %s, %s, %s", k.ID(), testKey.ID(), otherKey.ID())
	}
	if _, err := LoadKey(dir); !errors.Is(err, ErrInvalid) {
		t.Errorf("a directory as key file: %v, want ErrInvalid", err)
	}
}

// A state key that others on the gateway can read protects nothing, and one others can
// replace lets them choose it: such a file is refused with a reason, whatever other mode
// bits it has, as is one owned by another user.
func TestLoadKeyRefusesExposedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.key")
	must(t, os.WriteFile(path, []byte("0123456789abcdef0123456789abcdef"), 0o600))
	for perm := os.FileMode(0); perm <= 0o777; perm++ {
		if perm&0o400 == 0 {
			continue // the owner cannot read it: not what this test is about
		}
		must(t, os.Chmod(path, perm))
		_, err := LoadKey(path)
		if exposed := perm&0o077 != 0; exposed != errors.Is(err, ErrKeyExposed) {
			t.Fatalf("mode %04o: %v; want refused: %v", perm, err, exposed)
		} else if exposed && !strings.Contains(err.Error(), fmt.Sprintf("mode %04o", perm)) {
			t.Fatalf("mode %04o refused without saying the mode: %v", perm, err)
		}
	}
}

func TestLoadKeyRefusesAnotherOwner(t *testing.T) {
	prereq.Root(t, "to give the key file to another user")
	path := filepath.Join(t.TempDir(), "state.key")
	must(t, os.WriteFile(path, []byte("0123456789abcdef0123456789abcdef"), 0o600))
	must(t, os.Chown(path, 12345, 0))
	if _, err := LoadKey(path); !errors.Is(err, ErrKeyExposed) || !strings.Contains(err.Error(), "uid 12345") {
		t.Errorf("a key file of uid 12345: %v, want refused naming the owner", err)
	}
}

// A card that corrupts the database at every boot does not fill the state file system with
// copies: the newest KeptCorruptCopies are kept (by the time in their name, then by their
// counter: -10 is newer than -9), the older are deleted and reported. Before, every copy was
// kept for good.
func TestCorruptCopiesBounded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	first := time.Date(2026, 11, 2, 9, 30, 0, 0, time.UTC)
	var removed []string
	recover := func(when time.Time) {
		t.Helper()
		must(t, os.WriteFile(path, []byte("garbage"), 0o600))
		s, rep := openTestStore(t, path, Options{Now: func() time.Time { return when }})
		must(t, s.Close())
		removed = append(removed, rep.Recovered.Removed...)
	}
	for range 11 { // base, -2 ... -11 within one second
		recover(first)
	}
	recover(first.Add(time.Hour))
	base := path + ".corrupt-20261102T093000Z"
	left, err := filepath.Glob(path + ".corrupt-*")
	must(t, err)
	slices.Sort(left)
	want := []string{base + "-10", base + "-11", path + ".corrupt-20261102T103000Z"}
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Errorf("copies left %v, want %v", left, want)
	}
	if len(removed) != 9 || slices.Contains(removed, base+"-10") {
		t.Errorf("removed %v: want the 9 oldest", removed)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the new database: %v", err)
	}
}

// A gateway without a real-time clock can boot at a time before its older copies': the copy
// just made is kept whatever its name says, and the report never names a file that is gone.
func TestCorruptCopyJustMadeKeptWhenTheClockWentBack(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	later := time.Date(2026, 11, 2, 9, 30, 0, 0, time.UTC)
	for i := range KeptCorruptCopies {
		must(t, os.WriteFile(path, []byte("garbage"), 0o600))
		s, _ := openTestStore(t, path, Options{Now: func() time.Time { return later.Add(time.Duration(i) * time.Hour) }})
		must(t, s.Close())
	}
	must(t, os.WriteFile(path, []byte("garbage"), 0o600))
	s, rep := openTestStore(t, path, Options{Now: func() time.Time { return time.Unix(0, 0) }}) // booted at 1970
	must(t, s.Close())
	if _, err := os.Stat(rep.Recovered.MovedTo); err != nil {
		t.Fatalf("the copy just made (%s) is gone: %v", rep.Recovered.MovedTo, err)
	}
	left, _ := filepath.Glob(path + ".corrupt-*")
	if len(left) != KeptCorruptCopies {
		t.Errorf("copies left %v, want %d", left, KeptCorruptCopies)
	}
}
