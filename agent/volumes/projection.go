package volumes

import (
	"crypto/sha256"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// projection is what a content volume's directory held after the agent last wrote or checked
// it: the payload's digest and the identity of every inode the payload is made of, as lstat
// gives it. A resync that brings the same payload compares these with lstat alone and is done
// when nothing moved. Verifying the files themselves means listing the data directory,
// reading ..data and the visible links and reading every file, and each of those updates an
// access time the first time after a write and once a day after (relatime): a dirtied inode,
// a write to the gateway's flash, for every volume of every pod. lstat updates none.
//
// What it catches: a file rewritten, replaced, chmodded or chowned (its mtime, inode, size,
// mode or owner), a name added or removed at any level (its directory's mtime), ..data
// switched (a new link inode). Anything else a hand on the host could do to the files keeps
// its inode and times only by setting them back on purpose; the next agent start checks the
// files themselves again.
type projection struct {
	digest [sha256.Size]byte
	inodes map[string]inodeKey // by path relative to the volume directory
}

// inodeKey is what lstat says about one inode that changes when it is written, replaced,
// chmodded or chowned.
type inodeKey struct {
	dev, ino   uint64
	mode       uint32
	uid, gid   uint32
	size       int64
	mtimeNanos int64
}

func lstatKey(p string) (inodeKey, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return inodeKey{}, &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	return inodeKey{
		dev: uint64(st.Dev), ino: st.Ino, mode: st.Mode, uid: st.Uid, gid: st.Gid,
		size: st.Size, mtimeNanos: st.Mtim.Nano(),
	}, nil
}

// payloadDigest is a digest of payload's paths, modes and bytes.
func payloadDigest(payload map[string]file) [sha256.Size]byte {
	// By the cleaned path, as writeAtomic writes it; the file looked up by its own key.
	clean := make(map[string]file, len(payload))
	paths := make([]string, 0, len(payload))
	for p, f := range payload {
		p = filepath.Clean(p)
		clean[p] = f
		paths = append(paths, p)
	}
	sort.Strings(paths)
	h := sha256.New()
	var n [8]byte
	for _, p := range paths {
		f := clean[p]
		// Lengths first, so that no two payloads give the same stream.
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
		binary.BigEndian.PutUint64(n[:], uint64(f.mode))
		h.Write(n[:])
		binary.BigEndian.PutUint64(n[:], uint64(len(f.data)))
		h.Write(n[:])
		h.Write(f.data)
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// recordProjection lstats what writeAtomic left in dir for payload, its data directory being
// ts: the volume directory, ..data, the data directory and every directory and file in it that
// the payload names, and the visible links.
func recordProjection(dir, ts string, payload map[string]file, digest [sha256.Size]byte) (*projection, error) {
	paths := map[string]bool{".": true, dataDirName: true, ts: true}
	for p := range payload {
		p = filepath.Clean(p)
		paths[strings.SplitN(p, string(os.PathSeparator), 2)[0]] = true // its visible link
		for sub := p; sub != "." && sub != ""; sub = filepath.Dir(sub) {
			paths[filepath.Join(ts, sub)] = true
		}
	}
	pr := &projection{digest: digest, inodes: make(map[string]inodeKey, len(paths))}
	for p := range paths {
		k, err := lstatKey(filepath.Join(dir, p))
		if err != nil {
			return nil, err
		}
		pr.inodes[p] = k
	}
	return pr, nil
}

// unchanged reports whether dir still holds what pr recorded, for a payload of digest.
func (pr *projection) unchanged(dir string, digest [sha256.Size]byte) bool {
	if pr == nil || pr.digest != digest {
		return false
	}
	for p, want := range pr.inodes {
		got, err := lstatKey(filepath.Join(dir, p))
		if err != nil || got != want {
			return false
		}
	}
	return true
}
