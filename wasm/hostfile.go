package wasm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/holdfast-dev/holdfast/policies/abi"
)

// FileMount maps a directory of the host into the guest's view of paths,
// like a mount in a container: for a probe, the container's root filesystem
// at "/" and its volumes at their mount paths.
type FileMount struct {
	// GuestPath is where the directory appears to the guest, e.g. "/".
	GuestPath string
	// HostPath is the directory on the host, e.g. the container's rootfs.
	HostPath string
}

type fileAccess struct {
	prefixes []string
	mounts   []FileMount
}

// WithFiles lets read_file and stat_file read, during this call, paths
// under one of prefixes (guest paths, e.g. "/run/app"), found through
// mounts. Resolution never leaves the matching prefix: ".." and symlinks are
// resolved inside it (os.Root), so a symlink planted by the workload cannot
// reach host files or other parts of the container (see containerd
// GHSA-rgh6-rfwx-v388). Without this option no path is readable.
func WithFiles(prefixes []string, mounts ...FileMount) CallOption {
	return func(o *callOptions) {
		fa := &fileAccess{}
		for _, p := range prefixes {
			if strings.HasPrefix(p, "/") {
				fa.prefixes = append(fa.prefixes, path.Clean(p))
			}
		}
		for _, m := range mounts {
			if strings.HasPrefix(m.GuestPath, "/") && m.HostPath != "" {
				fa.mounts = append(fa.mounts, FileMount{GuestPath: path.Clean(m.GuestPath), HostPath: filepath.Clean(m.HostPath)})
			}
		}
		o.files = fa
	}
}

// under reports whether p is dir or inside it (both clean, absolute).
func under(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// relTo returns p relative to dir (p under dir), "." for dir itself.
func relTo(p, dir string) string {
	r := strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
	if dir == "/" {
		r = strings.TrimPrefix(p, "/")
	}
	if r == "" {
		return "."
	}
	return r
}

// fileError is a refusal or failure of a file host function.
type fileError struct {
	code string
	msg  string
}

func (e *fileError) Error() string { return e.msg }

// resolve maps guestPath, lexically, to the mount holding it: the mount's
// host directory, the directory inside it that confines the access (the
// allowed prefix, or the mount itself if the prefix lies above it), and the
// path below that directory. Nothing is opened yet.
func (fa *fileAccess) resolve(guestPath string) (hostDir, confine, rel string, err error) {
	if fa == nil || len(fa.prefixes) == 0 {
		return "", "", "", &fileError{"denied", "no file access for this call"}
	}
	if !strings.HasPrefix(guestPath, "/") || strings.ContainsRune(guestPath, 0) {
		return "", "", "", &fileError{"invalid", fmt.Sprintf("path %.256q must be absolute", guestPath)}
	}
	p := path.Clean(guestPath) // lexical: "/a/../etc" becomes "/etc" before the prefix check
	prefix := ""
	for _, pre := range fa.prefixes {
		if under(p, pre) && len(pre) > len(prefix) {
			prefix = pre
		}
	}
	if prefix == "" {
		return "", "", "", &fileError{"denied", fmt.Sprintf("path %.256q is outside the allowed prefixes %v", p, fa.prefixes)}
	}
	var mount *FileMount
	for i := range fa.mounts {
		m := &fa.mounts[i]
		if under(p, m.GuestPath) && (mount == nil || len(m.GuestPath) > len(mount.GuestPath)) {
			mount = m
		}
	}
	if mount == nil {
		return "", "", "", &fileError{"not_found", fmt.Sprintf("nothing is mounted at %.256q", p)}
	}
	confineAt := mount.GuestPath
	if under(prefix, mount.GuestPath) {
		confineAt = prefix
	}
	return mount.HostPath, relTo(confineAt, mount.GuestPath), relTo(p, confineAt), nil
}

// openConfinedRoot opens rel inside hostDir/confine with os.Root: ".." and
// symlinks are followed only while they stay inside; an absolute symlink is
// refused (os.Root cannot read it relative to the container's root). It is
// the portable fallback of openConfined.
func openConfinedRoot(hostDir, confine, rel string, flags int) (*os.File, error) {
	root, err := os.OpenRoot(hostDir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if confine != "." {
		sub, err := root.OpenRoot(confine)
		if err != nil {
			return nil, err
		}
		defer sub.Close()
		root = sub
	}
	return root.OpenFile(rel, flags, 0)
}

func fsError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &fileError{"not_found", err.Error()}
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ELOOP):
		return &fileError{"denied", err.Error()}
	}
	// os.Root refuses a path or symlink that leaves the root with a
	// PathError whose cause is its own (unexported) error, not an errno.
	var pe *fs.PathError
	var errno syscall.Errno
	if errors.As(err, &pe) && !errors.As(pe.Err, &errno) {
		return &fileError{"denied", err.Error()}
	}
	return &fileError{"io", err.Error()}
}

// openGuestFile opens a regular file for reading. It never blocks on a FIFO.
func (fa *fileAccess) openGuestFile(guestPath string) (*os.File, fs.FileInfo, error) {
	hostDir, confine, rel, err := fa.resolve(guestPath)
	if err != nil {
		return nil, nil, err
	}
	f, err := openConfined(hostDir, confine, rel, false)
	if err != nil {
		return nil, nil, fsError(err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fsError(err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, &fileError{"invalid", fmt.Sprintf("%.256q is not a regular file (%s)", guestPath, fi.Mode().Type())}
	}
	return f, fi, nil
}

func (fa *fileAccess) statGuestFile(guestPath string) (fs.FileInfo, error) {
	hostDir, confine, rel, err := fa.resolve(guestPath)
	if err != nil {
		return nil, err
	}
	f, err := openConfined(hostDir, confine, rel, true)
	if err != nil {
		return nil, fsError(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fsError(err)
	}
	return fi, nil
}

// FileRequest is abi.FileRequest (see policies/abi).
type FileRequest = abi.FileRequest

// FileContent is abi.FileContent (see policies/abi).
type FileContent = abi.FileContent

// FileStat is abi.FileStat (see policies/abi).
type FileStat = abi.FileStat

func fileAnswer(err error) hostError {
	var fe *fileError
	if errors.As(err, &fe) {
		return hostError{Error: fe.msg, Code: fe.code}
	}
	return hostError{Error: err.Error(), Code: "io"}
}

func readFile(ctx context.Context, st *callState, raw []byte) any {
	var req FileRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return hostError{Error: "request: " + err.Error(), Code: "invalid"}
	}
	files, lim := st.opts.files, st.m.limits
	return st.m.fileOp(ctx, func() any {
		f, fi, err := files.openGuestFile(req.Path)
		if err != nil {
			return fileAnswer(err)
		}
		defer f.Close()
		limit := lim.HostResponseBytes // escaped, the data is no shorter
		if req.MaxBytes > 0 && req.MaxBytes < limit {
			limit = req.MaxBytes
		}
		data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
		if err != nil {
			return fileAnswer(fsError(err))
		}
		out := FileContent{Size: fi.Size()}
		if len(data) > limit {
			data, out.Truncated = data[:limit], true
		}
		out.Data = string(data)
		fitAnswer(&out, &out.Data, &out.Truncated, lim.HostResponseBytes)
		return out
	})
}

func statFile(ctx context.Context, st *callState, raw []byte) any {
	var req FileRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return hostError{Error: "request: " + err.Error(), Code: "invalid"}
	}
	files := st.opts.files
	return st.m.fileOp(ctx, func() any {
		fi, err := files.statGuestFile(req.Path)
		if err != nil {
			return fileAnswer(err)
		}
		return FileStat{Size: fi.Size(), ModTimeUnixNano: fi.ModTime().UnixNano(), Mode: fi.Mode().String(), IsDir: fi.IsDir()}
	})
}

// fileOp runs op, the file system work of read_file or stat_file, so that
// the call's deadline holds even when the kernel does not return: an open or
// a read on a hung NFS server or FUSE daemon (a volume of the pod) blocks
// without end and cannot be interrupted. op runs on a goroutine of its own;
// at the deadline the guest gets a "timeout" answer and the goroutine is
// left to finish when the kernel lets it, then closes its file and drops
// what it read. Such goroutines have no owner that waits for them, as none
// could: each holds a slot of the module's fileOps, so a policy has at most
// MaxInstances of them, and while all are blocked its file accesses are
// answered "timeout" at once.
func (m *Module) fileOp(ctx context.Context, op func() any) any {
	select {
	case m.fileOps <- struct{}{}:
	default:
		return hostError{Error: fmt.Sprintf("%d earlier file accesses of this policy are still blocked in the kernel (a hung file system?)", cap(m.fileOps)), Code: "timeout"}
	}
	done := make(chan any, 1)
	go func() {
		defer func() { <-m.fileOps }()
		done <- op()
	}()
	select {
	case answer := <-done:
		return answer
	case <-ctx.Done():
		return hostError{Error: "the file system did not answer before the call's deadline", Code: "timeout"}
	}
}
