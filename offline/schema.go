package offline

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
)

//go:generate go run ./internal/genv1db -out testdata/schema-v1.db
//go:generate go run ./internal/genv2db -out testdata/schema-v2.db

// SchemaVersion is the schema this package reads and writes. See doc.go for
// the tree of each version.
const SchemaVersion = 4

// Bucket and key names of schema v4 (doc.go draws the tree). The legacy
// meta/boot_count, sync/, node/ and pods/<uid>/containers/ are created as
// before, for older agents after a rollback, but never read or updated (see
// doc.go).
var (
	bucketMeta   = []byte("meta")
	keyVersion   = []byte("version")
	keyBootCount = []byte("boot_count")
	// keySealedBy (v4) is the ID of the state key the pod records are sealed with; absent
	// while there has never been a key. See sealing.
	keySealedBy       = []byte("sealed_by")
	bucketPods        = []byte("pods")
	keyPod            = []byte("pod")
	keyAdmission      = []byte("admission")
	bucketContainers  = []byte("containers")
	bucketTokens      = []byte("tokens")
	bucketAllocation  = []byte("allocation")
	keyAllocation     = "containers"
	bucketSync        = []byte("sync")
	bucketConfigMaps  = []byte("configmaps")
	bucketSecrets     = []byte("secrets")
	bucketNode        = []byte("node")
	bucketOutbox      = []byte("outbox")
	bucketOutboxIndex = []byte("outbox_index")
	bucketQuarantine  = []byte("quarantine")
	// bucketPolicyModules is created by the first PutPolicyModule, not by
	// initSchema or a migration: a v3 agent that never saw it ignores it, so
	// adding it needs no schema version (a newer version would make an older
	// agent, after a rollback, move the whole database aside).
	bucketPolicyModules = []byte("policy_modules")

	// topBuckets are the top-level buckets of schemas v2 to v4.
	topBuckets = [][]byte{
		bucketMeta, bucketPods, bucketSync, bucketConfigMaps, bucketSecrets,
		bucketNode, bucketOutbox, bucketOutboxIndex, bucketQuarantine,
	}
)

// initSchema creates the buckets and meta keys of the current schema in an
// empty database.
func initSchema(tx *bolt.Tx) error {
	for _, name := range topBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(keyVersion, []byte(strconv.Itoa(SchemaVersion))); err != nil {
		return fmt.Errorf("put schema version: %w", err)
	}
	if meta.Get(keyBootCount) == nil {
		if err := meta.Put(keyBootCount, binary.BigEndian.AppendUint64(nil, 0)); err != nil {
			return fmt.Errorf("put boot counter: %w", err)
		}
	}
	return nil
}

// errNoSchema: the database has no buckets at all (a new bbolt file).
var errNoSchema = errors.New("no schema")

// readVersion returns the schema version of the database, errNoSchema for a
// database without buckets, or an error describing why it is not ours.
func readVersion(tx *bolt.Tx) (int, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		empty := true
		_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
		if empty {
			return 0, errNoSchema
		}
		return 0, errors.New("no meta bucket: not a holdfast state database")
	}
	raw := meta.Get(keyVersion)
	if raw == nil {
		return 0, errors.New("meta bucket without a schema version")
	}
	v, err := strconv.Atoi(string(raw))
	if err != nil || v < 1 {
		return 0, fmt.Errorf("unreadable schema version %q", raw)
	}
	return v, nil
}

// migration upgrades a database from version `from` to from+1 inside the
// caller's transaction. q records undecodable records it quarantined instead
// of failing the migration; key is the store's state key, nil if none.
type migration func(tx *bolt.Tx, q *quarantiner, key *Key) error

// migrations[v] upgrades from schema v to v+1.
var migrations = map[int]migration{
	1: migrateV1toV2,
	2: migrateV2toV3,
	3: migrateV3toV4,
}

// migrateV3toV4 changes no record: v4 pod records (and ConfigMaps where asked) may be sealed,
// which a v3 agent would take for corrupt records and quarantine whole pods (their admission,
// containers and tokens) after a firmware rollback. With the new version it moves the file
// aside instead, as for any newer schema. The sealing itself is Open's (applySealing), after
// the migration, for this file and for one whose key is configured later.
func migrateV3toV4(tx *bolt.Tx, _ *quarantiner, _ *Key) error {
	return initSchema(tx)
}

// Schema v1, as written by the first prototype (see doc.go): flat buckets
// keyed namespace/name, plain JSON values without a checksum, pods admitted
// before they were written, no container records, no outbox.
type v1PodEntry struct {
	Source     Source    `json:"source"`
	Pod        *v1.Pod   `json:"pod"`
	AdmittedAt time.Time `json:"admittedAt"`
}

// migrateV1toV2 re-keys pods by UID (recording their admission and an empty
// container bucket), frames every value with a checksum, and adds the new
// buckets. A v1 record that does not decode, or a pod without a UID, is
// quarantined under its v1 key.
func migrateV1toV2(tx *bolt.Tx, q *quarantiner, _ *Key) error {
	for _, name := range topBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}

	// Pods: the v1 bucket shares its name with the v2 one, so read it all,
	// drop it and write the new tree.
	type kv struct{ k, v []byte }
	var oldPods []kv
	if err := tx.Bucket(bucketPods).ForEach(func(k, v []byte) error {
		oldPods = append(oldPods, kv{clone(k), clone(v)})
		return nil
	}); err != nil {
		return fmt.Errorf("read v1 pods: %w", err)
	}
	if err := tx.DeleteBucket(bucketPods); err != nil {
		return fmt.Errorf("drop v1 pods bucket: %w", err)
	}
	pods, err := tx.CreateBucket(bucketPods)
	if err != nil {
		return fmt.Errorf("create v2 pods bucket: %w", err)
	}
	for _, p := range oldPods {
		key := "pods/" + string(p.k)
		if p.v == nil { // a nested bucket: v1 had none; dropped with the bucket
			q.note(key, fmt.Errorf("migrate v1 pod: %w: unexpected nested bucket (dropped)", errUndecodable))
			continue
		}
		var e v1PodEntry
		if err := json.Unmarshal(p.v, &e); err != nil {
			if err := q.putAndNote(tx, key, key, p.v, fmt.Errorf("migrate v1 pod: %w: %v", errUndecodable, err)); err != nil {
				return err
			}
			continue
		}
		if e.Pod == nil || e.Pod.UID == "" || !e.Source.valid() {
			if err := q.putAndNote(tx, key, key, p.v, fmt.Errorf("migrate v1 pod: %w: no pod, no UID or unknown source", errUndecodable)); err != nil {
				return err
			}
			continue
		}
		raw, err := encodeValue(podEntry{Source: e.Source, Pod: e.Pod})
		if err != nil {
			return fmt.Errorf("migrate v1 pod %s: %w", key, err)
		}
		b, err := pods.CreateBucketIfNotExists([]byte(e.Pod.UID))
		if err != nil {
			return fmt.Errorf("migrate v1 pod %s: %w", key, err)
		}
		if err := b.Put(keyPod, raw); err != nil {
			return fmt.Errorf("migrate v1 pod %s: %w", key, err)
		}
		if !e.AdmittedAt.IsZero() {
			// v1 only wrote pods after admitting them.
			araw, err := encodeAdmission(Admission{Accepted: true, At: e.AdmittedAt})
			if err != nil {
				return fmt.Errorf("migrate v1 pod %s: %w", key, err)
			}
			if err := b.Put(keyAdmission, araw); err != nil {
				return fmt.Errorf("migrate v1 pod %s: %w", key, err)
			}
		}
		if _, err := b.CreateBucketIfNotExists(bucketContainers); err != nil {
			return fmt.Errorf("migrate v1 pod %s: %w", key, err)
		}
	}

	// ConfigMaps, Secrets, Node: same keys, values re-encoded and framed
	// with a checksum.
	reframe := func(bucket []byte, decode func([]byte) (any, error)) error {
		b := tx.Bucket(bucket)
		var all []kv
		if err := b.ForEach(func(k, v []byte) error {
			all = append(all, kv{clone(k), clone(v)})
			return nil
		}); err != nil {
			return fmt.Errorf("read v1 %s: %w", bucket, err)
		}
		for _, e := range all {
			key := string(bucket) + "/" + string(e.k)
			if e.v == nil { // a nested bucket: v1 had none; leave it alone
				q.note(key, fmt.Errorf("migrate v1 record: %w: unexpected nested bucket", errUndecodable))
				continue
			}
			obj, err := decode(e.v)
			if err != nil {
				if err := b.Delete(e.k); err != nil {
					return fmt.Errorf("migrate %s: %w", key, err)
				}
				if err := q.putAndNote(tx, key, key, e.v, fmt.Errorf("migrate v1 record: %w: %v", errUndecodable, err)); err != nil {
					return err
				}
				continue
			}
			framed, err := encodeValue(obj)
			if err != nil {
				return fmt.Errorf("migrate %s: %w", key, err)
			}
			if err := b.Put(e.k, framed); err != nil {
				return fmt.Errorf("migrate %s: %w", key, err)
			}
		}
		return nil
	}
	if err := reframe(bucketConfigMaps, decodeJSON[v1.ConfigMap]); err != nil {
		return err
	}
	if err := reframe(bucketSecrets, decodeJSON[v1.Secret]); err != nil {
		return err
	}
	if err := reframe(bucketNode, decodeJSON[v1.Node]); err != nil {
		return err
	}
	return initSchema(tx)
}

// migrateV2toV3 encrypts the Secrets v2 kept in the clear with the state
// key, or drops them when there is no key: v3 never keeps a Secret readable
// on disk, and the apiserver gives it again. A v2 Secret that does not
// decode is dropped too (quarantining it would keep it in the clear).
// Tokens are new in v3; nothing else changes.
func migrateV2toV3(tx *bolt.Tx, q *quarantiner, key *Key) error {
	b := tx.Bucket(bucketSecrets)
	type kv struct{ k, v []byte }
	var all []kv
	if err := b.ForEach(func(k, v []byte) error {
		all = append(all, kv{clone(k), clone(v)})
		return nil
	}); err != nil {
		return fmt.Errorf("read v2 secrets: %w", err)
	}
	clear := objectClass{kind: "secret", bucket: bucketSecrets}
	for _, e := range all {
		place := classSecret.place(string(e.k))
		if e.v == nil {
			q.note(place, fmt.Errorf("migrate v2 secret: %w: unexpected nested bucket (dropped)", errUndecodable))
			if err := b.DeleteBucket(e.k); err != nil {
				return fmt.Errorf("migrate %s: %w", place, err)
			}
			continue
		}
		sec, err := decodeObject[v1.Secret](sealing{}, clear, string(e.k), e.v)
		if err != nil || key == nil {
			if err != nil {
				q.note(place, fmt.Errorf("migrate v2 secret: %w (dropped)", err))
			}
			if err := b.Delete(e.k); err != nil {
				return fmt.Errorf("migrate %s: %w", place, err)
			}
			continue
		}
		sealed, err := encodeObject(sealing{key: key}, classSecret, string(e.k), sec)
		if err != nil {
			return fmt.Errorf("migrate %s: %w", place, err)
		}
		if err := b.Put(e.k, sealed); err != nil {
			return fmt.Errorf("migrate %s: %w", place, err)
		}
	}
	return initSchema(tx)
}

func decodeJSON[T any](raw []byte) (any, error) {
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, err
	}
	return v, nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}
