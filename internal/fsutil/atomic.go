// Package fsutil holds the few file-system helpers holdfast needs to be safe on power loss.
package fsutil

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteJSONAtomic writes v as JSON to path: temp file, fsync, rename, fsync dir, so a power
// cut leaves either the old record or the new one.
func WriteJSONAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, b, 0o600)
}

// WriteFileAtomic writes data to path with permissions perm: temp file, fsync, rename, fsync
// dir, so a power cut leaves either the old content or the new one. The directory is created
// (0700) if missing.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return placeDurably(path, data, perm, os.Rename)
}

// CreateFileExclusive makes path hold data with permissions perm, unless path exists (an
// error wrapping fs.ErrExist): temp file, fsync, link into place (a link, unlike a rename,
// fails on an existing name), fsync dir. Two writers racing for one name agree on one content.
func CreateFileExclusive(path string, data []byte, perm os.FileMode) error {
	return placeDurably(path, data, perm, os.Link)
}

// placeDurably writes data to a synced temporary file beside path, puts it in place with
// place(temp, path), and syncs the directory. The directory is created (0700) if missing.
func placeDurably(path string, data []byte, perm os.FileMode, place func(oldpath, newpath string) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err := place(f.Name(), path); err != nil {
		return fmt.Errorf("put %s in place: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory, so that a rename or a file creation in it survives a power cut.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
