package fsutil

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// The agent reads the same files and lists the same directories again and again: records at
// every sync of a pod, the pods' directories at every relist, GC and eviction pass, the
// manifest directory at every rescan. A plain read or listing of a file or directory changed
// since it was last read updates its access time (relatime), and again once a day: a dirtied
// inode, a write to the gateway's flash for nothing. These read without updating it.

// openNoAtime opens path read-only with O_NOATIME, or plainly where O_NOATIME is refused (a
// file the process does not own, without CAP_FOWNER).
func openNoAtime(path string, flags int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|flags|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		f, err = os.OpenFile(path, os.O_RDONLY|flags, 0)
	}
	return f, err
}

// ReadFileNoAtime is os.ReadFile without updating the file's access time.
func ReadFileNoAtime(path string) ([]byte, error) {
	f, err := openNoAtime(path, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// ReadDirNoAtime is os.ReadDir (the entries sorted by name) without updating the directory's
// access time.
func ReadDirNoAtime(dir string) ([]os.DirEntry, error) {
	f, err := openNoAtime(dir, unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}

// WalkDirNoAtime is filepath.WalkDir without updating the directories' access times: the same
// order, the same calls of fn, the same meaning of fs.SkipDir and fs.SkipAll; symbolic links
// are not followed.
func WalkDirNoAtime(root string, fn fs.WalkDirFunc) error {
	info, err := os.Lstat(root)
	if err != nil {
		err = fn(root, nil, err)
	} else {
		err = walkDirNoAtime(root, fs.FileInfoToDirEntry(info), fn)
	}
	if err == filepath.SkipDir || err == filepath.SkipAll {
		return nil
	}
	return err
}

// walkDirNoAtime is filepath.WalkDir's walkDir with ReadDirNoAtime.
func walkDirNoAtime(path string, d fs.DirEntry, fn fs.WalkDirFunc) error {
	if err := fn(path, d, nil); err != nil || !d.IsDir() {
		if err == filepath.SkipDir && d.IsDir() {
			err = nil // skip the directory's contents
		}
		return err
	}
	entries, err := ReadDirNoAtime(path)
	if err != nil {
		// Second call, to report the error.
		if err = fn(path, d, err); err != nil {
			if err == filepath.SkipDir && d.IsDir() {
				err = nil
			}
			return err
		}
	}
	for _, e := range entries {
		if err := walkDirNoAtime(filepath.Join(path, e.Name()), e, fn); err != nil {
			if err == filepath.SkipDir {
				break
			}
			return err
		}
	}
	return nil
}
