package offline

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/holdfast-dev/holdfast/internal/failpoint"
)

// batcher commits concurrent writes together (group commit): the first
// writer to arrive becomes the leader and runs every queued write in one
// bbolt transaction, so N concurrent writers cost one fsync instead of N.
// Unlike bolt.DB.Batch it adds no delay: a lone writer commits at once, and
// writers arriving during a commit form the next batch. It starts no
// goroutines; the leader is always one of the callers.
//
// As with bolt.DB.Batch, a write function may run more than once (when
// another function in its batch fails, the batch is retried without it), so
// it must reset any result it reports through its closure at the start.
type batcher struct {
	db       *bolt.DB
	maxBatch int
	commits  *atomic.Uint64

	// mu protects queue and leading. Invariant: queue is non-empty only
	// while leading is true (some caller is, or is about to become, leader).
	mu      sync.Mutex
	queue   []*batchCall
	leading bool

	// beforeRun, if set (tests only, before first use), is called by the
	// leader with the number of calls it is about to commit.
	beforeRun func(n int)
	// queued, if set (tests only), observes the queue length after each
	// enqueue, under mu.
	queued func(n int)
}

type batchCall struct {
	fn   func(*bolt.Tx) error
	done chan error // buffered: receives errLead at most once, then the result
}

// errLead tells a queued caller that it is now the leader.
var errLead = errors.New("offline: batch leadership handed over")

func (b *batcher) do(fn func(*bolt.Tx) error) error {
	c := &batchCall{fn: fn, done: make(chan error, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.queued != nil {
		b.queued(len(b.queue))
	}
	if b.leading {
		b.mu.Unlock()
		if err := <-c.done; err != errLead {
			return err
		}
		b.mu.Lock()
	} else {
		b.leading = true
	}
	// Leader: c is queue[0] (it was appended to an empty queue, or it was
	// promoted from the head of the queue).
	n := min(len(b.queue), b.maxBatch)
	calls := append([]*batchCall(nil), b.queue[:n]...)
	b.queue = append([]*batchCall(nil), b.queue[n:]...)
	b.mu.Unlock()

	if b.beforeRun != nil {
		b.beforeRun(len(calls))
	}
	b.run(calls)

	b.mu.Lock()
	if len(b.queue) > 0 {
		b.queue[0].done <- errLead
	} else {
		b.leading = false
	}
	b.mu.Unlock()
	return <-c.done
}

// run commits calls in one transaction. If one fails, the transaction is
// rolled back, that call gets its error (it ran after the calls before it,
// which is a valid serial order) and the others are retried.
func (b *batcher) run(calls []*batchCall) {
	for len(calls) > 0 {
		failed := -1
		var failErr error
		err := guardedUpdate(b.db, func(tx *bolt.Tx) error {
			for i, c := range calls {
				if err := c.fn(tx); err != nil {
					failed, failErr = i, err
					return err
				}
			}
			failpoint.Inject(failpoint.StoreBeforeCommit)
			return nil
		})
		if failed >= 0 && errors.Is(err, failErr) {
			calls[failed].done <- failErr
			calls = append(calls[:failed], calls[failed+1:]...)
			continue
		}
		if err == nil {
			b.commits.Add(1)
			failpoint.Inject(failpoint.StoreAfterCommit)
		}
		for _, c := range calls {
			c.done <- err
		}
		return
	}
}

// guardedUpdate runs db.Update turning panics and memory faults on the
// mapped file into ErrCorruptDatabase. bbolt rolls the transaction back
// while the panic unwinds.
func guardedUpdate(db *bolt.DB, fn func(*bolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverCorrupt(&err)
	return db.Update(fn)
}

// guardedView is guardedUpdate for read transactions.
func guardedView(db *bolt.DB, fn func(*bolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverCorrupt(&err)
	return db.View(fn)
}

func recoverCorrupt(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %v", ErrCorruptDatabase, r)
	}
}
