package offline

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// holdFirstBatch makes the first commit wait (up to 5 s) until want calls
// are queued behind it, so batching is observed rather than hoped for.
func holdFirstBatch(s *BoltStore, want int) (maxBatch *atomic.Int64) {
	var queued atomic.Int64
	maxBatch = new(atomic.Int64)
	s.batch.queued = func(n int) { queued.Store(int64(n)) }
	var first atomic.Bool
	first.Store(true)
	s.batch.beforeRun = func(n int) {
		if int64(n) > maxBatch.Load() {
			maxBatch.Store(int64(n))
		}
		if first.CompareAndSwap(true, false) {
			deadline := time.Now().Add(5 * time.Second)
			for queued.Load() < int64(want) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		}
	}
	return maxBatch
}

func TestConcurrentWritesAreBatched(t *testing.T) {
	s := newTestBolt(t)
	const writers, each = 16, 20
	for w := range writers {
		must(t, s.PutPod(SourceAPI, testPod(fmt.Sprintf("uid-%d", w), fmt.Sprintf("p%d", w))))
	}
	before := s.Stats()
	maxBatch := holdFirstBatch(s, writers-1)

	var wg sync.WaitGroup
	errs := make(chan error, writers*each*2)
	for w := range writers {
		wg.Go(func() {
			uid := types.UID(fmt.Sprintf("uid-%d", w))
			for i := range each {
				errs <- s.PutToken(uid, "t", Token{Token: fmt.Sprintf("jwt-%d", i)})
				_, err := s.AppendStatus(StatusUpdate{UID: uid, Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0})
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}

	after := s.Stats()
	writes, commits := after.Writes-before.Writes, after.Commits-before.Commits
	t.Logf("%d writes in %d commits (largest batch %d)", writes, commits, maxBatch.Load())
	if writes != writers*each*2 {
		t.Errorf("%d writes counted, want %d", writes, writers*each*2)
	}
	if maxBatch.Load() < writers-1 || commits > writes-uint64(writers-2) {
		t.Errorf("writes were not batched: %d writes, %d commits, largest batch %d", writes, commits, maxBatch.Load())
	}
	for w := range writers {
		uid := types.UID(fmt.Sprintf("uid-%d", w))
		if tok, err := s.GetToken(uid, "t"); err != nil || tok.Token != fmt.Sprintf("jwt-%d", each-1) {
			t.Errorf("pod %s: token %+v, %v; want jwt-%d", uid, tok, err, each-1)
		}
	}
	pending, _, err := s.PendingStatuses()
	must(t, err)
	if len(pending) != writers {
		t.Errorf("%d pods pending", len(pending))
	}
	for _, p := range pending {
		// The outbox keeps each pod's oldest pending entry and its latest.
		if p.Entries != 2 || p.Status.ContainerStatuses[0].RestartCount != each-1 {
			t.Errorf("pending %s: %d entries, restartCount %d", p.UID, p.Entries, p.Status.ContainerStatuses[0].RestartCount)
		}
	}
}

// TestFailingWriteDoesNotSinkItsBatch: a write function that fails inside a
// shared transaction gets its own error and leaves nothing behind; the
// others in the batch still commit. (Store methods probe before writing, so
// this drives the batcher directly.)
func TestFailingWriteDoesNotSinkItsBatch(t *testing.T) {
	s := newTestBolt(t)
	const n = 12
	maxBatch := holdFirstBatch(s, n-1)
	results := make([]error, n)
	injected := errors.New("injected")
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = s.update(func(tx *bolt.Tx) error {
				if err := tx.Bucket(bucketSync).Put([]byte(fmt.Sprintf("k%02d", i)), []byte("v")); err != nil {
					return err
				}
				if i%3 == 1 {
					return fmt.Errorf("write %d: %w", i, injected) // after writing: must be rolled back
				}
				return nil
			})
		})
	}
	wg.Wait()
	if maxBatch.Load() < n-1 {
		t.Fatalf("no batch formed (largest %d)", maxBatch.Load())
	}
	err := s.view(func(tx *bolt.Tx) error {
		for i, err := range results {
			present := tx.Bucket(bucketSync).Get([]byte(fmt.Sprintf("k%02d", i))) != nil
			switch {
			case i%3 != 1 && (err != nil || !present):
				t.Errorf("write %d: err %v, present %t; want committed", i, err, present)
			case i%3 == 1 && (!errors.Is(err, injected) || present):
				t.Errorf("write %d: err %v, present %t; want its own error and nothing written", i, err, present)
			}
		}
		return nil
	})
	must(t, err)
}

// TestLoneWritesEachCommit: sequential writes are not held back to wait for
// company (bolt.DB.Batch would wait MaxBatchDelay, 10 ms, each time); each
// commits on its own.
func TestLoneWritesEachCommit(t *testing.T) {
	s := newTestBolt(t)
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	before := s.Stats()
	start := time.Now()
	const n = 20
	for i := range n {
		must(t, s.PutToken("uid-1", "t", Token{Token: fmt.Sprintf("jwt-%d", i)}))
	}
	per := time.Since(start) / n
	t.Logf("lone fsynced write: %s", per)
	if d := s.Stats().Commits - before.Commits; d != n {
		t.Errorf("%d commits for %d lone writes", d, n)
	}
}

// TestBytesWritten: a commit counts the pages it wrote (at least a data page and the meta
// page); a write skipped as unchanged counts nothing.
func TestBytesWritten(t *testing.T) {
	s := newTestBolt(t)
	before := s.Stats()
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	after := s.Stats()
	if d := after.BytesWritten - before.BytesWritten; d < 2*s.pageSize {
		t.Errorf("a committed put wrote %d bytes; want at least a data page and the meta page (2 x %d)", d, s.pageSize)
	}
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	if st := s.Stats(); st.BytesWritten != after.BytesWritten || st.SkippedWrites != after.SkippedWrites+1 {
		t.Errorf("an unchanged put: bytes written %d -> %d, skipped %d -> %d; want no bytes, one skip",
			after.BytesWritten, st.BytesWritten, after.SkippedWrites, st.SkippedWrites)
	}
}
