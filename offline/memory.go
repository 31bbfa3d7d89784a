package offline

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// MemStore is a Store in memory, for unit tests of agent logic. It keeps
// values encoded exactly as BoltStore does, so it skips the same unchanged
// writes, detects the same corrupt records and hands out copies; it passes
// the same contract suite. Nothing survives the process.
type MemStore struct {
	now func() time.Time

	// mu protects every field below.
	seal       sealing
	mu         sync.Mutex
	closed     bool
	failWrites error
	pods       map[types.UID]*memPod
	configMaps map[string][]byte
	secrets    map[string][]byte
	// policyModules: digest -> framed module, as BoltStore keeps them.
	policyModules map[string][]byte
	outbox        outboxState
	quarantine    []QuarantinedRecord
	stats         Stats
}

type memPod struct {
	pod        []byte
	admission  []byte
	allocation []byte
	tokens     map[string][]byte
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty in-memory store. now stamps quarantined
// records; nil means time.Now.
func NewMemStore(now func() time.Time) *MemStore {
	if now == nil {
		now = time.Now
	}
	return &MemStore{
		now:        now,
		pods:       map[types.UID]*memPod{},
		configMaps: map[string][]byte{},
		secrets:    map[string][]byte{},

		policyModules: map[string][]byte{},
		outbox:        newOutboxState(),
	}
}

// SetKey sets the state key, as Options.Key does for Open. Calling it again
// stands for a reboot with another key file: records sealed before become
// ErrKeyMismatch, and records kept in the clear are sealed, as Open seals them
// (BoltStore.applySealing). nil means no key.
func (m *MemStore) SetKey(k *Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seal.key = k
	m.applySealingLocked()
}

// applySealingLocked is BoltStore.applySealing for pod records (a MemStore does not seal
// ConfigMaps); called with mu held.
func (m *MemStore) applySealingLocked() {
	k := m.seal.key
	if k == nil {
		return
	}
	reseal := func(bucket []byte, slot *[]byte, place string) {
		if v, ok, _ := sealedCopy(k, place, *slot); ok {
			m.setBytes(bucket, slot, v)
		}
	}
	if m.seal.sealedBy == "" {
		for uid, p := range m.pods {
			reseal(bucketPods, &p.pod, podPlace(uid))
		}
	}
	m.seal.sealedBy = k.ID()
}

// FailWrites makes every later write return err (wrapped), to test how the
// agent copes with a full or failing disk; nil restores normal writes.
func (m *MemStore) FailWrites(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failWrites = err
}

// lock takes mu and checks the store is open; write also checks FailWrites.
func (m *MemStore) lock(write bool) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	if write && m.failWrites != nil {
		err := m.failWrites
		m.mu.Unlock()
		return err
	}
	return nil
}

// wrote counts a mutation of the top-level bucket the BoltStore keeps it in; called with mu
// held.
func (m *MemStore) wrote(bucket []byte, changed bool) {
	if changed {
		m.stats.Writes++
		m.stats.Commits++
		if m.stats.WritesByBucket == nil {
			m.stats.WritesByBucket = map[string]uint64{}
		}
		m.stats.WritesByBucket[string(bucket)]++
	} else {
		m.stats.SkippedWrites++
	}
}

// quarantineLocked stores raw in the quarantine; called with mu held.
func (m *MemStore) quarantineLocked(key string, raw []byte, reason error) {
	m.quarantine = append(m.quarantine, QuarantinedRecord{
		Seq: uint64(len(m.quarantine)) + 1, Key: key, Reason: reason.Error(),
		At: m.now().UTC(), Value: clone(raw),
	})
	m.stats.Quarantined++
}

// setBytes stores raw in *slot unless identical; called with mu held.
func (m *MemStore) setBytes(bucket []byte, slot *[]byte, raw []byte) {
	same := *slot != nil && bytes.Equal(*slot, raw)
	if !same {
		*slot = raw
	}
	m.wrote(bucket, !same)
}

// Stats implements Store.
func (m *MemStore) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	st.WritesByBucket = maps.Clone(m.stats.WritesByBucket)
	return st
}

// Close implements Store.
func (m *MemStore) Close() error {
	if err := m.lock(false); err != nil {
		return err
	}
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// PutPod implements Store.
func (m *MemStore) PutPod(source Source, pod *v1.Pod) error {
	raw, err := encodePod(m.seal, source, pod)
	if err != nil {
		return fmt.Errorf("put pod: %w", err)
	}
	if err := m.lock(true); err != nil {
		return fmt.Errorf("put pod %s: %w", pod.UID, err)
	}
	defer m.mu.Unlock()
	p := m.pods[pod.UID]
	if p == nil {
		p = &memPod{tokens: map[string][]byte{}}
		m.pods[pod.UID] = p
	}
	m.setBytes(bucketPods, &p.pod, raw)
	m.outbox.recordPut(pod.UID)
	return nil
}

// SetAdmission implements Store.
func (m *MemStore) SetAdmission(uid types.UID, a Admission) error {
	op := fmt.Sprintf("set admission of pod %s", uid)
	raw, err := encodeAdmission(a)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := m.lock(true); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	p := m.pods[uid]
	if p == nil {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	if p.admission != nil {
		if bytes.Equal(p.admission, raw) {
			m.wrote(bucketPods, false)
			return nil
		}
		prev, derr := decodeAdmission(p.admission)
		if derr == nil {
			return fmt.Errorf("%s: %w: accepted=%t at %s", op, ErrAdmissionDecided, prev.Accepted, prev.At.Format(time.RFC3339))
		}
		m.quarantineLocked("pods/"+string(uid)+"/admission", p.admission, derr)
	}
	p.admission = raw
	m.wrote(bucketPods, true)
	return nil
}

// readPodLocked decodes one pod, quarantining bad parts as BoltStore does.
func (m *MemStore) readPodLocked(uid types.UID, errs map[string]error) (PodRecord, bool) {
	p := m.pods[uid]
	key := "pods/" + string(uid)
	podErr := func(err error) (PodRecord, bool) {
		errs[string(uid)] = err
		m.quarantineLocked(key+"/pod", p.pod, err)
		if p.admission != nil {
			m.quarantineLocked(key+"/admission", p.admission, err)
		}
		if p.allocation != nil {
			m.quarantineLocked(allocationPlace(uid), p.allocation, err)
		}
		for _, name := range slices.Sorted(maps.Keys(p.tokens)) {
			m.quarantineLocked(key+"/tokens/"+name, p.tokens[name], err)
		}
		delete(m.pods, uid)
		m.stats.Writes++
		m.stats.Commits++
		return PodRecord{}, false
	}
	e, err := decodePod(m.seal, uid, p.pod)
	if errors.Is(err, ErrKeyMismatch) {
		errs[string(uid)] = fmt.Errorf("pod object: %w", err) // left in place
		return PodRecord{}, false
	}
	if err != nil {
		return podErr(fmt.Errorf("pod object: %w", err))
	}
	rec := PodRecord{UID: uid, Source: e.Source, Pod: e.Pod}
	if st, ok := m.outbox.latestStatus(uid); ok {
		rec.Pod.Status = st // as BoltStore: the record holds no status, the outbox the latest
	}
	if p.admission != nil {
		if rec.Admission, err = decodeAdmission(p.admission); err != nil {
			return podErr(fmt.Errorf("admission: %w", err))
		}
	}
	return rec, true
}

// GetPod implements Store.
func (m *MemStore) GetPod(uid types.UID) (PodRecord, error) {
	op := fmt.Sprintf("get pod %s", uid)
	if err := m.lock(false); err != nil {
		return PodRecord{}, fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	if m.pods[uid] == nil {
		return PodRecord{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	errs := map[string]error{}
	rec, _ := m.readPodLocked(uid, errs)
	if err := recordErr(errs); err != nil {
		return PodRecord{}, fmt.Errorf("%s: %w", op, err)
	}
	return rec, nil
}

// LoadPods implements Store.
func (m *MemStore) LoadPods() ([]PodRecord, map[string]error, error) {
	if err := m.lock(false); err != nil {
		return nil, nil, fmt.Errorf("load pods: %w", err)
	}
	defer m.mu.Unlock()
	errs := map[string]error{}
	var recs []PodRecord
	for _, uid := range slices.Sorted(maps.Keys(m.pods)) {
		if rec, ok := m.readPodLocked(uid, errs); ok {
			recs = append(recs, rec)
		}
	}
	if len(errs) == 0 {
		errs = nil
	}
	return recs, errs, nil
}

// DeletePodSealedWithAnotherKey implements Store.
func (m *MemStore) DeletePodSealedWithAnotherKey(uid types.UID) (bool, error) {
	if err := m.lock(true); err != nil {
		return false, fmt.Errorf("delete pod %s sealed with another key: %w", uid, err)
	}
	defer m.mu.Unlock()
	p := m.pods[uid]
	if p == nil || p.pod == nil {
		return false, nil
	}
	if _, err := decodePod(m.seal, uid, p.pod); !errors.Is(err, ErrKeyMismatch) {
		return false, nil
	}
	delete(m.pods, uid)
	m.outbox.recordDeleted(uid)
	m.wrote(bucketPods, true)
	return true, nil
}

// DeletePod implements Store.
func (m *MemStore) DeletePod(uid types.UID) error {
	if err := m.lock(true); err != nil {
		return fmt.Errorf("delete pod %s: %w", uid, err)
	}
	defer m.mu.Unlock()
	_, present := m.pods[uid]
	delete(m.pods, uid)
	m.outbox.recordDeleted(uid)
	m.wrote(bucketPods, present)
	return nil
}

// getSlotLocked decodes *slot, quarantining it under key if it is bad.
func (m *MemStore) getSlotLocked(op, key string, slot *[]byte, decode func([]byte) error) (bool, error) {
	if *slot == nil {
		return false, nil
	}
	if err := decode(*slot); err != nil {
		if errors.Is(err, ErrKeyMismatch) {
			return false, fmt.Errorf("%s: %w", op, err)
		}
		m.quarantineLocked(key, *slot, err)
		*slot = nil
		m.stats.Writes++
		m.stats.Commits++
		return false, fmt.Errorf("%s: %w: %s: %v", op, ErrCorruptRecord, key, err)
	}
	return true, nil
}

func memPutObject[T any, P namedObject[T]](m *MemStore, c objectClass, table map[string][]byte, obj P) error {
	if obj == nil {
		return fmt.Errorf("put %s: %w: nil object", c.kind, ErrInvalid)
	}
	key, err := objectKey(obj.GetNamespace(), obj.GetName())
	if err != nil {
		return fmt.Errorf("put %s: %w", c.kind, err)
	}
	if err := m.lock(true); err != nil {
		return fmt.Errorf("put %s %s: %w", c.kind, key, err)
	}
	defer m.mu.Unlock()
	raw, err := encodeObject(m.seal, c, key, obj)
	if err != nil {
		return fmt.Errorf("put %s %s: %w", c.kind, key, err)
	}
	slot := table[key]
	m.setBytes(c.bucket, &slot, raw)
	table[key] = slot
	return nil
}

func memGetObject[T any, P namedObject[T]](m *MemStore, c objectClass, table map[string][]byte, namespace, name string) (P, error) {
	key, err := objectKey(namespace, name)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", c.kind, err)
	}
	op := fmt.Sprintf("get %s %s", c.kind, key)
	if err := m.lock(false); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	slot := table[key]
	var obj P
	found, err := m.getSlotLocked(op, c.place(key), &slot, func(raw []byte) (err error) {
		obj, err = decodeObject[T, P](m.seal, c, key, raw)
		return err
	})
	if slot == nil {
		delete(table, key)
	}
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return obj, nil
}

func (m *MemStore) deleteObject(c objectClass, table map[string][]byte, namespace, name string) error {
	key, err := objectKey(namespace, name)
	if err != nil {
		return fmt.Errorf("delete %s: %w", c.kind, err)
	}
	if err := m.lock(true); err != nil {
		return fmt.Errorf("delete %s %s: %w", c.kind, key, err)
	}
	defer m.mu.Unlock()
	_, present := table[key]
	delete(table, key)
	m.wrote(c.bucket, present)
	return nil
}

// PutPolicyModule implements Store.
func (m *MemStore) PutPolicyModule(digest string, module []byte) error {
	if _, err := policyModuleKey(digest); err != nil {
		return fmt.Errorf("put policy module: %w", err)
	}
	if err := m.lock(true); err != nil {
		return fmt.Errorf("put policy module %s: %w", digest, err)
	}
	defer m.mu.Unlock()
	slot := m.policyModules[digest]
	m.setBytes(bucketPolicyModules, &slot, encodeBlob(module))
	m.policyModules[digest] = slot
	return nil
}

// GetPolicyModule implements Store.
func (m *MemStore) GetPolicyModule(digest string) ([]byte, error) {
	op := "get policy module " + digest
	if _, err := policyModuleKey(digest); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := m.lock(false); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	slot := m.policyModules[digest]
	var module []byte
	found, err := m.getSlotLocked(op, string(bucketPolicyModules)+"/"+digest, &slot, func(raw []byte) (err error) {
		module, err = decodeBlob(raw)
		return err
	})
	if slot == nil {
		delete(m.policyModules, digest) // quarantined
	}
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return module, nil
}

// PolicyModules implements Store.
func (m *MemStore) PolicyModules() ([]string, error) {
	if err := m.lock(false); err != nil {
		return nil, fmt.Errorf("list policy modules: %w", err)
	}
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.policyModules)), nil
}

// DeletePolicyModule implements Store.
func (m *MemStore) DeletePolicyModule(digest string) error {
	if _, err := policyModuleKey(digest); err != nil {
		return fmt.Errorf("delete policy module: %w", err)
	}
	if err := m.lock(true); err != nil {
		return fmt.Errorf("delete policy module %s: %w", digest, err)
	}
	defer m.mu.Unlock()
	_, present := m.policyModules[digest]
	delete(m.policyModules, digest)
	m.wrote(bucketPolicyModules, present)
	return nil
}

// PutConfigMap implements Store.
func (m *MemStore) PutConfigMap(cm *v1.ConfigMap) error {
	return memPutObject(m, classConfigMap, m.configMaps, cm)
}

// GetConfigMap implements Store.
func (m *MemStore) GetConfigMap(namespace, name string) (*v1.ConfigMap, error) {
	return memGetObject[v1.ConfigMap](m, classConfigMap, m.configMaps, namespace, name)
}

// DeleteConfigMap implements Store.
func (m *MemStore) DeleteConfigMap(namespace, name string) error {
	return m.deleteObject(classConfigMap, m.configMaps, namespace, name)
}

// PutSecret implements Store.
func (m *MemStore) PutSecret(s *v1.Secret) error {
	return memPutObject(m, classSecret, m.secrets, s)
}

// GetSecret implements Store.
func (m *MemStore) GetSecret(namespace, name string) (*v1.Secret, error) {
	return memGetObject[v1.Secret](m, classSecret, m.secrets, namespace, name)
}

// DeleteSecret implements Store.
func (m *MemStore) DeleteSecret(namespace, name string) error {
	return m.deleteObject(classSecret, m.secrets, namespace, name)
}

// SetAllocation implements Store.
func (m *MemStore) SetAllocation(uid types.UID, a Allocation) error {
	op := fmt.Sprintf("set allocation of pod %s", uid)
	raw, err := encodeAllocation(a)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := m.lock(true); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	p := m.pods[uid]
	if p == nil {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	m.setBytes(bucketPods, &p.allocation, raw)
	return nil
}

// GetAllocation implements Store.
func (m *MemStore) GetAllocation(uid types.UID) (Allocation, error) {
	op := fmt.Sprintf("get allocation of pod %s", uid)
	if err := m.lock(false); err != nil {
		return Allocation{}, fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	p := m.pods[uid]
	if p == nil || p.allocation == nil {
		return Allocation{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	var a Allocation
	found, err := m.getSlotLocked(op, allocationPlace(uid), &p.allocation, func(raw []byte) (err error) {
		a, err = decodeAllocation(raw)
		return err
	})
	if err != nil {
		return Allocation{}, err
	}
	if !found {
		return Allocation{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return a, nil
}

// PutToken implements Store.
func (m *MemStore) PutToken(uid types.UID, name string, t Token) error {
	op := fmt.Sprintf("put token %q of pod %s", name, uid)
	if err := m.lock(true); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	raw, err := encodeToken(m.seal.key, uid, name, t)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	p := m.pods[uid]
	if p == nil {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	slot := p.tokens[name]
	m.setBytes(bucketPods, &slot, raw)
	p.tokens[name] = slot
	return nil
}

// GetToken implements Store.
func (m *MemStore) GetToken(uid types.UID, name string) (Token, error) {
	op := fmt.Sprintf("get token %q of pod %s", name, uid)
	if err := m.lock(false); err != nil {
		return Token{}, fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	p := m.pods[uid]
	if p == nil || p.tokens[name] == nil {
		return Token{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	slot := p.tokens[name]
	var t Token
	found, err := m.getSlotLocked(op, tokenPlace(uid, name), &slot, func(raw []byte) (err error) {
		t, err = decodeToken(m.seal.key, uid, name, raw)
		return err
	})
	if slot == nil {
		delete(p.tokens, name)
	}
	if err != nil {
		return Token{}, err
	}
	if !found {
		return Token{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return t, nil
}

// AppendStatus implements Store.
func (m *MemStore) AppendStatus(u StatusUpdate) (uint64, error) {
	op := fmt.Sprintf("append status of pod %s", u.UID)
	raw, err := encodeStatus(u)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	e, err := decodeStatus(raw) // as BoltStore's journal gives it back: UTC, whole seconds
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if err := m.lock(true); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	defer m.mu.Unlock()
	seq := m.outbox.lastSeq + 1
	m.outbox.appendStatus(seq, e)
	m.stats.OutboxSuperseded = m.outbox.superseded
	m.wrote(bucketOutbox, true)
	return seq, nil
}

// PendingStatuses implements Store.
func (m *MemStore) PendingStatuses() ([]PendingStatus, map[string]error, error) {
	if err := m.lock(false); err != nil {
		return nil, nil, fmt.Errorf("read outbox: %w", err)
	}
	defer m.mu.Unlock()
	return m.outbox.pendingStatuses(), nil, nil
}

// AckStatuses implements Store.
func (m *MemStore) AckStatuses(uid types.UID, upTo uint64) error {
	if err := m.lock(true); err != nil {
		return fmt.Errorf("ack statuses of pod %s up to %d: %w", uid, upTo, err)
	}
	defer m.mu.Unlock()
	changed, _ := m.outbox.ack(uid, upTo)
	m.wrote(bucketOutbox, changed)
	return nil
}

// OutboxLen implements Store.
func (m *MemStore) OutboxLen() (int, error) {
	if err := m.lock(false); err != nil {
		return 0, fmt.Errorf("count outbox entries: %w", err)
	}
	defer m.mu.Unlock()
	return m.outbox.pendingLen(), nil
}

// Quarantined implements Store.
func (m *MemStore) Quarantined() ([]QuarantinedRecord, error) {
	if err := m.lock(false); err != nil {
		return nil, fmt.Errorf("list quarantine: %w", err)
	}
	defer m.mu.Unlock()
	out := make([]QuarantinedRecord, len(m.quarantine))
	for i, q := range m.quarantine {
		q.Value = clone(q.Value)
		out[i] = q
	}
	return out, nil
}
