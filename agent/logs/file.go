package logs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// rotationFormat is the suffix of a rotated log file, kubelet's: ATTEMPT.log.20261102-100405.
const rotationFormat = "20060102-150405"

// rotationRetry is how long a failed rotation waits before it is tried again; meanwhile lines
// go on to the current file.
const rotationRetry = 10 * time.Second

// FileOptions configure a log file.
type FileOptions struct {
	// MaxSize is the size in bytes past which the file is rotated; 0 never rotates.
	MaxSize int64
	// MaxFiles is how many files (the live one included) are kept; below 2 means 2.
	MaxFiles int
	// Now is the clock for rotation names; defaults to time.Now.
	Now func() time.Time
}

// File is a container log file being written, rotated by size. It is safe for concurrent
// use: each Write lands whole.
type File struct {
	loc  location
	opts FileOptions

	mu      sync.Mutex // protects the fields below
	dir     *os.File   // the directory, opened without following symlinks
	f       *os.File   // the live file
	size    int64
	retryAt time.Time // no rotation before this time (a rotation failed)
}

// OpenFile opens (creating it and its directories as needed) the log file at path for
// appending. root is the pod log root (see the package doc on symlinks); empty means three
// levels up from path.
func OpenFile(root, path string, opts FileOptions) (*File, error) {
	loc, err := locate(root, path)
	if err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.MaxFiles = max(opts.MaxFiles, 2)
	dir, err := openDir(loc, true)
	if err != nil {
		return nil, err
	}
	f, err := openFileAt(dir, loc.name, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o640)
	if err != nil {
		dir.Close()
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		dir.Close()
		return nil, err
	}
	lf := &File{loc: loc, opts: opts, dir: dir, f: f, size: st.Size()}
	if err := lf.prune(); err != nil {
		lf.Close()
		return nil, err
	}
	return lf, nil
}

// Path is the live file's path.
func (lf *File) Path() string { return lf.loc.path() }

// Write appends line with one write(2), rotating the file first if the line would take it past
// the maximum size. A line larger than the maximum size goes whole into a fresh file.
func (lf *File) Write(line []byte) (int, error) {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.f == nil {
		return 0, os.ErrClosed
	}
	var rotateErr error
	if lf.opts.MaxSize > 0 && lf.size > 0 && lf.size+int64(len(line)) > lf.opts.MaxSize && !lf.opts.Now().Before(lf.retryAt) {
		if rotateErr = lf.rotateLocked(); rotateErr != nil {
			lf.retryAt = lf.opts.Now().Add(rotationRetry)
		}
	}
	n, err := lf.f.Write(line)
	if err != nil && n > 0 {
		// A full file system took part of the line: take it back, so that the file holds
		// whole lines only and the next line does not run on from a torn one.
		if terr := lf.f.Truncate(lf.size); terr == nil {
			n = 0
		}
	}
	lf.size += int64(n)
	return n, errors.Join(err, rotateErr)
}

// rotateLocked syncs and renames the live file, starts a new one, syncs the directory and
// prunes old rotated files. If the new file cannot be made, writing goes on to the renamed
// one.
func (lf *File) rotateLocked() error {
	if err := lf.f.Sync(); err != nil {
		return fmt.Errorf("rotate %s: sync: %w", lf.Path(), err)
	}
	rotated, err := lf.rotatedName()
	if err != nil {
		return err
	}
	dfd := int(lf.dir.Fd())
	if err := unix.Renameat(dfd, lf.loc.name, dfd, rotated); err != nil {
		return fmt.Errorf("rotate %s: rename to %s: %w", lf.Path(), rotated, err)
	}
	f, err := openFileAt(lf.dir, lf.loc.name, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_EXCL, 0o640)
	if err != nil {
		return fmt.Errorf("rotate %s: %w", lf.Path(), err)
	}
	old := lf.f
	lf.f, lf.size = f, 0
	closeErr := old.Close()
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("rotate %s: sync directory: %w", lf.Path(), err)
	}
	return errors.Join(closeErr, lf.prune())
}

// rotatedName is NAME.YYYYMMDD-HHMMSS, or with -001, -002 ... when that name is taken.
func (lf *File) rotatedName() (string, error) {
	return rotatedName(lf.dir, lf.loc.name, lf.opts.Now())
}

// rotatedName is a free name in dir for the rotation of name at now.
func rotatedName(dir *os.File, name string, now time.Time) (string, error) {
	base := name + "." + now.UTC().Format(rotationFormat)
	for i := 0; i < 1000; i++ {
		rotated := base
		if i > 0 {
			rotated = fmt.Sprintf("%s-%03d", base, i)
		}
		var st unix.Stat_t
		err := unix.Fstatat(int(dir.Fd()), rotated, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			return rotated, nil
		} else if err != nil {
			return "", fmt.Errorf("rotate %s: %w", filepath.Join(dir.Name(), name), &os.PathError{Op: "stat", Path: filepath.Join(dir.Name(), rotated), Err: err})
		}
	}
	return "", fmt.Errorf("rotate %s: more than 1000 rotations in one second", filepath.Join(dir.Name(), name))
}

// prune removes the oldest rotated files beyond MaxFiles-1.
func (lf *File) prune() error { return pruneRotated(lf.dir, lf.loc.name, lf.opts.MaxFiles) }

// pruneRotated removes the oldest rotated files of name in dir beyond maxFiles-1.
func pruneRotated(dir *os.File, name string, maxFiles int) error {
	names, err := rotatedNames(dir, name)
	if err != nil {
		return fmt.Errorf("prune rotated logs of %s: %w", filepath.Join(dir.Name(), name), err)
	}
	var errs []error
	for _, n := range names[:max(0, len(names)-(maxFiles-1))] {
		if err := unix.Unlinkat(int(dir.Fd()), n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, &os.PathError{Op: "remove", Path: filepath.Join(dir.Name(), n), Err: err})
		}
	}
	return errors.Join(errs...)
}

// RotateAside rotates a log file another process writes (a CRI runtime writes its containers'
// logs itself), as the kubelet's container log manager does: the live file at path is renamed
// to its rotated name and the rotated files beyond maxFiles-1 are removed; the writer is then
// asked to reopen path, which makes a new file. If it cannot, undo renames the file back, so
// that no output goes to a file the readers no longer see. Following no symlink.
func RotateAside(path string, maxFiles int, now time.Time) (undo func() error, err error) {
	loc, err := locate("", path)
	if err != nil {
		return nil, err
	}
	dir, err := openDir(loc, false)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	rotated, err := rotatedName(dir, loc.name, now)
	if err != nil {
		return nil, err
	}
	if err := unix.Renameat(int(dir.Fd()), loc.name, int(dir.Fd()), rotated); err != nil {
		return nil, fmt.Errorf("rotate %s: rename to %s: %w", path, rotated, err)
	}
	undo = func() error {
		if err := os.Rename(filepath.Join(filepath.Dir(path), rotated), path); err != nil {
			return fmt.Errorf("undo the rotation of %s: %w", path, err)
		}
		return nil
	}
	return undo, pruneRotated(dir, loc.name, maxFiles)
}

// Close syncs and closes the file: what was written survives a power cut.
func (lf *File) Close() error {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.f == nil {
		return nil
	}
	syncErr := lf.f.Sync()
	err := errors.Join(syncErr, lf.f.Close(), lf.dir.Close())
	lf.f, lf.dir = nil, nil
	return err
}
