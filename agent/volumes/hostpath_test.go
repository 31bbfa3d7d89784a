package volumes

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/prereq"
)

// findBlockDevice returns some block device of the machine or, if /dev has none (a
// container's), a block device node made in dir (root: mknod).
func findBlockDevice(t *testing.T, dir string) string {
	t.Helper()
	entries, _ := os.ReadDir("/dev")
	for _, e := range entries {
		p := filepath.Join("/dev", e.Name())
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			return p
		}
	}
	p := filepath.Join(dir, "block")
	prereq.NoError(t, unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))), "a block device, or mknod to make one (root)")
	return p
}

func TestCheckHostPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	link := filepath.Join(dir, "link-to-dir")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	block := findBlockDevice(t, dir)

	for _, tc := range []struct {
		path    string
		typ     *v1.HostPathType
		wantErr string // "" for success
		created os.FileMode
	}{
		{path: dir, typ: ptr.To(v1.HostPathDirectory)},
		{path: link, typ: ptr.To(v1.HostPathDirectory)}, // symlinks are followed, as in kubelet
		{path: file, typ: ptr.To(v1.HostPathDirectory), wantErr: "hostPath type check failed: " + file + " is not a directory, it's a File"},
		{path: missing, typ: ptr.To(v1.HostPathDirectory), wantErr: "hostPath type check failed, " + missing + " is not a directory, unable to determine its type: path \"" + missing + "\" does not exist"},
		{path: file, typ: ptr.To(v1.HostPathFile)},
		{path: dir, typ: ptr.To(v1.HostPathFile), wantErr: "is not a file, it's a Directory"},
		{path: sock, typ: ptr.To(v1.HostPathSocket)},
		{path: file, typ: ptr.To(v1.HostPathSocket), wantErr: "is not a socket file, it's a File"},
		{path: "/dev/null", typ: ptr.To(v1.HostPathCharDev)},
		{path: file, typ: ptr.To(v1.HostPathCharDev), wantErr: "is not a character device, it's a File"},
		{path: "/dev/null", typ: ptr.To(v1.HostPathBlockDev), wantErr: "is not a block device, it's a CharDevice"},
		{path: block, typ: ptr.To(v1.HostPathBlockDev)},
		{path: filepath.Join(dir, "new/dir"), typ: ptr.To(v1.HostPathDirectoryOrCreate), created: os.ModeDir},
		{path: file, typ: ptr.To(v1.HostPathDirectoryOrCreate), wantErr: "is not a directory, it's a File"},
		{path: filepath.Join(dir, "newfile"), typ: ptr.To(v1.HostPathFileOrCreate)},
		{path: dir, typ: ptr.To(v1.HostPathFileOrCreate), wantErr: "is not a file, it's a Directory"},
		{path: filepath.Join(dir, "no-parent/file"), typ: ptr.To(v1.HostPathFileOrCreate), wantErr: "no such file or directory"},
		{path: filepath.Join(dir, "unset-new"), typ: nil, created: os.ModeDir}, // created as a directory, as containerd's CRI does
		{path: filepath.Join(dir, "unset-empty"), typ: ptr.To(v1.HostPathUnset), created: os.ModeDir},
		{path: file, typ: ptr.To(v1.HostPathUnset)},
		{path: "relative/path", typ: ptr.To(v1.HostPathDirectory), wantErr: "must be an absolute path"},
		{path: dir + "/../etc", typ: ptr.To(v1.HostPathDirectory), wantErr: "must not contain '..'"},
		{path: dir, typ: ptr.To[v1.HostPathType]("Bogus"), wantErr: "Bogus is an invalid volume type"},
	} {
		name := tc.path
		if tc.typ != nil {
			name = string(*tc.typ) + " " + name
		}
		t.Run(name, func(t *testing.T) {
			err := checkHostPath(tc.path, tc.typ)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(tc.path)
			if err != nil {
				t.Fatalf("path after check: %v", err)
			}
			if tc.created == os.ModeDir && !fi.IsDir() {
				t.Errorf("%s is %v, want a directory", tc.path, fi.Mode())
			}
			if tc.typ != nil && *tc.typ == v1.HostPathFileOrCreate && !fi.Mode().IsRegular() {
				t.Errorf("%s is %v, want a regular file", tc.path, fi.Mode())
			}
		})
	}
}
