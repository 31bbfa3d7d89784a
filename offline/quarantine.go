package offline

import (
	"fmt"
	"maps"
	"time"

	bolt "go.etcd.io/bbolt"
)

// quarantiner moves undecodable records into the quarantine bucket inside a
// write transaction and remembers what it moved, for the caller's per-key
// error map. Create one per transaction attempt: a batched transaction may
// run its function more than once.
type quarantiner struct {
	now  func() time.Time
	errs map[string]error
	// mismatched are the records sealed with another key than the store's: reported, never
	// quarantined (the right key may come back).
	mismatched map[string]error
	// moved counts records written to the quarantine bucket.
	moved int
}

func newQuarantiner(now func() time.Time) *quarantiner {
	return &quarantiner{now: now, errs: map[string]error{}}
}

// put stores raw under the next quarantine sequence number, recording key
// (its bucket path and key) and reason. The caller deletes the original.
func (q *quarantiner) put(tx *bolt.Tx, key string, raw []byte, reason error) error {
	b, err := tx.CreateBucketIfNotExists(bucketQuarantine)
	if err != nil {
		return fmt.Errorf("quarantine %s: %w", key, err)
	}
	seq, err := b.NextSequence()
	if err != nil {
		return fmt.Errorf("quarantine %s: %w", key, err)
	}
	val, err := encodeValue(quarantineEntry{Key: key, Reason: reason.Error(), At: q.now().UTC(), Value: clone(raw)})
	if err != nil {
		return fmt.Errorf("quarantine %s: %w", key, err)
	}
	if err := b.Put(seqKey(seq), val); err != nil {
		return fmt.Errorf("quarantine %s: %w", key, err)
	}
	q.moved++
	return nil
}

// keyMismatch reports a record sealed with another key (ErrKeyMismatch); unlike note, it does
// not make readOrQuarantine write.
func (q *quarantiner) keyMismatch(key string, err error) {
	if q.mismatched == nil {
		q.mismatched = map[string]error{}
	}
	q.mismatched[key] = err
}

// withMismatches is every error reported: notes and key mismatches; nil if none.
func (q *quarantiner) withMismatches() map[string]error {
	if len(q.mismatched) == 0 {
		if len(q.errs) == 0 {
			return nil
		}
		return q.errs
	}
	all := maps.Clone(q.errs)
	maps.Copy(all, q.mismatched)
	return all
}

// note records an error for key without quarantining anything.
func (q *quarantiner) note(key string, err error) { q.errs[key] = err }

// putAndNote quarantines raw and reports err under reportKey.
func (q *quarantiner) putAndNote(tx *bolt.Tx, reportKey, key string, raw []byte, err error) error {
	q.note(reportKey, err)
	return q.put(tx, key, raw, err)
}

// quarantineBucket flattens every value under b (recursively) into the
// quarantine, each with its full key below prefix, and the given reason.
// The caller deletes b afterwards.
func (q *quarantiner) quarantineBucket(tx *bolt.Tx, b *bolt.Bucket, prefix string, reason error) error {
	type kv struct {
		key string
		val []byte
	}
	var all []kv
	var walk func(b *bolt.Bucket, prefix string)
	walk = func(b *bolt.Bucket, prefix string) {
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if sub := b.Bucket(k); sub != nil {
				walk(sub, prefix+"/"+string(k))
				continue
			}
			all = append(all, kv{prefix + "/" + string(k), clone(v)})
		}
	}
	walk(b, prefix)
	for _, e := range all {
		if err := q.put(tx, e.key, e.val, reason); err != nil {
			return err
		}
	}
	return nil
}

func decodeQuarantine(seq uint64, raw []byte) QuarantinedRecord {
	var e quarantineEntry
	if err := decodeValue(raw, &e); err != nil {
		return QuarantinedRecord{
			Seq: seq, Key: "quarantine/" + seqString(seq),
			Reason: "undecodable quarantine entry: " + err.Error(), Value: clone(raw),
		}
	}
	return QuarantinedRecord{Seq: seq, Key: e.Key, Reason: e.Reason, At: e.At, Value: e.Value}
}
