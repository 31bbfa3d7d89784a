package gc

import (
	"context"
	"fmt"
	"golang.org/x/sys/unix"
)

// ImageFilesystem is the image file system, whose usage image collection and the eviction
// manager's imagefs signals measure.
type ImageFilesystem interface {
	Filesystem
	// Root is a path on it.
	Root(ctx context.Context) (string, error)
}

// StatFS returns the size and the space available to unprivileged users of the file system
// holding path, as df counts them.
func StatFS(path string) (capacity, available uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	bsize := uint64(st.Bsize)
	return uint64(st.Blocks) * bsize, uint64(st.Bavail) * bsize, nil
}
