package volumes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/test/prereq"
)

func requireRoot(t *testing.T) {
	t.Helper()
	prereq.Root(t, "mounts")
}

// TestBindSubPath: a subPath that stays in its volume, through relative or absolute symlinks,
// is bound; one that leaves it by "..", an absolute path or a symlink is refused, and nothing is
// created outside the volume on the way.
func TestBindSubPath(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	root := filepath.Join(base, "vol")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root + "/data/x", outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "data/f"), []byte("inside"), 0o644))
	must(os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o600))
	must(os.Symlink("data", filepath.Join(root, "in")))                          // relative, stays inside
	must(os.Symlink(filepath.Join(root, "data"), filepath.Join(root, "abs-in"))) // absolute, stays inside
	must(os.Symlink(outside, filepath.Join(root, "out")))                        // leaves the volume
	must(os.Symlink("../outside", filepath.Join(root, "up")))                    // leaves by ..
	must(os.Symlink("/", filepath.Join(root, "data/x/root")))                    // deeper, to /

	targets := filepath.Join(base, "subpaths")
	for i, tc := range []struct {
		sub     string
		wantErr string
		read    string // a file under the bound path, and its content
		content string
	}{
		{sub: "data/f", read: "", content: "inside"},
		{sub: "data", read: "f", content: "inside"},
		{sub: "in", read: "f", content: "inside"},
		{sub: "abs-in/f", content: "inside"},
		{sub: "new/dir", read: ""}, // created inside the volume
		{sub: "out", wantErr: "not within volume path"},
		{sub: "out/secret", wantErr: "not within volume path"},
		{sub: "up/secret", wantErr: "not within volume path"},
		{sub: "data/x/root/etc", wantErr: "not within volume path"},
		{sub: "out/newdir", wantErr: "not within volume path"},
		{sub: "../outside", wantErr: "must not contain '..'"},
		{sub: "data/../../outside", wantErr: "must not contain '..'"},
		{sub: "/etc", wantErr: "must be a relative path"},
	} {
		t.Run(tc.sub, func(t *testing.T) {
			target := filepath.Join(targets, strings.ReplaceAll(tc.sub, "/", "_")+"-"+string(rune('a'+i)))
			err := bindSubPath(root, tc.sub, target)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unmountUnder(target) })
			if tc.content != "" {
				b, err := os.ReadFile(filepath.Join(target, tc.read))
				if err != nil || string(b) != tc.content {
					t.Errorf("read through the bind: %q, %v", b, err)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(outside, "newdir")); !os.IsNotExist(err) {
		t.Errorf("a refused subPath created %s/newdir (%v)", outside, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "new/dir")); err != nil || !fi.IsDir() {
		t.Errorf("missing subPath directory not created inside the volume: %v", err)
	}

	// Binding again (a container restart) replaces the old bind instead of stacking.
	target := filepath.Join(targets, "again")
	for range 2 {
		if err := bindSubPath(root, "data", target); err != nil {
			t.Fatal(err)
		}
	}
	if n := countMounts(t, target); n != 1 {
		t.Errorf("%d mounts on %s after binding twice, want 1", n, target)
	}

	// A bind is a snapshot of what was checked: swapping the directory for a symlink to the
	// outside afterwards does not change what the bind shows.
	must(os.Rename(filepath.Join(root, "data"), filepath.Join(root, "data-old")))
	must(os.Symlink(outside, filepath.Join(root, "data")))
	if _, err := os.Stat(filepath.Join(target, "secret")); !os.IsNotExist(err) {
		t.Errorf("the bind follows a symlink swapped in after the check (%v)", err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "inside" {
		t.Errorf("bind lost its content: %q, %v", b, err)
	}
	// And a new bind now refuses it.
	if err := bindSubPath(root, "data", target); err == nil || !strings.Contains(err.Error(), "not within volume path") {
		t.Errorf("bind through a swapped-in symlink: %v", err)
	}

	// Removal never goes through a mount: with the bind still there it refuses.
	if err := bindSubPath(root, "data-old", target); err != nil {
		t.Fatal(err)
	}
	if err := removeAllOneFS(targets); err == nil || !strings.Contains(err.Error(), "still mounted") {
		t.Fatalf("removeAllOneFS with a mount below: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "data-old/f")); err != nil {
		t.Fatalf("removal went through the bind: %v", err)
	}
	if err := unmountUnder(targets); err != nil {
		t.Fatal(err)
	}
	if err := removeAllOneFS(targets); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "data-old/f")); err != nil {
		t.Fatalf("volume content lost: %v", err)
	}
}

func countMounts(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == real {
			n++
		}
	}
	return n
}

// A subPath that does not exist yet is created with the mode of its volume's root, special bits
// included and past the umask, as kubelet creates it: a volume given to an fsGroup (g+rwx,
// setgid) must give its new subdirectories to the group too.
func TestSubPathCreatedWithTheVolumeMode(t *testing.T) {
	root := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	want := os.ModeDir | os.ModeSetgid | os.ModeSticky | 0o777
	if err := os.Chmod(root, want.Perm()|os.ModeSetgid|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := safeMkdirAll(root, "a/b"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "a/b"} {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v (the volume's)", p, fi.Mode(), want)
		}
	}
}
