package offline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/internal/failpoint"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// statusJournal is BoltStore's outbox: an append-only file beside the database, one record per
// status change, each made durable by one fdatasync. It is a file of its own because a bbolt
// commit costs two syncs and a few pages (data, freelist, meta), and a pod whose readiness
// flips every few seconds would otherwise wear a gateway's flash by gigabytes a day (#28).
//
// A status is synced before AppendStatus returns, as before: a status computed offline survives
// an agent restart or a power cut and is delivered when the apiserver is back. Acks and the
// removals of delivered statuses are not synced: they are written with the next status, at a
// compaction or at Close. Lost in a crash, a delivered status is sent once more, a patch that
// changes nothing.
//
// Each record is a frame: a 4-byte big-endian length, then what encodeValue makes (a CRC-32C
// and the JSON of a journalRecord). A torn write at the end (a power cut during an append) is
// cut off at open; a damaged frame before the end stops the replay there, and what follows it
// is quarantined: the journal keeps only statuses, which the agent can compute again.
//
// When the file grows past four times what its live statuses take (and compactMin), it is
// rewritten with one snapshot record per pod (temporary file, fsync, rename, directory fsync).
type statusJournal struct {
	path string

	mu    sync.Mutex // protects the fields below
	f     *os.File   // nil once closed
	size  int64      // bytes of whole frames in f
	state outboxState
	// deferred holds the frames of acks and removals not written yet.
	deferred []byte
	// compactAt is the size past which the file is rewritten.
	compactAt int64
	// written counts writes to f: a sync covers those counted before it began.
	written uint64
	// damage is what the replay at open could not read, by "journal@<offset>", until the first
	// pendingStatuses reports it; damagedBytes is its raw content, for the quarantine.
	damage       map[string]error
	damagedBytes map[string][]byte

	syncMu sync.Mutex // serializes syncs; taken before mu when both are
	synced uint64     // written as of the last successful sync; under syncMu

	syncs, bytesWritten atomic.Uint64
}

// journalRecord is one record of the status journal.
type journalRecord struct {
	Kind journalKind `json:"kind"`
	// Seq is a status's sequence number, or (journalSeq) the highest handed out.
	Seq uint64    `json:"seq,omitempty"`
	UID types.UID `json:"uid,omitempty"`
	// Entry is the status of a journalStatus or journalSnapshot record.
	Entry *outboxEntry `json:"entry,omitempty"`
	// UpTo is what a journalAck acknowledges.
	UpTo uint64 `json:"upTo,omitempty"`
	// Pending, FirstSeq and FirstTimestamp restore a pod's outboxPod (journalSnapshot).
	Pending        int       `json:"pending,omitempty"`
	FirstSeq       uint64    `json:"firstSeq,omitempty"`
	FirstTimestamp time.Time `json:"firstTimestamp,omitzero"`
}

type journalKind string

const (
	journalStatus   journalKind = "status"   // a status appended
	journalAck      journalKind = "ack"      // a pod's statuses up to UpTo delivered
	journalForget   journalKind = "forget"   // a pod's entry dropped
	journalSnapshot journalKind = "snapshot" // a pod's entry as a compaction found it
	journalSeq      journalKind = "seq"      // the highest sequence number handed out
)

const (
	// journalName is the journal's file name suffix, beside the database file.
	journalSuffix = ".outbox"
	// compactMin is the journal size below which it is never compacted.
	compactMin = 64 << 10
	// deferredMax bounds the acks kept in memory: past it they are written without a sync.
	deferredMax = 64 << 10
	// maxFrame bounds a frame's length: a length past it is damage, not a record to allocate.
	maxFrame = 16 << 20
	// damagedKept bounds the damaged bytes quarantined.
	damagedKept = 64 << 10
)

// openStatusJournal opens (creating it if missing) the journal at path and replays it.
func openStatusJournal(path string) (*statusJournal, error) {
	data, err := fsutil.ReadFileNoAtime(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read status journal %s: %w", path, err)
	}
	j := &statusJournal{path: path}
	good := j.replay(data)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open status journal %s: %w", path, err)
	}
	if good < int64(len(data)) {
		// A torn last write or damage: cut it off, so appends follow whole frames.
		if err := f.Truncate(good); err != nil {
			f.Close()
			return nil, fmt.Errorf("cut the damaged end of status journal %s: %w", path, err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			f.Close()
			return nil, fmt.Errorf("sync status journal %s: %w", path, err)
		}
	}
	j.f, j.size = f, good
	j.compactAt = max(compactMin, 4*good)
	return j, nil
}

// replay applies the file's records to j.state and returns the length of its readable prefix.
// A record whose frame is whole but whose content is not usable is skipped and reported; a
// damaged frame ends the replay.
func (j *statusJournal) replay(data []byte) int64 {
	j.state = newOutboxState()
	off := 0
	for off < len(data) {
		// Whatever cannot be read ends the replay: most often the last frame, torn by a power
		// cut during an append (its status was never acknowledged to anyone), else damage.
		if len(data)-off < 4 {
			j.damaged(off, data[off:], fmt.Errorf("%w: %d bytes at the end of the journal, less than a frame's length (a write cut short)", errUndecodable, len(data)-off))
			break
		}
		n := int(binary.BigEndian.Uint32(data[off:]))
		if n > maxFrame || n > len(data)-off-4 {
			j.damaged(off, data[off:], fmt.Errorf("%w: frame of %d bytes at offset %d of a %d-byte journal (a write cut short, or damage)", errUndecodable, n, off, len(data)))
			break
		}
		end := off + 4 + n
		var rec journalRecord
		if err := decodeValue(data[off+4:end], &rec); err != nil {
			j.damaged(off, data[off:], err)
			break
		}
		if err := j.state.apply(rec); err != nil {
			// A whole frame whose content is not usable: skipped, the rest is read.
			j.damaged(off, data[off:end], err)
		}
		off = end
	}
	return int64(off)
}

func (j *statusJournal) damaged(off int, raw []byte, err error) {
	if j.damage == nil {
		j.damage, j.damagedBytes = map[string]error{}, map[string][]byte{}
	}
	key := fmt.Sprintf("journal@%d", off)
	j.damage[key] = err
	j.damagedBytes[key] = clone(raw[:min(len(raw), damagedKept)])
}

// apply replays one record.
func (o *outboxState) apply(rec journalRecord) error {
	switch rec.Kind {
	case journalStatus, journalSnapshot:
		e := rec.Entry
		if e == nil || e.UID == "" {
			return fmt.Errorf("%w: %s record without a status", errUndecodable, rec.Kind)
		}
		if err := checkTimes(e.Timestamp, rec.FirstTimestamp); err != nil {
			return err
		}
		if rec.Kind == journalSnapshot {
			if rec.Pending < 0 || rec.Pending > 2 {
				return fmt.Errorf("%w: snapshot with %d pending entries", errUndecodable, rec.Pending)
			}
			o.pods[e.UID] = &outboxPod{latest: *e, latestSeq: rec.Seq, pending: rec.Pending, firstSeq: rec.FirstSeq, firstTimestamp: rec.FirstTimestamp}
			o.lastSeq = max(o.lastSeq, rec.Seq)
			return nil
		}
		if rec.Seq <= o.lastSeq {
			return fmt.Errorf("%w: status sequence %d after %d", errUndecodable, rec.Seq, o.lastSeq)
		}
		o.appendStatus(rec.Seq, *e)
	case journalAck:
		o.ack(rec.UID, rec.UpTo)
	case journalForget:
		o.forget(rec.UID)
	case journalSeq:
		o.lastSeq = max(o.lastSeq, rec.Seq)
	default:
		return fmt.Errorf("%w: journal record of kind %q", errUndecodable, rec.Kind)
	}
	return nil
}

func journalFrame(rec journalRecord) ([]byte, error) {
	framed, err := encodeValue(rec)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 4, 4+len(framed))
	binary.BigEndian.PutUint32(out, uint32(len(framed)))
	return append(out, framed...), nil
}

// appendStatus writes a status and syncs it. Concurrent appends share a sync: one that finds
// its write covered by another's sync returns without one.
func (j *statusJournal) appendStatus(u StatusUpdate) (uint64, error) {
	e := outboxEntry{UID: u.UID, Namespace: u.Namespace, Name: u.Name, Status: u.Status, Timestamp: u.Timestamp.UTC()}
	j.mu.Lock()
	if j.f == nil {
		j.mu.Unlock()
		return 0, ErrClosed
	}
	seq := j.state.lastSeq + 1
	frame, err := journalFrame(journalRecord{Kind: journalStatus, Seq: seq, Entry: &e})
	if err != nil {
		j.mu.Unlock()
		return 0, err
	}
	if err := j.writeLocked(append(j.deferred, frame...)); err != nil {
		j.mu.Unlock()
		return 0, err
	}
	j.deferred = nil
	j.state.appendStatus(seq, e)
	gen := j.written
	j.mu.Unlock()
	if err := j.sync(gen); err != nil {
		return 0, err
	}
	// A compaction that fails leaves the synced status in the old file, which grows on.
	_ = j.compactIfDue()
	failpoint.Inject(failpoint.OutboxAfterAppend)
	return seq, nil
}

// writeLocked appends b at the end of the file; on a failure (a full disk) the file is cut back
// to its last whole frame.
func (j *statusJournal) writeLocked(b []byte) error {
	if _, err := j.f.WriteAt(b, j.size); err != nil {
		if terr := j.f.Truncate(j.size); terr != nil {
			err = errors.Join(err, terr)
		}
		return fmt.Errorf("write status journal: %w", err)
	}
	j.size += int64(len(b))
	j.written++
	j.bytesWritten.Add(uint64(len(b)))
	return nil
}

// sync makes every write up to gen durable, unless a sync since did.
func (j *statusJournal) sync(gen uint64) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced >= gen {
		return nil
	}
	j.mu.Lock()
	f, upTo := j.f, j.written
	j.mu.Unlock()
	if f == nil {
		return ErrClosed
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("sync status journal: %w", err)
	}
	j.syncs.Add(1)
	j.synced = upTo
	return nil
}

// deferLocked queues a record that needs no sync of its own.
func (j *statusJournal) deferLocked(rec journalRecord) {
	frame, err := journalFrame(rec)
	if err != nil {
		return // records of these kinds always encode
	}
	j.deferred = append(j.deferred, frame...)
	if len(j.deferred) > deferredMax && j.writeLocked(j.deferred) == nil {
		j.deferred = nil
	}
}

// ack marks the pod's statuses up to upTo delivered.
func (j *statusJournal) ack(uid types.UID, upTo uint64) (changed bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return false, ErrClosed
	}
	changed, _ = j.state.ack(uid, upTo)
	if changed {
		j.deferLocked(journalRecord{Kind: journalAck, UID: uid, UpTo: upTo})
	}
	return changed, nil
}

// recordDeleted drops the pod's delivered status; a pending one stays until delivered.
func (j *statusJournal) recordDeleted(uid types.UID) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil && j.state.recordDeleted(uid) {
		j.deferLocked(journalRecord{Kind: journalForget, UID: uid})
	}
}

// compactIfDue rewrites the journal as one snapshot per pod once it has grown past compactAt.
func (j *statusJournal) compactIfDue() error {
	j.mu.Lock()
	due := j.f != nil && j.size > j.compactAt
	j.mu.Unlock()
	if !due {
		return nil
	}
	return j.compact()
}

func (j *statusJournal) compact() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return ErrClosed
	}
	data, err := j.snapshotLocked()
	if err != nil {
		return err
	}
	f, err := placeJournal(j.path, data)
	if err != nil {
		j.compactAt = 2 * j.size // not again at the next append
		return fmt.Errorf("compact status journal: %w", err)
	}
	j.f.Close()
	j.f, j.size, j.deferred = f, int64(len(data)), nil
	j.written++
	j.synced = j.written
	j.syncs.Add(2) // the file's and the directory's
	j.bytesWritten.Add(uint64(len(data)))
	j.compactAt = max(compactMin, 4*j.size)
	return nil
}

// placeJournal writes data to a synced temporary file, renames it to path, syncs the
// directory and returns the file, open for the appends that follow: a power cut leaves the
// old journal or the new one.
func placeJournal(path string, data []byte) (*os.File, error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".outbox-*")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*os.File, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fail(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fail(err)
	}
	if err := fsutil.SyncDir(dir); err != nil {
		// Renamed, but the rename may not survive a power cut: the old journal would come
		// back, which holds everything the new one does.
		return f, nil
	}
	return f, nil
}

// snapshotLocked encodes the state as a compaction writes it: the highest sequence number,
// then each pod's entry, by UID.
func (j *statusJournal) snapshotLocked() ([]byte, error) {
	out, err := journalFrame(journalRecord{Kind: journalSeq, Seq: j.state.lastSeq})
	if err != nil {
		return nil, err
	}
	uids := make([]types.UID, 0, len(j.state.pods))
	for uid := range j.state.pods {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	for _, uid := range uids {
		p := j.state.pods[uid]
		e := p.latest
		frame, err := journalFrame(journalRecord{Kind: journalSnapshot, Seq: p.latestSeq, Entry: &e,
			Pending: p.pending, FirstSeq: p.firstSeq, FirstTimestamp: p.firstTimestamp})
		if err != nil {
			return nil, err
		}
		out = append(out, frame...)
	}
	return out, nil
}

// close writes what was deferred, syncs and closes the file.
func (j *statusJournal) close() error {
	if j == nil {
		return nil // Open failed before the journal was opened
	}
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	var err error
	if len(j.deferred) > 0 {
		if err = j.writeLocked(j.deferred); err == nil {
			j.deferred = nil
			err = unix.Fdatasync(int(j.f.Fd()))
			j.syncs.Add(1)
		}
	}
	if cerr := j.f.Close(); err == nil {
		err = cerr
	}
	j.f = nil
	if err != nil {
		return fmt.Errorf("close status journal %s: %w", j.path, err)
	}
	return nil
}

// takeDamage returns, once, what the replay at open could not read.
func (j *statusJournal) takeDamage() (map[string]error, map[string][]byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	d, b := j.damage, j.damagedBytes
	j.damage, j.damagedBytes = nil, nil
	return d, b
}

func (j *statusJournal) superseded() uint64 {
	if j == nil {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state.superseded
}

// adoptJournal finishes opening the outbox: the statuses an agent before the journal left in
// the database's outbox bucket move into the journal (synced, then the bucket emptied, so a
// crash between leaves them in both and the move is done again); what the journal's replay
// could not read goes to the quarantine; statuses of pods with no record left are dropped once
// delivered.
func (s *BoltStore) adoptJournal(report *OpenReport) error {
	j := s.journal
	var migrated []sequencedStatus
	var lastSeq uint64
	var q *quarantiner
	undecodable := false
	err := s.db.View(func(tx *bolt.Tx) error {
		ob := tx.Bucket(bucketOutbox)
		lastSeq = ob.Sequence()
		return ob.ForEach(func(k, v []byte) error {
			seq, ok := parseSeqKey(k)
			if !ok || v == nil {
				undecodable = true
				return nil
			}
			e, err := decodeStatus(v)
			if err != nil {
				undecodable = true
				return nil
			}
			migrated = append(migrated, sequencedStatus{seq: seq, entry: e})
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("read the outbox bucket: %w", err)
	}
	if len(migrated) > 0 || lastSeq > 0 || undecodable {
		if err := j.migrate(migrated, lastSeq); err != nil {
			return err
		}
		err := s.db.Update(func(tx *bolt.Tx) error {
			q = newQuarantiner(s.now)
			ob := tx.Bucket(bucketOutbox)
			if err := ob.ForEach(func(k, v []byte) error {
				key := fmt.Sprintf("outbox/%x", k)
				if seq, ok := parseSeqKey(k); ok {
					key = "outbox/" + seqString(seq)
				}
				switch _, ok := parseSeqKey(k); {
				case !ok || v == nil:
					return q.putAndNote(tx, key, key, v, fmt.Errorf("%w: outbox key of %d bytes", errUndecodable, len(k)))
				default:
					if _, err := decodeStatus(v); err != nil {
						return q.putAndNote(tx, key, key, v, err)
					}
				}
				return nil
			}); err != nil {
				return err
			}
			for _, name := range [][]byte{bucketOutbox, bucketOutboxIndex} {
				if err := tx.DeleteBucket(name); err != nil {
					return err
				}
				if _, err := tx.CreateBucket(name); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("empty the outbox bucket moved to the status journal: %w", err)
		}
		s.commits.Add(1)
		if len(q.errs) > 0 && report.Quarantined == nil {
			report.Quarantined = map[string]error{}
		}
		maps.Copy(report.Quarantined, q.errs)
	}
	if _, raw := j.peekDamage(); len(raw) > 0 {
		err := s.db.Update(func(tx *bolt.Tx) error {
			q := newQuarantiner(s.now)
			for key, b := range raw {
				if err := q.put(tx, "outbox/"+key, b, j.damage[key]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("quarantine the unreadable end of the status journal: %w", err)
		}
		s.commits.Add(1)
	}
	var uids map[types.UID]bool
	err = s.db.View(func(tx *bolt.Tx) error {
		uids = map[types.UID]bool{}
		return tx.Bucket(bucketPods).ForEach(func(k, _ []byte) error {
			uids[types.UID(k)] = true
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("list pod records: %w", err)
	}
	j.mu.Lock()
	var gone []types.UID
	for uid := range j.state.pods {
		if !uids[uid] {
			gone = append(gone, uid)
		}
	}
	j.mu.Unlock()
	for _, uid := range gone {
		j.recordDeleted(uid)
	}
	return nil
}

// migrate appends statuses of the database's outbox bucket the journal does not have yet (a
// sequence number above its last), and the bucket's last number, and syncs.
func (j *statusJournal) migrate(entries []sequencedStatus, lastSeq uint64) error {
	j.mu.Lock()
	var buf []byte
	for _, e := range entries {
		if e.seq <= j.state.lastSeq {
			continue
		}
		entry := e.entry
		frame, err := journalFrame(journalRecord{Kind: journalStatus, Seq: e.seq, Entry: &entry})
		if err != nil {
			j.mu.Unlock()
			return err
		}
		buf = append(buf, frame...)
		j.state.appendStatus(e.seq, entry)
	}
	if lastSeq > j.state.lastSeq {
		frame, err := journalFrame(journalRecord{Kind: journalSeq, Seq: lastSeq})
		if err != nil {
			j.mu.Unlock()
			return err
		}
		buf = append(buf, frame...)
		j.state.lastSeq = lastSeq
	}
	var err error
	if len(buf) > 0 {
		err = j.writeLocked(buf)
	}
	gen := j.written
	j.mu.Unlock()
	if err != nil {
		return fmt.Errorf("move the outbox into the status journal: %w", err)
	}
	return j.sync(gen)
}

// peekDamage is what takeDamage will return.
func (j *statusJournal) peekDamage() (map[string]error, map[string][]byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.damage, j.damagedBytes
}

// sequencedStatus is one decoded outbox entry with its sequence number.
type sequencedStatus struct {
	seq   uint64
	entry outboxEntry
}
