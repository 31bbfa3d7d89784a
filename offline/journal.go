package offline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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
// removals of delivered statuses are written at once but not synced: a kill of the agent loses
// none; a power cut may, and then a delivered status is sent once more, a patch that changes
// nothing.
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
	// key seals each record, as pod records are sealed: a status holds termination messages
	// (a failed container's last log lines), and the latest status a journal gives an offline
	// boot decides what runs (a Failed or Evicted pod is not started); nil: in the clear.
	key *Key

	mu    sync.Mutex // protects the fields below
	f     *os.File   // nil once closed
	size  int64      // bytes of whole frames in f
	state outboxState
	// compactAt is the size past which the file is rewritten.
	compactAt int64
	// written counts writes to f: a sync covers those counted before it began.
	written uint64
	// rewrite: the file is to be rewritten from j.state before the next append (damage found
	// at open, or a failed write or sync left the file behind the state).
	rewrite bool
	// damage is what the replay at open could not read, by "journal@<offset>", until the first
	// pendingStatuses reports it; damagedBytes is its raw content, for the quarantine.
	damage       map[string]error
	damagedBytes map[string][]byte

	syncMu sync.Mutex // serializes syncs; taken before mu when both are
	synced uint64     // written as of the last successful sync; under syncMu
	// syncedSize is the file's size as of the last successful sync: what a power cut keeps
	// for sure (tests stand for one with it). Under syncMu.
	syncedSize int64
	// dirDirty: the journal's directory entry (a new file, a compaction's rename) is not known
	// durable; a sync syncs the directory too until it is. Under syncMu.
	dirDirty bool

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
	// maxFrame bounds a frame's length: a length past it is damage, not a record to allocate.
	maxFrame = 16 << 20
	// damagedKept bounds the damaged bytes quarantined.
	damagedKept = 64 << 10
)

// journalPlace is what the journal's records are sealed to (Key.seal's additional data).
const journalPlace = "outbox"

// maxJournal bounds what Open reads: a journal past it is moved aside, unread.
const maxJournal = 64 << 20

// seqJumpAfterDamage is how far sequence numbers jump when the replay found damage: a record
// lost to it may have carried the highest number handed out, which must not be handed out
// again (an ack of it would ack another status).
const seqJumpAfterDamage = 1 << 20

// maxSeq bounds the sequence numbers the replay accepts: far from wrapping around.
const maxSeq = 1 << 62

// openStatusJournal opens (creating it if missing) the journal at path and replays it. A path
// that is no regular file, or cannot be read, is moved aside and a new journal started: the
// journal holds statuses the agent computes again, and a bad file never stops a boot.
func openStatusJournal(path string, key *Key) (*statusJournal, error) {
	j := &statusJournal{path: path, key: key}
	removeStaleTemps(filepath.Dir(path))
	f, data, err := readJournal(path)
	if err != nil {
		moved, merr := moveAside(path, time.Now())
		if merr != nil {
			return nil, fmt.Errorf("status journal %s unusable (%v) and moving it aside failed: %w", path, err, merr)
		}
		removeOldCopies(path, moved, KeptCorruptCopies)
		j.noteDamage("journal", nil, fmt.Errorf("%w: status journal unusable (%v); moved to %s", errUndecodable, err, moved))
		if f, data, err = readJournal(path); err != nil {
			return nil, fmt.Errorf("status journal %s: %w", path, err)
		}
	}
	good, damaged := j.replay(data)
	j.f, j.size, j.syncedSize = f, int64(len(data)), int64(len(data))
	if damaged || good < int64(len(data)) {
		// Rewritten once the damage is quarantined (adoptJournal): appends follow whole frames.
		j.rewrite = true
	}
	if len(data) == 0 {
		// A new file: its directory entry must survive a power cut before anything synced in
		// it is reported durable. Tried now; if that fails, by the first sync.
		j.dirDirty = fsutil.SyncDir(filepath.Dir(path)) != nil
	}
	j.setCompactAt()
	return j, nil
}

// readJournal opens path (created if missing), refusing what is not a regular file (a
// symbolic link, a FIFO that would block the boot, a directory), and reads it.
func readJournal(path string) (*os.File, []byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
	case !fi.Mode().IsRegular():
		err = fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	case fi.Size() > maxJournal:
		err = fmt.Errorf("%d bytes, past the %d a journal of statuses can hold", fi.Size(), maxJournal)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxJournal))
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("read: %w", err)
	}
	return f, data, nil
}

// removeStaleTemps removes what a compaction cut short by a crash left.
func removeStaleTemps(dir string) {
	if temps, err := filepath.Glob(filepath.Join(dir, ".outbox-*")); err == nil {
		for _, t := range temps {
			os.Remove(t)
		}
	}
}

// replay applies the file's records to j.state. It returns the length of the prefix read
// without damage and whether any damage was found. A damaged frame (a bad checksum, a length
// that does not fit, a record that does not open with the key) is skipped: the replay looks
// for the next whole frame after it, so one bad sector does not take the statuses of every
// pod written after it. Most often the damage is the last frame, torn by a power cut during
// an append: its status was never reported durable to anyone.
func (j *statusJournal) replay(data []byte) (good int64, damaged bool) {
	j.state = newOutboxState()
	good = -1
	off := 0
	for off < len(data) {
		rec, n, err := j.parseFrame(data[off:])
		if err == nil {
			if err := j.state.apply(rec); err != nil {
				// A whole frame whose content is not usable: skipped.
				j.noteDamage(fmt.Sprintf("journal@%d", off), data[off:off+n], err)
				damaged = true
				if good < 0 {
					good = int64(off)
				}
			}
			off += n
			continue
		}
		next := len(data)
		for p := off + 1; p < len(data); p++ {
			if _, _, err := j.parseFrame(data[p:]); err == nil {
				next = p
				break
			}
		}
		j.noteDamage(fmt.Sprintf("journal@%d", off), data[off:next], err)
		damaged = true
		if good < 0 {
			good = int64(off)
		}
		off = next
	}
	if good < 0 {
		good = int64(len(data))
	}
	if damaged {
		j.state.lastSeq += seqJumpAfterDamage
	}
	return good, damaged
}

// parseFrame reads the frame at the start of b: its record and its whole length.
func (j *statusJournal) parseFrame(b []byte) (journalRecord, int, error) {
	if len(b) < 4 {
		return journalRecord{}, 0, fmt.Errorf("%w: %d bytes at the end of the journal, less than a frame's length (a write cut short)", errUndecodable, len(b))
	}
	n := int(binary.BigEndian.Uint32(b))
	if n > maxFrame || n > len(b)-4 {
		return journalRecord{}, 0, fmt.Errorf("%w: a frame of %d bytes where %d are left (a write cut short, or damage)", errUndecodable, n, len(b)-4)
	}
	var rec journalRecord
	if err := j.key.openSealedOrPlain(journalPlace, b[4:4+n], &rec, j.key == nil); err != nil {
		return journalRecord{}, 0, err
	}
	return rec, 4 + n, nil
}

func (j *statusJournal) noteDamage(key string, raw []byte, err error) {
	if j.damage == nil {
		j.damage, j.damagedBytes = map[string]error{}, map[string][]byte{}
	}
	j.damage[key] = err
	j.damagedBytes[key] = clone(raw[:min(len(raw), damagedKept)])
}

// setCompactAt sets the size past which the journal is compacted: four times what its live
// statuses take, so that a compaction is paid for by many appends, and never sooner than
// compactMin.
func (j *statusJournal) setCompactAt() {
	live, err := j.snapshotLocked()
	if err != nil {
		j.compactAt = max(compactMin, 4*j.size)
		return
	}
	j.compactAt = max(compactMin, 4*int64(len(live)))
}

// apply replays one record.
func (o *outboxState) apply(rec journalRecord) error {
	if rec.Seq > maxSeq || rec.UpTo > maxSeq || rec.FirstSeq > maxSeq {
		return fmt.Errorf("%w: sequence number past %d", errUndecodable, uint64(maxSeq))
	}
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

// frame encodes a record as the journal keeps it: length, then the CRC-framed record, sealed
// with the key when there is one.
func (j *statusJournal) frame(rec journalRecord) ([]byte, error) {
	framed, err := j.key.sealOrFrame(journalPlace, rec)
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
	// The entry kept in memory is the one a replay would give: a copy (the caller's slices
	// are not shared), in UTC, times in whole seconds as JSON keeps them.
	raw, err := encodeStatus(u)
	if err != nil {
		return 0, err
	}
	e, err := decodeStatus(raw)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := j.rewriteIfDue(); err != nil {
		return 0, err
	}
	j.mu.Lock()
	if j.f == nil {
		j.mu.Unlock()
		return 0, ErrClosed
	}
	if j.state.lastSeq >= maxSeq {
		j.mu.Unlock()
		return 0, fmt.Errorf("status journal: sequence numbers exhausted at %d", j.state.lastSeq)
	}
	seq := j.state.lastSeq + 1
	frame, err := j.frame(journalRecord{Kind: journalStatus, Seq: seq, Entry: &e})
	if err != nil {
		j.mu.Unlock()
		return 0, err
	}
	if err := j.writeLocked(frame); err != nil {
		j.mu.Unlock()
		return 0, err
	}
	j.state.appendStatus(seq, e)
	gen := j.written
	j.mu.Unlock()
	if err := j.sync(gen); err != nil {
		return 0, err
	}
	failpoint.Inject(failpoint.OutboxAfterAppend)
	// A compaction that fails leaves the synced status in the old file, which grows on.
	_ = j.compactIfDue()
	return seq, nil
}

// writeLocked appends b at the end of the file; on a failure (a full disk) the file is cut back
// to its last whole frame, or rewritten before the next append if it cannot be.
func (j *statusJournal) writeLocked(b []byte) error {
	if _, err := j.f.WriteAt(b, j.size); err != nil {
		if terr := j.f.Truncate(j.size); terr != nil {
			j.rewrite = true
			err = errors.Join(err, terr)
		}
		return fmt.Errorf("write status journal: %w", err)
	}
	j.size += int64(len(b))
	j.written++
	j.bytesWritten.Add(uint64(len(b)))
	return nil
}

// sync makes every write up to gen durable, unless a sync since did. After a failed sync the
// file's content is unknown (Linux may have dropped the pages it could not write and report
// the next sync clean): the file is rewritten from memory before the next append.
func (j *statusJournal) sync(gen uint64) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced >= gen && !j.dirDirty {
		return nil
	}
	j.mu.Lock()
	f, upTo, size := j.f, j.written, j.size
	j.mu.Unlock()
	if f == nil {
		return ErrClosed
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		j.mu.Lock()
		j.rewrite = true
		j.mu.Unlock()
		return fmt.Errorf("sync status journal: %w", err)
	}
	j.syncs.Add(1)
	if j.dirDirty {
		if err := fsutil.SyncDir(filepath.Dir(j.path)); err != nil {
			return fmt.Errorf("sync status journal: %w", err)
		}
		j.syncs.Add(1)
		j.dirDirty = false
	}
	j.synced, j.syncedSize = upTo, size
	return nil
}

// writeUnsyncedLocked writes a record that needs no sync of its own (an ack, a forget): a
// kill of the agent does not lose it (it is in the page cache); a power cut may, and then a
// delivered status is sent once more. Left in memory until the next append instead, the acks
// of an agent killed between two changes were lost, and at its restart every delivered status
// came back pending: shown as the pod's status (Running, ready) before its containers ran.
func (j *statusJournal) writeUnsyncedLocked(rec journalRecord) {
	frame, err := j.frame(rec)
	if err != nil {
		return // records of these kinds always encode
	}
	if err := j.writeLocked(frame); err != nil {
		// Not written (a full disk): the state in memory is ahead of the file, which is
		// rewritten from it before the next append.
		j.rewrite = true
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
		j.writeUnsyncedLocked(journalRecord{Kind: journalAck, UID: uid, UpTo: upTo})
	}
	return changed, nil
}

// recordDeleted drops the pod's delivered status; a pending one stays until delivered.
func (j *statusJournal) recordDeleted(uid types.UID) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil && j.state.recordDeleted(uid) {
		j.writeUnsyncedLocked(journalRecord{Kind: journalForget, UID: uid})
	}
}

// recordPut is told that the pod has a record (again): its status stays once delivered.
func (j *statusJournal) recordPut(uid types.UID) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.state.recordPut(uid)
}

// compactIfDue rewrites the journal as one snapshot per pod once it has grown past compactAt.
func (j *statusJournal) compactIfDue() error {
	j.mu.Lock()
	due := j.f != nil && j.size > j.compactAt
	j.mu.Unlock()
	if !due {
		return nil
	}
	return j.compact(false)
}

// rewriteIfDue rewrites the journal from memory when the file is known to be behind it.
func (j *statusJournal) rewriteIfDue() error {
	j.mu.Lock()
	due := j.f != nil && j.rewrite
	j.mu.Unlock()
	if !due {
		return nil
	}
	return j.compact(true)
}

// compact rewrites the journal from j.state, if it is still due (another caller may have
// compacted meanwhile) or forced.
func (j *statusJournal) compact(force bool) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return ErrClosed
	}
	if !force && !j.rewrite && j.size <= j.compactAt {
		return nil
	}
	data, err := j.snapshotLocked()
	if err != nil {
		return err
	}
	f, dirErr, err := placeJournal(j.path, data)
	if err != nil {
		j.compactAt = 2 * j.size // not again at the next append
		return fmt.Errorf("compact status journal: %w", err)
	}
	j.f.Close()
	j.f, j.size, j.rewrite = f, int64(len(data)), false
	j.written++
	j.synced, j.syncedSize = j.written, j.size
	j.syncs.Add(2) // the file's and the directory's
	j.bytesWritten.Add(uint64(len(data)))
	j.compactAt = max(compactMin, 4*j.size) // the file is the live statuses' snapshot
	// The rename is done but its directory entry may not be durable: the next sync syncs the
	// directory before it reports anything durable.
	j.dirDirty = dirErr != nil
	return nil
}

// placeJournal writes data to a synced temporary file, renames it to path, syncs the
// directory and returns the file, open for the appends that follow: a power cut leaves the
// old journal or the new one. dirErr is a failed sync of the directory after the rename.
func placeJournal(path string, data []byte) (f *os.File, dirErr, err error) {
	dir := filepath.Dir(path)
	f, err = os.CreateTemp(dir, ".outbox-*")
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*os.File, error, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, nil, err
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
	return f, fsutil.SyncDir(dir), nil
}

// snapshotLocked encodes the state as a compaction writes it: the highest sequence number,
// then each pod's entry, by UID.
func (j *statusJournal) snapshotLocked() ([]byte, error) {
	out, err := j.frame(journalRecord{Kind: journalSeq, Seq: j.state.lastSeq})
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
		frame, err := j.frame(journalRecord{Kind: journalSnapshot, Seq: p.latestSeq, Entry: &e,
			Pending: p.pending, FirstSeq: p.firstSeq, FirstTimestamp: p.firstTimestamp})
		if err != nil {
			return nil, err
		}
		out = append(out, frame...)
	}
	return out, nil
}

// close syncs what is not synced and closes the file.
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
	if j.written > j.synced {
		if err = unix.Fdatasync(int(j.f.Fd())); err == nil {
			j.syncs.Add(1)
			j.synced = j.written
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

// takeDamage returns, once, what the replay at open could not read (its bytes were
// quarantined by Open).
func (j *statusJournal) takeDamage() map[string]error {
	j.mu.Lock()
	defer j.mu.Unlock()
	d := j.damage
	j.damage, j.damagedBytes = nil, nil
	return d
}

// adoptJournal finishes opening the outbox, in an order a crash anywhere leaves safe:
//
//  1. what the journal's replay could not read goes to the quarantine, before the file is
//     rewritten without it;
//  2. pod records that carry a status (written by an agent before the journal, at an upgrade
//     or after a rollback and a new upgrade: this one writes none) give it to the journal as
//     the pod's latest, and are written again without it;
//  3. statuses such an agent left in the database's outbox bucket move into the journal,
//     numbered after everything in it (they are the newest), synced before the bucket is
//     emptied (a crash between moves them twice: the second supersedes the first);
//  4. the bucket's sequence follows the journal's, so an older agent after a rollback numbers
//     its statuses above every number handed out;
//  5. statuses of pods with no record left are dropped once delivered.
func (s *BoltStore) adoptJournal(report *OpenReport) error {
	j := s.journal
	if damage, raw := j.peekDamage(); len(raw) > 0 {
		err := s.db.Update(func(tx *bolt.Tx) error {
			q := newQuarantiner(s.now)
			for _, key := range slices.Sorted(maps.Keys(raw)) {
				if err := q.put(tx, "outbox/"+key, raw[key], damage[key]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("quarantine what the status journal's replay could not read: %w", err)
		}
		s.commits.Add(1)
		s.quarantined.Add(uint64(len(raw)))
	}
	if err := j.rewriteIfDue(); err != nil {
		return err
	}
	// The records' statuses first: an older agent's outbox entries are newer than the
	// apiserver's echo it cached in its records.
	if err := s.moveRecordStatuses(); err != nil {
		return err
	}
	if err := s.moveOutboxBucket(report); err != nil {
		return err
	}
	j.mu.Lock()
	lastSeq := j.state.lastSeq
	j.mu.Unlock()
	var uids map[types.UID]bool
	var bucketSeq uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		bucketSeq = tx.Bucket(bucketOutbox).Sequence()
		uids = map[types.UID]bool{}
		return tx.Bucket(bucketPods).ForEach(func(k, _ []byte) error {
			uids[types.UID(k)] = true
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("list pod records: %w", err)
	}
	if bucketSeq != lastSeq {
		if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketOutbox).SetSequence(lastSeq) }); err != nil {
			return fmt.Errorf("set the outbox bucket's sequence: %w", err)
		}
		s.commits.Add(1)
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

// moveOutboxBucket moves the statuses found in the database's outbox bucket into the journal
// and empties the bucket (its keys: the bucket and its sequence stay, for an older agent).
func (s *BoltStore) moveOutboxBucket(report *OpenReport) error {
	var found []outboxEntry
	any := false
	var bucketSeq uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		bucketSeq = min(tx.Bucket(bucketOutbox).Sequence(), maxSeq)
		return tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error {
			any = true
			if _, ok := parseSeqKey(k); ok && v != nil {
				if e, err := decodeStatus(v); err == nil {
					found = append(found, e)
				}
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("read the outbox bucket: %w", err)
	}
	if !any {
		return nil
	}
	// Numbers go on above the bucket's last: none the older agent handed out is reused.
	s.journal.mu.Lock()
	s.journal.state.lastSeq = max(s.journal.state.lastSeq, bucketSeq)
	s.journal.mu.Unlock()
	if err := s.journal.appendAll(found); err != nil {
		return fmt.Errorf("move the outbox bucket into the status journal: %w", err)
	}
	q := newQuarantiner(s.now)
	err = s.db.Update(func(tx *bolt.Tx) error {
		q = newQuarantiner(s.now)
		if err := tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error {
			name := fmt.Sprintf("outbox/%x", k)
			seq, ok := parseSeqKey(k)
			if ok {
				name = "outbox/" + seqString(seq)
			}
			if !ok || v == nil {
				return q.putAndNote(tx, name, name, v, fmt.Errorf("%w: outbox key of %d bytes", errUndecodable, len(k)))
			}
			if _, err := decodeStatus(v); err != nil {
				return q.putAndNote(tx, name, name, v, err)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := emptyBucket(tx.Bucket(bucketOutbox)); err != nil {
			return err
		}
		return emptyBucket(tx.Bucket(bucketOutboxIndex))
	})
	if err != nil {
		return fmt.Errorf("empty the outbox bucket moved to the status journal: %w", err)
	}
	s.commits.Add(1)
	s.quarantined.Add(uint64(q.moved))
	if len(q.errs) > 0 {
		if report.Quarantined == nil {
			report.Quarantined = map[string]error{}
		}
		maps.Copy(report.Quarantined, q.errs)
	}
	return nil
}

// emptyBucket deletes every key and nested bucket of b; b itself and its sequence stay.
func emptyBucket(b *bolt.Bucket) error {
	var keys [][]byte
	if err := b.ForEach(func(k, _ []byte) error { keys = append(keys, clone(k)); return nil }); err != nil {
		return err
	}
	for _, k := range keys {
		del := b.Delete
		if b.Bucket(k) != nil {
			del = b.DeleteBucket
		}
		if err := del(k); err != nil {
			return err
		}
	}
	return nil
}

// moveRecordStatuses gives the journal the status of each pod record that carries one, as the
// pod's latest (delivered unless the journal has it pending), and writes the records again
// without it. Records that do not open with the store's key are left as they are.
func (s *BoltStore) moveRecordStatuses() error {
	type found struct {
		uid    types.UID
		source Source
		pod    *v1.Pod
	}
	var withStatus []found
	err := s.db.View(func(tx *bolt.Tx) error {
		pods := tx.Bucket(bucketPods)
		return pods.ForEach(func(k, _ []byte) error {
			pb := pods.Bucket(k)
			if pb == nil {
				return nil
			}
			e, err := decodePod(s.seal, types.UID(k), pb.Get(keyPod))
			if err != nil || equality.Semantic.DeepEqual(e.Pod.Status, v1.PodStatus{}) {
				return nil
			}
			withStatus = append(withStatus, found{types.UID(k), e.Source, e.Pod})
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("read pod records: %w", err)
	}
	if len(withStatus) == 0 {
		return nil
	}
	for _, f := range withStatus {
		if err := s.journal.adoptStatus(f.pod, s.now()); err != nil {
			return fmt.Errorf("move the status of pod record %s into the status journal: %w", f.uid, err)
		}
	}
	if err := s.journal.sync(s.journal.generation()); err != nil {
		return err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		for _, f := range withStatus {
			raw, err := encodePod(s.seal, f.source, f.pod) // without its status
			if err != nil {
				return err
			}
			if pb := bucketAt(tx, bucketPods, []byte(f.uid)); pb != nil {
				if err := pb.Put(keyPod, raw); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write pod records without their status: %w", err)
	}
	s.commits.Add(1)
	return nil
}

// appendAll appends statuses, numbered after everything in the journal, with one sync.
func (j *statusJournal) appendAll(entries []outboxEntry) error {
	j.mu.Lock()
	var buf []byte
	for _, e := range entries {
		seq := j.state.lastSeq + 1
		frame, err := j.frame(journalRecord{Kind: journalStatus, Seq: seq, Entry: &e})
		if err != nil {
			j.mu.Unlock()
			return err
		}
		buf = append(buf, frame...)
		j.state.appendStatus(seq, e)
	}
	var err error
	if len(buf) > 0 {
		err = j.writeLocked(buf)
	}
	gen := j.written
	j.mu.Unlock()
	if err != nil {
		return err
	}
	return j.sync(gen)
}

// adoptStatus makes status the pod's latest, delivered unless a status of the pod is pending,
// and writes it (not synced: the caller syncs).
func (j *statusJournal) adoptStatus(pod *v1.Pod, at time.Time) error {
	raw, err := encodeStatus(StatusUpdate{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Status: pod.Status, Timestamp: at})
	if err != nil {
		return err
	}
	e, err := decodeStatus(raw)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.state.lastSeq++
	p := j.state.pods[pod.UID]
	if p == nil {
		p = &outboxPod{}
		j.state.pods[pod.UID] = p
	}
	p.latest, p.latestSeq = e, j.state.lastSeq
	if p.pending == 1 {
		p.firstSeq, p.firstTimestamp = p.latestSeq, e.Timestamp
	}
	frame, err := j.frame(journalRecord{Kind: journalSnapshot, Seq: p.latestSeq, Entry: &e,
		Pending: p.pending, FirstSeq: p.firstSeq, FirstTimestamp: p.firstTimestamp})
	if err != nil {
		return err
	}
	return j.writeLocked(frame)
}

// generation is the count of writes so far, for sync.
func (j *statusJournal) generation() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.written
}

func (j *statusJournal) superseded() uint64 {
	if j == nil {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state.superseded
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
