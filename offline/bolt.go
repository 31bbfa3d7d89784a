package offline

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/internal/failpoint"
)

// BoltStore is the Store the agent runs with: one bbolt file, fsynced on
// every commit (NoSync is never set), concurrent writes group-committed, and
// unchanged writes skipped. Create it with Open.
type BoltStore struct {
	path  string
	db    *bolt.DB
	lock  *fileLock
	now   func() time.Time
	batch *batcher
	// seal: the state key (nil if the agent has none), which seals Secrets, tokens and pod
	// records, and whether it seals ConfigMaps too.
	seal sealing

	// closed is set once by Close; methods check it first.
	closed atomic.Bool

	// journal is the outbox (journal.go).
	journal *statusJournal

	writes, skipped, commits, quarantined atomic.Uint64
	byBucketMu                            sync.Mutex        // protects writesByBucket
	writesByBucket                        map[string]uint64 // changing writes by top-level bucket
	// pageSize and pageAllocAtOpen turn bbolt's own count of the page bytes its write
	// transactions allocated into the bytes the store wrote since Open (Stats.BytesWritten).
	pageSize        uint64
	pageAllocAtOpen int64
}

var _ Store = (*BoltStore)(nil)

// Path returns the database file's path.
func (s *BoltStore) Path() string { return s.path }

// Stats implements Store.
func (s *BoltStore) Stats() Stats {
	return Stats{
		Writes:           s.writes.Load(),
		SkippedWrites:    s.skipped.Load(),
		Commits:          s.commits.Load(),
		Quarantined:      s.quarantined.Load(),
		OutboxSuperseded: s.journal.superseded(),
		OutboxSyncs:      s.journal.syncs.Load(),
		OutboxBytes:      s.journal.bytesWritten.Load(),
		WritesByBucket: func() map[string]uint64 {
			s.byBucketMu.Lock()
			defer s.byBucketMu.Unlock()
			return maps.Clone(s.writesByBucket)
		}(),
		// bbolt never rewrites a page in place: every page a commit writes was allocated by
		// its transaction (copy-on-write), and the commit then writes one meta page. A write
		// transaction rolled back (a batch retried without its failing call) allocates no
		// pages: they are allocated when a commit spills.
		BytesWritten: uint64(pageAlloc(s.db)-s.pageAllocAtOpen) + s.commits.Load()*s.pageSize,
	}
}

// pageAlloc is the bytes of pages the database's transactions allocated since it was opened.
func pageAlloc(db *bolt.DB) int64 {
	st := db.Stats()
	return st.TxStats.GetPageAlloc()
}

// Close implements Store. It waits for transactions in progress, closes the
// file and then releases the lock file.
func (s *BoltStore) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	err := s.db.Close()
	if jerr := s.journal.close(); err == nil {
		err = jerr
	}
	if lerr := s.lock.release(); err == nil {
		err = lerr
	}
	if err != nil {
		return fmt.Errorf("close state database %s: %w", s.path, err)
	}
	return nil
}

// view runs a read transaction.
func (s *BoltStore) view(fn func(tx *bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return guardedView(s.db, fn)
}

// update runs fn in a batched, fsynced write transaction. fn may run more
// than once; see batcher.
func (s *BoltStore) update(fn func(tx *bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.batch.do(fn)
}

// count counts a write to the top-level bucket that holds the record: changed, or skipped.
func (s *BoltStore) count(bucket []byte, changed bool) {
	if changed {
		s.writes.Add(1)
		s.byBucketMu.Lock()
		s.writesByBucket[string(bucket)]++
		s.byBucketMu.Unlock()
	} else {
		s.skipped.Add(1)
	}
}

// bucketAt walks path from the root; nil if any bucket is missing.
func bucketAt(tx *bolt.Tx, path ...[]byte) *bolt.Bucket {
	if len(path) == 0 {
		return nil
	}
	b := tx.Bucket(path[0])
	for _, name := range path[1:] {
		if b == nil {
			return nil
		}
		b = b.Bucket(name)
	}
	return b
}

// put stores raw at path/key unless it is already there. The probe runs in
// a read transaction so an unchanged value costs no write transaction at
// all; the write re-checks inside its transaction. Missing buckets on path
// are created if create is set, else the put fails with ErrNotFound.
func (s *BoltStore) put(op string, path [][]byte, key, raw []byte, create bool) error {
	same := false
	err := s.view(func(tx *bolt.Tx) error {
		b := bucketAt(tx, path...)
		if b == nil {
			if !create {
				return ErrNotFound
			}
			return nil
		}
		same = bytes.Equal(b.Get(key), raw)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if same {
		s.count(path[0], false)
		return nil
	}
	var changed bool
	err = s.update(func(tx *bolt.Tx) error {
		changed = false
		b, err := writableBucket(tx, path, create)
		if err != nil {
			return err
		}
		if bytes.Equal(b.Get(key), raw) {
			return nil
		}
		changed = true
		return b.Put(key, raw)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	s.count(path[0], changed)
	return nil
}

// del deletes path/key if present.
func (s *BoltStore) del(op string, path [][]byte, key []byte) error {
	present := false
	err := s.view(func(tx *bolt.Tx) error {
		if b := bucketAt(tx, path...); b != nil {
			present = b.Get(key) != nil
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if !present {
		s.count(path[0], false)
		return nil
	}
	var changed bool
	err = s.update(func(tx *bolt.Tx) error {
		changed = false
		b := bucketAt(tx, path...)
		if b == nil || b.Get(key) == nil {
			return nil
		}
		changed = true
		return b.Delete(key)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	s.count(path[0], changed)
	return nil
}

func writableBucket(tx *bolt.Tx, path [][]byte, create bool) (*bolt.Bucket, error) {
	if !create {
		if b := bucketAt(tx, path...); b != nil {
			return b, nil
		}
		return nil, ErrNotFound
	}
	b, err := tx.CreateBucketIfNotExists(path[0])
	for _, name := range path[1:] {
		if err != nil {
			break
		}
		b, err = b.CreateBucketIfNotExists(name)
	}
	return b, err
}

// readOrQuarantine runs read in a read transaction; if it reports bad
// records, it runs again in a write transaction where it quarantines them,
// so the result returned always matches what was quarantined. The records
// sealed with another key are in the result too (ErrKeyMismatch), but cost
// no write transaction: they stay where they are.
func (s *BoltStore) readOrQuarantine(read func(tx *bolt.Tx, q *quarantiner) error) (map[string]error, error) {
	q := newQuarantiner(s.now)
	if err := s.view(func(tx *bolt.Tx) error { return read(tx, q) }); err != nil {
		return nil, err
	}
	if len(q.errs) == 0 {
		return q.withMismatches(), nil
	}
	err := s.update(func(tx *bolt.Tx) error {
		q = newQuarantiner(s.now)
		return read(tx, q)
	})
	if err != nil {
		return nil, err
	}
	s.quarantined.Add(uint64(q.moved))
	if q.moved > 0 {
		s.count(bucketQuarantine, true)
	}
	return q.withMismatches(), nil
}

// --- pods ---

// PutPod implements Store.
func (s *BoltStore) PutPod(source Source, pod *v1.Pod) error {
	raw, err := encodePod(s.seal, source, pod)
	if err != nil {
		return fmt.Errorf("put pod: %w", err)
	}
	if err := s.put(fmt.Sprintf("put pod %s", pod.UID), [][]byte{bucketPods, []byte(pod.UID)}, keyPod, raw, true); err != nil {
		return err
	}
	s.journal.recordPut(pod.UID)
	return nil
}

// SetAdmission implements Store.
func (s *BoltStore) SetAdmission(uid types.UID, a Admission) error {
	op := fmt.Sprintf("set admission of pod %s", uid)
	raw, err := encodeAdmission(a)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	// check decides from the stored value: nil to write, errSame to skip.
	errSame := errors.New("same")
	check := func(b *bolt.Bucket) error {
		if b == nil || b.Get(keyPod) == nil {
			return ErrNotFound
		}
		old := b.Get(keyAdmission)
		switch {
		case old == nil:
			return nil
		case bytes.Equal(old, raw):
			return errSame
		}
		if prev, err := decodeAdmission(old); err == nil {
			return fmt.Errorf("%w: accepted=%t at %s", ErrAdmissionDecided, prev.Accepted, prev.At.Format(time.RFC3339))
		}
		return nil // undecodable: quarantined and replaced below
	}
	err = s.view(func(tx *bolt.Tx) error { return check(bucketAt(tx, bucketPods, []byte(uid))) })
	if errors.Is(err, errSame) {
		s.count(bucketPods, false)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var changed bool
	var q *quarantiner
	err = s.update(func(tx *bolt.Tx) error {
		changed, q = false, newQuarantiner(s.now)
		b := bucketAt(tx, bucketPods, []byte(uid))
		if err := check(b); err != nil {
			if errors.Is(err, errSame) {
				return nil
			}
			return err
		}
		if old := b.Get(keyAdmission); old != nil {
			_, derr := decodeAdmission(old)
			if err := q.put(tx, "pods/"+string(uid)+"/admission", old, derr); err != nil {
				return err
			}
		}
		changed = true
		return b.Put(keyAdmission, raw)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	s.quarantined.Add(uint64(q.moved))
	s.count(bucketPods, changed)
	return nil
}

// putPodChild stores raw at pods/<uid>/<bucket>/<name> unless it is already
// there; ErrNotFound if the pod is not recorded.
func (s *BoltStore) putPodChild(op string, uid types.UID, bucket []byte, name string, raw []byte) error {
	same := false
	err := s.view(func(tx *bolt.Tx) error {
		pb := bucketAt(tx, bucketPods, []byte(uid))
		if pb == nil || pb.Get(keyPod) == nil {
			return ErrNotFound
		}
		if cb := pb.Bucket(bucket); cb != nil {
			same = bytes.Equal(cb.Get([]byte(name)), raw)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if same {
		s.count(bucketPods, false)
		return nil
	}
	var changed bool
	err = s.update(func(tx *bolt.Tx) error {
		changed = false
		pb := bucketAt(tx, bucketPods, []byte(uid))
		if pb == nil || pb.Get(keyPod) == nil {
			return ErrNotFound
		}
		cb, err := pb.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		if bytes.Equal(cb.Get([]byte(name)), raw) {
			return nil
		}
		changed = true
		return cb.Put([]byte(name), raw)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	s.count(bucketPods, changed)
	return nil
}

// readPod decodes one pod bucket. A bad object or admission is reported to q;
// in a writable transaction the whole pod is also quarantined. ok is false if
// the pod is unusable. The containers sub-bucket that agents before this one
// wrote is not read (see doc.go): it goes with its pod.
func readPod(tx *bolt.Tx, seal sealing, pods *bolt.Bucket, uid types.UID, q *quarantiner) (rec PodRecord, ok bool, err error) {
	key := "pods/" + string(uid)
	pb := pods.Bucket([]byte(uid))
	if pb == nil {
		raw := pods.Get([]byte(uid))
		perr := fmt.Errorf("%w: a value where a pod bucket was expected", errUndecodable)
		q.note(string(uid), perr)
		if tx.Writable() {
			if err := q.put(tx, key, raw, perr); err != nil {
				return rec, false, err
			}
			return rec, false, pods.Delete([]byte(uid))
		}
		return rec, false, nil
	}
	podErr := func(perr error) (PodRecord, bool, error) {
		q.note(string(uid), perr)
		if tx.Writable() {
			if err := q.quarantineBucket(tx, pb, key, perr); err != nil {
				return PodRecord{}, false, err
			}
			return PodRecord{}, false, pods.DeleteBucket([]byte(uid))
		}
		return PodRecord{}, false, nil
	}
	raw := pb.Get(keyPod)
	if raw == nil {
		return podErr(fmt.Errorf("%w: pod bucket without a pod object", errUndecodable))
	}
	e, err := decodePod(seal, uid, raw)
	if errors.Is(err, ErrKeyMismatch) {
		// Left in place: the right key may come back, and the apiserver gives the pod again.
		q.keyMismatch(string(uid), fmt.Errorf("pod object: %w", err))
		return rec, false, nil
	}
	if err != nil {
		return podErr(fmt.Errorf("pod object: %w", err))
	}
	rec = PodRecord{UID: uid, Source: e.Source, Pod: e.Pod}
	if raw := pb.Get(keyAdmission); raw != nil {
		if rec.Admission, err = decodeAdmission(raw); err != nil {
			return podErr(fmt.Errorf("admission: %w", err))
		}
	}
	return rec, true, nil
}

// GetPod implements Store.
func (s *BoltStore) GetPod(uid types.UID) (PodRecord, error) {
	op := fmt.Sprintf("get pod %s", uid)
	var rec PodRecord
	var found bool
	errs, err := s.readOrQuarantine(func(tx *bolt.Tx, q *quarantiner) error {
		rec, found = PodRecord{}, false
		pods := tx.Bucket(bucketPods)
		if pods.Get([]byte(uid)) == nil && pods.Bucket([]byte(uid)) == nil {
			return nil
		}
		found = true
		var err error
		rec, _, err = readPod(tx, s.seal, pods, uid, q)
		return err
	})
	if err != nil {
		return PodRecord{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := recordErr(errs); err != nil {
		return PodRecord{}, fmt.Errorf("%s: %w", op, err)
	}
	if !found {
		return PodRecord{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	s.withLatestStatus(&rec)
	return rec, nil
}

// withLatestStatus gives the record's pod the latest status the outbox has of it: pod records
// are written without their status (encodePod), which changes far more often than the spec.
func (s *BoltStore) withLatestStatus(rec *PodRecord) {
	if rec.Pod == nil {
		return
	}
	if st, ok := s.latestStatus(rec.UID); ok {
		rec.Pod.Status = st
	}
}

// LoadPods implements Store.
func (s *BoltStore) LoadPods() ([]PodRecord, map[string]error, error) {
	var recs []PodRecord
	errs, err := s.readOrQuarantine(func(tx *bolt.Tx, q *quarantiner) error {
		recs = nil
		pods := tx.Bucket(bucketPods)
		var uids []types.UID
		if err := pods.ForEach(func(k, _ []byte) error {
			uids = append(uids, types.UID(k))
			return nil
		}); err != nil {
			return err
		}
		// Keys are collected first: bbolt forbids changing a bucket while a
		// cursor walks it, and readPod may quarantine.
		for _, uid := range uids {
			rec, ok, err := readPod(tx, s.seal, pods, uid, q)
			if err != nil {
				return fmt.Errorf("pod %s: %w", uid, err)
			}
			if ok {
				recs = append(recs, rec)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("load pods: %w", err)
	}
	for i := range recs {
		s.withLatestStatus(&recs[i])
	}
	return recs, errs, nil
}

// DeletePod implements Store.
func (s *BoltStore) DeletePod(uid types.UID) error {
	op := fmt.Sprintf("delete pod %s", uid)
	present := false
	if err := s.view(func(tx *bolt.Tx) error {
		pods := tx.Bucket(bucketPods)
		present = pods.Bucket([]byte(uid)) != nil || pods.Get([]byte(uid)) != nil
		return nil
	}); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if !present {
		s.journal.recordDeleted(uid)
		s.count(bucketPods, false)
		return nil
	}
	var changed bool
	err := s.update(func(tx *bolt.Tx) error {
		changed = false
		pods := tx.Bucket(bucketPods)
		switch {
		case pods.Bucket([]byte(uid)) != nil:
			changed = true
			return pods.DeleteBucket([]byte(uid))
		case pods.Get([]byte(uid)) != nil:
			changed = true
			return pods.Delete([]byte(uid))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	s.journal.recordDeleted(uid)
	s.count(bucketPods, changed)
	return nil
}

// DeletePodSealedWithAnotherKey implements Store.
func (s *BoltStore) DeletePodSealedWithAnotherKey(uid types.UID) (bool, error) {
	var deleted bool
	err := s.update(func(tx *bolt.Tx) error {
		deleted = false
		pb := bucketAt(tx, bucketPods, []byte(uid))
		if pb == nil {
			return nil
		}
		raw := pb.Get(keyPod)
		if raw == nil {
			return nil
		}
		if _, err := decodePod(s.seal, uid, raw); !errors.Is(err, ErrKeyMismatch) {
			return nil
		}
		deleted = true
		return tx.Bucket(bucketPods).DeleteBucket([]byte(uid))
	})
	if err != nil {
		return false, fmt.Errorf("delete pod %s sealed with another key: %w", uid, err)
	}
	if deleted {
		s.journal.recordDeleted(uid)
	}
	s.count(bucketPods, deleted)
	return deleted, nil
}

// --- reading one record ---

// getValue reads path/key, quarantining it if decode fails. found is false
// if it is absent (or was just quarantined, in which case err wraps
// ErrCorruptRecord). A value sealed with another key (ErrKeyMismatch) is
// left in place and returned as the error.
func (s *BoltStore) getValue(op string, bucket, key []byte, decode func([]byte) error) (found bool, err error) {
	errs, err := s.readOrQuarantine(func(tx *bolt.Tx, q *quarantiner) error {
		found = false
		b := tx.Bucket(bucket)
		if b == nil { // a bucket created by its first put (policy_modules)
			return nil
		}
		raw := b.Get(key)
		if raw == nil {
			return nil
		}
		if derr := decode(raw); derr != nil {
			path := string(bucket) + "/" + string(key)
			if errors.Is(derr, ErrKeyMismatch) {
				q.keyMismatch(path, derr)
				return nil
			}
			if tx.Writable() {
				if err := q.putAndNote(tx, path, path, raw, derr); err != nil {
					return err
				}
				return b.Delete(key)
			}
			q.note(path, derr)
			return nil
		}
		found = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	if err := recordErr(errs); err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	return found, nil
}

// --- policy modules ---

// PutPolicyModule implements Store.
func (s *BoltStore) PutPolicyModule(digest string, module []byte) error {
	key, err := policyModuleKey(digest)
	if err != nil {
		return fmt.Errorf("put policy module: %w", err)
	}
	return s.put("put policy module "+digest, [][]byte{bucketPolicyModules}, key, encodeBlob(module), true)
}

// GetPolicyModule implements Store.
func (s *BoltStore) GetPolicyModule(digest string) ([]byte, error) {
	op := "get policy module " + digest
	key, err := policyModuleKey(digest)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	var module []byte
	found, err := s.getValue(op, bucketPolicyModules, key, func(raw []byte) (err error) {
		module, err = decodeBlob(raw)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return module, nil
}

// PolicyModules implements Store.
func (s *BoltStore) PolicyModules() ([]string, error) {
	var digests []string
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPolicyModules)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			digests = append(digests, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list policy modules: %w", err)
	}
	return digests, nil // bbolt iterates in key order
}

// DeletePolicyModule implements Store.
func (s *BoltStore) DeletePolicyModule(digest string) error {
	key, err := policyModuleKey(digest)
	if err != nil {
		return fmt.Errorf("delete policy module: %w", err)
	}
	return s.del("delete policy module "+digest, [][]byte{bucketPolicyModules}, key)
}

// --- ConfigMaps and Secrets ---

func putObject[T any, P namedObject[T]](s *BoltStore, c objectClass, obj P) error {
	if obj == nil {
		return fmt.Errorf("put %s: %w: nil object", c.kind, ErrInvalid)
	}
	key, err := objectKey(obj.GetNamespace(), obj.GetName())
	if err != nil {
		return fmt.Errorf("put %s: %w", c.kind, err)
	}
	raw, err := encodeObject(s.seal, c, key, obj)
	if err != nil {
		return fmt.Errorf("put %s %s: %w", c.kind, key, err)
	}
	return s.put(fmt.Sprintf("put %s %s", c.kind, key), [][]byte{c.bucket}, []byte(key), raw, true)
}

func getObject[T any, P namedObject[T]](s *BoltStore, c objectClass, namespace, name string) (P, error) {
	key, err := objectKey(namespace, name)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", c.kind, err)
	}
	var obj P
	found, err := s.getValue(fmt.Sprintf("get %s %s", c.kind, key), c.bucket, []byte(key), func(raw []byte) (err error) {
		obj, err = decodeObject[T, P](s.seal, c, key, raw)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("get %s %s: %w", c.kind, key, ErrNotFound)
	}
	return obj, nil
}

func (s *BoltStore) deleteObject(c objectClass, namespace, name string) error {
	key, err := objectKey(namespace, name)
	if err != nil {
		return fmt.Errorf("delete %s: %w", c.kind, err)
	}
	return s.del(fmt.Sprintf("delete %s %s", c.kind, key), [][]byte{c.bucket}, []byte(key))
}

// PutConfigMap implements Store.
func (s *BoltStore) PutConfigMap(cm *v1.ConfigMap) error {
	return putObject(s, classConfigMap, cm)
}

// GetConfigMap implements Store.
func (s *BoltStore) GetConfigMap(namespace, name string) (*v1.ConfigMap, error) {
	return getObject[v1.ConfigMap](s, classConfigMap, namespace, name)
}

// DeleteConfigMap implements Store.
func (s *BoltStore) DeleteConfigMap(namespace, name string) error {
	return s.deleteObject(classConfigMap, namespace, name)
}

// PutSecret implements Store.
func (s *BoltStore) PutSecret(secret *v1.Secret) error {
	return putObject(s, classSecret, secret)
}

// GetSecret implements Store.
func (s *BoltStore) GetSecret(namespace, name string) (*v1.Secret, error) {
	return getObject[v1.Secret](s, classSecret, namespace, name)
}

// DeleteSecret implements Store.
func (s *BoltStore) DeleteSecret(namespace, name string) error {
	return s.deleteObject(classSecret, namespace, name)
}

// --- allocations ---

// SetAllocation implements Store.
func (s *BoltStore) SetAllocation(uid types.UID, a Allocation) error {
	op := fmt.Sprintf("set allocation of pod %s", uid)
	raw, err := encodeAllocation(a)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return s.putPodChild(op, uid, bucketAllocation, keyAllocation, raw)
}

// GetAllocation implements Store.
func (s *BoltStore) GetAllocation(uid types.UID) (Allocation, error) {
	op := fmt.Sprintf("get allocation of pod %s", uid)
	var a Allocation
	var found bool
	errs, err := s.readOrQuarantine(func(tx *bolt.Tx, q *quarantiner) error {
		a, found = Allocation{}, false
		b := bucketAt(tx, bucketPods, []byte(uid), bucketAllocation)
		if b == nil {
			return nil
		}
		raw := b.Get([]byte(keyAllocation))
		if raw == nil {
			return nil
		}
		var derr error
		a, derr = decodeAllocation(raw)
		switch {
		case derr == nil:
			found = true
		case tx.Writable():
			if err := q.putAndNote(tx, allocationPlace(uid), allocationPlace(uid), raw, derr); err != nil {
				return err
			}
			return b.Delete([]byte(keyAllocation))
		default:
			q.note(allocationPlace(uid), derr)
		}
		return nil
	})
	switch {
	case err != nil:
		return Allocation{}, fmt.Errorf("%s: %w", op, err)
	case len(errs) > 0:
		return Allocation{}, fmt.Errorf("%s: %w: %v", op, ErrCorruptRecord, joinErrs(errs))
	case !found:
		return Allocation{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return a, nil
}

// --- tokens ---

// PutToken implements Store.
func (s *BoltStore) PutToken(uid types.UID, name string, t Token) error {
	op := fmt.Sprintf("put token %q of pod %s", name, uid)
	raw, err := encodeToken(s.seal.key, uid, name, t)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return s.putPodChild(op, uid, bucketTokens, name, raw)
}

// GetToken implements Store.
func (s *BoltStore) GetToken(uid types.UID, name string) (Token, error) {
	op := fmt.Sprintf("get token %q of pod %s", name, uid)
	var t Token
	var found bool
	var mismatch error
	errs, err := s.readOrQuarantine(func(tx *bolt.Tx, q *quarantiner) error {
		t, found, mismatch = Token{}, false, nil
		b := bucketAt(tx, bucketPods, []byte(uid), bucketTokens)
		if b == nil {
			return nil
		}
		raw := b.Get([]byte(name))
		if raw == nil {
			return nil
		}
		var derr error
		t, derr = decodeToken(s.seal.key, uid, name, raw)
		switch {
		case derr == nil:
			found = true
		case errors.Is(derr, ErrKeyMismatch):
			mismatch = derr
		case tx.Writable():
			if err := q.putAndNote(tx, tokenPlace(uid, name), tokenPlace(uid, name), raw, derr); err != nil {
				return err
			}
			return b.Delete([]byte(name))
		default:
			q.note(tokenPlace(uid, name), derr)
		}
		return nil
	})
	switch {
	case err != nil:
		return Token{}, fmt.Errorf("%s: %w", op, err)
	case len(errs) > 0:
		return Token{}, fmt.Errorf("%s: %w: %v", op, ErrCorruptRecord, joinErrs(errs))
	case mismatch != nil:
		return Token{}, fmt.Errorf("%s: %w", op, mismatch)
	case !found:
		return Token{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return t, nil
}

// --- outbox ---

// AppendStatus implements Store: the status goes to the status journal (journal.go), synced.
func (s *BoltStore) AppendStatus(u StatusUpdate) (uint64, error) {
	op := fmt.Sprintf("append status of pod %s", u.UID)
	if u.UID == "" {
		return 0, fmt.Errorf("%s: %w: status update without pod UID", op, ErrInvalid)
	}
	if s.closed.Load() {
		return 0, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	seq, err := s.journal.appendStatus(u)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	s.count(bucketOutbox, true)
	return seq, nil
}

// PendingStatuses implements Store. What the journal's replay at Open could not read is
// reported once, by "journal@<offset>"; Open quarantined its bytes.
func (s *BoltStore) PendingStatuses() ([]PendingStatus, map[string]error, error) {
	if s.closed.Load() {
		return nil, nil, fmt.Errorf("read outbox: %w", ErrClosed)
	}
	errs := s.journal.takeDamage()
	s.journal.mu.Lock()
	defer s.journal.mu.Unlock()
	return s.journal.state.pendingStatuses(), errs, nil
}

// AckStatuses implements Store. The ack is written but not synced (a delivered status whose
// ack a power cut lost is sent once more).
func (s *BoltStore) AckStatuses(uid types.UID, upTo uint64) error {
	failpoint.Inject(failpoint.OutboxBeforeAck)
	if s.closed.Load() {
		return fmt.Errorf("ack statuses of pod %s up to %d: %w", uid, upTo, ErrClosed)
	}
	changed, err := s.journal.ack(uid, upTo)
	if err != nil {
		return fmt.Errorf("ack statuses of pod %s up to %d: %w", uid, upTo, err)
	}
	s.count(bucketOutbox, changed)
	return nil
}

// OutboxLen implements Store.
func (s *BoltStore) OutboxLen() (int, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("count outbox entries: %w", ErrClosed)
	}
	s.journal.mu.Lock()
	defer s.journal.mu.Unlock()
	return s.journal.state.pendingLen(), nil
}

// latestStatus is the pod's latest status in the journal, delivered or not.
func (s *BoltStore) latestStatus(uid types.UID) (v1.PodStatus, bool) {
	s.journal.mu.Lock()
	defer s.journal.mu.Unlock()
	return s.journal.state.latestStatus(uid)
}

// Quarantined implements Store.
func (s *BoltStore) Quarantined() ([]QuarantinedRecord, error) {
	var out []QuarantinedRecord
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketQuarantine).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			seq, _ := parseSeqKey(k)
			out = append(out, decodeQuarantine(seq, v))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list quarantine: %w", err)
	}
	return out, nil
}

// recordErr is the error of a read of one record, from its per-key errors: ErrCorruptRecord if
// any was undecodable (and quarantined), else the ErrKeyMismatch of a record left in place.
func recordErr(errs map[string]error) error {
	for _, err := range errs {
		if !errors.Is(err, ErrKeyMismatch) {
			return fmt.Errorf("%w: %v", ErrCorruptRecord, joinErrs(errs))
		}
	}
	if len(errs) > 0 {
		return joinErrs(errs)
	}
	return nil
}

// joinErrs renders a per-key error map in key order, for messages.
func joinErrs(errs map[string]error) error {
	keys := make([]string, 0, len(errs))
	for k := range errs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var all []error
	for _, k := range keys {
		all = append(all, fmt.Errorf("%s: %w", k, errs[k]))
	}
	return errors.Join(all...)
}
