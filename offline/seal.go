package offline

import (
	"bytes"
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

// applySealing brings the database in line with the key it is opened with, and sets
// s.seal.sealedBy (see sealing):
//
//   - the first open with a key seals the pod records written in the clear before (a pod
//     accepted then and not updated since would keep its env values readable on the disk for
//     good), and records the key's ID in meta/sealed_by;
//   - an open with another key records the new ID: what the old key sealed waits for the
//     apiserver (ErrKeyMismatch), and a pod record in the clear is refused from then on;
//   - with Options.SealConfigMaps, every open with a key seals the ConfigMaps in the clear
//     (the option may have been turned on since);
//   - an open without a key changes nothing, and learns whether pod records must not be
//     written in the clear (report.KeyMissing).
//
// A read transaction finds the work first, so that an open with nothing to do (every boot but
// the first with a key) writes nothing. Values that do not decode are left for the loads to
// quarantine.
func (s *BoltStore) applySealing(report *OpenReport) error {
	key := s.seal.key
	var sealedBy string
	var found []plainRecord
	if err := s.view(func(tx *bolt.Tx) error {
		sealedBy = string(tx.Bucket(bucketMeta).Get(keySealedBy))
		found = nil
		if key == nil {
			return nil
		}
		if sealedBy == "" {
			pods := tx.Bucket(bucketPods)
			if err := pods.ForEach(func(uid, _ []byte) error {
				if pb := pods.Bucket(uid); pb != nil && inClear(pb.Get(keyPod)) {
					found = append(found, plainRecord{path: [][]byte{bucketPods, clone(uid)}, key: keyPod,
						place: podPlace(types.UID(uid)), bucket: bucketPods})
				}
				return nil
			}); err != nil {
				return err
			}
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
		return fmt.Errorf("read the records to seal: %w", err)
	}
	if key == nil {
		s.seal.sealedBy = sealedBy
		report.KeyMissing = sealedBy
		return nil
	}
	if len(found) == 0 && sealedBy == key.ID() {
		s.seal.sealedBy = sealedBy
		return nil
	}
	var sealedIn [][]byte // the top-level bucket of each record sealed
	err := s.update(func(tx *bolt.Tx) error {
		sealedIn = nil
		for _, r := range found {
			b := bucketAt(tx, r.path...)
			if b == nil {
				continue
			}
			v, ok, err := sealedCopy(key, r.place, b.Get(r.key))
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
		meta := tx.Bucket(bucketMeta)
		if bytes.Equal(meta.Get(keySealedBy), []byte(key.ID())) {
			return nil
		}
		return meta.Put(keySealedBy, []byte(key.ID()))
	})
	if err != nil {
		return fmt.Errorf("seal records kept in the clear: %w", err)
	}
	for _, b := range sealedIn {
		s.count(b, true)
	}
	s.seal.sealedBy = key.ID()
	report.Sealed = len(sealedIn)
	if sealedBy != "" && sealedBy != key.ID() {
		report.KeyChangedFrom = sealedBy
	}
	return nil
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
