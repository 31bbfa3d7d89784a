package offline

import (
	"errors"
	"io"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Store is everything the agent keeps across restarts. Both implementations
// (BoltStore on disk, MemStore in memory) pass the same contract suite, so
// agent logic tested against MemStore sees the same semantics the gateway
// runs with.
//
// Common guarantees, unless a method says otherwise:
//   - Safe for concurrent use.
//   - A write that returned nil is durable (BoltStore: committed and fsynced)
//     and visible to every read that starts after it returned.
//   - A put whose encoded value is byte-identical to the stored one writes
//     nothing and is counted in Stats.SkippedWrites.
//   - Values handed in are encoded before the call returns: the caller may
//     reuse or mutate them afterwards. Values handed out are fresh copies.
//   - A read that meets an undecodable record moves it to the quarantine and
//     reports it (ErrCorruptRecord for single reads, the per-key error map of
//     LoadPods and PendingStatuses); it never fails a whole load because of
//     one record.
//   - After Close every method returns ErrClosed.
type Store interface {
	// PutPod records a pod the agent has received, keyed by pod.UID, with
	// its source. It creates the record or replaces the stored object; it
	// never touches the pod's admission or tokens. The object is
	// stored as given: callers store the pod as applied (status and
	// managedFields only cost flash writes).
	PutPod(source Source, pod *v1.Pod) error

	// SetAdmission records the outcome of admission for a recorded pod.
	// Admission runs once per pod: once decided it is immutable. Setting the
	// same decision again is a no-op; a different one returns
	// ErrAdmissionDecided. a.At must be set. ErrNotFound if the pod is not
	// recorded.
	SetAdmission(uid types.UID, a Admission) error

	// GetPod returns one pod record with its admission. ErrNotFound if
	// absent. If its object or admission is undecodable, the whole pod (its
	// tokens included) is quarantined and an error wrapping ErrCorruptRecord
	// is returned; a second call returns ErrNotFound.
	GetPod(uid types.UID) (PodRecord, error)

	// LoadPods returns every decodable pod record, sorted by UID, and a map
	// from pod UID to error for every pod that could not be decoded. Those
	// pods are moved to the quarantine. The error return is for failures of
	// the store itself, in which case the other two are nil.
	LoadPods() ([]PodRecord, map[string]error, error)

	// DeletePod removes the pod record with its admission and tokens.
	// Pending status updates of the pod stay in the outbox until acked.
	// Deleting an absent pod is a no-op.
	DeletePod(uid types.UID) error

	// DeletePodSealedWithAnotherKey removes the pod record only if it is
	// still one that does not open with the store's key (ErrKeyMismatch),
	// checked in the same transaction: a record written again meanwhile, by
	// the pod's worker or its source, stays. deleted reports whether it went.
	DeletePodSealedWithAnotherKey(uid types.UID) (deleted bool, err error)

	// PutConfigMap records a ConfigMap a pod mounts, keyed namespace/name;
	// its resourceVersion is in its ObjectMeta.
	PutConfigMap(cm *v1.ConfigMap) error
	// GetConfigMap returns a recorded ConfigMap or ErrNotFound.
	GetConfigMap(namespace, name string) (*v1.ConfigMap, error)
	// DeleteConfigMap removes a recorded ConfigMap; absent is a no-op.
	DeleteConfigMap(namespace, name string) error

	// PutSecret records a Secret a pod mounts, keyed namespace/name,
	// encrypted with the store's state key (AES-GCM). Without a key it
	// returns ErrNoKey: Secrets never reach the disk in the clear.
	PutSecret(s *v1.Secret) error
	// GetSecret returns a recorded Secret or ErrNotFound. A Secret sealed
	// with another key than the store's (the key file changed, or none is
	// loaded) is ErrKeyMismatch: treat it as missing; it stays in place.
	GetSecret(namespace, name string) (*v1.Secret, error)
	// DeleteSecret removes a recorded Secret; absent is a no-op.
	DeleteSecret(namespace, name string) error

	// SetAllocation records the resources allocated to a recorded pod's
	// containers (in-place resize: what the node granted, which its
	// containers run with, whatever its spec says now). It replaces the
	// previous allocation. ErrNotFound if the pod is not recorded.
	SetAllocation(uid types.UID, a Allocation) error
	// GetAllocation returns the pod's recorded allocation, ErrNotFound if it
	// has none, or an error wrapping ErrCorruptRecord (the record is then
	// quarantined).
	GetAllocation(uid types.UID) (Allocation, error)

	// PutToken records the last service account token fetched for a
	// recorded pod, under a name the caller chooses per projection,
	// encrypted as Secrets are (ErrNoKey without a key). ErrNotFound if the
	// pod is not recorded. The token goes with the pod's record.
	PutToken(uid types.UID, name string, t Token) error
	// GetToken returns a recorded token, ErrNotFound, or ErrKeyMismatch as
	// GetSecret does.
	GetToken(uid types.UID, name string) (Token, error)

	// AppendStatus appends a pod status update to the outbox and returns
	// its sequence number. Sequence numbers increase strictly, across
	// restarts, and are never reused. u.Timestamp is kept as given.
	//
	// The outbox keeps at most two entries per pod, so that it stays
	// bounded through weeks offline however often a pod's status changes:
	// the pod's oldest pending entry (how late its status is) and the new
	// one. The entries between are dropped, superseded: only the latest
	// status is ever sent. Stats().OutboxSuperseded counts them.
	AppendStatus(u StatusUpdate) (seq uint64, err error)

	// PendingStatuses returns the outbox coalesced per pod: one entry per
	// pod with the latest status, in the order of each pod's first pending
	// entry. Undecodable entries are quarantined and reported by sequence
	// number (decimal) in the map.
	PendingStatuses() ([]PendingStatus, map[string]error, error)

	// AckStatuses removes the pod's outbox entries with a sequence number
	// <= upTo (typically PendingStatus.LastSeq after a successful update).
	// Entries appended later stay. Acking nothing is a no-op.
	AckStatuses(uid types.UID, upTo uint64) error

	// OutboxLen returns how many entries the outbox holds, not coalesced
	// (at most two per pod): what it costs in the file while the apiserver
	// is out of reach.
	OutboxLen() (int, error)

	// PutPolicyModule records the bytes of a Wasm policy module delivered from a
	// registry, keyed by the digest its configuration pins ("sha256:" and 64
	// lowercase hex digits, ErrInvalid otherwise), so that a boot with no
	// network loads it as it loads a local one. The caller verified the bytes
	// against that digest before; the store keeps them as given.
	PutPolicyModule(digest string, module []byte) error
	// GetPolicyModule returns a recorded module or ErrNotFound. Bytes damaged
	// in the file are quarantined and reported as ErrCorruptRecord: the
	// caller pulls the module again.
	GetPolicyModule(digest string) ([]byte, error)
	// PolicyModules lists the digests of the recorded modules, sorted.
	PolicyModules() ([]string, error)
	// DeletePolicyModule removes a recorded module; absent is a no-op.
	DeletePolicyModule(digest string) error

	// Quarantined lists the records moved to the quarantine, oldest first.
	Quarantined() ([]QuarantinedRecord, error)

	// Stats returns counters since the store was opened.
	Stats() Stats

	// Close releases the store (and, for BoltStore, the file and its lock).
	// It waits for writes in progress. Closing twice returns ErrClosed.
	io.Closer
}

// Errors returned by Store methods, wrapped with context; test with errors.Is.
var (
	// ErrNotFound: the record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrCorruptRecord: a stored record could not be decoded; it has been
	// moved to the quarantine.
	ErrCorruptRecord = errors.New("corrupt record (quarantined)")
	// ErrAdmissionDecided: admission already decided differently for this pod.
	ErrAdmissionDecided = errors.New("admission already decided")
	// ErrLocked: another process holds the state database.
	ErrLocked = errors.New("state database is locked")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store closed")
	// ErrInvalid: the caller passed a value the store refuses to record.
	ErrInvalid = errors.New("invalid argument")
	// ErrCorruptDatabase: bbolt panicked or faulted on the file while the
	// store was running: damage the checks at Open did not see. Close the
	// store and Open it again, which moves the file aside and starts fresh.
	ErrCorruptDatabase = errors.New("state database is corrupt")
)

// Source says where a pod came from.
type Source string

const (
	// SourceAPI: the pod came from the apiserver.
	SourceAPI Source = "api"
	// SourceFile: a static pod from the manifest directory.
	SourceFile Source = "file"
)

func (s Source) valid() bool { return s == SourceAPI || s == SourceFile }

// PodRecord is what the store knows about one pod.
type PodRecord struct {
	UID    types.UID
	Source Source
	// Pod is the object as applied.
	Pod *v1.Pod
	// Admission is the zero value until SetAdmission was called.
	Admission Admission
}

// Admission is the outcome of the one admission a pod goes through. Its JSON
// shape is part of the on-disk schema (see doc.go).
type Admission struct {
	// Accepted is true if the pod was admitted.
	Accepted bool `json:"accepted"`
	// At is when the decision was made; zero means not decided yet.
	At time.Time `json:"at"`
	// Reason and Message explain a rejection (e.g. "OutOfcpu").
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Decided reports whether admission has run for the pod.
func (a Admission) Decided() bool { return !a.At.IsZero() }

// Allocation is the resources the node allocated to a pod's containers, by
// container name, and to the pod itself: its spec's at admission, then each
// resize it accepted. Its JSON shape is part of the on-disk schema (see doc.go).
type Allocation struct {
	Containers map[string]v1.ResourceRequirements `json:"containers"`
	// Pod is the pod-level resources allocated (spec.resources); nil: none. An
	// allocation written before pod-level resources were admitted has none, as
	// its pod had none.
	Pod *v1.ResourceRequirements `json:"pod,omitempty"`
}

// Token is a service account token kept so that a pod rebooted offline
// mounts it again. Its JSON shape is part of the on-disk schema (see doc.go),
// stored encrypted.
type Token struct {
	// Token is the bearer token (a JWT) the projection writes.
	Token string `json:"token"`
	// IssuedAt is when it was fetched; ExpiresAt when the apiserver stops
	// accepting it.
	IssuedAt  time.Time `json:"issuedAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// StatusUpdate is one pod status the agent wants the apiserver to see.
type StatusUpdate struct {
	UID       types.UID
	Namespace string
	Name      string
	Status    v1.PodStatus
	// Timestamp is when the status was observed. It is delivered as is, so
	// a status computed while offline keeps its original time.
	Timestamp time.Time
}

// PendingStatus is the outbox coalesced for one pod.
type PendingStatus struct {
	UID       types.UID
	Namespace string
	Name      string
	// Status and Timestamp are those of the latest pending entry.
	Status    v1.PodStatus
	Timestamp time.Time
	// FirstSeq and FirstTimestamp are those of the oldest pending entry:
	// the order of delivery and how late it is.
	FirstSeq       uint64
	FirstTimestamp time.Time
	// LastSeq is the sequence number to ack once Status was delivered.
	LastSeq uint64
	// Entries is how many pending entries were coalesced (1 or 2: see
	// AppendStatus).
	Entries int
}

// QuarantinedRecord is a record that could not be decoded and was moved out
// of the way, kept for inspection.
type QuarantinedRecord struct {
	// Seq orders quarantined records.
	Seq uint64
	// Key is where the record was: bucket path and key joined with "/",
	// e.g. "pods/<uid>/tokens/<name>".
	Key string
	// Reason is why it was moved.
	Reason string
	// At is when it was moved.
	At time.Time
	// Value is the raw bytes as they were stored.
	Value []byte
}

// Stats counts store activity since open. Tests use it to assert that
// unchanged writes are skipped and concurrent writes batched.
type Stats struct {
	// Writes counts logical writes that changed the store: puts of new or
	// different bytes, deletes, appends, acks.
	Writes uint64
	// WritesByBucket splits Writes by the top-level bucket of the record
	// written (pods, outbox, secrets, ...; see the schema in doc.go).
	WritesByBucket map[string]uint64
	// SkippedWrites counts puts and deletes skipped because they would not
	// change the stored bytes.
	SkippedWrites uint64
	// Commits counts write transactions committed (BoltStore: each one a
	// fsync; several writes may share one). MemStore counts one per write.
	Commits uint64
	// Quarantined counts records moved to the quarantine.
	Quarantined uint64
	// OutboxSuperseded counts pending status updates dropped from the
	// outbox because a newer status of the same pod replaced them before
	// they were delivered (see AppendStatus).
	OutboxSuperseded uint64
	// OutboxSyncs counts the syncs of the status journal, BoltStore's outbox (each status
	// appended costs at most one; concurrent appends share one); MemStore: 0.
	OutboxSyncs uint64
	// OutboxBytes counts the bytes written to the status journal; MemStore: 0.
	OutboxBytes uint64
	// BytesWritten counts the bytes committed transactions wrote to the database file
	// (BoltStore: whole pages, what flash wears by; MemStore: 0, it has no file).
	BytesWritten uint64
}
