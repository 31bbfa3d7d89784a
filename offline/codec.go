package offline

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Every record value (not the raw meta keys) is framed as
//
//	crc32c(payload) as 4 bytes big-endian || payload (JSON)
//
// so that a flipped bit on a worn SD card is detected as a corrupt record
// and quarantined instead of being acted on.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const frameHeader = 4

// errUndecodable marks decoding failures; the stores turn them into
// ErrCorruptRecord after quarantining.
var errUndecodable = errors.New("undecodable")

func encodeValue(v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return encodeBlob(payload), nil
}

// encodeBlob frames bytes that are not JSON (a Wasm module) with the same
// checksum as encodeValue.
func encodeBlob(b []byte) []byte {
	out := make([]byte, frameHeader+len(b))
	binary.BigEndian.PutUint32(out, crc32.Checksum(b, castagnoli))
	copy(out[frameHeader:], b)
	return out
}

// decodeBlob checks and strips encodeBlob's frame; the result is a copy.
func decodeBlob(raw []byte) ([]byte, error) {
	payload, err := unframe(raw)
	if err != nil {
		return nil, err
	}
	return clone(payload), nil
}

// unframe checks a value's checksum and returns its payload (not a copy).
func unframe(raw []byte) ([]byte, error) {
	if len(raw) < frameHeader {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the frame header", errUndecodable, len(raw))
	}
	payload := raw[frameHeader:]
	if want, got := binary.BigEndian.Uint32(raw), crc32.Checksum(payload, castagnoli); want != got {
		return nil, fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", errUndecodable, want, got)
	}
	return payload, nil
}

// policyModuleKey checks a module digest: the key of policy_modules.
func policyModuleKey(digest string) ([]byte, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("%w: policy module digest %q is not sha256:<64 lowercase hex digits>", ErrInvalid, digest)
	}
	return []byte(digest), nil
}

func decodeValue(raw []byte, v any) error {
	payload, err := unframe(raw)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("%w: %v", errUndecodable, err)
	}
	return nil
}

// podEntry is the value under pods/<uid>/pod.
type podEntry struct {
	Source Source  `json:"source"`
	Pod    *v1.Pod `json:"pod"`
}

// outboxEntry is the value under outbox/<seq>.
type outboxEntry struct {
	UID       types.UID    `json:"uid"`
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Status    v1.PodStatus `json:"status"`
	Timestamp time.Time    `json:"timestamp"`
}

// quarantineEntry is the value under quarantine/<seq>.
type quarantineEntry struct {
	Key    string    `json:"key"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	Value  []byte    `json:"value"`
}

// podPlace names a pod record for sealing.
func podPlace(uid types.UID) string { return "pods/" + string(uid) + "/pod" }

// encodePod seals the pod record when there is a state key: a pod's spec holds its inline
// env values, and users put passwords there as often as in Secrets. A store whose records
// were once sealed keeps none in the clear, key or not (ErrNoKey).
func encodePod(s sealing, source Source, pod *v1.Pod) ([]byte, error) {
	if !source.valid() {
		return nil, fmt.Errorf("%w: source %q (want %q or %q)", ErrInvalid, source, SourceAPI, SourceFile)
	}
	if pod == nil || pod.UID == "" {
		return nil, fmt.Errorf("%w: pod without UID", ErrInvalid)
	}
	if s.key == nil && s.sealedBy != "" {
		return nil, fmt.Errorf("%w: the pod records of this database are sealed with key %s, which is not loaded; none is written in the clear", ErrNoKey, s.sealedBy)
	}
	// The record keeps the pod without its status: a status changes far more often than a
	// spec, and the outbox keeps the latest (LoadPods and GetPod give it back). Written with
	// it, every status change and the apiserver's echo of it cost a write of the whole pod.
	withoutStatus := *pod
	withoutStatus.Status = v1.PodStatus{}
	return s.key.sealOrFrame(podPlace(pod.UID), podEntry{Source: source, Pod: &withoutStatus})
}

// decodePod decodes a pod record: sealed (ErrKeyMismatch if by another key than the one
// loaded), or in the clear while the store has never had a key. Once it has, a record in the
// clear was not written by holdfast (see sealing): it is refused, never run.
func decodePod(s sealing, uid types.UID, raw []byte) (podEntry, error) {
	var e podEntry
	if err := s.key.openSealedOrPlain(podPlace(uid), raw, &e, s.sealedBy == ""); err != nil {
		return podEntry{}, err
	}
	switch {
	case e.Pod == nil:
		return podEntry{}, fmt.Errorf("%w: no pod object", errUndecodable)
	case e.Pod.UID == "":
		return podEntry{}, fmt.Errorf("%w: pod without UID", errUndecodable)
	case e.Pod.UID != uid:
		return podEntry{}, fmt.Errorf("%w: pod UID %q stored under key %q", errUndecodable, e.Pod.UID, uid)
	case !e.Source.valid():
		return podEntry{}, fmt.Errorf("%w: unknown source %q", errUndecodable, e.Source)
	}
	return e, nil
}

func encodeAdmission(a Admission) ([]byte, error) {
	if !a.Decided() {
		return nil, fmt.Errorf("%w: admission without a decision time", ErrInvalid)
	}
	a.At = a.At.UTC()
	return encodeValue(a)
}

func decodeAdmission(raw []byte) (Admission, error) {
	var a Admission
	if err := decodeValue(raw, &a); err != nil {
		return Admission{}, err
	}
	if !a.Decided() {
		return Admission{}, fmt.Errorf("%w: admission without a decision time", errUndecodable)
	}
	if err := checkTimes(a.At); err != nil {
		return Admission{}, err
	}
	return a, nil
}

func encodeStatus(u StatusUpdate) ([]byte, error) {
	if u.UID == "" {
		return nil, fmt.Errorf("%w: status update without pod UID", ErrInvalid)
	}
	return encodeValue(outboxEntry{
		UID: u.UID, Namespace: u.Namespace, Name: u.Name,
		Status: u.Status, Timestamp: u.Timestamp.UTC(),
	})
}

func decodeStatus(raw []byte) (outboxEntry, error) {
	var e outboxEntry
	if err := decodeValue(raw, &e); err != nil {
		return outboxEntry{}, err
	}
	if e.UID == "" {
		return outboxEntry{}, fmt.Errorf("%w: status update without pod UID", errUndecodable)
	}
	if err := checkTimes(e.Timestamp); err != nil {
		return outboxEntry{}, err
	}
	return e, nil
}

// checkTimes refuses times the encoders could not write back: they store UTC, and JSON
// (RFC 3339) has only years 0000-9999, so "0000-01-01T00:00:00+01:00" decodes but, in UTC,
// does not encode. No encoder writes such a time; a record holding one is corrupt, and
// accepting it would make the record's next write fail instead of quarantining it now.
func checkTimes(ts ...time.Time) error {
	for _, t := range ts {
		if y := t.UTC().Year(); y < 0 || y > 9999 {
			return fmt.Errorf("%w: time %s outside the years 0000-9999 in UTC", errUndecodable, t)
		}
	}
	return nil
}

// objectKey is the key of ConfigMaps and Secrets: "namespace/name".
func objectKey(namespace, name string) (string, error) {
	if name == "" || strings.Contains(namespace, "/") || strings.Contains(name, "/") {
		return "", fmt.Errorf("%w: object key %q/%q", ErrInvalid, namespace, name)
	}
	return namespace + "/" + name, nil
}

// namedObject is what ConfigMaps and Secrets have in common for the codec:
// a pointer to T with object metadata.
type namedObject[T any] interface {
	*T
	GetNamespace() string
	GetName() string
}

// objectClass is how one kind of object is stored: its bucket, and whether
// its values are always sealed with the state key (Secrets), or sealed only
// when the store is asked to (ConfigMaps, Options.SealConfigMaps) and read
// either way.
type objectClass struct {
	kind   string
	bucket []byte
	sealed bool
}

var (
	classConfigMap = objectClass{kind: "configmap", bucket: bucketConfigMaps}
	classSecret    = objectClass{kind: "secret", bucket: bucketSecrets, sealed: true}
)

// sealing says how a store seals the records that hold a secret only sometimes.
type sealing struct {
	key *Key
	// configMaps: ConfigMaps are sealed with key too (Options.SealConfigMaps).
	configMaps bool
	// sealedBy is the ID of the key the store's pod records are sealed with (meta/sealed_by),
	// "" while the store has never had a key. Pod records are written in the clear only while
	// it is "", so once it is set a pod record in the clear was planted by whoever could write
	// the disk: it is refused (a pod record decides what runs, as root maybe). And with no key
	// loaded then (the key file unreadable, the TPM gone), pod records are not written at all
	// rather than in the clear.
	sealedBy string
}

// objectKey is the key objects of class c are sealed with: nil for ConfigMaps not asked to be.
func (s sealing) objectKey(c objectClass) *Key {
	if c.sealed || s.configMaps {
		return s.key
	}
	return nil
}

// place names a record for sealing: its bucket path and key.
func (c objectClass) place(key string) string { return string(c.bucket) + "/" + key }

func encodeObject(s sealing, c objectClass, key string, obj any) ([]byte, error) {
	if c.sealed {
		return s.key.seal(c.place(key), obj)
	}
	return s.objectKey(c).sealOrFrame(c.place(key), obj)
}

func decodeObject[T any, P namedObject[T]](s sealing, c objectClass, key string, raw []byte) (P, error) {
	obj := P(new(T))
	var err error
	if c.sealed {
		err = s.key.open(c.place(key), raw, obj)
	} else {
		// A ConfigMap may have been sealed (asked to be then, or now) or not: either reads.
		err = s.key.openSealedOrPlain(c.place(key), raw, obj, true)
	}
	if err != nil {
		return nil, err
	}
	if got := obj.GetNamespace() + "/" + obj.GetName(); got != key {
		return nil, fmt.Errorf("%w: object %q stored under key %q", errUndecodable, got, key)
	}
	return obj, nil
}

// tokenPlace names a token record for sealing.
func tokenPlace(uid types.UID, name string) string {
	return "pods/" + string(uid) + "/tokens/" + name
}

func allocationPlace(uid types.UID) string {
	return "pods/" + string(uid) + "/allocation/" + keyAllocation
}

func encodeAllocation(a Allocation) ([]byte, error) {
	if a.Containers == nil {
		return nil, fmt.Errorf("%w: allocation without containers", ErrInvalid)
	}
	return encodeValue(a)
}

func decodeAllocation(raw []byte) (Allocation, error) {
	var a Allocation
	if err := decodeValue(raw, &a); err != nil {
		return Allocation{}, err
	}
	if a.Containers == nil {
		return Allocation{}, fmt.Errorf("%w: allocation without containers", errUndecodable)
	}
	return a, nil
}

func encodeToken(k *Key, uid types.UID, name string, t Token) ([]byte, error) {
	if name == "" || t.Token == "" {
		return nil, fmt.Errorf("%w: token without a name or a value", ErrInvalid)
	}
	return k.seal(tokenPlace(uid, name), t)
}

func decodeToken(k *Key, uid types.UID, name string, raw []byte) (Token, error) {
	var t Token
	if err := k.open(tokenPlace(uid, name), raw, &t); err != nil {
		return Token{}, err
	}
	if t.Token == "" {
		return Token{}, fmt.Errorf("%w: empty token", errUndecodable)
	}
	return t, nil
}

// seqKey encodes a sequence number so keys sort in numeric order.
func seqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

func parseSeqKey(k []byte) (uint64, bool) {
	if len(k) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k), true
}

func seqString(seq uint64) string { return strconv.FormatUint(seq, 10) }
