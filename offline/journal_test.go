package offline

import (
	"strings"

	"encoding/binary"
	"encoding/json"
	"fmt"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
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
	seeds := 200
	if v := os.Getenv("HOLDFAST_JOURNAL_MODEL_SEQUENCES"); v != "" {
		var err error
		if seeds, err = strconv.Atoi(v); err != nil || seeds < 1 {
			t.Fatalf("HOLDFAST_JOURNAL_MODEL_SEQUENCES=%q: want a positive count", v)
		}
	}
	defer func(min int64) { compactMin = min }(compactMin)
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 7))
		// A compaction every few changes, so that sequences cross many, power cuts and kills
		// included.
		compactMin = int64(1<<10 + rng.IntN(4<<10))
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
		for step := range 80 {
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
			case r < 19:
				// A kill: what was written survives, synced or not.
				var raws [2][]byte
				for i, jf := range s.journal.files {
					if raws[i], err = os.ReadFile(jf.path); err != nil {
						fail("read journal: %v", err)
					}
				}
				_ = s.Close()
				for i, jf := range s.journal.files {
					must(t, os.WriteFile(jf.path, raws[i], 0o600))
				}
				if s, _, err = Open(path, Options{}); err != nil {
					fail("open after a kill: %v", err)
				}
				steps = append(steps, "kill")
			default:
				// A power cut: only what was synced survives for sure, then maybe junk (a
				// torn write). Nothing pending is lost; what comes back pending besides is a
				// delivered status whose ack was not synced.
				// Each of the journal's two files keeps what its last sync made durable.
				s.journal.syncMu.Lock()
				files := s.journal.files
				cur := s.journal.cur
				s.journal.syncMu.Unlock()
				var cuts [2][]byte
				for i, jf := range files {
					raw, err := os.ReadFile(jf.path)
					if err != nil {
						fail("read journal: %v", err)
					}
					synced := min(int(jf.syncedSize), len(raw))
					cuts[i] = append(raw[:synced:synced], make([]byte, rng.IntN(64))...)
					for k := synced; k < len(cuts[i]); k++ {
						cuts[i][k] = byte(rng.IntN(256))
					}
				}
				_ = s.Close()
				for i, jf := range files {
					must(t, os.WriteFile(jf.path, cuts[i], 0o600))
				}
				if s, _, err = Open(path, Options{}); err != nil {
					fail("open after a power cut: %v", err)
				}
				s.journal.mu.Lock()
				kept := cloneOutbox(s.journal.state)
				s.journal.mu.Unlock()
				for uid, p := range model.pods {
					k := kept.pods[uid]
					switch {
					case k == nil && p.pending > 0:
						fail("pod %s's pending status lost by a power cut", uid)
					case k != nil && k.latestSeq == p.latestSeq && k.pending < p.pending:
						fail("pod %s after a power cut: %+v, want %+v or its acks undone", uid, *k, *p)
					case k != nil && k.latestSeq != p.latestSeq:
						fail("pod %s after a power cut has status %d, want %d", uid, k.latestSeq, p.latestSeq)
					}
				}
				for uid, k := range kept.pods {
					if model.pods[uid] == nil && (!k.recordGone || k.pending == 0) {
						fail("after a power cut pod %s is in the outbox (%+v), which the model dropped", uid, *k)
					}
				}
				steps = append(steps, fmt.Sprintf("power cut (current file %d: %d, other %d bytes kept)", cur, len(cuts[cur]), len(cuts[1-cur])))
				model = kept
			}
			got, errs, err := s.PendingStatuses()
			if err != nil {
				fail("PendingStatuses: %v", err)
			}
			for key := range errs {
				// Only a power cut's torn end is reported, once, at the open after it.
				if !strings.HasPrefix(steps[len(steps)-1], "power cut") || !strings.HasPrefix(key, "journal") {
					fail("PendingStatuses reports %v", errs)
				}
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
// the replay never fails, what it gives back is statuses that were appended, and sequence
// numbers go on above every one it kept, and above every one handed out when it found damage.
func TestJournalCutAnywhereOpens(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _, err := Open(path, Options{})
	must(t, err)
	appended := map[uint64]int32{}
	var lastAppended uint64
	for i := range 12 {
		uid := types.UID(fmt.Sprintf("p%d", i%3))
		must(t, s.PutPod(SourceAPI, testPod(string(uid), string(uid))))
		seq, err := s.AppendStatus(StatusUpdate{UID: uid, Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0})
		must(t, err)
		appended[seq] = int32(i)
		lastAppended = seq
		if i%4 == 3 {
			must(t, s.AckStatuses(uid, seq))
		}
	}
	must(t, s.Close())
	whole, err := os.ReadFile(firstJournalFile(path))
	must(t, err)

	check := func(name string, journal []byte) {
		t.Helper()
		j := &statusJournal{}
		good, damaged := j.replay(journal)
		if good > int64(len(journal)) || (!damaged && good != int64(len(journal))) {
			t.Fatalf("%s: readable prefix %d of %d, damaged %v", name, good, len(journal), damaged)
		}
		var maxSeq uint64
		for _, ps := range j.state.pendingStatuses() {
			restarts, ok := appended[ps.LastSeq]
			if !ok || ps.Status.ContainerStatuses[0].RestartCount != restarts {
				t.Fatalf("%s: pending %+v was never appended", name, ps)
			}
			maxSeq = max(maxSeq, ps.LastSeq)
		}
		if j.state.lastSeq < maxSeq {
			t.Fatalf("%s: next sequence %d not above kept %d", name, j.state.lastSeq+1, maxSeq)
		}
		if damaged && j.state.lastSeq < lastAppended {
			t.Fatalf("%s: after damage the next sequence %d may reuse one handed out (up to %d)", name, j.state.lastSeq+1, lastAppended)
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
	raw, err := os.ReadFile(firstJournalFile(path))
	must(t, err)
	first := 4 + int(binary.BigEndian.Uint32(raw))
	raw[first+10] ^= 0xff // inside the second frame
	must(t, os.WriteFile(firstJournalFile(path), raw, 0o600))
	second := first + 4 + int(binary.BigEndian.Uint32(raw[first:]))
	s2, _ := openTestStore(t, path, Options{})
	pending, errs, err := s2.PendingStatuses()
	must(t, err)
	// The replay resynchronizes after the damaged frame: the third status, written after it,
	// is kept; the second alone is lost.
	if len(pending) != 1 || pending[0].FirstSeq != 1 || pending[0].Status.ContainerStatuses[0].RestartCount != 2 ||
		len(errs) != 1 || errs[fmt.Sprintf("journal.a@%d", first)] == nil {
		t.Errorf("PendingStatuses = %+v, %v; want the first and third statuses and the damage at %d", pending, errs, first)
	}
	if _, errs, _ := s2.PendingStatuses(); len(errs) != 0 {
		t.Errorf("damage reported twice: %v", errs)
	}
	q, err := s2.Quarantined()
	must(t, err)
	if len(q) != 1 || q[0].Key != fmt.Sprintf("outbox/journal.a@%d", first) || len(q[0].Value) != second-first {
		t.Errorf("quarantine = %+v, want the %d bytes of the second frame", q, second-first)
	}
	// Numbers handed out before the damage are not handed out again.
	seq, err := s2.AppendStatus(StatusUpdate{UID: "u", Status: testStatus(v1.PodRunning, 3), Timestamp: t0})
	must(t, err)
	if seq <= 3+seqJumpAfterDamage-1 {
		t.Errorf("sequence %d after damage, want a jump past every number handed out", seq)
	}
}

// TestJournalCompacts: weeks of status changes keep the journal bounded, and a compaction
// loses nothing.
func TestJournalCompacts(t *testing.T) {
	s := newTestBolt(t)
	var max int64
	for i := range 800 {
		uid := types.UID(fmt.Sprintf("p%d", i%5))
		seq, err := s.AppendStatus(StatusUpdate{UID: uid, Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0})
		must(t, err)
		if i%3 != 0 {
			must(t, s.AckStatuses(uid, seq))
		}
		for _, jf := range s.journal.files {
			fi, err := os.Stat(jf.path)
			must(t, err)
			max = maxInt(max, fi.Size())
		}
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
	for _, suffix := range journalFileSuffixes {
		os.Remove(path + journalSuffix + suffix) // as an agent before the journal left it
	}

	s2, rep := openTestStore(t, path, Options{})
	if len(rep.Quarantined) != 1 || rep.Quarantined["outbox/4"] == nil {
		t.Errorf("report's quarantined = %v, want the garbage entry 4", rep.Quarantined)
	}
	pending, _, err := s2.PendingStatuses()
	must(t, err)
	if len(pending) != 2 || pending[0].UID != "a" || pending[0].FirstSeq <= 4 || pending[0].Entries != 2 ||
		pending[0].Status.ContainerStatuses[0].RestartCount != 2 || pending[1].UID != "b" {
		t.Errorf("pending after the upgrade = %+v, want a's two then b's, numbered after the bucket's 4", pending)
	}
	seq, err := s2.AppendStatus(StatusUpdate{UID: "c", Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	if seq <= pending[0].LastSeq || seq <= pending[1].LastSeq {
		t.Errorf("sequence %d after the moved ones %+v", seq, pending)
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

// TestPlantedStatusRefused: with a state key the journal's records are sealed; a record
// written in the clear by whoever can write the disk (a Failed, Evicted status that would stop
// the pod at an offline boot) is refused, and the sealed record's status stands.
func TestPlantedStatusRefused(t *testing.T) {
	s := newTestBolt(t)
	pod := testPod("uid-1", "web")
	must(t, s.PutPod(SourceAPI, pod))
	_, err := s.AppendStatus(StatusUpdate{UID: pod.UID, Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	path := s.Path()
	must(t, s.Close())
	raw, err := os.ReadFile(firstJournalFile(path))
	must(t, err)
	if strings.Contains(string(raw), "Running") {
		t.Fatal("the journal holds a status in the clear with a state key")
	}
	evicted := outboxEntry{UID: pod.UID, Timestamp: t0, Status: v1.PodStatus{Phase: v1.PodFailed, Reason: "Evicted", Message: "attacker"}}
	planted, err := (&statusJournal{}).frame(journalRecord{Kind: journalSnapshot, Seq: 99, Entry: &evicted})
	must(t, err)
	must(t, os.WriteFile(firstJournalFile(path), append(raw, planted...), 0o600))
	s2, _ := openTestStore(t, path, Options{Key: testKey})
	rec, err := s2.GetPod(pod.UID)
	must(t, err)
	if rec.Pod.Status.Phase != v1.PodRunning {
		t.Errorf("status after a planted record = %+v, want Running", rec.Pod.Status)
	}
	if _, errs, _ := s2.PendingStatuses(); len(errs) != 1 {
		t.Errorf("the planted record is not reported: %v", errs)
	}
}

// TestRollbackAndUpgradeAgain: an older agent run after a rollback writes its statuses into
// the pod record and the outbox bucket; the next upgrade takes them as the newest, whatever
// the journal held from before the rollback, and numbers on above the bucket's.
func TestRollbackAndUpgradeAgain(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _, err := Open(path, Options{})
	must(t, err)
	pod := testPod("uid-1", "web")
	must(t, s.PutPod(SourceAPI, pod))
	seq, err := s.AppendStatus(StatusUpdate{UID: pod.UID, Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	must(t, s.AckStatuses(pod.UID, seq))
	must(t, s.Close())

	// The older agent: a record with its status (the apiserver's echo), then a pending status.
	db, err := bolt.Open(path, 0o600, nil)
	must(t, err)
	echo := pod.DeepCopy()
	echo.Status = testStatus(v1.PodRunning, 5)
	must(t, db.Update(func(tx *bolt.Tx) error {
		raw, err := encodeValue(podEntry{Source: SourceAPI, Pod: echo})
		if err != nil {
			return err
		}
		if err := bucketAt(tx, bucketPods, []byte(pod.UID)).Put(keyPod, raw); err != nil {
			return err
		}
		ob := tx.Bucket(bucketOutbox)
		next, _ := ob.NextSequence()
		raw, err = encodeStatus(StatusUpdate{UID: pod.UID, Status: testStatus(v1.PodFailed, 7), Timestamp: t0.Add(time.Hour)})
		if err != nil {
			return err
		}
		return ob.Put(seqKey(next), raw)
	}))
	must(t, db.Close())

	s2, _ := openTestStore(t, path, Options{})
	pending, _, err := s2.PendingStatuses()
	must(t, err)
	if len(pending) != 1 || pending[0].Status.Phase != v1.PodFailed || pending[0].Status.ContainerStatuses[0].RestartCount != 7 {
		t.Fatalf("pending after the new upgrade = %+v, want the older agent's Failed status", pending)
	}
	rec, err := s2.GetPod(pod.UID)
	must(t, err)
	if rec.Pod.Status.Phase != v1.PodFailed {
		t.Errorf("GetPod's status = %+v, want the newest (Failed)", rec.Pod.Status)
	}
	if pending[0].LastSeq <= seq {
		t.Errorf("the older agent's status numbered %d, not after %d", pending[0].LastSeq, seq)
	}
	must(t, s2.db.View(func(tx *bolt.Tx) error {
		if got := tx.Bucket(bucketOutbox).Sequence(); got < pending[0].LastSeq {
			t.Errorf("the outbox bucket's sequence %d is below the journal's %d: an older agent would reuse numbers", got, pending[0].LastSeq)
		}
		e, err := decodePod(s2.seal, pod.UID, bucketAt(tx, bucketPods, []byte(pod.UID)).Get(keyPod))
		if err != nil || e.Pod.Status.Phase != "" {
			t.Errorf("the record still carries a status: %+v, %v", e.Pod.Status, err)
		}
		return nil
	}))
}

// TestJournalCompactsFromItsLiveSize: a journal found large at open, whose live statuses are
// few, is compacted by the next append (its threshold comes from what it holds, not from its
// size: four times the size at each boot would never compact).
func TestJournalCompactsFromItsLiveSize(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _, err := Open(path, Options{})
	must(t, err)
	must(t, s.Close())
	j := &statusJournal{}
	var big []byte
	for i := range 3000 {
		e := outboxEntry{UID: "u", Timestamp: t0, Status: testStatus(v1.PodRunning, int32(i))}
		f, err := j.frame(journalRecord{Kind: journalStatus, Seq: uint64(i + 1), Entry: &e})
		must(t, err)
		big = append(big, f...)
	}
	must(t, os.WriteFile(firstJournalFile(path), big, 0o600))
	s2, _ := openTestStore(t, path, Options{})
	_, err = s2.AppendStatus(StatusUpdate{UID: "u", Status: testStatus(v1.PodRunning, 1), Timestamp: t0})
	must(t, err)
	fi, err := os.Stat(s2.journal.current().path)
	must(t, err)
	if fi.Size() >= int64(len(big)) {
		t.Errorf("journal of %d bytes (one live pod) not compacted: %d", len(big), fi.Size())
	}
}

// TestJournalPathNotARegularFile: a directory, a FIFO (which would block a read) or a symbolic
// link at the path of one of the journal's files, or of an older agent's journal, does not stop
// the boot: it is moved aside, a link's target left alone.
func TestJournalPathNotARegularFile(t *testing.T) {
	for name, plant := range map[string]func(path, target string) error{
		"directory": func(path, _ string) error { return os.Mkdir(path, 0o700) },
		"fifo":      func(path, _ string) error { return unix.Mkfifo(path, 0o600) },
		"symlink":   func(path, target string) error { return os.Symlink(target, path) },
	} {
		for file, suffix := range map[string]string{"journal.a": journalFileSuffixes[0], "journal.b": journalFileSuffixes[1], "journal": ""} {
			t.Run(name+" at "+file, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "state.db")
				target := filepath.Join(dir, "precious")
				must(t, os.WriteFile(target, []byte("keep me"), 0o600))
				must(t, plant(path+journalSuffix+suffix, target))
				s, _ := openTestStore(t, path, Options{})
				if _, err := s.AppendStatus(StatusUpdate{UID: "u", Status: testStatus(v1.PodRunning, 0), Timestamp: t0}); err != nil {
					t.Fatalf("append after a %s at the journal's path: %v", name, err)
				}
				if _, errs, _ := s.PendingStatuses(); errs[file] == nil {
					t.Errorf("the unusable journal is not reported: %v", errs)
				}
				if b, err := os.ReadFile(target); err != nil || string(b) != "keep me" {
					t.Errorf("the link's target = %q, %v", b, err)
				}
			})
		}
	}
}

// TestStatusKeptAsAppended: the outbox keeps what was appended, not the caller's slices, and
// gives back before a restart what it gives after.
func TestStatusKeptAsAppended(t *testing.T) {
	s := newTestBolt(t)
	must(t, s.PutPod(SourceAPI, testPod("u", "u")))
	st := testStatus(v1.PodRunning, 1)
	now := metav1.NewTime(t0.Add(123 * time.Millisecond))
	st.StartTime = &now
	_, err := s.AppendStatus(StatusUpdate{UID: "u", Status: st, Timestamp: t0})
	must(t, err)
	st.ContainerStatuses[0].RestartCount = 42
	before, _, err := s.PendingStatuses()
	must(t, err)
	if before[0].Status.ContainerStatuses[0].RestartCount != 1 {
		t.Errorf("the caller's change reached the outbox: %+v", before[0].Status)
	}
	path := s.Path()
	must(t, s.Close())
	s2, _ := openTestStore(t, path, Options{Key: testKey})
	after, _, err := s2.PendingStatuses()
	must(t, err)
	if !sameJSON(t, before, after) || !before[0].Status.StartTime.Equal(after[0].Status.StartTime) {
		t.Errorf("before a restart %+v, after %+v", before, after)
	}
}

// TestRecordPutAgainKeepsItsStatus: a pod whose record went while a status was pending and
// came back keeps its status once delivered.
func TestRecordPutAgainKeepsItsStatus(t *testing.T) {
	for name, s := range map[string]Store{"bolt": newTestBolt(t), "mem": NewMemStore(nil)} {
		pod := testPod("u", "u")
		must(t, s.PutPod(SourceAPI, pod))
		seq, err := s.AppendStatus(StatusUpdate{UID: "u", Status: testStatus(v1.PodRunning, 1), Timestamp: t0})
		must(t, err)
		must(t, s.DeletePod("u"))
		must(t, s.PutPod(SourceAPI, pod))
		must(t, s.AckStatuses("u", seq))
		rec, err := s.GetPod("u")
		must(t, err)
		if len(rec.Pod.Status.ContainerStatuses) != 1 {
			t.Errorf("%s: status lost: %+v", name, rec.Pod.Status)
		}
	}
}

// TestSequenceNearItsEndRefused: a record numbered near the end of uint64 (damage, or planted)
// is refused: numbers would wrap to 0, which is never acknowledged.
func TestSequenceNearItsEndRefused(t *testing.T) {
	j := &statusJournal{}
	f, err := j.frame(journalRecord{Kind: journalSeq, Seq: ^uint64(0)})
	must(t, err)
	if _, damaged := j.replay(f); !damaged || j.state.lastSeq >= maxSeq {
		t.Errorf("a sequence of 2^64-1 accepted: last %d", j.state.lastSeq)
	}
}

// syncedDisk stands for the disk under the journal: journalSync and journalSyncDir are
// replaced to count each sync and to keep, for each file, what its last sync made durable.
type syncedDisk struct {
	mu    sync.Mutex
	syncs int
	image map[string][]byte // a file's content as of its last sync, by path
}

func watchSyncs(t *testing.T) *syncedDisk {
	d := &syncedDisk{image: map[string][]byte{}}
	sync, syncDir := journalSync, journalSyncDir
	t.Cleanup(func() { journalSync, journalSyncDir = sync, syncDir })
	journalSync = func(f *os.File) error {
		if err := sync(f); err != nil {
			return err
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			return err
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		d.syncs++
		d.image[f.Name()] = b
		return nil
	}
	journalSyncDir = func(dir string) error {
		if err := syncDir(dir); err != nil {
			return err
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		d.syncs++
		return nil
	}
	return d
}

func (d *syncedDisk) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.syncs
}

// powerCut writes, under dir, each file as its last sync left it, then junk (a write torn by
// the cut): paths are the files' paths, name by name under dir.
func (d *syncedDisk) powerCut(t *testing.T, rng *rand.Rand, dir string, paths ...string) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range paths {
		b := append([]byte(nil), d.image[p]...)
		for range rng.IntN(64) {
			b = append(b, byte(rng.IntN(256)))
		}
		must(t, os.WriteFile(filepath.Join(dir, filepath.Base(p)), b, 0o600))
	}
}

// TestEveryStatusChangeCostsOneSync is the attacker of #28's strict figure: every status
// change costs one sync, those that compact the journal too (a compaction written to a new
// file and renamed over the journal cost two more: the new file's and the directory's), an
// ack none; and a power cut after any change, the disk keeping only what the syncs made
// durable, keeps every pod's latest status.
func TestEveryStatusChangeCostsOneSync(t *testing.T) {
	disk := watchSyncs(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})
	const pods = 11
	latest := map[types.UID]v1.PodStatus{}
	for i := range pods {
		uid := types.UID(fmt.Sprintf("pod-%d", i))
		must(t, s.PutPod(SourceAPI, testPod(string(uid), string(uid))))
	}
	rng := rand.New(rand.NewPCG(3, 5))
	compactions := 0
	for change := range 1500 {
		uid := types.UID(fmt.Sprintf("pod-%d", rng.IntN(pods)))
		st := testStatus(v1.PodRunning, int32(change))
		s.journal.mu.Lock()
		gen := s.journal.gen
		s.journal.mu.Unlock()
		before := disk.count()
		seq, err := s.AppendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: st, Timestamp: t0.Add(time.Duration(change) * time.Second)})
		must(t, err)
		if n := disk.count() - before; n != 1 {
			t.Fatalf("status change %d cost %d syncs, want 1", change, n)
		}
		latest[uid] = st
		s.journal.mu.Lock()
		if s.journal.gen != gen {
			compactions++
		}
		s.journal.mu.Unlock()
		before = disk.count()
		must(t, s.AckStatuses(uid, seq))
		if n := disk.count() - before; n != 0 {
			t.Fatalf("an ack cost %d syncs, want none", n)
		}
		if change%50 != 49 {
			continue
		}
		// The power cut: a copy of the state as the disk keeps it, opened.
		cutDir := t.TempDir()
		raw, err := os.ReadFile(path)
		must(t, err)
		must(t, os.WriteFile(filepath.Join(cutDir, "state.db"), raw, 0o600))
		disk.powerCut(t, rng, cutDir, s.journal.files[0].path, s.journal.files[1].path)
		cut, _, err := Open(filepath.Join(cutDir, "state.db"), Options{Key: testKey})
		if err != nil {
			t.Fatalf("open after a power cut at change %d: %v", change, err)
		}
		for uid, want := range latest {
			rec, err := cut.GetPod(uid)
			must(t, err)
			if !equality.Semantic.DeepEqual(rec.Pod.Status, want) {
				t.Fatalf("after a power cut at change %d pod %s has status %+v, want %+v", change, uid, rec.Pod.Status, want)
			}
		}
		must(t, cut.Close())
	}
	if compactions < 5 {
		t.Errorf("%d compactions in 1500 changes: the attacker did not reach them", compactions)
	}
}

// TestCompactionCutShortLosesNothing: a power cut while a compaction writes the other file
// (any prefix of its record written, over what an older generation left there, the file's
// new length durable or not) keeps every status synced before it; the journal opens on the
// file it was compacting from, or on the whole compaction.
func TestCompactionCutShortLosesNothing(t *testing.T) {
	defer func(min int64) { compactMin = min }(compactMin)
	compactMin = 2 << 10
	disk := watchSyncs(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})
	for i := range 4 {
		must(t, s.PutPod(SourceAPI, testPod(fmt.Sprintf("pod-%d", i), fmt.Sprintf("pod-%d", i))))
	}
	latest := map[types.UID]v1.PodStatus{}
	appendOne := func(i int) {
		uid := types.UID(fmt.Sprintf("pod-%d", i%4))
		st := testStatus(v1.PodRunning, int32(i))
		seq, err := s.AppendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: st, Timestamp: t0})
		must(t, err)
		latest[uid] = st
		if i%3 == 0 {
			must(t, s.AckStatuses(uid, seq))
		}
		if i%7 == 0 {
			// The pod's record goes with its delivered status (a forget record), and comes
			// back: a forget of an older generation read after the compaction would drop the
			// status it has since.
			must(t, s.AckStatuses(uid, seq))
			must(t, s.DeletePod(uid))
			must(t, s.PutPod(SourceAPI, testPod(string(uid), string(uid))))
			latest[uid] = v1.PodStatus{}
		}
	}
	gen := func() uint64 {
		s.journal.mu.Lock()
		defer s.journal.mu.Unlock()
		return s.journal.gen
	}
	i := 0
	for ; gen() < 3; i++ {
		appendOne(i)
	}
	// Up to the change that compacts again: the files as they are before it.
	for {
		s.journal.mu.Lock()
		frame, _ := s.journal.frame(journalRecord{Kind: journalStatus, Seq: s.journal.state.lastSeq + 1,
			Entry: &outboxEntry{UID: "pod-0", Timestamp: t0, Status: testStatus(v1.PodRunning, int32(i))}})
		due := s.journal.size+int64(len(frame)) > s.journal.compactAt
		s.journal.mu.Unlock()
		if due {
			break
		}
		appendOne(i)
		i++
	}
	files := s.journal.files
	next, nextName := files[1-s.journal.cur].path, files[1-s.journal.cur].name
	before := map[types.UID]v1.PodStatus{}
	maps.Copy(before, latest)
	disk.mu.Lock()
	current := disk.image[files[s.journal.cur].path]
	disk.mu.Unlock()
	old, err := os.ReadFile(next)
	must(t, err)
	if len(old) == 0 {
		// Emptied at Open or by a failed compaction: stand for an older generation's records.
		old = current
	}
	g := gen()
	appendOne(i)
	if gen() != g+1 {
		t.Fatalf("change %d did not compact (generation %d)", i, gen())
	}
	compacted, err := os.ReadFile(next)
	must(t, err)
	// Opening the copies needs no durability (watchSyncs' cleanup puts the syncs back).
	journalSync = func(*os.File) error { return nil }
	journalSyncDir = func(string) error { return nil }
	cutDir := t.TempDir()
	// overOld: the whole record, then an older generation's frames from mid-frame on, whose
	// first bytes are damage to report.
	check := func(name string, nextImage []byte, overOld bool) {
		t.Helper()
		for _, jf := range files {
			b := current
			if jf.path == next {
				b = nextImage
			}
			must(t, os.WriteFile(filepath.Join(cutDir, filepath.Base(jf.path)), b, 0o600))
		}
		// The journal alone: the database is not what a compaction changes.
		cut, err := openStatusJournal(filepath.Join(cutDir, "state.db"+journalSuffix), testKey)
		if err != nil {
			t.Fatalf("%s: open: %v", name, err)
		}
		defer cut.close()
		whole := true
		for uid, want := range before {
			got, _ := cut.state.latestStatus(uid)
			if !equality.Semantic.DeepEqual(got, want) {
				whole = false
				if !equality.Semantic.DeepEqual(got, latest[uid]) {
					t.Fatalf("%s: pod %s has status %+v, want %+v (or the compacting change's)", name, uid, got.ContainerStatuses, want.ContainerStatuses)
				}
			}
		}
		errs := cut.takeDamage()
		// A compaction record that did not survive is reported (what it held may be lost);
		// nothing else.
		delete(errs, nextName+"@0")
		if len(errs) != 0 && (whole || !overOld) {
			t.Errorf("%s: the compaction cut short is reported: %v", name, errs)
		}
	}
	// Every few bytes (a few hundred cuts), and every byte of the first and the last 40: the
	// record's length, its checksum, its end.
	for k := 0; k <= len(compacted); k++ {
		if k > 40 && k < len(compacted)-40 && k%(len(compacted)/300+1) != 0 {
			continue
		}
		// The new length durable, the record written up to k.
		check(fmt.Sprintf("cut at %d, new length", k), compacted[:k], false)
		// The old length kept: what the older generation left past k.
		if k < len(old) {
			check(fmt.Sprintf("cut at %d over the old content", k), append(append([]byte(nil), compacted[:k]...), old[k:]...), k == len(compacted))
		}
	}
}

// TestFailedCompactionLosesNothing: a compaction whose write or sync fails (a full disk, an
// I/O error) leaves the status appended to the current file, and what it left in the other
// file does not win at the next Open over what was appended after; when the other file
// cannot even be emptied, appends fail until a compaction succeeds, and nothing is lost.
func TestFailedCompactionLosesNothing(t *testing.T) {
	for _, emptyFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("emptying fails %v", emptyFails), func(t *testing.T) {
			defer func(min int64) { compactMin = min }(compactMin)
			compactMin = 2 << 10
			dir := t.TempDir()
			path := filepath.Join(dir, "state.db")
			s, _ := openTestStore(t, path, Options{Key: testKey})
			for i := range 4 {
				must(t, s.PutPod(SourceAPI, testPod(fmt.Sprintf("pod-%d", i), fmt.Sprintf("pod-%d", i))))
			}
			real := journalSync
			defer func() { journalSync = real }()
			failing := false
			journalSync = func(f *os.File) error {
				if failing && f != s.journal.current().f {
					if !emptyFails {
						failing = false // the sync of the emptied file succeeds
					}
					return unix.EIO
				}
				return real(f)
			}
			latest := map[types.UID]v1.PodStatus{}
			var errs int
			for i := range 400 {
				uid := types.UID(fmt.Sprintf("pod-%d", i%4))
				st := testStatus(v1.PodRunning, int32(i))
				if i == 100 || i == 250 {
					failing = true
				}
				if i == 260 {
					failing = false
				}
				_, err := s.AppendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: st, Timestamp: t0})
				if err != nil {
					errs++
					continue
				}
				latest[uid] = st
			}
			if emptyFails != (errs > 0) {
				t.Errorf("%d appends failed, want failures only while the other file cannot be emptied", errs)
			}
			must(t, s.Close())
			s2, _ := openTestStore(t, path, Options{Key: testKey})
			for uid, want := range latest {
				rec, err := s2.GetPod(uid)
				must(t, err)
				if !equality.Semantic.DeepEqual(rec.Pod.Status, want) {
					t.Errorf("pod %s has status %+v, want %+v", uid, rec.Pod.Status.ContainerStatuses, want.ContainerStatuses)
				}
			}
		})
	}
}

// firstJournalFile is the path of the journal's first file, the current one until a
// compaction, for the database at path.
func firstJournalFile(path string) string { return path + journalSuffix + journalFileSuffixes[0] }

// TestReopenSyncsNothing: a boot costs no sync of its own when the journal's files are there
// (the other file, emptied at each boot, is no new directory entry); the first boot syncs the
// directory of the files it made.
func TestReopenSyncsNothing(t *testing.T) {
	disk := watchSyncs(t)
	path := filepath.Join(t.TempDir(), "state.db")
	s, _, err := Open(path, Options{Key: testKey})
	must(t, err)
	if disk.count() == 0 {
		t.Error("the first open made the journal's files without syncing their directory")
	}
	_, err = s.AppendStatus(StatusUpdate{UID: "u", Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	must(t, s.Close())
	before := disk.count()
	s2, _, err := Open(path, Options{Key: testKey})
	must(t, err)
	defer s2.Close()
	if n := disk.count() - before; n != 0 {
		t.Errorf("a boot with the journal's files there cost %d syncs, want 0", n)
	}
}

// TestTornEndCutOffAtOpen: a torn end (an append cut short by a power cut) is cut off at Open,
// which needs no space and no compaction, and reported once.
func TestTornEndCutOffAtOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, _, err := Open(path, Options{Key: testKey})
	must(t, err)
	_, err = s.AppendStatus(StatusUpdate{UID: "u", Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	must(t, s.Close())
	whole, err := os.ReadFile(firstJournalFile(path))
	must(t, err)
	must(t, os.WriteFile(firstJournalFile(path), append(whole, 0, 0, 1, 0, 'x', 'y'), 0o600))
	s2, _, err := Open(path, Options{Key: testKey})
	must(t, err)
	defer s2.Close()
	if fi, err := os.Stat(firstJournalFile(path)); err != nil || fi.Size() != int64(len(whole)) || s2.journal.rewrite {
		t.Errorf("after a torn end: %v, %v, rewrite %v; want the file cut back to %d bytes and no rewrite", fi.Size(), err, s2.journal.rewrite, len(whole))
	}
	if _, errs, _ := s2.PendingStatuses(); len(errs) != 1 {
		t.Errorf("the torn end reported as %v, want once", errs)
	}
}

// replay replays one file's content into j.state, as Open does for the current file (tests
// and the fuzzer). It returns the length of the prefix read without damage and whether
// any damage was found.
func (j *statusJournal) replay(data []byte) (good int64, damaged bool) {
	r := j.replayFile("journal", data)
	j.state, j.gen = r.state, r.gen
	for key, err := range r.damage {
		j.noteDamage(key, r.damagedBytes[key], err)
	}
	if r.damaged {
		j.state.lastSeq += seqJumpAfterDamage
	}
	return r.good, r.damaged
}
