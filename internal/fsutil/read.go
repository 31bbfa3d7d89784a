package fsutil

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ReadFileNoAtime reads a file without updating its access time. A plain read of a file
// written since it was last read updates it (relatime), which dirties the inode: a record
// the agent reads at every sync of a pod would cost the flash a write after each change, and
// once a day. Where O_NOATIME is refused (a file the process does not own) it reads plainly.
func ReadFileNoAtime(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		f, err = os.Open(path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
