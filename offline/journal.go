package offline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
// cut off at open; a damaged frame before the end is skipped and quarantined, and the replay
// goes on at the next whole frame: the journal keeps only statuses, which the agent can compute
// again.
//
// Two files take turns, "<db>.outbox.a" and "<db>.outbox.b", both made at Open; appends go to
// the current one. When it grows past four times what its live statuses take (and compactMin),
// the status being appended is not appended: a compaction writes one record holding every
// pod's entry, that status included, at the start of the other file, cuts the file there and
// fdatasyncs it, and that file becomes the current one. The change costs one sync, as any
// other: no directory entry changes, so no directory sync (a temporary file renamed over the
// journal cost a second sync, and two more bytes of metadata to wear, at each compaction).
//
// Every record carries the generation of the compaction that began its file (0: a file never
// compacted into). At Open the file whose records carry the highest generation is the current
// one: a compaction cut short by a power cut left no whole compaction record, so the file it
// was writing keeps its older generation and loses. Records of a lower generation than their
// file's (an older use of the file, left past a compaction record whose cut was not durable)
// are not read. The other file's damage at its start (a compaction record cut short by a power
// cut, or damaged since) is reported too: if nothing of its generation survives, the older file
// wins with the statuses it had before that compaction.
//
// "<db>.outbox" is the journal of an agent before two files (one file, compacted by a rename):
// found at Open (the first boot after the upgrade, or after a rollback to such an agent and an
// upgrade again), its statuses are the newest: each pod's latest is taken over, numbered above
// every number either journal handed out, and the file is removed once a compaction has made
// them durable in the two files.
type statusJournal struct {
	path string
	// key seals each record, as pod records are sealed: a status holds termination messages
	// (a failed container's last log lines), and the latest status a journal gives an offline
	// boot decides what runs (a Failed or Evicted pod is not started); nil: in the clear.
	key *Key

	mu sync.Mutex // protects the fields below; cur and files[].f change under syncMu too
	// files are the journal's two files; cur is the current one's index.
	files [2]journalFile
	cur   int
	// gen is the current file's generation, carried by every record written to it.
	gen   uint64
	size  int64 // bytes of whole frames in the current file
	state outboxState
	// compactAt is the size past which the next status appended is written by a compaction.
	compactAt int64
	// written counts writes to the current file: a sync covers those counted before it began.
	written uint64
	// rewrite: the current file is behind j.state (damage found at open, a failed write or
	// sync, a compaction that failed and left the other file unknown): the next append is
	// written by a compaction.
	rewrite bool
	closed  bool
	// legacyPath is the journal of an agent before two files, taken over at Open: removed
	// once a compaction has made its statuses durable in the two files.
	legacyPath string
	// damage is what the replay at open could not read, by "<file>@<offset>", until the first
	// pendingStatuses reports it; damagedBytes is its raw content, for the quarantine.
	damage       map[string]error
	damagedBytes map[string][]byte

	syncMu sync.Mutex // serializes syncs; taken before mu when both are
	synced uint64     // written as of the last successful sync; under syncMu
	// dirDirty: the directory entry of a file made at Open is not known durable; a sync syncs
	// the directory too until it is. Under syncMu.
	dirDirty bool

	syncs, bytesWritten atomic.Uint64
}

// journalFile is one of the journal's two files.
type journalFile struct {
	path string
	// name prefixes the keys of its damage: "journal.a", "journal.b".
	name string
	f    *os.File
	// syncedSize is the file's size as of its last successful sync: what a power cut keeps
	// for sure (tests stand for one with it). Under syncMu.
	syncedSize int64
}

// journalRecord is one record of the status journal.
type journalRecord struct {
	Kind journalKind `json:"kind"`
	// Gen is the generation of the file the record was written to (journalCompaction: the
	// one it begins).
	Gen uint64 `json:"gen,omitempty"`
	// Seq is a status's sequence number, or (journalSeq, journalCompaction) the highest
	// handed out.
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
	// Pods are every pod's entry (journalCompaction).
	Pods []journalPodEntry `json:"pods,omitempty"`
}

// journalPodEntry is one pod's entry in a compaction record: what restores its outboxPod.
type journalPodEntry struct {
	Seq            uint64      `json:"seq"`
	Entry          outboxEntry `json:"entry"`
	Pending        int         `json:"pending,omitempty"`
	FirstSeq       uint64      `json:"firstSeq,omitempty"`
	FirstTimestamp time.Time   `json:"firstTimestamp,omitzero"`
}

type journalKind string

const (
	journalStatus     journalKind = "status"     // a status appended
	journalAck        journalKind = "ack"        // a pod's statuses up to UpTo delivered
	journalForget     journalKind = "forget"     // a pod's entry dropped
	journalCompaction journalKind = "compaction" // every pod's entry, at the start of a file
	// journalSnapshot and journalSeq: a pod's entry and the highest sequence number, as an
	// earlier compaction wrote them (one record each), and as moveRecordStatuses writes a
	// record's status.
	journalSnapshot journalKind = "snapshot"
	journalSeq      journalKind = "seq"
)

const (
	// journalSuffix names the journal beside the database: the path of the file an agent
	// before two files wrote, and the stem of the two.
	journalSuffix = ".outbox"
	// maxFrame bounds a frame's length: a length past it is damage, not a record to allocate.
	maxFrame = 16 << 20
	// damagedKept bounds the damaged bytes quarantined.
	damagedKept = 64 << 10
)

// journalPlace is what the journal's records are sealed to (Key.seal's additional data).
const journalPlace = "outbox"

// maxJournal bounds what Open reads: a journal file past it is moved aside, unread.
const maxJournal = 64 << 20

// seqJumpAfterDamage is how far sequence numbers jump when the replay found damage: a record
// lost to it may have carried the highest number handed out, which must not be handed out
// again (an ack of it would ack another status).
const seqJumpAfterDamage = 1 << 20

// maxSeq bounds the sequence numbers the replay accepts: far from wrapping around.
const maxSeq = 1 << 62

// journalFileSuffixes name the journal's two files: appended to its path.
var journalFileSuffixes = [2]string{".a", ".b"}

// compactMin is the journal size below which it is never compacted. A variable: tests lower
// it to compact every few changes.
var compactMin int64 = 64 << 10

// journalSync and journalSyncDir make a journal file's writes, and a directory's entries,
// durable. Tests replace them to count the syncs and to keep what each made durable.
var (
	journalSync    = func(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
	journalSyncDir = fsutil.SyncDir
)

// openStatusJournal opens (creating them if missing) the journal's two files at path and
// path's alternate, replays both and makes the one of the highest generation the current one.
// A path that is no regular file, or cannot be read, is moved aside and a new file started:
// the journal holds statuses the agent computes again, and a bad file never stops a boot.
func openStatusJournal(path string, key *Key) (*statusJournal, error) {
	j := &statusJournal{path: path, key: key}
	for i, suffix := range journalFileSuffixes {
		j.files[i] = journalFile{path: path + suffix, name: "journal" + suffix}
	}
	removeStaleTemps(filepath.Dir(path))
	var found [2]journalReplay
	made := false
	for i := range j.files {
		jf := &j.files[i]
		f, data, fileMade, err := j.openFile(jf)
		if err != nil {
			for k := range i {
				j.files[k].f.Close()
			}
			return nil, err
		}
		jf.f = f
		made = made || fileMade
		found[i] = j.replayFile(jf.name, data)
	}
	j.cur = 0
	if found[1].newerThan(found[0]) {
		j.cur = 1
	}
	cur, other := found[j.cur], found[1-j.cur]
	j.state, j.gen, j.size = cur.state, cur.gen, cur.size
	// The current file's damage is reported. Of the other's, only damage at its start: a
	// compaction record that did not survive (cut short by a power cut, or damaged since, and
	// then the statuses it held are lost); the rest is superseded content (the torn end of an
	// older use), and reporting it would report again at each boot what a power cut left.
	for key, err := range cur.damage {
		j.noteDamage(key, cur.damagedBytes[key], err)
	}
	if key := fmt.Sprintf("%s@0", j.files[1-j.cur].name); other.damage[key] != nil {
		j.noteDamage(key, other.damagedBytes[key], other.damage[key])
	}
	j.files[j.cur].syncedSize = cur.size
	damaged := cur.damaged || other.damaged
	switch {
	case cur.damaged && cur.tornTail:
		// Only the end is damaged (an append cut short): cut off, which needs no space on a
		// full disk; appends follow whole frames.
		if err := j.files[j.cur].f.Truncate(cur.good); err != nil {
			j.rewrite = true
		} else {
			j.size = cur.good
		}
	case cur.damaged:
		// Rewritten once the damage is quarantined (adoptJournal): appends follow whole frames.
		j.rewrite = true
	}
	if other.size > 0 {
		// Superseded: emptied so that it is not read at every boot, nor its damage reported
		// again. Not synced: a power cut may bring it back, and it loses again.
		_ = j.files[1-j.cur].f.Truncate(0)
	}
	legacy, err := j.takeOverLegacy(path)
	if err != nil {
		for k := range j.files {
			j.files[k].f.Close()
		}
		return nil, err
	}
	damaged = damaged || legacy.damaged
	if damaged {
		j.state.lastSeq += seqJumpAfterDamage
	}
	if made {
		// A new file (the first boot, or one moved aside): its directory entry must survive a
		// power cut before anything synced in it is reported durable. Tried now; if that
		// fails, by the first sync. Not at every boot: the other file, emptied, is no new one.
		j.dirDirty = journalSyncDir(filepath.Dir(path)) != nil
	}
	j.setCompactAt()
	return j, nil
}

// takeOverLegacy reads the journal an agent before two files left at path, if there is one:
// its statuses are the newest (written after everything in the two files: at the first boot
// after the upgrade, or by that agent after a rollback), so each pod's latest is taken over,
// numbered above every number handed out by either, pending if it was. The file is removed by
// the next compaction (j.rewrite: adoptJournal's), once the two files hold them durably.
func (j *statusJournal) takeOverLegacy(path string) (journalReplay, error) {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return journalReplay{}, nil
	}
	lf := journalFile{path: path, name: "journal"}
	f, data, _, err := j.openFile(&lf)
	if err != nil {
		return journalReplay{}, err
	}
	f.Close()
	l := j.replayFile(lf.name, data)
	for key, err := range l.damage {
		j.noteDamage(key, l.damagedBytes[key], err)
	}
	j.state.takeOver(l.state)
	j.legacyPath, j.rewrite = path, true
	return l, nil
}

// openFile opens and reads one of the journal's files; one that cannot be used is moved aside
// (its damage noted) and a new one made in its place. made: the file's directory entry is
// new (the file was missing, or moved aside).
func (j *statusJournal) openFile(jf *journalFile) (f *os.File, data []byte, made bool, err error) {
	_, serr := os.Lstat(jf.path)
	made = errors.Is(serr, fs.ErrNotExist)
	if f, data, err = readJournal(jf.path); err == nil {
		return f, data, made, nil
	}
	moved, merr := moveAside(jf.path, time.Now())
	if merr != nil {
		return nil, nil, false, fmt.Errorf("status journal %s unusable (%v) and moving it aside failed: %w", jf.path, err, merr)
	}
	removeOldCopies(jf.path, moved, KeptCorruptCopies)
	j.noteDamage(jf.name, nil, fmt.Errorf("%w: status journal unusable (%v); moved to %s", errUndecodable, err, moved))
	if f, data, err = readJournal(jf.path); err != nil {
		return nil, nil, false, fmt.Errorf("status journal %s: %w", jf.path, err)
	}
	return f, data, true, nil
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

// removeStaleTemps removes what a compaction of an earlier agent (a temporary file renamed
// over the journal) cut short by a crash left.
func removeStaleTemps(dir string) {
	if temps, err := filepath.Glob(filepath.Join(dir, ".outbox-*")); err == nil {
		for _, t := range temps {
			os.Remove(t)
		}
	}
}

// journalReplay is what the replay of one file found.
type journalReplay struct {
	state outboxState
	// gen is the file's generation: the highest its whole records carry.
	gen uint64
	// size is the file's length; good the length of its prefix read without damage.
	size, good int64
	damaged    bool
	// records counts the records read of the file's generation.
	records int
	// tornTail: the damage is the file's end alone (from good on, no whole frame).
	tornTail bool
	// damage is what could not be read, by "<file>@<offset>", and its bytes.
	damage       map[string]error
	damagedBytes map[string][]byte
}

// newerThan reports whether r's file is the current one rather than o's: the higher
// generation; at the same generation (files of an agent before two files, or both empty), the
// one with the higher sequence number, then the one with records.
func (r journalReplay) newerThan(o journalReplay) bool {
	if r.gen != o.gen {
		return r.gen > o.gen
	}
	if r.state.lastSeq != o.state.lastSeq {
		return r.state.lastSeq > o.state.lastSeq
	}
	return r.records > 0 && o.records == 0
}

// replayFile replays a file's records. A damaged frame (a bad checksum, a length that does
// not fit, a record that does not open with the key) is skipped: the replay looks for the next
// whole frame after it, so one bad sector does not take the statuses of every pod written
// after it. Most often the damage is the last frame, torn by a power cut during an append: its
// status was never reported durable to anyone.
func (j *statusJournal) replayFile(name string, data []byte) journalReplay {
	type framed struct {
		rec journalRecord
		off int
		raw []byte
	}
	r := journalReplay{state: newOutboxState(), size: int64(len(data)), good: -1}
	damage := func(off int, raw []byte, err error) {
		if r.damage == nil {
			r.damage, r.damagedBytes = map[string]error{}, map[string][]byte{}
		}
		key := fmt.Sprintf("%s@%d", name, off)
		r.damage[key], r.damagedBytes[key] = err, raw
		r.damaged = true
		if r.good < 0 {
			r.good = int64(off)
		}
	}
	// First the whole frames and the file's generation, then the records of that generation
	// in order.
	var frames []framed
	off := 0
	for off < len(data) {
		rec, n, err := j.parseFrame(data[off:])
		if err == nil {
			frames = append(frames, framed{rec, off, data[off : off+n]})
			r.gen = max(r.gen, rec.Gen)
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
		damage(off, data[off:next], err)
		off = next
	}
	for _, fr := range frames {
		switch {
		case fr.rec.Gen < r.gen:
			// Left by an older use of this file past the compaction record that began its
			// generation: superseded, not damage.
			continue
		case fr.rec.Kind == journalCompaction && fr.off != 0:
			damage(fr.off, fr.raw, fmt.Errorf("%w: a compaction record %d bytes into the journal, not at its start", errUndecodable, fr.off))
			continue
		}
		if err := r.state.apply(fr.rec); err != nil {
			// A whole frame whose content is not usable: skipped.
			damage(fr.off, fr.raw, err)
			continue
		}
		r.records++
	}
	if r.good < 0 {
		r.good = r.size
	}
	r.tornTail = r.damaged && (len(frames) == 0 || frames[len(frames)-1].off < int(r.good))
	return r
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
	if rec.Gen > maxSeq {
		return journalRecord{}, 0, fmt.Errorf("%w: generation past %d", errUndecodable, uint64(maxSeq))
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
	live, err := j.compactionLocked(j.gen + 1)
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
	case journalCompaction:
		pods := make(map[types.UID]*outboxPod, len(rec.Pods))
		for _, p := range rec.Pods {
			if err := checkPodEntry(p); err != nil {
				return err
			}
			if pods[p.Entry.UID] != nil {
				return fmt.Errorf("%w: compaction with two entries of pod %s", errUndecodable, p.Entry.UID)
			}
			pods[p.Entry.UID] = &outboxPod{latest: p.Entry, latestSeq: p.Seq, pending: p.Pending, firstSeq: p.FirstSeq, firstTimestamp: p.FirstTimestamp}
		}
		o.pods = pods
		o.lastSeq = max(o.lastSeq, rec.Seq)
	case journalStatus, journalSnapshot:
		if rec.Entry == nil {
			return fmt.Errorf("%w: %s record without a status", errUndecodable, rec.Kind)
		}
		if rec.Kind == journalSnapshot {
			p := journalPodEntry{Seq: rec.Seq, Entry: *rec.Entry, Pending: rec.Pending, FirstSeq: rec.FirstSeq, FirstTimestamp: rec.FirstTimestamp}
			if err := checkPodEntry(p); err != nil {
				return err
			}
			o.pods[p.Entry.UID] = &outboxPod{latest: p.Entry, latestSeq: p.Seq, pending: p.Pending, firstSeq: p.FirstSeq, firstTimestamp: p.FirstTimestamp}
			o.lastSeq = max(o.lastSeq, rec.Seq)
			return nil
		}
		if rec.Entry.UID == "" {
			return fmt.Errorf("%w: status record without a pod", errUndecodable)
		}
		if err := checkTimes(rec.Entry.Timestamp); err != nil {
			return err
		}
		if rec.Seq <= o.lastSeq {
			return fmt.Errorf("%w: status sequence %d after %d", errUndecodable, rec.Seq, o.lastSeq)
		}
		o.appendStatus(rec.Seq, *rec.Entry)
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

// checkPodEntry checks a pod's entry as a compaction wrote it.
func checkPodEntry(p journalPodEntry) error {
	if p.Entry.UID == "" {
		return fmt.Errorf("%w: pod entry without a pod", errUndecodable)
	}
	if p.Seq > maxSeq || p.FirstSeq > maxSeq {
		return fmt.Errorf("%w: sequence number past %d", errUndecodable, uint64(maxSeq))
	}
	if p.Pending < 0 || p.Pending > 2 {
		return fmt.Errorf("%w: pod entry with %d pending statuses", errUndecodable, p.Pending)
	}
	return checkTimes(p.Entry.Timestamp, p.FirstTimestamp)
}

// frame encodes a record as the journal keeps it, in the current file's generation: length,
// then the CRC-framed record, sealed with the key when there is one.
func (j *statusJournal) frame(rec journalRecord) ([]byte, error) {
	if rec.Kind != journalCompaction {
		rec.Gen = j.gen
	}
	framed, err := j.key.sealOrFrame(journalPlace, rec)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 4, 4+len(framed))
	binary.BigEndian.PutUint32(out, uint32(len(framed)))
	return append(out, framed...), nil
}

// current is the current file.
func (j *statusJournal) current() *journalFile { return &j.files[j.cur] }

// appendStatus writes a status and syncs it. Concurrent appends share a sync: one that finds
// its write covered by another's sync returns without one. A status that would take the file
// past compactAt is written by a compaction instead, which costs the same one sync.
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
	j.mu.Lock()
	seq, frame, err := j.nextStatusLocked(e)
	if err != nil {
		j.mu.Unlock()
		return 0, err
	}
	if j.rewrite || j.size+int64(len(frame)) > j.compactAt {
		j.mu.Unlock()
		return j.appendByCompaction(e)
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
	return seq, nil
}

// nextStatusLocked numbers e and frames it as a status record of the current file.
func (j *statusJournal) nextStatusLocked(e outboxEntry) (uint64, []byte, error) {
	if j.closed {
		return 0, nil, ErrClosed
	}
	if j.state.lastSeq >= maxSeq {
		return 0, nil, fmt.Errorf("status journal: sequence numbers exhausted at %d", j.state.lastSeq)
	}
	seq := j.state.lastSeq + 1
	frame, err := j.frame(journalRecord{Kind: journalStatus, Seq: seq, Entry: &e})
	return seq, frame, err
}

// appendByCompaction writes a status by a compaction into the other file. If the compaction
// fails but leaves the other file durably empty, the status is appended to the current file
// as any other.
func (j *statusJournal) appendByCompaction(e outboxEntry) (uint64, error) {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	seq, frame, err := j.nextStatusLocked(e)
	if err != nil {
		j.mu.Unlock()
		return 0, err
	}
	// In memory first: a compaction writes the state. If nothing writes it, the state is
	// ahead of the files and j.rewrite says so: the next append rewrites it.
	j.state.appendStatus(seq, e)
	cerr := j.compactLocked()
	if cerr == nil {
		j.mu.Unlock()
		failpoint.Inject(failpoint.OutboxAfterAppend)
		return seq, nil
	}
	if j.rewrite {
		j.mu.Unlock()
		return 0, cerr
	}
	if err := j.writeLocked(frame); err != nil {
		j.rewrite = true
		j.mu.Unlock()
		return 0, errors.Join(cerr, err)
	}
	j.mu.Unlock()
	if err := j.syncLocked(); err != nil {
		return 0, err
	}
	failpoint.Inject(failpoint.OutboxAfterAppend)
	return seq, nil
}

// writeLocked appends b at the end of the current file; on a failure (a full disk) the file is
// cut back to its last whole frame, or rewritten before the next append if it cannot be.
func (j *statusJournal) writeLocked(b []byte) error {
	f := j.current().f
	if _, err := f.WriteAt(b, j.size); err != nil {
		if terr := f.Truncate(j.size); terr != nil {
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

// sync makes every write up to gen durable, unless a sync since did.
func (j *statusJournal) sync(gen uint64) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced >= gen && !j.dirDirty {
		return nil
	}
	j.mu.Lock()
	if j.rewrite && !j.closed {
		// A sync failed since the write (or the file is behind for another reason): the pages
		// it could not write may be marked clean, and a sync now would report them durable.
		// The state is written whole by a compaction instead, with the one sync.
		defer j.mu.Unlock()
		return j.compactLocked()
	}
	j.mu.Unlock()
	return j.syncLocked()
}

// syncLocked syncs the current file, and the directory while a file's entry made at Open is
// not known durable. After a failed sync the file's content is unknown (Linux may have dropped
// the pages it could not write and report the next sync clean): the state is rewritten by a
// compaction at the next append. Called with syncMu held.
func (j *statusJournal) syncLocked() error {
	j.mu.Lock()
	jf, upTo, size, closed := j.current(), j.written, j.size, j.closed
	j.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if err := journalSync(jf.f); err != nil {
		j.mu.Lock()
		j.rewrite = true
		j.mu.Unlock()
		return fmt.Errorf("sync status journal: %w", err)
	}
	j.syncs.Add(1)
	if err := j.syncDirLocked(); err != nil {
		return fmt.Errorf("sync status journal: %w", err)
	}
	j.synced, jf.syncedSize = upTo, size
	return nil
}

// syncDirLocked syncs the journal's directory if a file's entry is not known durable.
func (j *statusJournal) syncDirLocked() error {
	if !j.dirDirty {
		return nil
	}
	if err := journalSyncDir(filepath.Dir(j.path)); err != nil {
		return err
	}
	j.syncs.Add(1)
	j.dirDirty = false
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
		// rewritten from it by the next append.
		j.rewrite = true
	}
}

// ack marks the pod's statuses up to upTo delivered.
func (j *statusJournal) ack(uid types.UID, upTo uint64) (changed bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
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
	if !j.closed && j.state.recordDeleted(uid) {
		j.writeUnsyncedLocked(journalRecord{Kind: journalForget, UID: uid})
	}
}

// recordPut is told that the pod has a record (again): its status stays once delivered.
func (j *statusJournal) recordPut(uid types.UID) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.state.recordPut(uid)
}

// rewriteIfDue rewrites the journal from memory, by a compaction, when the current file is
// known to be behind it (damage found at Open).
func (j *statusJournal) rewriteIfDue() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed || !j.rewrite {
		return nil
	}
	return j.compactLocked()
}

// compactLocked writes j.state as one compaction record at the start of the other file, cuts
// it there, syncs it (the one sync) and makes it the current file, of the next generation.
// The current file is left as it is: until that sync returns, it is what a power cut keeps.
//
// On failure the current file stays current, and the other is emptied and synced, so that
// what the failed compaction may have left there cannot win at the next Open over statuses
// appended to the current file meanwhile; if even that fails, j.rewrite is set: every append
// is then written by a compaction until one succeeds. Called with syncMu and mu held.
func (j *statusJournal) compactLocked() error {
	if j.closed {
		return ErrClosed
	}
	gen := j.gen + 1
	data, err := j.compactionLocked(gen)
	if err != nil {
		return err
	}
	next := &j.files[1-j.cur]
	err = writeWhole(next.f, data)
	if err == nil {
		if err = journalSync(next.f); err == nil {
			j.syncs.Add(1)
			err = j.syncDirLocked()
		}
	}
	if err != nil {
		err = fmt.Errorf("compact status journal into %s: %w", next.path, err)
		if terr := next.f.Truncate(0); terr != nil {
			j.rewrite = true
			return errors.Join(err, terr)
		}
		if serr := journalSync(next.f); serr != nil {
			j.rewrite = true
			return errors.Join(err, serr)
		}
		j.syncs.Add(1)
		next.syncedSize = 0
		j.compactAt = 2 * j.size // not again at the next append
		return err
	}
	j.bytesWritten.Add(uint64(len(data)))
	j.cur, j.gen, j.size, j.rewrite = 1-j.cur, gen, int64(len(data)), false
	j.written++
	j.synced, next.syncedSize = j.written, j.size
	j.compactAt = max(compactMin, 4*j.size) // the file is the live statuses' compaction
	if j.legacyPath != "" {
		// Its statuses are durable in the two files now. Left in place, the next boot would
		// take them over again, over newer ones: until it is gone, every append compacts and
		// tries again. Its removal is made durable before anything synced after it is
		// reported durable (dirDirty).
		if err := os.Remove(j.legacyPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			j.rewrite = true
			return nil
		}
		j.legacyPath, j.dirDirty = "", true
		_ = j.syncDirLocked()
	}
	return nil
}

// writeWhole makes data the whole content of f.
func writeWhole(f *os.File, data []byte) error {
	if _, err := f.WriteAt(data, 0); err != nil {
		return err
	}
	return f.Truncate(int64(len(data)))
}

// compactionLocked encodes the state as a compaction writes it: one record of generation gen
// with the highest sequence number and each pod's entry, by UID.
func (j *statusJournal) compactionLocked(gen uint64) ([]byte, error) {
	rec := journalRecord{Kind: journalCompaction, Gen: gen, Seq: j.state.lastSeq, Pods: make([]journalPodEntry, 0, len(j.state.pods))}
	for _, uid := range slices.Sorted(maps.Keys(j.state.pods)) {
		p := j.state.pods[uid]
		rec.Pods = append(rec.Pods, journalPodEntry{Seq: p.latestSeq, Entry: p.latest, Pending: p.pending, FirstSeq: p.firstSeq, FirstTimestamp: p.firstTimestamp})
	}
	return j.frame(rec)
}

// close syncs what is not synced and closes the files.
func (j *statusJournal) close() error {
	if j == nil {
		return nil // Open failed before the journal was opened
	}
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	var err error
	if j.written > j.synced {
		if err = journalSync(j.current().f); err == nil {
			j.syncs.Add(1)
			j.synced = j.written
		}
	}
	for i := range j.files {
		if cerr := j.files[i].f.Close(); err == nil {
			err = cerr
		}
	}
	j.closed = true
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
	// Damage, or the journal of an agent before two files, is written out whole now. If that
	// fails (a full disk, an I/O error) the boot goes on: j.rewrite stays, and the next status
	// appended is written by a compaction.
	_ = j.rewriteIfDue()
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
