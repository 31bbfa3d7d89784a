package offline

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/types"
)

// plainRecord is a record kept in the clear that the store's key should seal.
type plainRecord struct {
	path   [][]byte // its bucket
	key    []byte
	place  string // what it is sealed to (Key.seal's additional data)
	bucket []byte // the top-level bucket, for the write counts
}

// sealPlainRecords seals with the store's key the records that may hold a secret and were
// written in the clear before a key was configured: pod records, and ConfigMaps when asked.
// Without it, a pod accepted before the key and not updated since would keep its env values
// readable on the disk for good. A read transaction finds them first, so that a boot with
// none (every boot but the first with a key) writes nothing. Values that do not decode are
// left for the loads to quarantine.
func (s *BoltStore) sealPlainRecords() (int, error) {
	if s.seal.key == nil {
		return 0, nil
	}
	var found []plainRecord
	if err := s.view(func(tx *bolt.Tx) error {
		found = nil
		pods := tx.Bucket(bucketPods)
		if err := pods.ForEach(func(uid, v []byte) error {
			if pb := pods.Bucket(uid); pb != nil && inClear(pb.Get(keyPod)) {
				found = append(found, plainRecord{path: [][]byte{bucketPods, clone(uid)}, key: keyPod,
					place: podPlace(types.UID(uid)), bucket: bucketPods})
			}
			return nil
		}); err != nil {
			return err
		}
		if !s.seal.configMaps {
			return nil
		}
		return tx.Bucket(bucketConfigMaps).ForEach(func(k, v []byte) error {
			if inClear(v) {
				found = append(found, plainRecord{path: [][]byte{bucketConfigMaps}, key: clone(k),
					place: classConfigMap.place(string(k)), bucket: bucketConfigMaps})
			}
			return nil
		})
	}); err != nil {
		return 0, fmt.Errorf("find records kept in the clear: %w", err)
	}
	if len(found) == 0 {
		return 0, nil
	}
	var sealedIn [][]byte // the top-level bucket of each record sealed
	err := s.update(func(tx *bolt.Tx) error {
		sealedIn = nil
		for _, r := range found {
			b := bucketAt(tx, r.path...)
			if b == nil {
				continue
			}
			v, ok, err := sealedCopy(s.seal.key, r.place, b.Get(r.key))
			if err != nil {
				return fmt.Errorf("seal %s: %w", r.place, err)
			}
			if !ok {
				continue
			}
			if err := b.Put(r.key, v); err != nil {
				return fmt.Errorf("seal %s: %w", r.place, err)
			}
			sealedIn = append(sealedIn, r.bucket)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("seal records kept in the clear: %w", err)
	}
	for _, b := range sealedIn {
		s.count(b, true)
	}
	return len(sealedIn), nil
}

// inClear reports whether raw is a well-framed JSON value that is not sealed.
func inClear(raw []byte) bool {
	if raw == nil {
		return false
	}
	payload, err := unframe(raw)
	if err != nil || !json.Valid(payload) {
		return false
	}
	sealed, err := isSealed(raw)
	return err == nil && !sealed
}

// sealedCopy is raw, a record kept in the clear, sealed with k for place; ok is false if raw
// is not such a record (sealed already, absent, or undecodable: left for the loads to
// quarantine). The JSON is sealed as it is, the same bytes encodeValue wrote: the same value
// put again seals to the same bytes and writes nothing.
func sealedCopy(k *Key, place string, raw []byte) (sealed []byte, ok bool, err error) {
	if !inClear(raw) {
		return nil, false, nil
	}
	payload, _ := unframe(raw) // inClear checked the frame
	sealed, err = k.seal(place, json.RawMessage(payload))
	return sealed, err == nil, err
}
