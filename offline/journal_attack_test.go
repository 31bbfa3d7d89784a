package offline

// Attacker tests of the two-file status journal, from a review of its first version.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/test/poll"
)

const attackBlock = 4096

// attackDisk models the disk under the journal's two files: durable[path] is what the last
// successful sync of the file made durable; a failed sync loses (Linux semantics) the pages
// dirty at the time, even if a later sync of the same file reports success.
type attackDisk struct {
	mu      sync.Mutex
	durable map[string][]byte
	// lost[path]: [from, to) dirty when a sync failed; a later successful sync does not
	// write it (the pages were marked clean), until the file is rewritten by a compaction.
	lost map[string][2]int
	// fail decides whether a sync fails (nil: never).
	fail func(path string) bool
	// before is called before each sync, with the file's path and whether it is the
	// compaction's (the file is not the current one).
	before func(path string, compaction bool)
	live   *statusJournal
	syncs  int
}

func newAttackDisk(t *testing.T) *attackDisk {
	d := &attackDisk{durable: map[string][]byte{}, lost: map[string][2]int{}}
	real, realDir := journalSync, journalSyncDir
	t.Cleanup(func() { journalSync, journalSyncDir = real, realDir })
	journalSync = func(f *os.File) error {
		d.mu.Lock()
		j, before, fail := d.live, d.before, d.fail
		d.mu.Unlock()
		compaction := false
		if j != nil {
			// Called with syncMu held: cur changes only under it.
			compaction = f != j.files[j.cur].f
		}
		if before != nil {
			before(f.Name(), compaction)
		}
		content, err := os.ReadFile(f.Name())
		if err != nil {
			return err
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		p := f.Name()
		if compaction {
			delete(d.lost, p) // rewritten whole (or emptied) by the compaction
		}
		if fail != nil && fail(p) {
			old := d.durable[p]
			from := min(len(old), len(content))
			if l, ok := d.lost[p]; ok {
				from = min(from, l[0])
			}
			d.lost[p] = [2]int{from, len(content)}
			return unix.EIO
		}
		if err := real(f); err != nil {
			return err
		}
		img := append([]byte(nil), content...)
		if l, ok := d.lost[p]; ok {
			old := d.durable[p]
			for i := l[0]; i < l[1] && i < len(img); i++ {
				img[i] = 0
				if i < len(old) {
					img[i] = old[i]
				}
			}
		}
		d.durable[p] = img
		d.syncs++
		return nil
	}
	journalSyncDir = func(string) error { return nil }
	return d
}

// blockMix is a file after a power cut: each 4096-byte block either as the disk had it
// (old) or as written since (new); the length old's or new's.
func blockMix(rng *rand.Rand, old, new []byte) []byte {
	size := len(old)
	if rng.IntN(2) == 0 {
		size = len(new)
	}
	out := make([]byte, size)
	allNew, allOld := rng.IntN(4) == 0, rng.IntN(4) == 0
	for b := 0; b < size; b += attackBlock {
		src := old
		if allNew || (!allOld && rng.IntN(2) == 0) {
			src = new
		}
		for i := b; i < min(b+attackBlock, size); i++ {
			if i < len(src) {
				out[i] = src[i]
			}
		}
	}
	return out
}

// attackPod is what the test knows of one pod's statuses.
type attackPod struct {
	confirmed *v1.PodStatus  // the last status whose append returned nil
	seq       uint64         // its number
	maybe     []v1.PodStatus // appended after it, with an error (or in flight at a cut)
	forgotten bool           // delivered and its record deleted after confirmed
}

func attackStatus(n int) v1.PodStatus {
	return v1.PodStatus{Phase: v1.PodRunning, Message: fmt.Sprintf("change %d", n)}
}

// checkAfterCut checks a journal opened after a power cut against what the test knows.
func checkAfterCut(t *testing.T, what string, j *statusJournal, pods map[types.UID]*attackPod, maxSeq uint64) {
	t.Helper()
	if j.state.lastSeq < maxSeq {
		t.Fatalf("%s: last sequence number %d, below %d handed out with a nil error", what, j.state.lastSeq, maxSeq)
	}
	for uid, p := range pods {
		got, ok := j.state.latestStatus(uid)
		if p.confirmed == nil && !ok {
			continue
		}
		if ok && p.confirmed != nil && equality.Semantic.DeepEqual(got, *p.confirmed) {
			continue
		}
		if !ok && (p.forgotten || p.confirmed == nil) {
			continue
		}
		if ok && slicesContainsStatus(p.maybe, got) {
			continue
		}
		want := "none"
		if p.confirmed != nil {
			want = p.confirmed.Message
		}
		t.Fatalf("%s: pod %s has %q (found %v), want the status appended last with a nil error %q (or one appended after it: %d)",
			what, uid, got.Message, ok, want, len(p.maybe))
	}
}

func slicesContainsStatus(list []v1.PodStatus, s v1.PodStatus) bool {
	for _, x := range list {
		if equality.Semantic.DeepEqual(x, s) {
			return true
		}
	}
	return false
}

// TestAttackPowerCutsAtBlockGranularity: generated sequences of appends, acks and deletes,
// with compactions every few changes, syncs failing at random (the pages they covered lost,
// as Linux does), and power cuts at random points: between operations, and in the middle
// of a compaction (the other file any mix of its old blocks and the new ones, its new length
// durable or not; the current file its durable content with any mix of the blocks written
// since). Every status appended with a nil error stays, never replaced by an older one, and
// sequence numbers never go back.
func TestAttackPowerCutsAtBlockGranularity(t *testing.T) {
	defer func(m int64) { compactMin = m }(compactMin)
	for seed := range uint64(24) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 77))
			compactMin = int64(1<<10 + rng.IntN(3<<10))
			failing := seed%3 == 2
			var key *Key
			if seed%2 == 0 {
				key = testKey
			}
			d := newAttackDisk(t)
			pods := map[types.UID]*attackPod{}
			var maxSeq uint64
			change := 0
			dir := t.TempDir()
			path := filepath.Join(dir, "state.db"+journalSuffix)
			j, err := openStatusJournal(path, key)
			must(t, err)
			paths := [2]string{path + journalFileSuffixes[0], path + journalFileSuffixes[1]}
			var cut map[string][]byte // images taken by a cut inside a sync
			cutAtSync := -1
			cutAtCompaction := false // cut at the next compaction's sync
			syncN := 0
			var stats [4]int // compaction syncs, cuts in them, cuts, failed appends
			defer func() {
				t.Logf("compaction syncs %d, cuts during them %d, cuts %d, failed appends %d", stats[0], stats[1], stats[2], stats[3])
			}()
			d.mu.Lock()
			d.live = j
			if failing {
				d.fail = func(string) bool { return rng.IntN(8) == 0 }
			}
			d.before = func(p string, compaction bool) {
				syncN++
				if compaction {
					stats[0]++
				}
				if syncN != cutAtSync && !(cutAtCompaction && compaction) {
					return
				}
				cutAtCompaction = false
				if compaction {
					stats[1]++
				}
				// A power cut in the middle of this sync: everything written since each
				// file's last sync in any mix of blocks.
				cut = map[string][]byte{}
				d.mu.Lock()
				defer d.mu.Unlock()
				for _, q := range paths {
					now, err := os.ReadFile(q)
					must(t, err)
					cut[q] = blockMix(rng, d.durable[q], now)
				}
			}
			d.mu.Unlock()
			reopen := func(what string, images map[string][]byte) {
				t.Helper()
				d.mu.Lock()
				d.live = nil
				d.mu.Unlock()
				cutAtSync, cutAtCompaction = -1, false
				j.close()
				cut = nil
				dir = t.TempDir()
				path = filepath.Join(dir, "state.db"+journalSuffix)
				newPaths := [2]string{path + journalFileSuffixes[0], path + journalFileSuffixes[1]}
				d.mu.Lock()
				for i, q := range paths {
					must(t, os.WriteFile(newPaths[i], images[q], 0o600))
					d.durable[newPaths[i]] = append([]byte(nil), images[q]...)
				}
				d.lost = map[string][2]int{}
				d.mu.Unlock()
				stats[2]++
				paths = newPaths
				d.mu.Lock()
				fail := d.fail
				d.fail = nil
				d.mu.Unlock()
				j, err = openStatusJournal(path, key)
				if err != nil {
					t.Fatalf("%s: open: %v", what, err)
				}
				if os.Getenv("ATTACK_DEBUG") != "" {
					for q, img := range images {
						r := j.replayFile(q, img)
						t.Logf("%s: %s: %d bytes, gen %d, lastSeq %d, records %d, damage %v", what, q, len(img), r.gen, r.state.lastSeq, r.records, len(r.damage))
					}
				}
				checkAfterCut(t, what, j, pods, maxSeq)
				must(t, j.rewriteIfDue())
				j.takeDamage()
				// A clean restart now: the damage was reported once, not again.
				j.close()
				j, err = openStatusJournal(path, key)
				must(t, err)
				if again := j.takeDamage(); len(again) != 0 {
					t.Fatalf("%s: damage reported again at the next restart: %v", what, again)
				}
				d.mu.Lock()
				d.fail = fail
				d.mu.Unlock()
				for uid, p := range pods {
					got, ok := j.state.latestStatus(uid)
					if !ok {
						delete(pods, uid)
						continue
					}
					// What the journal has is now the pod's status, as appended with a nil
					// error (it came back after the cut: it is there to deliver).
					p.confirmed, p.maybe, p.forgotten = &got, nil, false
					p.seq = j.state.pods[uid].latestSeq
				}
				d.mu.Lock()
				d.live = j
				d.mu.Unlock()
			}
			for op := range 400 {
				if rng.IntN(25) == 0 {
					cutAtSync = syncN + 1 + rng.IntN(3)
				}
				if rng.IntN(15) == 0 {
					cutAtCompaction = true
				}
				uid := types.UID(fmt.Sprintf("pod-%d", rng.IntN(6)))
				p := pods[uid]
				if p == nil {
					p = &attackPod{}
					pods[uid] = p
				}
				switch r := rng.IntN(10); {
				case r < 6:
					change++
					st := attackStatus(change)
					seq, err := j.appendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: st, Timestamp: t0.Add(time.Duration(change) * time.Second)})
					if err != nil {
						if !failing {
							t.Fatalf("op %d: append: %v", op, err)
						}
						p.maybe = append(p.maybe, st)
						stats[3]++
						break
					}
					if cut != nil {
						// Cut during this append: it did not return before the cut.
						p.maybe = append(p.maybe, st)
						break
					}
					if seq <= maxSeq {
						t.Fatalf("op %d: sequence %d after %d", op, seq, maxSeq)
					}
					maxSeq = seq
					p.confirmed, p.seq, p.maybe, p.forgotten = &st, seq, nil, false
				case r < 8:
					if p.confirmed != nil {
						_, err := j.ack(uid, p.seq)
						must(t, err)
					}
				default:
					if p.confirmed != nil && len(p.maybe) == 0 {
						if _, err := j.ack(uid, p.seq); err != nil {
							t.Fatal(err)
						}
						j.recordDeleted(uid)
						p.forgotten = true
					}
				}
				if cut != nil {
					images := cut
					cut, cutAtSync = nil, -1
					reopen(fmt.Sprintf("op %d: power cut during sync %d", op, syncN), images)
					continue
				}
				if rng.IntN(30) == 0 {
					images := map[string][]byte{}
					d.mu.Lock()
					for _, q := range paths {
						now, err := os.ReadFile(q)
						must(t, err)
						images[q] = blockMix(rng, d.durable[q], now)
					}
					d.mu.Unlock()
					reopen(fmt.Sprintf("op %d: power cut between operations", op), images)
				}
			}
			d.mu.Lock()
			d.live = nil
			d.mu.Unlock()
			j.close()
		})
	}
}

// TestAttackSyncAfterAFailedSyncTrusted: two appends written before either syncs; the first
// sync fails (Linux marks the pages it could not write clean, and the next fdatasync reports
// success); the second append's sync, finding its write not covered, syncs again, is told
// success, and returns nil. A power cut then loses the status of that nil.
func TestAttackSyncAfterAFailedSyncTrusted(t *testing.T) {
	d := newAttackDisk(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db"+journalSuffix)
	j, err := openStatusJournal(path, testKey)
	must(t, err)
	defer j.close()
	d.mu.Lock()
	d.live = j
	d.mu.Unlock()
	_, err = j.appendStatus(StatusUpdate{UID: "pod-0", Name: "pod-0", Status: attackStatus(0), Timestamp: t0})
	must(t, err)
	j.mu.Lock()
	w0 := j.written
	j.mu.Unlock()
	j.syncMu.Lock() // both appends write before either syncs
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid := types.UID(fmt.Sprintf("pod-%d", i+1))
			_, errs[i] = j.appendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: attackStatus(i + 1), Timestamp: t0})
		}()
	}
	poll.UntilTrue(t, 5*time.Second, time.Millisecond, "both writes", func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.written == w0+2
	})
	failed := false
	d.mu.Lock()
	d.fail = func(string) bool {
		if failed {
			return false
		}
		failed = true
		return true
	}
	d.mu.Unlock()
	j.syncMu.Unlock()
	wg.Wait()
	if errs[0] == nil && errs[1] == nil || errs[0] != nil && errs[1] != nil {
		t.Fatalf("errors %v: want exactly one sync failed", errs)
	}
	// The power cut: each file as the disk has it.
	cutDir := t.TempDir()
	d.mu.Lock()
	for _, q := range []string{path + journalFileSuffixes[0], path + journalFileSuffixes[1]} {
		must(t, os.WriteFile(filepath.Join(cutDir, filepath.Base(q)), d.durable[q], 0o600))
	}
	d.mu.Unlock()
	cut, err := openStatusJournal(filepath.Join(cutDir, "state.db"+journalSuffix), testKey)
	must(t, err)
	defer cut.close()
	for i, err := range errs {
		uid := types.UID(fmt.Sprintf("pod-%d", i+1))
		if err != nil {
			continue
		}
		if got, ok := cut.state.latestStatus(uid); !ok || got.Message != attackStatus(i+1).Message {
			t.Errorf("pod %s: its append returned nil after the other's sync failed, and a power cut lost it (found %v, %q)", uid, ok, got.Message)
		}
	}
}

// TestAttackConcurrentAppendsAcksClose: appends, acks, deletes, reads and a close, from
// several goroutines, with compactions every few changes (run with -race). Nothing but
// ErrClosed fails, nothing deadlocks, and what returned nil is there at the next Open.
func TestAttackConcurrentAppendsAcksClose(t *testing.T) {
	defer func(m int64) { compactMin = m }(compactMin)
	compactMin = 1 << 10
	real := journalSync
	defer func() { journalSync = real }()
	journalSync = func(*os.File) error { return nil } // races, not durability
	for round := range 3 {
		dir := t.TempDir()
		path := filepath.Join(dir, "state.db"+journalSuffix)
		j, err := openStatusJournal(path, nil)
		must(t, err)
		var mu sync.Mutex
		confirmed := map[types.UID]string{}
		var wg sync.WaitGroup
		done := make(chan struct{})
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				uid := types.UID(fmt.Sprintf("pod-%d", w))
				for n := 0; ; n++ {
					msg := fmt.Sprintf("w%d-%d", w, n)
					seq, err := j.appendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: v1.PodStatus{Message: msg}, Timestamp: t0})
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil {
						t.Errorf("append: %v", err)
						return
					}
					mu.Lock()
					confirmed[uid] = msg
					mu.Unlock()
					if n%2 == 0 {
						if _, err := j.ack(uid, seq); err != nil && !errors.Is(err, ErrClosed) {
							t.Errorf("ack: %v", err)
						}
					}
					if n%5 == 4 {
						j.recordPut(uid)
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				j.recordDeleted("pod-gone")
				_ = j.superseded()
				_ = j.generation()
				j.mu.Lock()
				_ = j.state.pendingStatuses()
				j.mu.Unlock()
				_ = j.rewriteIfDue()
				_ = j.sync(j.generation())
			}
		}()
		time.Sleep(time.Duration(100+50*round) * time.Millisecond)
		j.mu.Lock()
		gen, written := j.gen, j.written
		j.mu.Unlock()
		if gen < 3 {
			t.Errorf("round %d: %d compactions in %d writes: the attacker did not reach them", round, gen, written)
		}
		must(t, j.close())
		close(done)
		wg.Wait()
		j2, err := openStatusJournal(path, nil)
		must(t, err)
		mu.Lock()
		for uid, msg := range confirmed {
			got, ok := j2.state.latestStatus(uid)
			if !ok || got.Message != msg {
				t.Errorf("round %d: pod %s has %q, want %q", round, uid, got.Message, msg)
			}
		}
		mu.Unlock()
		if d := j2.takeDamage(); len(d) != 0 {
			t.Errorf("round %d: damage after a clean close: %v", round, d)
		}
		j2.close()
	}
}

// oldFormatFrame frames a record as the agent before two files wrote it (no generation).
func oldFormatFrame(t *testing.T, key *Key, rec journalRecord) []byte {
	t.Helper()
	b, err := (&statusJournal{key: key}).frame(rec)
	must(t, err)
	return b
}

// TestAttackUpgradeFromOneFile: a journal of the agent before two files (a compaction's
// snapshot and seq records, then statuses, acks and forgets; generation 0) opens with every
// status, numbers on above it, and compacts into the new file without losing any.
func TestAttackUpgradeFromOneFile(t *testing.T) {
	defer func(m int64) { compactMin = m }(compactMin)
	compactMin = 1 << 10
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db"+journalSuffix)
	var old []byte
	e := func(uid string, n int) *outboxEntry {
		return &outboxEntry{UID: types.UID(uid), Name: uid, Timestamp: t0, Status: attackStatus(n)}
	}
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalSnapshot, Seq: 40, Entry: e("a", 1)})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalSnapshot, Seq: 41, Entry: e("b", 2), Pending: 1, FirstSeq: 41, FirstTimestamp: t0})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalSnapshot, Seq: 42, Entry: e("gone", 3)})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalSeq, Seq: 50})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalStatus, Seq: 51, Entry: e("c", 4)})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalForget, UID: "gone"})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalStatus, Seq: 52, Entry: e("a", 5)})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalAck, UID: "a", UpTo: 52})...)
	must(t, os.WriteFile(path, old, 0o600))
	j, err := openStatusJournal(path, testKey)
	must(t, err)
	want := map[types.UID]string{"a": attackStatus(5).Message, "b": attackStatus(2).Message, "c": attackStatus(4).Message}
	check := func(what string, j *statusJournal) {
		t.Helper()
		for uid, msg := range want {
			if got, ok := j.state.latestStatus(uid); !ok || got.Message != msg {
				t.Errorf("%s: pod %s has %q, want %q", what, uid, got.Message, msg)
			}
		}
		if _, ok := j.state.latestStatus("gone"); ok {
			t.Errorf("%s: a forgotten pod came back", what)
		}
		if p := j.state.pods["a"]; p == nil || p.pending != 0 {
			t.Errorf("%s: an acked status is pending again", what)
		}
		if d := j.takeDamage(); len(d) != 0 {
			t.Errorf("%s: damage %v", what, d)
		}
	}
	check("upgrade", j)
	// The old file's statuses are taken over, numbered above its last (52), one per pod.
	if j.state.lastSeq != 52+3 || j.legacyPath != path {
		t.Errorf("upgrade: last %d, legacy %q; want 55 and the old file to remove", j.state.lastSeq, j.legacyPath)
	}
	must(t, j.rewriteIfDue())
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) || j.legacyPath != "" {
		t.Errorf("the old file is still there after the compaction that took it over: %v", err)
	}
	check("upgrade, compacted", j)
	seq, err := j.appendStatus(StatusUpdate{UID: "d", Name: "d", Status: attackStatus(6), Timestamp: t0})
	must(t, err)
	if seq != 56 {
		t.Errorf("first number after the upgrade %d, want 56", seq)
	}
	want["d"] = attackStatus(6).Message
	for n := 7; j.gen < 3; n++ {
		_, err := j.appendStatus(StatusUpdate{UID: "d", Name: "d", Status: attackStatus(n), Timestamp: t0})
		must(t, err)
		want["d"] = attackStatus(n).Message
	}
	must(t, j.close())
	j2, err := openStatusJournal(path, testKey)
	must(t, err)
	defer j2.close()
	check("after compactions", j2)
}

// TestAttackRollbackThenUpgradeAgain: the agent of two files compacts (its second file is
// current, its generation above 0); a rollback to the agent before two files (which knows only
// <db>.outbox) writes its statuses there, as records without a generation; the upgrade again
// must take them, the newest, and number above them. (A first version kept <db>.outbox as one
// of its two files: the stale file of a higher generation won, the rolled-back agent's
// statuses were lost and numbers it handed out were handed out again.)
func TestAttackRollbackThenUpgradeAgain(t *testing.T) {
	defer func(m int64) { compactMin = m }(compactMin)
	compactMin = 1 << 10
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db"+journalSuffix)
	j, err := openStatusJournal(path, testKey)
	must(t, err)
	n := 0
	for j.gen < 1 || j.cur != 1 {
		n++
		_, err := j.appendStatus(StatusUpdate{UID: "a", Name: "a", Status: attackStatus(n), Timestamp: t0})
		must(t, err)
	}
	lastBefore := j.state.lastSeq
	must(t, j.close())
	// The rollback: the older agent reads and writes <db>.outbox alone (the two files are
	// unknown to it): a snapshot of its state, a seq record (its numbers jumped after damage
	// it found), and the statuses it appends after.
	snap, _ := j.state.latestStatus("a")
	oldSeq := lastBefore + seqJumpAfterDamage
	var old []byte
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalSnapshot, Seq: lastBefore - 3,
		Entry: &outboxEntry{UID: "a", Name: "a", Timestamp: t0, Status: snap}})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalSeq, Seq: oldSeq})...)
	old = append(old, oldFormatFrame(t, testKey, journalRecord{Kind: journalStatus, Seq: oldSeq + 1,
		Entry: &outboxEntry{UID: "a", Name: "a", Timestamp: t0, Status: v1.PodStatus{Phase: v1.PodFailed, Message: "after the rollback"}}})...)
	must(t, os.WriteFile(path, old, 0o600))
	// The upgrade again.
	j2, err := openStatusJournal(path, testKey)
	must(t, err)
	defer j2.close()
	got, _ := j2.state.latestStatus("a")
	if got.Message != "after the rollback" {
		t.Errorf("after a rollback and an upgrade again, pod a has %q (from before the rollback, generation %d, second file current: %v), want the rolled-back agent's status", got.Message, j2.gen, j2.cur == 1)
	}
	if j2.state.lastSeq < oldSeq+1 {
		t.Errorf("after a rollback and an upgrade again, the last number is %d: the rolled-back agent handed out %d", j2.state.lastSeq, oldSeq+1)
	}
}

// damagedJournal makes, under dir, a store whose journal holds two statuses of pod "a", the
// first frame damaged (a bad sector, not a torn end: a torn end alone is cut off at Open,
// which needs no space), so that Open rewrites the journal by a compaction. It returns the
// database's path and the status Open must keep.
func damagedJournal(t *testing.T, dir string) (string, string) {
	t.Helper()
	path := filepath.Join(dir, "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})
	must(t, s.PutPod(SourceAPI, testPod("a", "a")))
	for n := 1; n <= 2; n++ {
		_, err := s.AppendStatus(StatusUpdate{UID: "a", Name: "a", Status: attackStatus(n), Timestamp: t0})
		must(t, err)
	}
	must(t, s.Close())
	raw, err := os.ReadFile(firstJournalFile(path))
	must(t, err)
	raw[10] ^= 0xff // inside the first frame
	must(t, os.WriteFile(firstJournalFile(path), raw, 0o600))
	return path, attackStatus(2).Message
}

// openDespite opens the store at path, which must not fail however the journal's rewrite
// does, and checks that pod "a" has the status want.
func openDespite(t *testing.T, path, want, what string) {
	t.Helper()
	s, _, err := Open(path, Options{Key: testKey})
	if err != nil {
		t.Fatalf("%s at a boot that rewrites a damaged journal blocks the boot: %v", what, err)
	}
	defer s.Close()
	s.journal.mu.Lock()
	rewrite := s.journal.rewrite
	s.journal.mu.Unlock()
	if !rewrite {
		t.Errorf("the journal's rewrite at Open succeeded despite %s: the attack did not reach it", what)
	}
	rec, err := s.GetPod("a")
	must(t, err)
	if rec.Pod.Status.Message != want {
		t.Errorf("pod a has %q, want %q", rec.Pod.Status.Message, want)
	}
}

// TestAttackFullDiskAtBootWithADamagedJournal: damage found at Open makes it rewrite the
// journal by a compaction, and the file system is full at that boot. Damage must never block
// a boot: Open goes on (the journal read, the damage reported, the rewrite left to the next
// append), and the status synced after the damage is there.
func TestAttackFullDiskAtBootWithADamagedJournal(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount a small tmpfs (this test needs root, as make test runs it): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	path, want := damagedJournal(t, dir)
	// The file system full.
	filler, err := os.Create(filepath.Join(dir, "filler"))
	must(t, err)
	for chunk := make([]byte, 4096); ; {
		if _, err := filler.Write(chunk); err != nil {
			break
		}
	}
	filler.Close()
	openDespite(t, path, want, "a full disk")
}

// TestAttackFailedSyncAtBootWithADamagedJournal: as above, the compaction's sync failing (an
// I/O error) instead of its write.
func TestAttackFailedSyncAtBootWithADamagedJournal(t *testing.T) {
	path, want := damagedJournal(t, t.TempDir())
	real := journalSync
	defer func() { journalSync = real }()
	journalSync = func(f *os.File) error {
		if f.Name() == path+journalSuffix+journalFileSuffixes[1] {
			return unix.EIO
		}
		return real(f)
	}
	openDespite(t, path, want, "a failed sync")
}

// TestAttackRottenCompactionReported: the compaction record just synced (the current file
// holds nothing else yet) is damaged on the disk (a bad block, bit rot). The file it was
// compacted from wins at Open with the statuses it had before; the status that the
// compaction wrote, appended with a nil error, is lost: the loss must be reported (the doc:
// "What is lost to damage of a compaction record is reported").
func TestAttackRottenCompactionReported(t *testing.T) {
	defer func(m int64) { compactMin = m }(compactMin)
	compactMin = 1 << 10
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db"+journalSuffix)
	j, err := openStatusJournal(path, testKey)
	must(t, err)
	var last string
	for n := 1; j.gen < 1; n++ {
		_, err := j.appendStatus(StatusUpdate{UID: "a", Name: "a", Status: attackStatus(n), Timestamp: t0})
		must(t, err)
		last = attackStatus(n).Message
	}
	compacted := j.files[j.cur].path
	must(t, j.close())
	raw, err := os.ReadFile(compacted)
	must(t, err)
	raw[len(raw)/2] ^= 0x40
	must(t, os.WriteFile(compacted, raw, 0o600))
	j2, err := openStatusJournal(path, testKey)
	must(t, err)
	defer j2.close()
	got, _ := j2.state.latestStatus("a")
	damage := j2.takeDamage()
	if got.Message != last && len(damage) == 0 {
		t.Errorf("pod a has %q, want %q or the damage reported; none reported", got.Message, last)
	}
}
