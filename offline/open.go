package offline

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// Options configure Open. The zero value is the default.
type Options struct {
	// Timeout is how long Open waits for another process to release the
	// database. Defaults to 1s.
	Timeout time.Duration
	// Now is the clock for report and quarantine times. Defaults to time.Now.
	Now func() time.Time
	// MaxBatch caps how many concurrent writes share one transaction.
	// Defaults to 128.
	MaxBatch int
	// Key encrypts Secrets, tokens and pod records at rest (see LoadKey).
	// Defaults to none: PutSecret and PutToken then return ErrNoKey, pod
	// records are kept in the clear, and records sealed before are
	// ErrKeyMismatch.
	Key *Key
	// SealConfigMaps seals ConfigMaps with Key too, for gateways whose
	// ConfigMaps hold what Secrets should (no effect without a Key).
	SealConfigMaps bool
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	return o
}

// OpenReport says what Open found and did, so the agent can log it, raise an
// event and set a node condition.
type OpenReport struct {
	// Path is the database file.
	Path string
	// Created is true if Open created an empty database: on first boot, or
	// after moving an unusable file aside (then Recovered is set too).
	Created bool
	// Recovered is set if the file found at Path was unusable.
	Recovered *Recovery
	// MigratedFrom is the schema version the file was migrated from, or 0.
	MigratedFrom int
	// SchemaVersion is the schema of the open database.
	SchemaVersion int
	// Quarantined lists records the migration could not convert, by key;
	// they are in the quarantine bucket.
	Quarantined map[string]error
	// Sealed counts the records written in the clear before a state key was
	// configured (pod records; ConfigMaps with SealConfigMaps) that Open
	// sealed with it.
	Sealed int
	// KeyChangedFrom is the ID of the key the pod records were sealed with
	// when Open was given another: what it sealed waits for the apiserver.
	KeyChangedFrom string
	// KeyMissing is the ID of the key the pod records are sealed with when
	// Open was given none: pod records are then neither read nor written
	// (ErrNoKey) rather than kept in the clear, until the key is back or the
	// database is removed.
	KeyMissing string
}

// Recovery describes an unusable database file that was moved aside.
type Recovery struct {
	// Kind classifies the problem; suitable as an event or condition reason.
	Kind RecoveryKind
	// Err is the detail.
	Err error
	// MovedTo is where the old file now is, kept for inspection.
	MovedTo string
	// Size is the old file's size in bytes.
	Size int64
	// Removed are older copies deleted to keep KeptCorruptCopies of them.
	Removed []string
}

// KeptCorruptCopies is how many unusable database files are kept for inspection, the newest:
// a failing card that corrupts the database at every boot must not fill the state file
// system with copies, which would then take the pods' volumes and the new database down too.
const KeptCorruptCopies = 3

// RecoveryKind classifies why a database file was unusable.
type RecoveryKind string

const (
	// RecoveryEmptyFile: the file existed with zero bytes (its content was
	// lost, e.g. by a power cut before the first fsync reached the disk).
	RecoveryEmptyFile RecoveryKind = "EmptyFile"
	// RecoveryUnreadable: bbolt could not open it (bad meta pages, not a
	// bbolt file, truncated below two pages) or panicked opening it.
	RecoveryUnreadable RecoveryKind = "Unreadable"
	// RecoveryInconsistent: it opened but reading every bucket or bbolt's
	// consistency check (tx.Check) failed: truncated, or damaged pages.
	RecoveryInconsistent RecoveryKind = "Inconsistent"
	// RecoveryForeign: a bbolt file, but not a holdfast state database.
	RecoveryForeign RecoveryKind = "Foreign"
	// RecoveryNewerSchema: written by a newer holdfast (e.g. firmware rolled
	// back); this version cannot read it.
	RecoveryNewerSchema RecoveryKind = "NewerSchema"
	// RecoveryMigrationFailed: the schema migration failed.
	RecoveryMigrationFailed RecoveryKind = "MigrationFailed"
)

func (r OpenReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "state database %s (schema v%d)", r.Path, r.SchemaVersion)
	switch {
	case r.Recovered != nil:
		fmt.Fprintf(&b, ": unusable (%s: %v), moved to %s, started empty", r.Recovered.Kind, r.Recovered.Err, r.Recovered.MovedTo)
	case r.Created:
		b.WriteString(": created")
	case r.MigratedFrom > 0:
		fmt.Fprintf(&b, ": migrated from schema v%d", r.MigratedFrom)
	default:
		b.WriteString(": opened")
	}
	if n := len(r.Quarantined); n > 0 {
		fmt.Fprintf(&b, ", %d record(s) quarantined", n)
	}
	if r.Sealed > 0 {
		fmt.Fprintf(&b, ", %d record(s) kept in the clear before a state key was configured now sealed with it", r.Sealed)
	}
	if r.KeyChangedFrom != "" {
		fmt.Fprintf(&b, ", sealed with key %s before: those records wait for the apiserver", r.KeyChangedFrom)
	}
	if r.KeyMissing != "" {
		fmt.Fprintf(&b, ", sealed with key %s, which is not loaded: pods are not kept for offline reboots", r.KeyMissing)
	}
	return b.String()
}

// Open opens (or creates) the state database at path, never failing because
// of what the file contains:
//
//   - It first takes an exclusive lock on "<path>.lock", waiting up to
//     opts.Timeout; if another process holds it, Open fails with an error
//     wrapping ErrLocked that names the path and the holder's PID.
//   - A missing file is created with an empty schema (report.Created).
//   - A file of an older schema is migrated in one transaction
//     (report.MigratedFrom); records the migration cannot read are
//     quarantined (report.Quarantined).
//   - An unusable file (zero bytes, unreadable by bbolt, failing a read of
//     every bucket or bbolt's consistency check, bbolt panicking or
//     faulting on it, a foreign or newer schema, a failed migration) is
//     renamed to "<path>.corrupt-<UTC timestamp>", kept for inspection, and
//     a fresh database is created (report.Recovered).
//
// Errors are left for what a new file cannot fix: the lock, permissions, a
// failing disk. Creation and renames are followed by an fsync of the
// directory, so a power cut cannot silently undo them.
func Open(path string, opts Options) (*BoltStore, OpenReport, error) {
	opts = opts.withDefaults()
	report := OpenReport{Path: path, SchemaVersion: SchemaVersion}
	fail := func(err error) (*BoltStore, OpenReport, error) {
		return nil, report, fmt.Errorf("open state database %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fail(fmt.Errorf("create directory: %w", err))
	}
	lock, err := acquireLock(path+".lock", opts.Timeout)
	if err != nil {
		return fail(err)
	}
	db, err := openLocked(path, opts, &report)
	if err != nil {
		_ = lock.release()
		return fail(err)
	}
	s := &BoltStore{path: path, db: db, lock: lock, now: opts.Now, seal: sealing{key: opts.Key, configMaps: opts.SealConfigMaps},
		pageSize: uint64(db.Info().PageSize), pageAllocAtOpen: pageAlloc(db), writesByBucket: map[string]uint64{}}
	s.batch = &batcher{db: db, maxBatch: opts.MaxBatch, commits: &s.commits}
	if err := s.applySealing(&report); err != nil {
		_ = s.Close()
		return fail(err)
	}
	if s.journal, err = openStatusJournal(path+journalSuffix, opts.Key); err != nil {
		_ = s.Close()
		return fail(err)
	}
	if err := s.adoptJournal(&report); err != nil {
		_ = s.Close()
		return fail(err)
	}
	s.quarantined.Store(uint64(len(report.Quarantined)))
	return s, report, nil
}

func openLocked(path string, opts Options, report *OpenReport) (*bolt.DB, error) {
	fi, err := os.Stat(path)
	var problem *Recovery
	switch {
	case errors.Is(err, fs.ErrNotExist):
		report.Created = true
		return createFresh(path, opts)
	case err != nil:
		return nil, err
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	case fi.Size() == 0:
		problem = &Recovery{Kind: RecoveryEmptyFile, Err: errors.New("the file is empty")}
	default:
		var db *bolt.DB
		db, problem, err = openExisting(path, opts, report)
		if err != nil {
			return nil, err
		}
		if problem == nil {
			return db, nil
		}
		problem.Size = fi.Size()
	}
	moved, err := moveAside(path, opts.Now())
	if err != nil {
		return nil, fmt.Errorf("the file is unusable (%s: %v) and moving it aside failed: %w", problem.Kind, problem.Err, err)
	}
	problem.MovedTo = moved
	problem.Removed = removeOldCopies(path, moved, KeptCorruptCopies)
	report.Recovered = problem
	report.Created = true
	report.MigratedFrom = 0
	report.Quarantined = nil
	return createFresh(path, opts)
}

// openExisting opens a non-empty file, verifies it and migrates it. A nil
// problem means db is ready; a non-nil problem means the file must be moved
// aside (db is closed then); err is for what moving it would not fix.
func openExisting(path string, opts Options, report *OpenReport) (*bolt.DB, *Recovery, error) {
	db, openErr, err := safeBoltOpen(path, opts.Timeout)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, nil, fmt.Errorf("%w: bbolt lock on %s held by another process (a holdfast without the lock file, or a tool such as bbolt)", ErrLocked, path)
	case openErr != nil:
		return nil, nil, openErr // the file itself could not be opened: permissions, I/O
	case err != nil:
		return nil, &Recovery{Kind: RecoveryUnreadable, Err: err}, nil
	}
	if err := verify(db); err != nil {
		_ = db.Close()
		return nil, &Recovery{Kind: RecoveryInconsistent, Err: err}, nil
	}
	var version int
	err = guardedView(db, func(tx *bolt.Tx) (err error) {
		version, err = readVersion(tx)
		return err
	})
	switch {
	case errors.Is(err, errNoSchema):
		// A bbolt file with no buckets: a first boot interrupted between
		// bbolt's initialisation and ours. Nothing was lost.
		report.Created = true
		if err := guardedUpdate(db, initSchema); err != nil {
			_ = db.Close()
			return nil, nil, fmt.Errorf("initialise schema: %w", err)
		}
		return db, nil, nil
	case err != nil:
		_ = db.Close()
		return nil, &Recovery{Kind: RecoveryForeign, Err: err}, nil
	case version > SchemaVersion:
		_ = db.Close()
		return nil, &Recovery{Kind: RecoveryNewerSchema, Err: fmt.Errorf("schema v%d is newer than v%d, the newest this holdfast reads", version, SchemaVersion)}, nil
	case version == SchemaVersion:
		return db, nil, nil
	}
	q := newQuarantiner(opts.Now)
	err = guardedUpdate(db, func(tx *bolt.Tx) error {
		q = newQuarantiner(opts.Now)
		for v := version; v < SchemaVersion; v++ {
			m, ok := migrations[v]
			if !ok {
				return fmt.Errorf("no migration from schema v%d", v)
			}
			if err := m(tx, q, opts.Key); err != nil {
				return fmt.Errorf("migrate schema v%d to v%d: %w", v, v+1, err)
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, &Recovery{Kind: RecoveryMigrationFailed, Err: err}, nil
	}
	report.MigratedFrom = version
	if len(q.errs) > 0 {
		report.Quarantined = q.errs
	}
	return db, nil, nil
}

// safeBoltOpen is bolt.Open with panics and memory faults (a truncated
// file is mapped beyond its end) turned into errors. openErr is set if the
// file could not even be opened. After a panic bbolt's own cleanup did not
// run: the file is closed here (releasing bbolt's flock); its mapping, if
// any, leaks, once, in a process that then carries on with a fresh file.
func safeBoltOpen(path string, timeout time.Duration) (db *bolt.DB, openErr, err error) {
	var file atomic.Pointer[os.File]
	opts := &bolt.Options{
		Timeout: timeout,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			if err != nil {
				openErr = err
				return nil, err
			}
			file.Store(f)
			return f, nil
		},
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if f := file.Load(); f != nil {
				_ = f.Close()
			}
			db, err = nil, fmt.Errorf("bbolt panicked opening the file: %v", r)
		}
	}()
	db, err = bolt.Open(path, 0o600, opts)
	return db, openErr, err
}

// verify reads every key and value of every bucket (so a page beyond the
// end of a truncated file faults here, where it is recovered, rather than
// later) and then runs bbolt's consistency check.
func verify(db *bolt.DB) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading the file panicked: %v", r)
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		// A file cut short (a partial copy, a power cut on a filesystem that lost the tail)
		// may still have readable buckets while its freelist or free pages lie past the end,
		// which only the next write would trip on: catch it here.
		if fi, err := os.Stat(db.Path()); err == nil && fi.Size() < tx.Size() {
			return fmt.Errorf("file is %d bytes, shorter than the %d bytes its metadata describes: truncated", fi.Size(), tx.Size())
		}
		var sum uint32
		var walk func(b *bolt.Bucket)
		walk = func(b *bolt.Bucket) {
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				sum = crc32.Update(sum, castagnoli, k)
				if v == nil {
					if sub := b.Bucket(k); sub != nil {
						walk(sub)
					}
					continue
				}
				sum = crc32.Update(sum, castagnoli, v)
			}
		}
		if err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			walk(b)
			return nil
		}); err != nil {
			return err
		}
		_ = sum
		var problems []error
		for err := range tx.Check() {
			problems = append(problems, err)
		}
		if n := len(problems); n > 0 {
			if n > 5 {
				problems = append(problems[:5], fmt.Errorf("and %d more", n-5))
			}
			return fmt.Errorf("consistency check: %w", errors.Join(problems...))
		}
		return nil
	})
}

// createFresh creates an empty database of the current schema. It is built
// under "<path>.new" and renamed into place once initialised and fsynced,
// then the directory is fsynced: a crash at any point leaves either no file
// at path or a complete one, never an empty file that the next boot would
// have to report as lost content.
func createFresh(path string, opts Options) (*bolt.DB, error) {
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: opts.Timeout})
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	err = guardedUpdate(db, initSchema)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("initialise schema: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("sync directory: %w", err)
	}
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.Timeout})
	if err != nil {
		return nil, fmt.Errorf("open after create: %w", err)
	}
	return db, nil
}

// removeOldCopies deletes the moved-aside copies of path but the one just made and the
// newest keep-1 others, newest by the time in their name and then by their counter, and
// returns the ones deleted. The one just made is kept whatever its name says: a gateway
// without a real-time clock may boot at a time before the older copies'. A copy that cannot
// be deleted is left; the next recovery tries again.
func removeOldCopies(path, justMade string, keep int) []string {
	copies := slices.DeleteFunc(copiesWithPrefix(path+".corrupt-"), func(c string) bool { return c == justMade })
	keep-- // the one just made
	if len(copies) <= keep {
		return nil
	}
	order := func(name string) (string, int) {
		stamp, n, _ := strings.Cut(strings.TrimPrefix(name, path+".corrupt-"), "-")
		counter, err := strconv.Atoi(n)
		if err != nil {
			counter = 1 // the first of its second
		}
		return stamp, counter
	}
	slices.SortFunc(copies, func(a, b string) int {
		sa, ca := order(a)
		sb, cb := order(b)
		return cmp.Or(strings.Compare(sa, sb), cmp.Compare(ca, cb))
	})
	var removed []string
	for _, c := range copies[:len(copies)-keep] {
		if err := os.Remove(c); err == nil {
			removed = append(removed, c)
		}
	}
	return removed
}

// copiesWithPrefix lists the files of prefix's directory whose path starts with prefix.
func copiesWithPrefix(prefix string) []string {
	entries, err := os.ReadDir(filepath.Dir(prefix))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if p := filepath.Join(filepath.Dir(prefix), e.Name()); strings.HasPrefix(p, prefix) {
			out = append(out, p)
		}
	}
	return out
}

// moveAside renames path to "<path>.corrupt-<UTC timestamp>" (with a
// counter above any of that second's copies if that exists, so that the
// counter orders them even after older ones were removed) and fsyncs the
// directory.
func moveAside(path string, now time.Time) (string, error) {
	base := path + ".corrupt-" + now.UTC().Format("20060102T150405Z")
	target := base
	if others := copiesWithPrefix(base); len(others) > 0 {
		highest := 1
		for _, o := range others {
			if n, err := strconv.Atoi(strings.TrimPrefix(o, base+"-")); err == nil {
				highest = max(highest, n)
			}
		}
		target = base + "-" + strconv.Itoa(highest+1)
	}
	for i := 2; ; i++ { // never over a file, whatever its name says
		if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
			break
		}
		target = base + "-" + strconv.Itoa(i)
	}
	if err := os.Rename(path, target); err != nil {
		return "", err
	}
	if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
		return target, fmt.Errorf("sync directory after rename: %w", err)
	}
	return target, nil
}
