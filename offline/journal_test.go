package offline

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

// TestStatusChangeCostsOneSyncAndNoPodWrite is the flash-wear attacker (#28): a pod whose
// readiness flips, each status delivered and echoed back by the apiserver. Before the journal
// each change cost three bbolt commits (append, ack, the echo rewriting the whole pod record),
// two fdatasyncs each.
func TestStatusChangeCostsOneSyncAndNoPodWrite(t *testing.T) {
	s := newTestBolt(t)
	pod := testPod("uid-1", "web")
	must(t, s.PutPod(SourceAPI, pod))
	before := s.Stats()
	const changes = 50
	for i := range changes {
		st := testStatus(v1.PodRunning, 0)
		st.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: []v1.ConditionStatus{v1.ConditionTrue, v1.ConditionFalse}[i%2]}}
		seq, err := s.AppendStatus(StatusUpdate{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Status: st, Timestamp: t0.Add(time.Duration(i) * time.Second)})
		must(t, err)
		must(t, s.AckStatuses(pod.UID, seq))
		echo := pod.DeepCopy()
		echo.Status = st
		must(t, s.PutPod(SourceAPI, echo)) // the informer's echo of the delivered status
	}
	after := s.Stats()
	if n := after.Commits - before.Commits; n != 0 {
		t.Errorf("%d status changes cost %d bbolt commits (two syncs each), want 0", changes, n)
	}
	if n := after.OutboxSyncs - before.OutboxSyncs; n > changes {
		t.Errorf("%d status changes cost %d journal syncs, want at most one each", changes, n)
	}
	if n := after.SkippedWrites - before.SkippedWrites; n < changes {
		t.Errorf("the apiserver's echoes of %d statuses were written: %d skipped", changes, n)
	}
	if per := (after.OutboxBytes - before.OutboxBytes) / changes; per > 16<<10 {
		t.Errorf("%d bytes written per status change, want at most 16 KiB", per)
	}
	// What a restart gives back is the latest status, though the record was never rewritten.
	rec, err := s.GetPod(pod.UID)
	must(t, err)
	if c := rec.Pod.Status.Conditions; len(c) != 1 || c[0].Status != v1.ConditionFalse {
		t.Errorf("GetPod's status = %+v, want the latest (Ready False)", rec.Pod.Status)
	}
	path := s.Path()
	must(t, s.Close())
	s2, _ := openTestStore(t, path, Options{Key: testKey})
	recs, _, err := s2.LoadPods()
	must(t, err)
	if len(recs) != 1 || len(recs[0].Pod.Status.Conditions) != 1 || recs[0].Pod.Status.Conditions[0].Status != v1.ConditionFalse {
		t.Errorf("after a restart LoadPods = %+v, want the pod with its latest status", recs)
	}
	if pending, _, _ := s2.PendingStatuses(); len(pending) != 0 {
		t.Errorf("delivered statuses pending after a restart: %+v", pending)
	}
}

// journalOp is one generated operation on the outbox.
type journalOp struct {
	kind byte // 'a' append, 'k' ack the pod's latest, 'd' delete the pod's record
	uid  types.UID
}

// TestJournalModel runs generated sequences of appends, acks and record deletions, with
// restarts (Close and Open) and kills (the file copied as it is, unsynced acks and all), and
// checks the journal against a model of the outbox after each step: pending statuses, their
// order, the latest status a restart gives back, and sequence numbers that never go back.
func TestJournalModel(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		dir := t.TempDir()
		path := filepath.Join(dir, "state.db")
		s, _, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		model := newOutboxState()
		var steps []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d after %v: %s", seed, steps, fmt.Sprintf(format, args...))
		}
		uids := []types.UID{"a", "b", "c"}
		for _, uid := range uids {
			must(t, s.PutPod(SourceAPI, testPod(string(uid), string(uid))))
		}
		var lastSeq uint64
		deleted := map[types.UID]bool{}
		for step := range 60 {
			uid := uids[rng.IntN(len(uids))]
			switch r := rng.IntN(20); {
			case r < 10:
				if deleted[uid] {
					continue // a pod whose record went is no longer the node's
				}
				st := testStatus(v1.PodRunning, int32(step))
				seq, err := s.AppendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: st, Timestamp: t0.Add(time.Duration(step) * time.Second)})
				if err != nil {
					fail("append: %v", err)
				}
				if seq <= lastSeq {
					fail("sequence %d after %d", seq, lastSeq)
				}
				lastSeq = seq
				e, _ := decodeStatus(mustEncodeStatus(t, StatusUpdate{UID: uid, Name: string(uid), Status: st, Timestamp: t0.Add(time.Duration(step) * time.Second)}))
				model.appendStatus(seq, e)
				steps = append(steps, fmt.Sprintf("append %s=%d", uid, seq))
			case r < 15:
				if p := model.pods[uid]; p != nil {
					must(t, s.AckStatuses(uid, p.latestSeq))
					model.ack(uid, p.latestSeq)
					steps = append(steps, fmt.Sprintf("ack %s<=%d", uid, p.latestSeq))
				}
			case r < 16:
				must(t, s.DeletePod(uid))
				model.recordDeleted(uid)
				deleted[uid] = true
				steps = append(steps, "delete-record "+string(uid))
			case r < 18:
				must(t, s.Close())
				if s, _, err = Open(path, Options{}); err != nil {
					fail("reopen: %v", err)
				}
				steps = append(steps, "restart")
			default:
				// A kill: only what was written survives, deferred acks are lost; a delivered
				// status comes back pending, which costs one patch that changes nothing.
				s.journal.mu.Lock()
				lost := len(s.journal.deferred) > 0
				s.journal.mu.Unlock()
				raw, err := os.ReadFile(path + journalSuffix)
				if err != nil {
					fail("read journal: %v", err)
				}
				_ = s.Close()
				must(t, os.WriteFile(path+journalSuffix, raw, 0o600))
				if s, _, err = Open(path, Options{}); err != nil {
					fail("open after a kill: %v", err)
				}
				// Nothing pending is lost; what comes back pending besides is a status that was
				// delivered, its latest.
				s.journal.mu.Lock()
				kept := cloneOutbox(s.journal.state)
				s.journal.mu.Unlock()
				for uid, p := range model.pods {
					k := kept.pods[uid]
					switch {
					case k == nil:
						fail("pod %s's outbox entry lost by a kill", uid)
					case k.latestSeq != p.latestSeq || k.pending < p.pending:
						fail("pod %s after a kill: %+v, want %+v or its acks undone", uid, *k, *p)
					case !lost && k.pending != p.pending:
						fail("pod %s after a kill with no ack lost: %+v, want %+v", uid, *k, *p)
					}
				}
				for uid, k := range kept.pods {
					if model.pods[uid] == nil && (!lost || !k.recordGone || k.pending == 0) {
						fail("after a kill pod %s is in the outbox (%+v), which the model dropped", uid, *k)
					}
				}
				model = kept
				steps = append(steps, fmt.Sprintf("kill(lost acks: %v)", lost))
			}
			got, errs, err := s.PendingStatuses()
			if err != nil || len(errs) != 0 {
				fail("PendingStatuses: %v %v", err, errs)
			}
			want := model.pendingStatuses()
			if len(got) != len(want) {
				fail("pending %+v, want %+v", got, want)
			}
			for i := range got {
				if got[i].UID != want[i].UID || got[i].FirstSeq != want[i].FirstSeq || got[i].LastSeq != want[i].LastSeq ||
					got[i].Entries != want[i].Entries || !equality.Semantic.DeepEqual(got[i].Status, want[i].Status) {
					fail("pending[%d] = %+v, want %+v", i, got[i], want[i])
				}
			}
			for _, uid := range uids {
				if deleted[uid] {
					if _, ok := s.latestStatus(uid); ok != (model.pods[uid] != nil) {
						fail("pod %s whose record went: status kept %v, want %v", uid, ok, model.pods[uid] != nil)
					}
					continue
				}
				rec, err := s.GetPod(uid)
				must(t, err)
				wantSt, _ := model.latestStatus(uid)
				if !equality.Semantic.DeepEqual(rec.Pod.Status, wantSt) {
					fail("pod %s status %+v, want %+v", uid, rec.Pod.Status, wantSt)
				}
			}
		}
		must(t, s.Close())
	}
}

func cloneOutbox(o outboxState) outboxState {
	c := o
	c.pods = map[types.UID]*outboxPod{}
	for uid, p := range o.pods {
		cp := *p
		c.pods[uid] = &cp
	}
	return c
}

func mustEncodeStatus(t *testing.T, u StatusUpdate) []byte {
	t.Helper()
	raw, err := encodeStatus(u)
	must(t, err)
	return raw
}

// TestJournalCutAnywhereOpens cuts the journal at every length and flips bytes at random:
// Open never fails, and what it gives back is statuses that were appended, with sequence
// numbers going on above every one it kept.
func TestJournalCutAnywhereOpens(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _, err := Open(path, Options{})
	must(t, err)
	appended := map[uint64]int32{}
	for i := range 12 {
		uid := types.UID(fmt.Sprintf("p%d", i%3))
		must(t, s.PutPod(SourceAPI, testPod(string(uid), string(uid))))
		seq, err := s.AppendStatus(StatusUpdate{UID: uid, Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0})
		must(t, err)
		appended[seq] = int32(i)
		if i%4 == 3 {
			must(t, s.AckStatuses(uid, seq))
		}
	}
	must(t, s.Close())
	whole, err := os.ReadFile(path + journalSuffix)
	must(t, err)
	db, err := os.ReadFile(path)
	must(t, err)

	check := func(name string, journal []byte) {
		t.Helper()
		d := t.TempDir()
		p := filepath.Join(d, "state.db")
		must(t, os.WriteFile(p, db, 0o600))
		must(t, os.WriteFile(p+journalSuffix, journal, 0o600))
		s, _, err := Open(p, Options{})
		if err != nil {
			t.Fatalf("%s: Open: %v", name, err)
		}
		defer s.Close()
		pending, _, err := s.PendingStatuses()
		must(t, err)
		var maxSeq uint64
		for _, ps := range pending {
			restarts, ok := appended[ps.LastSeq]
			if !ok || ps.Status.ContainerStatuses[0].RestartCount != restarts {
				t.Fatalf("%s: pending %+v was never appended", name, ps)
			}
			maxSeq = max(maxSeq, ps.LastSeq)
		}
		seq, err := s.AppendStatus(StatusUpdate{UID: "p0", Status: testStatus(v1.PodRunning, 99), Timestamp: t0})
		must(t, err)
		if seq <= maxSeq {
			t.Fatalf("%s: new sequence %d not above kept %d", name, seq, maxSeq)
		}
	}
	for n := range len(whole) {
		check(fmt.Sprintf("cut at %d", n), whole[:n])
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		b := append([]byte(nil), whole...)
		at := rng.IntN(len(b))
		b[at] ^= byte(1 + rng.IntN(255))
		check(fmt.Sprintf("flip %d at %d", i, at), b)
	}
}

// TestJournalDamageQuarantined: a damaged frame before the end is reported by the first
// PendingStatuses and its bytes kept in the quarantine, not silently dropped.
func TestJournalDamageQuarantined(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _, err := Open(path, Options{})
	must(t, err)
	for i := range 3 {
		_, err := s.AppendStatus(StatusUpdate{UID: "u", Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0})
		must(t, err)
	}
	must(t, s.Close())
	raw, err := os.ReadFile(path + journalSuffix)
	must(t, err)
	first := 4 + int(binary.BigEndian.Uint32(raw))
	raw[first+10] ^= 0xff // inside the second frame
	must(t, os.WriteFile(path+journalSuffix, raw, 0o600))
	s2, _ := openTestStore(t, path, Options{})
	pending, errs, err := s2.PendingStatuses()
	must(t, err)
	if len(pending) != 1 || pending[0].Status.ContainerStatuses[0].RestartCount != 0 || len(errs) != 1 || errs[fmt.Sprintf("journal@%d", first)] == nil {
		t.Errorf("PendingStatuses = %+v, %v; want the first status and the damage at %d", pending, errs, first)
	}
	if _, errs, _ := s2.PendingStatuses(); len(errs) != 0 {
		t.Errorf("damage reported twice: %v", errs)
	}
	q, err := s2.Quarantined()
	must(t, err)
	if len(q) != 1 || q[0].Key != fmt.Sprintf("outbox/journal@%d", first) || len(q[0].Value) != len(raw)-first {
		t.Errorf("quarantine = %+v", q)
	}
}

// TestJournalCompacts: weeks of status changes keep the journal bounded, and a compaction
// loses nothing.
func TestJournalCompacts(t *testing.T) {
	s := newTestBolt(t)
	var max int64
	for i := range 3000 {
		uid := types.UID(fmt.Sprintf("p%d", i%5))
		seq, err := s.AppendStatus(StatusUpdate{UID: uid, Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0})
		must(t, err)
		if i%3 != 0 {
			must(t, s.AckStatuses(uid, seq))
		}
		fi, err := os.Stat(s.Path() + journalSuffix)
		must(t, err)
		max = maxInt(max, fi.Size())
	}
	if max > 2*compactMin {
		t.Errorf("journal grew to %d bytes for 5 pods", max)
	}
	before, _, err := s.PendingStatuses()
	must(t, err)
	path := s.Path()
	must(t, s.Close())
	s2, _ := openTestStore(t, path, Options{Key: testKey})
	after, _, err := s2.PendingStatuses()
	must(t, err)
	if !sameJSON(t, before, after) {
		t.Errorf("after compactions and a restart: %+v, want %+v", after, before)
	}
}

func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	must(t, err)
	jb, err := json.Marshal(b)
	must(t, err)
	return string(ja) == string(jb)
}

func maxInt(a, b int64) int64 { return max(a, b) }

// TestOutboxBucketMovesToTheJournal: statuses an agent before the journal left in the
// database's outbox bucket are delivered after the upgrade, and numbers go on above theirs.
func TestOutboxBucketMovesToTheJournal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _, err := Open(path, Options{})
	must(t, err)
	must(t, s.Close())
	db, err := bolt.Open(path, 0o600, nil)
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error {
		ob := tx.Bucket(bucketOutbox)
		for i, uid := range []types.UID{"a", "b", "a"} {
			seq, _ := ob.NextSequence()
			raw, err := encodeStatus(StatusUpdate{UID: uid, Name: string(uid), Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0.Add(time.Duration(i) * time.Minute)})
			if err != nil {
				return err
			}
			if err := ob.Put(seqKey(seq), raw); err != nil {
				return err
			}
		}
		seq, _ := ob.NextSequence()
		return ob.Put(seqKey(seq), garbage)
	}))
	must(t, db.Close())
	os.Remove(path + journalSuffix)

	s2, rep := openTestStore(t, path, Options{})
	if len(rep.Quarantined) != 1 || rep.Quarantined["outbox/4"] == nil {
		t.Errorf("report's quarantined = %v, want the garbage entry 4", rep.Quarantined)
	}
	pending, _, err := s2.PendingStatuses()
	must(t, err)
	if len(pending) != 2 || pending[0].UID != "a" || pending[0].FirstSeq != 1 || pending[0].LastSeq != 3 ||
		pending[0].Status.ContainerStatuses[0].RestartCount != 2 || pending[1].UID != "b" {
		t.Errorf("pending after the upgrade = %+v", pending)
	}
	seq, err := s2.AppendStatus(StatusUpdate{UID: "c", Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	if seq <= 4 {
		t.Errorf("sequence %d after the bucket's 4", seq)
	}
	must(t, s2.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketOutbox).Cursor().First(); k != nil {
			t.Error("the outbox bucket still holds entries")
		}
		return nil
	}))
}

// TestDeliveredStatusGoesWithItsRecord: a pod's record deleted takes its delivered status
// along; a pending one stays until delivered (a final status), then goes, also across a
// restart.
func TestDeliveredStatusGoesWithItsRecord(t *testing.T) {
	s := newTestBolt(t)
	for _, uid := range []string{"done", "final"} {
		must(t, s.PutPod(SourceAPI, testPod(uid, uid)))
	}
	seq, err := s.AppendStatus(StatusUpdate{UID: "done", Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	must(t, s.AckStatuses("done", seq))
	final, err := s.AppendStatus(StatusUpdate{UID: "final", Status: testStatus(v1.PodSucceeded, 0), Timestamp: t0})
	must(t, err)
	must(t, s.DeletePod("done"))
	must(t, s.DeletePod("final"))
	if _, ok := s.latestStatus("done"); ok {
		t.Error("the delivered status of a deleted pod is kept")
	}
	pending, _, _ := s.PendingStatuses()
	if len(pending) != 1 || pending[0].UID != "final" {
		t.Fatalf("pending = %+v, want the final status", pending)
	}
	path := s.Path()
	must(t, s.Close())
	s2, _ := openTestStore(t, path, Options{Key: testKey})
	if pending, _, _ := s2.PendingStatuses(); len(pending) != 1 || pending[0].LastSeq != final {
		t.Fatalf("after a restart pending = %+v, want the final status", pending)
	}
	must(t, s2.AckStatuses("final", final))
	if _, ok := s2.latestStatus("final"); ok {
		t.Error("a delivered status whose record went is kept")
	}
}
