package volumes

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// file is one file of a content volume: its bytes and permission bits.
type file struct {
	data []byte
	mode os.FileMode
}

const (
	dataDirName    = "..data"
	newDataDirName = "..data_tmp"

	maxFileNameLength = 255
	maxPathLength     = 4096
)

// writeAtomic projects payload into dir the way kubelet's AtomicWriter does, so containers that
// watch ..data (or simply re-read files) see a consistent set:
//
//	dir/KEY            -> ..data/KEY          (one symlink per top-level name)
//	dir/..data         -> ..2006_01_02_15_04_05.NNN
//	dir/..2006_...NNN/ the files themselves
//
// When the payload equals what ..data holds, nothing is written (flash wears out) and it
// reports false. Otherwise the new set is written and fsynced in a fresh timestamped directory,
// ..data is switched to it with one rename (atomic), the visible symlinks are added or removed,
// and the old directory is deleted. A crash at any point leaves the old set or the new one
// visible. Names beginning with ".." are reserved. dir must exist. The caller serializes writes
// to one dir. ts is the name of the data directory ..data names afterwards ("" on an error
// before it was known).
func writeAtomic(dir string, payload map[string]file) (ts string, changed bool, err error) {
	clean := make(map[string]file, len(payload))
	for p, f := range payload {
		if err := validatePayloadPath(p); err != nil {
			return "", false, err
		}
		clean[filepath.Clean(p)] = f
	}

	dataDir := filepath.Join(dir, dataDirName)
	oldTs, err := os.Readlink(dataDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("read %s: %w", dataDir, err)
	}
	var toRemove map[string]bool
	if oldTs != "" {
		oldPath := filepath.Join(dir, oldTs)
		if toRemove, err = stalePaths(clean, oldPath); err != nil {
			return oldTs, false, err
		}
		same, err := payloadMatches(clean, oldPath)
		if err != nil {
			return oldTs, false, err
		}
		if same && len(toRemove) == 0 {
			// Up to date; still make sure every visible link exists (a crash may have come
			// between the swap and the links).
			return oldTs, false, createVisibleLinks(dir, clean)
		}
	}

	tsDir, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return oldTs, false, fmt.Errorf("create data directory in %s: %w", dir, err)
	}
	// 0755 whatever the umask: other users in the container must be able to reach the files.
	if err := os.Chmod(tsDir, 0o755); err != nil {
		os.RemoveAll(tsDir)
		return oldTs, false, err
	}
	if err := writePayload(tsDir, clean); err != nil {
		os.RemoveAll(tsDir)
		return oldTs, false, err
	}
	newLink := filepath.Join(dir, newDataDirName)
	os.Remove(newLink) // left over by a crash between symlink and rename
	if err := os.Symlink(filepath.Base(tsDir), newLink); err != nil {
		os.RemoveAll(tsDir)
		return oldTs, false, fmt.Errorf("create %s: %w", newLink, err)
	}
	if err := os.Rename(newLink, dataDir); err != nil {
		os.Remove(newLink)
		os.RemoveAll(tsDir)
		return oldTs, false, fmt.Errorf("switch %s: %w", dataDir, err)
	}
	if err := fsutil.SyncDir(dir); err != nil {
		return filepath.Base(tsDir), true, err
	}
	if err := createVisibleLinks(dir, clean); err != nil {
		return filepath.Base(tsDir), true, err
	}
	for p := range toRemove {
		// Only top-level names are links; deeper paths went away with the old directory.
		if strings.Contains(p, string(os.PathSeparator)) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return filepath.Base(tsDir), true, fmt.Errorf("remove stale %s: %w", p, err)
		}
	}
	if oldTs != "" && oldTs != filepath.Base(tsDir) {
		if err := os.RemoveAll(filepath.Join(dir, oldTs)); err != nil {
			return filepath.Base(tsDir), true, fmt.Errorf("remove old data directory: %w", err)
		}
	}
	removeLeftovers(dir, filepath.Base(tsDir))
	return filepath.Base(tsDir), true, nil
}

// validatePayloadPath refuses what could escape the volume or collide with the writer's own
// names: absolute paths, "..", names starting with "..", over-long names.
func validatePayloadPath(p string) error {
	if p == "" {
		return errors.New("invalid path: must not be empty")
	}
	if path.IsAbs(p) {
		return fmt.Errorf("invalid path: must be relative path: %s", p)
	}
	if len(p) > maxPathLength {
		return fmt.Errorf("invalid path: must be less than or equal to %d characters", maxPathLength)
	}
	items := strings.Split(p, "/")
	for _, item := range items {
		if item == ".." {
			return fmt.Errorf("invalid path: must not contain '..': %s", p)
		}
		if len(item) > maxFileNameLength {
			return fmt.Errorf("invalid path: filenames must be less than or equal to %d characters", maxFileNameLength)
		}
	}
	if strings.HasPrefix(items[0], "..") && len(items[0]) > 2 {
		return fmt.Errorf("invalid path: must not start with '..': %s", p)
	}
	return nil
}

// payloadMatches reports whether oldDir holds exactly payload's bytes and modes.
func payloadMatches(payload map[string]file, oldDir string) (bool, error) {
	for p, f := range payload {
		full := filepath.Join(oldDir, p)
		fi, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != f.mode.Perm() {
			return false, nil
		}
		// Without updating its access time: the resync compares every content volume every
		// volumeResyncPeriod, and the first read after a write would dirty the inode.
		b, err := fsutil.ReadFileNoAtime(full)
		if err != nil {
			return false, err
		}
		if !bytes.Equal(b, f.data) {
			return false, nil
		}
	}
	return true, nil
}

// stalePaths lists the paths in oldDir that the new payload no longer has (directories that
// still lead to a new file are kept).
func stalePaths(payload map[string]file, oldDir string) (map[string]bool, error) {
	keep := map[string]bool{}
	for p := range payload {
		for sub := p; sub != "." && sub != ""; sub = filepath.Dir(sub) {
			keep[sub] = true
		}
	}
	stale := map[string]bool{}
	err := fsutil.WalkDirNoAtime(oldDir, func(full string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(oldDir, full)
		if err != nil || rel == "." {
			return err
		}
		if !keep[rel] {
			stale[rel] = true
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return stale, err
}

// writePayload writes and fsyncs every file of payload under dir, then the directories.
func writePayload(dir string, payload map[string]file) error {
	dirs := map[string]bool{dir: true}
	names := make([]string, 0, len(payload))
	for p := range payload {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		f := payload[p]
		full := filepath.Join(dir, p)
		parent := filepath.Dir(full)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", parent, err)
		}
		for d := parent; d != dir && strings.HasPrefix(d, dir); d = filepath.Dir(d) {
			dirs[d] = true
		}
		if err := writeFileSync(full, f.data, f.mode.Perm()); err != nil {
			return err
		}
	}
	for d := range dirs {
		if err := fsutil.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func writeFileSync(name string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	// The mode asked for, whatever the umask.
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", name, err)
	}
	return f.Close()
}

// createVisibleLinks makes dir/NAME -> ..data/NAME for every top-level name of the payload.
func createVisibleLinks(dir string, payload map[string]file) error {
	for p := range payload {
		top := strings.SplitN(p, string(os.PathSeparator), 2)[0]
		link := filepath.Join(dir, top)
		if _, err := os.Readlink(link); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("visible path %s is not a link into ..data: %w", link, err)
		}
		if err := os.Symlink(filepath.Join(dataDirName, top), link); err != nil {
			return fmt.Errorf("create %s: %w", link, err)
		}
	}
	return nil
}

// removeLeftovers deletes timestamped directories other than current that a crash in the
// middle of a write left behind.
func removeLeftovers(dir, current string) {
	entries, err := fsutil.ReadDirNoAtime(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() && strings.HasPrefix(n, "..") && n != current && n != dataDirName {
			os.RemoveAll(filepath.Join(dir, n))
		}
	}
}

// hasData reports whether dir already holds a written set of files (it survives an agent
// restart, and a reboot for disk-backed volumes).
func hasData(dir string) bool {
	// lstat, not readlink: reading a link updates its access time (see projection).
	fi, err := os.Lstat(filepath.Join(dir, dataDirName))
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}
